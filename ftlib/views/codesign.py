"""Chapter 4's views of stored rows: the 2^4 grid in every measured mode, what each switch
buys, the ladder GPT-2 -> FastTransformer, which attention kernel each variant gets and what the
original K/V layout costs, with the runs behind each table.

A configuration's step may have been measured by several suites (a ladder rung is also a
grid cell; the last rung times like Figure 1's FastTransformer), so rows are found by their
model config, B, T, mode and precision, from the suites in ``SOURCES`` in that order of
preference; each value carries the suite it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ftlib.analysis.accounting import num_params
from ftlib.analysis.backends import expected_backend
from ftlib.analysis.totals import step_summary
from ftlib.model.ablations import SWITCHES, grid, kv_head_sweep, ladder, mlp_ratio_sweep
from ftlib.model.config import ModelConfig, preset
from ftlib.views.baselines import runs_on_starts, verdict
from ftlib.views.bench import gpu_label, model_title, ok_rows, same_config
from ftlib.views.plots import legend_below
from ftlib.views.tables import records, table_view

B, T = 32, 256  # the post's shape, at which every chapter-4 suite measures
# (mode, precision) columns of the grid and the ladder, in the order shown.
COLUMNS = (("eager", "fp32"), ("cudagraph", "fp32"), ("eager", "tf32"), ("cudagraph", "tf32"),
           ("compile-ro", "fp32"))
# One colour per column, the same in the ladder and the sweeps; the accounting's line is grey.
COLUMN_COLORS = dict(zip(COLUMNS, ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a")))
ACCOUNTING_COLOR = "#7f7f7f"
SOURCES = ("grid", "grid_compile", "ladder", "baselines")
OWN_SOURCES = SOURCES[:3]  # the suites chapter 4 runs itself; baselines only lends rows
LADDER_SOURCES = ("ladder", "grid", "grid_compile", "baselines")  # the ladder's own run first
# The attention variants whose SDPA backend chapter 4 reads from the profiler.
VARIANTS: dict[str, ModelConfig] = {
    "gpt2": preset("gpt2"),
    "fasttransformer": preset("fasttransformer"),  # K/V expanded to (B, H, T, d): a stride-0 view
    "fasttransformer-broadcast": preset("fasttransformer", kv_layout="broadcast"),  # (B, 1, T, d), as the original
}
NOT_PROFILED = "not measured yet"
KV_AS_PASSED = {"gpt2": "(B, H, T, d), explicit softmax", "fasttransformer": "(B, H, T, d) expanded view",
                "fasttransformer-broadcast": "(B, 1, T, d), as the original"}


def col(mode: str, precision: str) -> str:
    return f"{mode} {precision} ms"


def measured(device: str, include_cpu: bool = False) -> list[dict]:
    """Every ok step row of one device from the suites chapter 4 reads."""
    return [r for r in ok_rows(SOURCES, include_cpu=include_cpu) if r["device_slug"] == device]


def find(rows: Iterable[dict], cfg: ModelConfig, mode: str, precision: str, b: int = B, t: int = T,
         sources: tuple[str, ...] = SOURCES) -> dict | None:
    """The row that measured ``cfg`` (init aside) at b x t in ``mode`` and ``precision``.

    From the first suite of ``sources`` that has one; the latest by date within a suite.
    """
    hits = [r for r in rows if r["mode"] == mode and r["precision"] == precision and r["B"] == b
            and r["T"] == t and same_config(r, cfg) and _default_placement(r)]
    for bench in sources:
        mine = sorted((r for r in hits if r.get("bench") == bench), key=lambda r: r.get("date", ""))
        if mine:
            return mine[-1]
    return None


def _default_placement(r: dict) -> bool:
    """Rows with AdamW where the grid's own suites put it (PyTorch's default; fused in a CUDA graph)."""
    kind = r.get("optimizer_kind") or "default"
    return kind == "default" or (kind == "fused" and r["mode"] == "cudagraph")


def _ms(rows: Iterable[dict], cfg: ModelConfig, mode: str, precision: str, b: int = B, t: int = T,
        sources: tuple[str, ...] = SOURCES) -> float | None:
    r = find(rows, cfg, mode, precision, b, t, sources)
    return r["median_ms"] if r else None


@table_view
def grid_table(rows: list[dict], configs: Mapping[str, ModelConfig] | None = None, b: int = B, t: int = T
               ) -> list[dict[str, Any]]:
    """One line per grid cell: parameters, accounting (fp32, H200 kernel rules), measured ms per column.

    ``configs`` and ``b`` x ``t`` default to the full-size grid at 32 x 256 (a smoke run passes its own).
    """
    out = []
    for label, cfg in (configs or grid()).items():
        s = step_summary(cfg, b, t, precision="fp32")
        line: dict[str, Any] = {"cell": label, "params": num_params(cfg), "GFLOP / step": s["flops"] / 1e9,
                                "GB moved / step (eager)": s["bytes"] / 1e9,
                                "attention kernel (expected)": expected_backend(cfg, "fp32", (9, 0))}
        for mode, prec in COLUMNS:
            line[col(mode, prec)] = _ms(rows, cfg, mode, prec, b, t)
        out.append(line)
    return out


def _names(label: str) -> tuple[str, ...]:
    return () if label == "gpt2" else tuple(label.split("+"))


@table_view
def switch_effects(table: pd.DataFrame | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured column: each switch's mean speed-up over the 8 cells where it is off.

    For a switch, every cell without it is paired with the cell that adds it, so each
    combination of the other three counts once; the speed-up is off-time over on-time. A
    switch whose 8 pairs are not all measured gets None, not an average of fewer pairs.
    """
    table = records(table) if isinstance(table, pd.DataFrame) else table
    by_names = {frozenset(_names(r["cell"])): r for r in table}
    out = []
    for mode, prec in COLUMNS:
        c = col(mode, prec)
        line: dict[str, Any] = {"mode": f"{mode} {prec}"}
        for sw in SWITCHES:
            ratios = []
            for names, off in by_names.items():
                on = by_names.get(names | {sw})
                if sw not in names and on is not None and off.get(c) and on.get(c):
                    ratios.append(off[c] / on[c])
            line[f"{sw} speed-up"] = sum(ratios) / len(ratios) if len(ratios) == 2 ** (len(SWITCHES) - 1) else None
        out.append(line)
    return out


