"""Chapter 5's views of stored rows: the sequence sweep (Figure 5), compile time, the eager inversion.

Each function returns a table (a DataFrame) or figures; the post's T4 numbers come from
``ftlib.analysis.claims`` and are labelled as claims, the T4 roofline as a projection. Rows are
matched on their whole model config (``ftlib.views.bench.same_config``), so a smoke run of a
smaller model never lands in a full-size table; pass the smoke run's ``overrides`` to see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.analysis.claims import POST_CLAIMED, POST_GPU, POST_STEP_MS, roofline_projection
from ftlib.model.config import ModelConfig, preset
from ftlib.views.bench import ok_rows, pick, same_config
from ftlib.views.plots import legend_below, log_ticks
from ftlib.views.tables import records, table_view

MODELS = ("gpt2", "fasttransformer")
TOKENS = 8192  # the original T sweep's tokens per step (B = TOKENS // T)
SWEEP_T = (128, 256, 512, 1024, 2048, 4096)
PROJECTION = f"projection: roofline floor on a {POST_GPU} (not a measurement)"
CLAIM = f"post (claim), {POST_GPU}"


def sweep_config(name: str, T: int, **overrides: Any) -> ModelConfig:
    """The model of the sweep at sequence length T: the preset with a context of exactly T."""
    return preset(name, block_size=T, **overrides)


def sweep_rows(device: str, include_cpu: bool = False, tokens: int = TOKENS, **overrides: Any) -> list[dict]:
    """ok tsweep rows of one device at ``tokens`` per step whose config is the sweep's own."""
    return [r for r in ok_rows("tsweep", include_cpu=include_cpu)
            if r["device_slug"] == device and r.get("tokens") == tokens and r.get("label") in MODELS
            and same_config(r, sweep_config(r["label"], r["T"], **overrides), ignore=())]


@table_view
def sweep_table(rows: Iterable[dict], precision: str = "fp32", mode: str = "compile-ro") -> list[dict[str, Any]]:
    """Per T (ascending): each model's median step, tokens/s and peak memory, and the speed-up.

    The speed-up is GPT-2's step time over FastTransformer's at the same T; None where
    either row is missing.
    """
    rows = [r for r in rows if r["precision"] == precision and r["mode"] == mode]
    out = []
    for T in sorted({r["T"] for r in rows}):
        g, f = pick(rows, label="gpt2", T=T), pick(rows, label="fasttransformer", T=T)
        line: dict[str, Any] = {"T": T, "B": (g or f)["B"]}
        for name, r in (("gpt2", g), ("fasttransformer", f)):
            line[f"{name} ms"] = r["median_ms"] if r else None
            line[f"{name} tokens/s"] = r["tokens_per_s"] if r else None
            line[f"{name} peak MB"] = r.get("peak_mem_mb") if r else None
        line["speed-up"] = g["median_ms"] / f["median_ms"] if g and f else None
        out.append(line)
    return out


def run_ratios(rows: Iterable[dict], field: str, **match: Any) -> pd.DataFrame:
    """GPT-2's ``field`` over FastTransformer's, per run: rows of one ``run_id`` paired only with each
    other (rows stored before runs were recorded are left out). Columns run_id, machine_id, ratio."""
    recs = [{"run_id": r["run_id"], "machine_id": r.get("machine_id"), "label": r["label"], "v": r[field]}
            for r in rows if r.get("run_id") and r.get(field) is not None
            and all(r.get(k) == v for k, v in match.items())]
    if not recs:
        return pd.DataFrame(columns=["run_id", "machine_id", "ratio"])
    wide = pd.DataFrame(recs).pivot_table(index=["run_id", "machine_id"], columns="label", values="v",
                                          aggfunc="median")
    if not set(MODELS) <= set(wide.columns):
        return pd.DataFrame(columns=["run_id", "machine_id", "ratio"])
    wide = wide.dropna(subset=list(MODELS))
    return (wide["gpt2"] / wide["fasttransformer"]).rename("ratio").reset_index()


def sweep_findings(rows: Iterable[dict], device: str) -> list[str]:
    """Chapter 5's findings on the T sweep of one device: per precision under reduce-overhead, the
    speed-up at the shortest and longest T, and at T=128 against the post's claim, with how many
    runs stand behind it (a verdict needs as many as the baselines' do)."""
    from ftlib.views.baselines import MIN_MACHINES, MIN_RUNS, enough_runs, runs_on_starts

    rows = list(rows)
    out = []
    for prec in ("fp32", "tf32"):
        table = [r for r in sweep_table.rows(rows, prec, "compile-ro") if r["speed-up"]]
        if not table:
            continue
        lo, hi = table[0], table[-1]
        per_run = run_ratios(rows, "median_ms", T=lo["T"], precision=prec, mode="compile-ro")
        n, m = len(per_run), per_run["machine_id"].nunique() if len(per_run) else 0
        line = (f"{device}, {prec}, reduce-overhead: FastTransformer over GPT-2 is {lo['speed-up']:.2f}× at "
                f"T={lo['T']} and {hi['speed-up']:.2f}× at T={hi['T']}, at {TOKENS:,} tokens per step")
        if prec == "fp32" and lo["T"] == 128:
            line += f" (the post claims {POST_CLAIMED['speedup_T128']}× at T=128 on its T4)"
        enough = "." if enough_runs(n, m) else f", too few for a verdict ({MIN_RUNS} on {MIN_MACHINES} needed)."
        out.append(f"{line}; {runs_on_starts(n, m)}{enough}")
    return out


