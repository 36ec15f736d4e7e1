"""Chapter 5's views of stored rows: the sequence sweep (Figure 5), compile time, the eager inversion.

Each function returns a table (a DataFrame) or figures; the post's T4 numbers come from
``ftlib.analysis.claims`` and are labelled as claims, the T4 roofline as a projection. Rows are
matched on their whole model config (``ftlib.views.bench.same_config``), so a smoke run of a
smaller model never lands in a full-size table; pass the smoke run's ``overrides`` to see it.
Every measured number is read run by run (:mod:`ftlib.views.per_run`): a ratio within one run, shown
as its median over runs with the slowest and fastest run, and a verdict only from 3 runs on 2 machine
starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.analysis.claims import POST_CLAIMED, POST_GPU, POST_STEP_MS, roofline_projection
from ftlib.model.config import ModelConfig, preset
from ftlib.views.bench import MODEL_NAMES, gpu_label, ok_rows, same_config
from ftlib.views.per_run import and_list, pair_runs, run_values, summary
from ftlib.views.plots import legend_below, log_ticks, with_subtitle
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
    """ok tsweep rows of one device at ``tokens`` per step whose config is the sweep's own, from runs
    that name themselves (``run_id``): a row that does not cannot be paired within its run."""
    return [r for r in ok_rows("tsweep", include_cpu=include_cpu)
            if r["device_slug"] == device and r.get("run_id") and r.get("tokens") == tokens and r.get("label") in MODELS
            and same_config(r, sweep_config(r["label"], r["T"], **overrides), ignore=())]


def _models_per_run(rows: list[dict], field: str, **match: Any) -> dict[str, float | None]:
    """Each model's ``field``: the median over runs of each run's value (None where no run has it)."""
    out: dict[str, float | None] = {}
    for m in MODELS:
        v = run_values(rows, field, label=m, **match)["value"]
        out[m] = float(v.median()) if len(v) else None
    return out


@table_view
def sweep_table(rows: Iterable[dict], precision: str = "fp32", mode: str = "compile-ro") -> list[dict[str, Any]]:
    """Per T (ascending): each model's step, tokens/s and peak memory, and the speed-up, over runs.

    Each model's numbers are the median over the runs that measured it. The speed-up is GPT-2's step
    time over FastTransformer's within one run; its median over runs stands with the slowest and
    fastest run, the runs and machine starts behind it and the verdict (too few runs below 3 runs on 2
    machine starts). None where no run measured both.
    """
    rows = [r for r in rows if r["precision"] == precision and r["mode"] == mode and r.get("run_id")]
    out = []
    for T in sorted({r["T"] for r in rows}):
        at = [r for r in rows if r["T"] == T]
        line: dict[str, Any] = {"T": T, "B": at[0]["B"]}
        for field, col in (("median_ms", "ms"), ("tokens_per_s", "tokens/s"), ("peak_mem_mb", "peak MB")):
            for m, v in _models_per_run(at, field).items():
                line[f"{m} {col}"] = v
        s = summary(run_ratios(at, "median_ms"))
        line.update({"speed-up": s and s["median"], "speed-up min": s and s["min"],
                     "speed-up max": s and s["max"], "runs": s and s["runs"],
                     "machine starts": s and s["machines"], "verdict": s and s["verdict"]})
        out.append(line)
    return out


def run_ratios(rows: Iterable[dict], field: str, **match: Any) -> pd.DataFrame:
    """GPT-2's ``field`` over FastTransformer's, per run: rows of one ``run_id`` paired only with each
    other (rows that do not name their run are left out). Columns run_id, machine_id, gpt2,
    fasttransformer, ratio."""
    pairs = pair_runs(rows, field, {"label": "gpt2"}, {"label": "fasttransformer"}, **match)
    return pairs.rename(columns={"slow": "gpt2", "fast": "fasttransformer"})


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


def compile_time_runs(device: str, mode: str = "compile-ro", include_cpu: bool = False,
                      **overrides: Any) -> pd.DataFrame:
    """Per run of the ``compile_time`` suite on ``device`` (fp32, B=32, T=256, a fresh process per case):
    each model's first-step seconds (tracing and compilation included) and GPT-2's over FastTransformer's,
    the form of the post's "3.5x faster". Columns run_id, machine_id, gpt2, fasttransformer, ratio.

    Chapter 5's table and chapter 7's audit both read the compile time through this one function.
    """
    rows = [r for r in ok_rows("compile_time", include_cpu=include_cpu) if r["device_slug"] == device
            and r["precision"] == "fp32" and r.get("label") in MODELS
            and same_config(r, preset(r["label"], **overrides), ignore=())]
    return run_ratios(rows, "first_step_s", mode=mode)


COMPILE_SOURCE = "the compile-time runs: a fresh process, empty compile caches"


@table_view
def compile_time_table(device: str, include_cpu: bool = False, **overrides: Any) -> list[dict[str, Any]]:
    """First-step seconds per mode and model (fp32, B=32, T=256), over runs, then the post's claim.

    Each model's seconds are the median over runs; the ratio (GPT-2's first step over FastTransformer's,
    the form of the post's "3.5x faster") is taken within each run and shown as its median with the
    slowest and fastest run, beside the runs and machine starts behind it.
    """
    out = []
    for mode in ("compile-ro", "compile", "cudagraph"):
        per_run = compile_time_runs(device, mode, include_cpu, **overrides)
        s = summary(per_run)
        if s:
            out.append({"source": COMPILE_SOURCE, "device": device, "mode": mode,
                        "gpt2 first step s": float(per_run["gpt2"].median()),
                        "fasttransformer first step s": float(per_run["fasttransformer"].median()),
                        "gpt2 / FT (median, min–max)": s["range"],
                        "runs": s["runs text"]})
    cs = POST_CLAIMED["compile_s"]
    out.append({"source": CLAIM, "device": POST_GPU, "mode": "compile-ro", "gpt2 first step s": cs["gpt2"],
                "fasttransformer first step s": cs["fasttransformer"],
                "gpt2 / FT (median, min–max)": f"{cs['gpt2'] / cs['fasttransformer']:.2f}×",
                "runs": "the post's one measurement"})
    return out


INVERSION = {"faster": "holds", "slower": "does not hold", "ties": "does not hold"}


@table_view
def eager_inversion_table(device: str, include_cpu: bool = False, tokens: int = TOKENS,
                          **overrides: Any) -> list[dict[str, Any]]:
    """FastTransformer in eager mode against GPT-2 compiled (reduce-overhead) along the T sweep, over runs.

    The post's own pair (98 vs 101.3 ms on its T4) first. At B=32, T=256 the baselines suite
    answers it with repeated runs (``ftlib.views.baselines.eager_inversion``). Per run, GPT-2's
    compiled step over FastTransformer's eager step (above 1: the eager FastTransformer is faster);
    the inversion holds where every run agrees, in at least 3 runs on 2 machine starts.
    """
    fe, gc = POST_STEP_MS[("fasttransformer", "eager")], POST_STEP_MS[("gpt2", "compile-ro")]
    ratio = "GPT-2 reduce-overhead / FastTransformer eager (median, min–max)"
    out = [{"source": CLAIM, "precision": "fp32", "T": 256, "B": 32, "FastTransformer eager ms": fe,
            "GPT-2 reduce-overhead ms": gc, ratio: f"{gc / fe:.2f}×", "runs": "the post's one measurement",
            "verdict": "holds in the post's numbers" if fe < gc else "does not hold in the post's numbers"}]
    sweep = sweep_rows(device, include_cpu, tokens, **overrides)
    for prec in ("fp32", "tf32", "bf16"):
        for T in sorted({r["T"] for r in sweep}):
            per_run = pair_runs(sweep, "median_ms", {"label": "gpt2", "mode": "compile-ro"},
                                {"label": "fasttransformer", "mode": "eager"}, precision=prec, T=T)
            s = summary(per_run)
            if s:
                out.append({"source": f"the sequence sweep, {gpu_label(device)}", "precision": prec, "T": T,
                            "B": tokens // T,
                            "FastTransformer eager ms": float(per_run["fast"].median()),
                            "GPT-2 reduce-overhead ms": float(per_run["slow"].median()),
                            ratio: s["range"], "runs": s["runs text"],
                            "verdict": INVERSION.get(s["verdict"], s["verdict"])})
    return out


# ---------------------------------------------------------------------------------------
# Chapter 5's sweep figures and the lines under them.

# The columns a reader compares first; every column is in the collapsed table and its CSV.
SWEEP_PREVIEW = ("T", "B", "gpt2 ms", "fasttransformer ms", "speed-up", "speed-up min", "speed-up max", "verdict")
SHORT_PROJECTION, SHORT_CLAIM = f"{POST_GPU} roofline projection", f"post's claim ({POST_GPU})"
PREC_COLOR, MODE_DASH = {"fp32": "#1f77b4", "tf32": "#ff7f0e"}, {"compile-ro": "solid", "eager": "dash"}
# How a legend names each mode: the glossary's words, not the suite's key.
MODE_WORDS = {"compile-ro": "reduce-overhead", "eager": "eager"}
# The speed-up figure draws the four series of one T a little apart (a factor on the log T axis), so that their
# min-max bars, which often overlap in value, stay apart and each reads as its own series'.
DODGE = {("fp32", "compile-ro"): 0.955, ("fp32", "eager"): 0.985, ("tf32", "compile-ro"): 1.015,
         ("tf32", "eager"): 1.045}


@table_view
def sweep_with_claims(rows: Iterable[dict], precision: str = "fp32", mode: str = "compile-ro") -> list[dict[str, Any]]:
    """:func:`sweep_table` with the post's Figure 5 claim as a last line."""
    return sweep_table.rows(rows, precision, mode) + post_sweep_claims.rows()