@table_view
def ladder_table(rows: list[dict], configs: Mapping[str, ModelConfig] | None = None, b: int = B, t: int = T
                 ) -> list[dict[str, Any]]:
    """The cumulative ladder: one line per rung, ms per column and the suite each came from."""
    out = []
    for rung, cfg in (configs or ladder()).items():
        line: dict[str, Any] = {"rung": rung}
        for mode, prec in COLUMNS:
            r = find(rows, cfg, mode, prec, b, t, LADDER_SOURCES)
            line[col(mode, prec)] = r["median_ms"] if r else None
            line[f"{mode} {prec} from"] = r["bench"] if r else None
        out.append(line)
    return out


def _capability(row: dict) -> tuple[int, int] | None:
    cap = (row.get("provenance") or {}).get("capability")
    return tuple(int(x) for x in str(cap).split(".")[:2]) if cap else None  # type: ignore[return-value]


@table_view
def backend_table(device: str | None, include_cpu: bool = False, precisions: tuple[str, ...] = ("fp32", "tf32"),
                  b: int = B, t: int = T, **overrides: Any) -> list[dict[str, Any]]:
    """Eager profiles at b x t (default the post's 32 x 256): the SDPA backend each variant ran, from its trace.

    Beside it the backend the accounting's rules expect on that device, and the profiler
    run's step time. A variant not profiled yet reads "not measured yet" (the chapter names the
    command once, :func:`ftlib.views.bench.not_measured`).
    ``overrides`` (config fields) with ``b``, ``t`` select smoke-run profiles of smaller models.
    """
    if device is None:  # no GPU has stored rows of this chapter's suites
        return []
    prof = [r for r in ok_rows("profile", include_cpu=include_cpu)
            if r["device_slug"] == device and r["mode"] == "eager" and (r["B"], r["T"]) == (b, t)]
    out = []
    for name, base in VARIANTS.items():
        cfg = base.replace(**overrides)
        for prec in precisions:
            mine = sorted((r for r in prof if r["precision"] == prec and same_config(r, cfg, ignore=())),
                          key=lambda r: (r.get("provenance") or {}).get("date", ""))
            r = mine[-1] if mine else None
            cap = _capability(r) if r else (9, 0)
            out.append({"model": name, "K/V as passed": KV_AS_PASSED[name], "precision": prec,
                        "SDPA backend (from trace)": r["sdpa_backend"] if r else NOT_PROFILED,
                        "expected (accounting)": expected_backend(cfg, prec, cap),
                        "step ms (profiler run)": r["step_ms"] if r else None})
    return out


