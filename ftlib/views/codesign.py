"""Chapter 4's views of stored rows: the 2^4 grid in every measured mode, what each switch
buys, the ladder GPT-2 -> FastTransformer, and which attention kernel each variant gets.

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
from ftlib.views.bench import not_measured, ok_rows, same_config
from ftlib.views.plots import legend_below
from ftlib.views.tables import records, table_view

B, T = 32, 256  # the post's shape, at which every chapter-4 suite measures
# (mode, precision) columns of the grid and the ladder, in the order shown.
COLUMNS = (("eager", "fp32"), ("cudagraph", "fp32"), ("eager", "tf32"), ("cudagraph", "tf32"),
           ("compile-ro", "fp32"))
SOURCES = ("grid", "grid_compile", "ladder", "baselines")
LADDER_SOURCES = ("ladder", "grid", "grid_compile", "baselines")  # the ladder's own run first
# The attention variants whose SDPA backend chapter 4 reads from the profiler.
VARIANTS: dict[str, ModelConfig] = {
    "gpt2": preset("gpt2"),
    "fasttransformer": preset("fasttransformer"),  # K/V expanded to (B, H, T, d): a stride-0 view
    "fasttransformer-broadcast": preset("fasttransformer", kv_layout="broadcast"),  # (B, 1, T, d), as the original
}
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
    run's step time. A variant not profiled yet gets a line saying how to measure it.
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
                        "SDPA backend (from trace)": r["sdpa_backend"] if r else not_measured("profile"),
                        "expected (accounting)": expected_backend(cfg, prec, cap),
                        "step ms (profiler run)": r["step_ms"] if r else None})
    return out


@table_view
def fallback_cost(rows: list[dict]) -> list[dict[str, Any]]:
    """Per mode (fp32, B=32, T=256): FastTransformer with expanded K/V vs the original (B,1,T,d) layout.

    Both from one run of the baselines suite (the latest that has both), which times the two
    layouts side by side in the same process.
    """
    base = [r for r in rows if r.get("bench") == "baselines" and r.get("run_id")]
    by_run: dict[str, list[dict]] = {}
    for r in sorted(base, key=lambda r: r.get("date", ""), reverse=True):
        by_run.setdefault(r["run_id"], []).append(r)
    out = []
    for mode in ("eager", "cudagraph", "compile", "compile-ro"):
        e = b = None
        for run in by_run.values():
            e = _ms(run, VARIANTS["fasttransformer"], mode, "fp32", sources=("baselines",))
            b = _ms(run, VARIANTS["fasttransformer-broadcast"], mode, "fp32", sources=("baselines",))
            if e and b:
                break
        out.append({"mode": mode, "expanded K/V ms": e, "original (B,1,T,d) ms": b,
                    "cost of the layout": b / e if e and b else None})
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
        fig.add_trace(go.Scatter(x=[r["rung"] for r in rows], y=[r[col(mode, prec)] for r in rows],
                                 mode="lines+markers", name=f"{mode} {prec}"))
    fig.update_layout(title=f"Cumulative ladder, {device} (B={b}, T={t})", yaxis_title="ms per step", height=430)
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
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{mode} {prec}"))
        fig.add_trace(go.Scatter(x=xs, y=[step_summary(c, B, T)["flops"] / 1e9 for c in sweep.values()],
                                 name="GFLOP / step (accounting)", yaxis="y2", line=dict(dash="dot")))
        fig.update_layout(title=f"{title} sweep on FastTransformer, {device}", xaxis=dict(title=title, tickvals=xs),
                          yaxis_title="ms per step", yaxis2=dict(overlaying="y", side="right", title="GFLOP per step",
                                                                 showgrid=False, tickmode="auto", nticks=6),
                          height=440)
        out.append((f"sweep-{title}", legend_below(fig)))
    return out