@table_view
def t4_projection(Ts: Sequence[int] = SWEEP_T, tokens: int = TOKENS, source: bool = True) -> list[dict[str, Any]]:
    """Per T: the roofline floor of each model's step on the post's T4 and their ratio (a projection)."""
    out = []
    for T in Ts:
        B = tokens // T
        g, f = (roofline_projection(sweep_config(n, T), B, T, POST_GPU) for n in MODELS)
        out.append({"T": T, "B": B, "gpt2 floor ms": g["floor_ms"], "fasttransformer floor ms": f["floor_ms"],
                    "floor ratio": g["floor_ms"] / f["floor_ms"],
                    "gpt2 floor tokens/s": B * T / (g["floor_ms"] / 1e3),
                    "fasttransformer floor tokens/s": B * T / (f["floor_ms"] / 1e3), "source": PROJECTION})
    if not source:  # a table whose caption says what it is
        out = [{k: v for k, v in r.items() if k != "source"} for r in out]
    return out


@table_view
def post_sweep_claims() -> list[dict[str, Any]]:
    """What the post states about Figure 5 in numbers: only T=128 (sec. 7's caption)."""
    return [{"T": 128, "B": TOKENS // 128, "speed-up": POST_CLAIMED["speedup_T128"],
             "fasttransformer tokens/s": POST_CLAIMED["tokens_per_s_T128"], "source": CLAIM}]


COMPILE_SOURCES = (
    ("compile_time", "a fresh process, empty compile caches"),
)


@table_view
def compile_time_table(device: str, include_cpu: bool = False, **overrides: Any) -> list[dict[str, Any]]:
    """First-step seconds per mode and model (fp32, B=32, T=256), from each source that has them.

    ``compile_time`` rows (a cold process per case), then the post's claim (compile-ro). The
    ratio is GPT-2's first step over FastTransformer's, the form of the post's "3.5x faster".
    """
    out = []
    for bench, how in COMPILE_SOURCES:
        rows = [r for r in ok_rows(bench, include_cpu=include_cpu) if r["device_slug"] == device
                and r["precision"] == "fp32" and r.get("first_step_s") is not None
                and r.get("label") in MODELS and same_config(r, preset(r["label"], **overrides), ignore=())]
        for mode in ("compile-ro", "compile", "cudagraph"):
            g, f = pick(rows, label="gpt2", mode=mode), pick(rows, label="fasttransformer", mode=mode)
            if g or f:
                out.append({"source": f"{bench} suite: {how}", "device": device, "mode": mode,
                            "gpt2 first step s": g and g["first_step_s"],
                            "fasttransformer first step s": f and f["first_step_s"],
                            "gpt2 / FT": g["first_step_s"] / f["first_step_s"] if g and f else None})
    cs = POST_CLAIMED["compile_s"]
    out.append({"source": CLAIM, "device": POST_GPU, "mode": "compile-ro", "gpt2 first step s": cs["gpt2"],
                "fasttransformer first step s": cs["fasttransformer"],
                "gpt2 / FT": cs["gpt2"] / cs["fasttransformer"]})
    return out


@table_view
def eager_inversion_table(device: str, include_cpu: bool = False, tokens: int = TOKENS,
                          **overrides: Any) -> list[dict[str, Any]]:
    """FastTransformer in eager mode against GPT-2 compiled (reduce-overhead) along the T sweep.

    The post's own pair (98 vs 101.3 ms on its T4) first. At B=32, T=256 the baselines suite
    answers it with repeated runs (``ftlib.views.baselines.eager_inversion``). The inversion holds
    where the eager FastTransformer step is the shorter one.
    """
    fe, gc = POST_STEP_MS[("fasttransformer", "eager")], POST_STEP_MS[("gpt2", "compile-ro")]
    out = [{"source": CLAIM, "precision": "fp32", "T": 256, "B": 32, "FT eager ms": fe, "GPT-2 compile-ro ms": gc,
            "verdict": "holds" if fe < gc else "does not hold"}]
    sweep = sweep_rows(device, include_cpu, tokens, **overrides)
    for prec in ("fp32", "tf32", "bf16"):
        for T in sorted({r["T"] for r in sweep}):
            f = pick(sweep, label="fasttransformer", mode="eager", precision=prec, T=T)
            g = pick(sweep, label="gpt2", mode="compile-ro", precision=prec, T=T)
            if f and g:
                out.append({"source": f"tsweep suite, {device}", "precision": prec, "T": T, "B": f["B"],
                            "FT eager ms": f["median_ms"], "GPT-2 compile-ro ms": g["median_ms"],
                            "verdict": "holds" if f["median_ms"] < g["median_ms"] else "does not hold"})
    return out