def _run_of(r: dict) -> str:
    """The run a row comes from (rows stored before runs were recorded: their commit and day)."""
    return r.get("run_id") or f"{r.get('commit', '')}@{str(r.get('date', ''))[:10]}"


@table_view
def grid_runs(rows: list[dict], configs: Mapping[str, ModelConfig] | None = None, b: int = B, t: int = T,
              sources: tuple[str, ...] = SOURCES) -> list[dict[str, Any]]:
    """Per measured column of the grid (or, with ``sources=LADDER_SOURCES``, the ladder): how many of its
    lines have a time, and from how many runs and machine starts of which suites those times come."""
    cfgs = configs or grid()
    out = []
    for mode, prec in COLUMNS:
        hits = [r for cfg in cfgs.values() if (r := find(rows, cfg, mode, prec, b, t, sources))]
        out.append({"column": f"{mode} {prec}", "measured": f"{len(hits)} of {len(cfgs)}",
                    "runs": len({_run_of(r) for r in hits}),
                    "machine starts": len({r.get("machine_id") or _run_of(r) for r in hits}),
                    "suites": ", ".join(sorted({r["bench"] for r in hits})) or None})
    return out


def runs_caption(runs: pd.DataFrame) -> str:
    """'1 run on 1 machine start' for a table of :func:`grid_runs` whose measured columns agree, else
    'runs per column as listed'."""
    counts = {(r["runs"], r["machine starts"]) for r in records(runs) if r["runs"]}
    if not counts:
        return "no runs stored"
    return runs_on_starts(*counts.pop()) if len(counts) == 1 else "runs per column as listed"


@table_view
def run_scatter(rows: list[dict], b: int = B, t: int = T, precision: str = "fp32") -> list[dict[str, Any]]:
    """How far apart one configuration's step lies from run to run: the baselines suite's GPT-2 and
    FastTransformer (PyTorch's default AdamW placement) per mode, fastest and slowest run, over every run."""
    out = []
    for name in ("gpt2", "fasttransformer"):
        mine = [r for r in rows if r.get("bench") == "baselines" and r.get("run_id") and r["precision"] == precision
                and (r["B"], r["T"]) == (b, t) and same_config(r, VARIANTS[name]) and _default_placement(r)]
        df = pd.DataFrame([{"mode": r["mode"], "run": r["run_id"], "machine": r.get("machine_id") or r["run_id"],
                            "ms": r["median_ms"]} for r in mine], columns=["mode", "run", "machine", "ms"])
        for mode in ("eager", "cudagraph", "compile-ro"):
            g = df[df["mode"] == mode]
            if g.empty:
                continue
            out.append({"model": name, "mode": f"{mode} {precision}", "fastest run ms": g["ms"].min(),
                        "slowest run ms": g["ms"].max(), "slowest / fastest": g["ms"].max() / g["ms"].min(),
                        "runs": g["run"].nunique(), "machine starts": g["machine"].nunique()})
    return out


LAYOUT_MODES = ("eager", "cudagraph", "compile", "compile-ro")
_LAYOUT_VERDICT = {"faster": "the original layout is slower", "slower": "the original layout is faster"}


@table_view
def fallback_cost(rows: list[dict], b: int = B, t: int = T) -> list[dict[str, Any]]:
    """Per mode (fp32, default b x t 32 x 256): the original (B,1,T,d) K/V layout's step time over the
    expanded view's on the FastTransformer.

    The baselines suite times both layouts in the same process, so each run gives one ratio; a mode
    shows the median ratio over every run that measured both layouts in it, its lowest and highest
    run, the median step time of each layout over the same runs, and the verdict
    (:func:`ftlib.views.baselines.verdict`).
    """
    names = {"fasttransformer": "expanded", "fasttransformer-broadcast": "original"}
    recs = [{"run": r["run_id"], "machine": r.get("machine_id") or r["run_id"], "mode": r["mode"],
             "layout": layout, "ms": r["median_ms"], "date": str(r.get("date", ""))}
            for r in rows if r.get("bench") == "baselines" and r.get("run_id") and r["precision"] == "fp32"
            and (r["B"], r["T"]) == (b, t) and r["mode"] in LAYOUT_MODES and _default_placement(r)
            for name, layout in names.items() if same_config(r, VARIANTS[name])]
    df = pd.DataFrame(recs, columns=["run", "machine", "mode", "layout", "ms", "date"])
    df = df.sort_values("date").groupby(["run", "machine", "mode", "layout"]).last().reset_index()
    per_run = df.pivot(index=["run", "machine", "mode"], columns="layout", values="ms")
    per_run = per_run.reindex(columns=["expanded", "original"]).dropna().reset_index()
    per_run["cost"] = per_run["original"] / per_run["expanded"]
    out = []
    for mode in LAYOUT_MODES:
        g = per_run[per_run["mode"] == mode]
        line: dict[str, Any] = {"mode": mode, "expanded K/V ms": None, "original (B,1,T,d) ms": None,
                                "cost of the layout": None, "cost of the layout, lowest run": None,
                                "cost of the layout, highest run": None, "runs": 0, "verdict": None}
        if len(g):
            n, m = g["run"].nunique(), g["machine"].nunique()
            lo, hi = g["cost"].min(), g["cost"].max()
            said = verdict(lo, hi, n, m)
            line.update({"expanded K/V ms": g["expanded"].median(), "original (B,1,T,d) ms": g["original"].median(),
                         "cost of the layout": g["cost"].median(), "cost of the layout, lowest run": lo,
                         "cost of the layout, highest run": hi, "runs": runs_on_starts(n, m),
                         "verdict": _LAYOUT_VERDICT.get(said, said)})
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------
# Chapter 4's previews and figures.

