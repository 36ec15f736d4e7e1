"""Chapter 5's closing section in plain words: the gain per precision, along the sequence, the eager
inversion and the compile time, every number computed from the stored runs.

Each number is a median over runs with the slowest and fastest run (``range_text``), beside the runs
and machine starts behind it; a verdict is spoken only where the baselines' rule allows one
(:func:`ftlib.views.baselines.verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ftlib.analysis.claims import POST_CLAIMED
from ftlib.views.baseline_report import NO_RUNS, eager_inversion
from ftlib.views.baselines import (
    MIN_MACHINES,
    MIN_RUNS,
    POST_CONFIG,
    config_name,
    lookup_row,
    model_speedups,
    range_text,
    runs_on_starts,
    spread,
)
from ftlib.views.bench import gpu_label
from ftlib.views.per_run import and_list
from ftlib.views.sweep import TOKENS, sweep_table
from ftlib.views.tables import records

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
STRONGEST = "strongest baseline of each"


def _said(verdict: str) -> str:
    """A verdict as the end of a sentence about FastTransformer against GPT-2."""
    if verdict == "faster":
        return "faster in every run"
    if verdict == "slower":
        return "slower in every run"
    if verdict == "ties":
        return "a tie in every run"
    if verdict.startswith("no verdict"):
        return "the runs disagree, so no verdict"
    return f"too few runs for a verdict ({MIN_RUNS} runs on {MIN_MACHINES} machine starts needed)"


def precision_gain(runs: pd.DataFrame, device: str) -> list[dict[str, Any]]:
    """Per precision (fp32, tf32, bf16, fp16): FastTransformer over GPT-2 with each model at its fastest
    compiled configuration of the run, B = 32, T = 256, over runs (median, min, max, runs, verdict)."""
    per_run = model_speedups(runs[runs["device_slug"] == device])
    per_run = per_run[per_run["config"] == STRONGEST]
    tab = spread(per_run, ["precision"])
    order = {p: i for i, p in enumerate(PRECISIONS)}
    return sorted(records(tab), key=lambda r: order.get(r["precision"], len(order)))


def _precision_lines(gain: list[dict[str, Any]]) -> list[str]:
    lines = [f"{g['precision']}: {range_text(g['median'], g['min'], g['max'])}; "
             f"{runs_on_starts(g['runs'], g['machines'])}; {_said(g['verdict'])}." for g in gain]
    top, low = max(gain, key=lambda g: g["median"]), min(gain, key=lambda g: g["median"])
    if top is not low:
        lines.append(f"The gain is largest in {top['precision']} ({top['median']:.2f}×) and smallest in "
                     f"{low['precision']} ({low['median']:.2f}×).")
    return lines


def _sweep_lines(rows: list[dict]) -> list[str]:
    out = []
    for prec in ("fp32", "tf32"):
        pts = [p for p in sweep_table.rows(rows, prec, "compile-ro") if p["speed-up"] is not None]
        if len(pts) < 2:
            continue
        a, b = pts[0], pts[-1]
        trend = "shrinks" if b["speed-up"] < a["speed-up"] else "grows"
        text = (f"In {prec}, reduce-overhead, at {TOKENS:,} tokens per step, the gain {trend} from "
                f"{range_text(a['speed-up'], a['speed-up min'], a['speed-up max'])} at T = {a['T']} to "
                f"{range_text(b['speed-up'], b['speed-up min'], b['speed-up max'])} at T = {b['T']} "
                f"({runs_on_starts(a['runs'], a['machine starts'])})")
        slower = [p["T"] for p in pts if p["verdict"] == "slower"]
        if slower:
            text += f"; FastTransformer steps slower than GPT-2 in every run at T = {and_list(slower)}"
        if prec == "fp32" and a["T"] == 128:
            text += f". The post claims {POST_CLAIMED['speedup_T128']}× at T = 128 on its T4"
        out.append(text + ".")
    return out


def _headline_inversion(runs: pd.DataFrame, device: str) -> list[str]:
    """The eager inversion at B = 32, T = 256 in fp32, GPT-2 compiled as the post compiled it."""
    inv = eager_inversion(runs[runs["device_slug"] == device])
    row = None if inv.empty else lookup_row(inv, precision="fp32", **{"GPT-2 compiled as": config_name(*POST_CONFIG)})
    if row is None:
        return []
    n = runs[(runs["device_slug"] == device) & (runs["precision"] == "fp32")]
    return [f"The eager inversion at B = 32, T = 256, fp32: FastTransformer run eagerly takes "
            f"{row['FastTransformer eager ms']:.2f} ms per step, GPT-2 compiled as the post compiled it "
            f"{row['GPT-2 compiled ms']:.2f} ms (medians; GPT-2's over FastTransformer's "
            f"{row['GPT-2 compiled / FastTransformer eager (median, min–max)']}, "
            f"{runs_on_starts(n['run_id'].nunique(), n['machine_id'].nunique())}): the inversion "
            f"{row['inversion']}."]


def _inversion_lines(table: pd.DataFrame) -> list[str]:
    rows = [r for r in records(table) if r["source"].startswith("tsweep")]
    out = []
    for prec in ("fp32", "tf32", "bf16"):
        mine = [r for r in rows if r["precision"] == prec]
        if not mine:
            continue
        holds = [r["T"] for r in mine if r["verdict"] == "holds"]
        fails = [r["T"] for r in mine if r["verdict"] == "does not hold"]
        other = [r["T"] for r in mine if r["T"] not in holds + fails]
        parts = [f"holds at T = {and_list(holds)}" if holds else "holds at no T",
                 f"does not hold at T = {and_list(fails)}" if fails else "",
                 f"has no verdict at T = {and_list(other)}" if other else ""]
        out.append(f"Along the sequence sweep in {prec}, FastTransformer run eagerly against GPT-2 compiled "
                   f"(reduce-overhead): the inversion {', '.join(p for p in parts if p)}.")
    return out


def _compile_line(table: pd.DataFrame) -> str | None:
    row = next((r for r in records(table) if r["source"].startswith("compile_time") and r["mode"] == "compile-ro"),
               None)
    if row is None:
        return None
    cs = POST_CLAIMED["compile_s"]
    return (f"The first step under reduce-overhead, compilation included, takes {row['gpt2 first step s']:.1f} s for "
            f"GPT-2 and {row['fasttransformer first step s']:.1f} s for FastTransformer (medians over runs): "
            f"GPT-2's is {row['gpt2 / FT (median, min–max)']} as long ({row['runs']}), where the post "
            f"claims {cs['gpt2'] / cs['fasttransformer']:.1f}× ({cs['gpt2']} s against {cs['fasttransformer']} s).")


def what_we_found(runs: pd.DataFrame, sweeps: Mapping[str, list[dict]] | None = None,
                  inversions: Mapping[str, pd.DataFrame] | None = None,
                  compile_times: Mapping[str, pd.DataFrame] | None = None) -> str:
    """Chapter 5's closing section (Markdown), per device: FastTransformer over GPT-2 per precision at each
    model's strongest compiled configuration and where the gain shrinks; the gain along the sequence
    sweep; the eager inversion along it; the compile time. ``sweeps``, ``inversions`` and
    ``compile_times`` map a device to its T-sweep rows, :func:`~ftlib.views.sweep.eager_inversion_table`
    and :func:`~ftlib.views.sweep.compile_time_table`."""
    sweeps, inversions, compile_times = sweeps or {}, inversions or {}, compile_times or {}
    devs = sorted(set(runs["device_slug"]) if not runs.empty else set()) or sorted(sweeps)
    if not devs:
        return NO_RUNS
    parts = []
    for dev in devs:
        lines = [f"**{gpu_label(dev)}.** FastTransformer over GPT-2 at B = 32, T = 256, each model at its fastest "
                 "compiled configuration of the run (GPT-2's step time over FastTransformer's, the median "
                 "over runs with the slowest and fastest run):", ""]
        gain = precision_gain(runs, dev) if not runs.empty else []
        lines += [f"- {s}" for s in _precision_lines(gain)] if gain else [f"- {NO_RUNS}"]
        rest = _sweep_lines(sweeps.get(dev, [])) + (_headline_inversion(runs, dev) if not runs.empty else [])
        if dev in inversions:
            rest += _inversion_lines(inversions[dev])
        if dev in compile_times:
            rest += [s for s in [_compile_line(compile_times[dev])] if s]
        parts.append("\n".join(lines) + "".join(f"\n\n{s}" for s in rest))
    return "\n\n".join(parts)