def has_cold_process_rows(table: pd.DataFrame) -> bool:
    """Whether a :func:`compile_time_table` holds rows of the cold-process suite (not only the claim)."""
    return any(r["source"].startswith("compile_time") for r in records(table))


def sweep_figures(rows: list[dict], device: str | None, tokens: int = TOKENS) -> list[tuple[str, go.Figure]]:
    """(name, figure): the speed-up of FastTransformer over GPT-2 against T, and each model's throughput,
    per precision (colour) and mode (line), beside the post's claim; the throughput beside the T4 roofline
    projection of each model. The projection's ratio of floors is no bound on a measured ratio (real steps sit
    above their floors by different amounts), so the speed-up figure leaves it to the table."""
    proj, claims = t4_projection.rows(), post_sweep_claims.rows()
    speed = go.Figure()
    tput = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                         subplot_titles=[MODEL_NAMES[m] for m in MODELS])
    for prec in ("fp32", "tf32"):
        for mode in ("compile-ro", "eager"):
            pts = sweep_table.rows(rows, prec, mode)
            if pts:
                style = dict(color=PREC_COLOR[prec], dash=MODE_DASH[mode])
                bars = dict(type="data", symmetric=False, thickness=1, width=3,
                            array=[_gap(p["speed-up max"], p["speed-up"]) for p in pts],
                            arrayminus=[_gap(p["speed-up"], p["speed-up min"]) for p in pts])
                speed.add_trace(go.Scatter(x=[p["T"] * DODGE[prec, mode] for p in pts], y=[p["speed-up"] for p in pts],
                                           error_y=bars, mode="lines+markers", line=style,
                                           name=f"{prec} {MODE_WORDS[mode]}",
                                           customdata=[p["T"] for p in pts],
                                           hovertemplate="T %{customdata}: %{y:.2f}×<extra>%{fullData.name}</extra>"))
                for i, m in enumerate(MODELS, start=1):
                    tput.add_trace(go.Scatter(x=[p["T"] for p in pts], y=[p[f"{m} tokens/s"] for p in pts],
                                              mode="lines+markers", name=f"{prec} {MODE_WORDS[mode]}", line=style,
                                              legendgroup=f"{prec} {mode}", showlegend=i == 1), row=1, col=i)
    speed.add_trace(go.Scatter(x=[c["T"] for c in claims], y=[c["speed-up"] for c in claims], name=SHORT_CLAIM,
                               mode="markers", marker=dict(symbol="star", size=14, color="#333")))
    speed.add_hline(y=1, line=dict(color="#999", width=1))
    where = gpu_label(device)
    ts = [p["T"] for p in proj]
    with_subtitle(speed, f"FastTransformer speed-up over GPT-2 vs T, {tokens:,} tokens/step, {where}",
                  "the four series of one T drawn a little apart, so that their bars do not overlap")
    speed.update_layout(xaxis=dict(title=f"T (B = {tokens} / T)", **log_ticks(ts)),
                        yaxis_title="speed-up (GPT-2 step / FastTransformer's):<br>median over runs, "
                                    "bars: slowest and fastest run", height=460)
    for i, m in enumerate(MODELS, start=1):
        tput.add_trace(go.Scatter(x=[p["T"] for p in proj], y=[p[f"{m} floor tokens/s"] for p in proj],
                                  name=SHORT_PROJECTION, mode="lines", line=dict(dash="dot", color="#7f7f7f"),
                                  legendgroup="projection", showlegend=i == 1), row=1, col=i)
    tput.add_trace(go.Scatter(x=[c["T"] for c in claims], y=[c["fasttransformer tokens/s"] for c in claims],
                              name=SHORT_CLAIM, mode="markers", marker=dict(symbol="star", size=14, color="#333")),
                   row=1, col=2)
    tput.update_xaxes(title_text=f"T (B = {tokens} / T)", **log_ticks(ts))
    tput.update_layout(title=f"Training throughput vs T (the post's Figure 5), medians over runs, {where}",
                       yaxis_title="tokens / s", height=480)
    return [(f"fig5-speedup-{device}", legend_below(speed)), (f"fig5-throughput-{device}", legend_below(tput))]


def _gap(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def slower_at(rows: list[dict], device: str | None) -> list[str]:
    """One sentence per precision and mode: the T at which FastTransformer steps slower than GPT-2 in every
    run, and those where the runs disagree or are too few for a verdict."""
    lines = []
    for prec in ("fp32", "tf32"):
        for mode in ("compile-ro", "eager"):
            pts = [p for p in sweep_table.rows(rows, prec, mode) if p["speed-up"] is not None]
            if not pts:
                continue
            slower = [p["T"] for p in pts if p["verdict"] == "slower"]
            split = [p["T"] for p in pts if p["verdict"].startswith("no verdict")]
            few = [p["T"] for p in pts if p["verdict"].startswith("too few")]
            text = (f"{gpu_label(device)}, {prec}, {mode}: FastTransformer steps slower than GPT-2 in every run at T = "
                    f"{and_list(slower)}" if slower else
                    f"{gpu_label(device)}, {prec}, {mode}: at no T is FastTransformer slower than GPT-2 in every run")
            if split:
                text += f"; the runs disagree at T = {and_list(split)}"
            if few:
                text += f"; too few runs for a verdict at T = {and_list(few)}"
            lines.append(text + ".")
    return lines