GRID_PREVIEW = ("cell", "GFLOP / step", *(col(m, p) for m, p in COLUMNS))
LADDER_PREVIEW = ("rung", *(col(m, p) for m, p in COLUMNS))


def unmeasured(table: pd.DataFrame, mode: str, precision: str, name: str = "cell") -> list[str]:
    """The lines of a grid or ladder table without a time in ``mode`` and ``precision``."""
    return [r[name] for r in records(table) if r.get(col(mode, precision)) is None]


def ladder_figure(steps: pd.DataFrame, device: str | None, b: int = B, t: int = T) -> go.Figure:
    """Each rung's step time in every measured column: GPT-2 -> FastTransformer, one change at a time."""
    rows = records(steps)
    fig = go.Figure()
    for mode, prec in COLUMNS:
        fig.add_trace(go.Scatter(x=[model_title(r["rung"]) for r in rows], y=[r[col(mode, prec)] for r in rows],
                                 mode="lines+markers", name=f"{mode} {prec}",
                                 line=dict(color=COLUMN_COLORS[(mode, prec)])))
    fig.update_layout(title=f"Cumulative ladder, {gpu_label(device)} (B={b}, T={t})", yaxis_title="ms per step",
                      height=430)
    return fig


def sweep_figures(rows: list[dict], device: str | None, b: int = B, t: int = T) -> list[tuple[str, go.Figure]]:
    """(name, figure) for the K/V-head and the MLP-ratio sweeps on the FastTransformer: step time per mode
    and precision (the grid suite's rows), and the accounting's GFLOP per step on a second axis."""
    out = []
    for title, sweep, xs in (("K/V heads", kv_head_sweep(), [1, 2, 4, 8]),
                             ("MLP ratio", mlp_ratio_sweep(), [1.0, 1.5, 2.0, 3.0, 4.0])):
        fig = go.Figure()
        for prec in ("fp32", "tf32"):
            for mode in ("eager", "cudagraph"):
                # By config, not label: n_kv_head=1 and mlp_ratio=2 are both the FastTransformer, one row.
                ys = [(find(rows, cfg, mode, prec, b, t, ("grid",)) or {}).get("median_ms") for cfg in sweep.values()]
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{mode} {prec}",
                                         line=dict(color=COLUMN_COLORS[(mode, prec)])))
        fig.add_trace(go.Scatter(x=xs, y=[step_summary(c, B, T)["flops"] / 1e9 for c in sweep.values()],
                                 name="GFLOP / step (accounting)", yaxis="y2",
                                 line=dict(dash="dot", color=ACCOUNTING_COLOR)))
        # Both axes from zero: on a second axis cut to its data's span, a 20% rise in FLOPs would climb the whole
        # height and read as steep as a doubling of the step time.
        fig.update_layout(title=f"{title} sweep on FastTransformer, {gpu_label(device)}",
                          xaxis=dict(title=title, tickvals=xs),
                          yaxis=dict(title="ms per step", rangemode="tozero"),
                          yaxis2=dict(overlaying="y", side="right", title="GFLOP per step", rangemode="tozero",
                                      showgrid=False, tickmode="auto", nticks=6),
                          height=440)
        out.append((f"sweep-{title}", legend_below(fig)))
    return out