# ---------------------------------------------------------------------------------------
# Chapter 5's sweep figures and the lines under them.

# The columns a reader compares first; every column is in the collapsed table and its CSV.
SWEEP_PREVIEW = ("T", "B", "gpt2 ms", "fasttransformer ms", "speed-up", "gpt2 tokens/s", "fasttransformer tokens/s")
SHORT_PROJECTION, SHORT_CLAIM = f"{POST_GPU} roofline projection", f"post's claim ({POST_GPU})"
MODEL_NAMES = {"gpt2": "GPT-2", "fasttransformer": "FastTransformer"}
PREC_COLOR, MODE_DASH = {"fp32": "#1f77b4", "tf32": "#ff7f0e"}, {"compile-ro": "solid", "eager": "dash"}


@table_view
def sweep_with_claims(rows: Iterable[dict], precision: str = "fp32", mode: str = "compile-ro") -> list[dict[str, Any]]:
    """:func:`sweep_table` with the post's Figure 5 claim as a last line."""
    return sweep_table.rows(rows, precision, mode) + post_sweep_claims.rows()


def has_cold_process_rows(table: pd.DataFrame) -> bool:
    """Whether a :func:`compile_time_table` holds rows of the cold-process suite (not only the claim)."""
    return any(r["source"].startswith("compile_time") for r in records(table))


def sweep_figures(rows: list[dict], device: str | None, tokens: int = TOKENS) -> list[tuple[str, go.Figure]]:
    """(name, figure): the speed-up of FastTransformer over GPT-2 against T, and each model's throughput,
    per precision (colour) and mode (line), beside the post's claim and the T4 roofline projection."""
    proj, claims = t4_projection.rows(), post_sweep_claims.rows()
    speed = go.Figure()
    tput = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                         subplot_titles=[MODEL_NAMES[m] for m in MODELS])
    for prec in ("fp32", "tf32"):
        for mode in ("compile-ro", "eager"):
            pts = sweep_table.rows(rows, prec, mode)
            if pts:
                style = dict(color=PREC_COLOR[prec], dash=MODE_DASH[mode])
                speed.add_trace(go.Scatter(x=[p["T"] for p in pts], y=[p["speed-up"] for p in pts],
                                           mode="lines+markers", name=f"{prec} {mode}", line=style))
                for i, m in enumerate(MODELS, start=1):
                    tput.add_trace(go.Scatter(x=[p["T"] for p in pts], y=[p[f"{m} tokens/s"] for p in pts],
                                              mode="lines+markers", name=f"{prec} {mode}", line=style,
                                              legendgroup=f"{prec} {mode}", showlegend=i == 1), row=1, col=i)
    speed.add_trace(go.Scatter(x=[p["T"] for p in proj], y=[p["floor ratio"] for p in proj], name=SHORT_PROJECTION,
                               mode="lines", line=dict(dash="dot", color="#7f7f7f")))
    speed.add_trace(go.Scatter(x=[c["T"] for c in claims], y=[c["speed-up"] for c in claims], name=SHORT_CLAIM,
                               mode="markers", marker=dict(symbol="star", size=14, color="#333")))
    speed.add_hline(y=1, line=dict(color="#999", width=1))
    where = device or "no GPU rows"
    ts = [p["T"] for p in proj]
    speed.update_layout(title=f"FastTransformer speed-up over GPT-2 vs T, {tokens:,} tokens/step, {where}",
                        xaxis=dict(title=f"T (B = {tokens} / T)", **log_ticks(ts)),
                        yaxis_title="speed-up (GPT-2 step time / FastTransformer's)", height=460)
    for i, m in enumerate(MODELS, start=1):
        tput.add_trace(go.Scatter(x=[p["T"] for p in proj], y=[p[f"{m} floor tokens/s"] for p in proj],
                                  name=SHORT_PROJECTION, mode="lines", line=dict(dash="dot", color="#7f7f7f"),
                                  legendgroup="projection", showlegend=i == 1), row=1, col=i)
    tput.add_trace(go.Scatter(x=[c["T"] for c in claims], y=[c["fasttransformer tokens/s"] for c in claims],
                              name=SHORT_CLAIM, mode="markers", marker=dict(symbol="star", size=14, color="#333")),
                   row=1, col=2)
    tput.update_xaxes(title_text=f"T (B = {tokens} / T)", **log_ticks(ts))
    tput.update_layout(title=f"Training throughput vs T (the post's Figure 5), {where}", yaxis_title="tokens / s",
                       height=480)
    return [(f"fig5-speedup-{device}", legend_below(speed)), (f"fig5-throughput-{device}", legend_below(tput))]


def slower_at(rows: list[dict], device: str | None) -> list[str]:
    """One line per precision and mode: the T at which FastTransformer steps slower than GPT-2."""
    lines = []
    for prec in ("fp32", "tf32"):
        for mode in ("compile-ro", "eager"):
            pts = sweep_table.rows(rows, prec, mode)
            slower = [p["T"] for p in pts if p["speed-up"] < 1]
            if pts:
                lines.append(f"{device} {prec} {mode}: FastTransformer slower than GPT-2 at T = {slower or 'none'}")
    return lines
