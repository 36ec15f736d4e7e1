"""Chapter 4 in words: how many runs stand behind the grid, how far eager steps scatter between runs,
and what each co-design change buys in the modes whose step replays a graph.

Every number comes from the tables of :mod:`ftlib.views.codesign` (stored rows of one device).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ftlib.model.ablations import SWITCHES
from ftlib.views.baselines import MIN_MACHINES, MIN_RUNS, TIE_BAND, range_text, runs_on_starts
from ftlib.views.bench import MODEL_NAMES
from ftlib.views.codesign import col
from ftlib.views.tables import records

# Columns whose step is one graph replay (the manual CUDA graph, compile with reduce-overhead), and
# those that launch every kernel from Python.
GRAPH_MODES = ("cudagraph fp32", "cudagraph tf32", "compile-ro fp32")
HOST_MODES = ("eager fp32", "eager tf32")
SWITCH_NAMES = {"MQA": "multi-query attention", "SDPA": "fused SDPA", "MLP2x": "the 2× MLP", "RMS": "RMSNorm"}


def _pct(ratio: float) -> str:
    return f"{100 * (ratio - 1):.0f}%"


def _runs_text(runs: list[dict[str, Any]]) -> str:
    """'1 run on 1 machine start' when every measured column agrees, else one count per column."""
    counts = {(r["runs"], r["machine starts"]) for r in runs}
    if len(counts) == 1:
        return runs_on_starts(*counts.pop())
    return "; ".join(f"{r['column']}: {runs_on_starts(r['runs'], r['machine starts'])}" for r in runs)


def _scatter(scatter: list[dict[str, Any]], modes: tuple[str, ...]) -> dict[str, Any] | None:
    """The line of ``run_scatter`` in ``modes`` whose runs lie furthest apart."""
    mine = [r for r in scatter if r["mode"] in modes]
    return max(mine, key=lambda r: r["slowest / fastest"]) if mine else None


def _effects(effects: list[dict[str, Any]], modes: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """switch -> {mode: speed-up} over ``modes``, measured values only."""
    by_mode = {r["mode"]: r for r in effects}
    return {sw: {m: by_mode[m][f"{sw} speed-up"] for m in modes
                 if m in by_mode and by_mode[m].get(f"{sw} speed-up") is not None} for sw in SWITCHES}


def effects_note(effects: pd.DataFrame, runs: pd.DataFrame, scatter: pd.DataFrame) -> str:
    """Markdown under the switch-effects table: the runs behind it and, where the eager columns hold
    fewer runs than a verdict needs, how their effects compare with the run-to-run scatter of eager steps."""
    runs_l = [r for r in records(runs) if r["runs"]]
    if not runs_l:
        return "No column of the grid is measured yet."
    text = f"The grid's times come from {_runs_text(runs_l)} (the table of runs above)."
    eager_runs = [r["runs"] for r in runs_l if r["column"] in HOST_MODES]
    worst, steady = _scatter(records(scatter), HOST_MODES), _scatter(records(scatter), GRAPH_MODES)
    if not eager_runs or max(eager_runs) >= MIN_RUNS or worst is None:
        return text
    # The largest eager effect as a factor either way (0.8x and 1.25x both 1.25).
    largest = max((max(v, 1 / v) for by in _effects(records(effects), HOST_MODES).values() for v in by.values()),
                  default=None)
    text += (f" The eager columns' effects are therefore single-run numbers, and eager steps scatter between "
             f"runs: {MODEL_NAMES[worst['model']]}'s {worst['mode']} step took {worst['fastest run ms']:.1f} to "
             f"{worst['slowest run ms']:.1f} ms over the baselines suite's "
             f"{runs_on_starts(worst['runs'], worst['machine starts'])}, {_pct(worst['slowest / fastest'])} apart")
    if largest is not None:
        text += (f"; the largest eager effect in the table, {_pct(largest)}, lies "
                 + ("within" if largest <= worst["slowest / fastest"] else "beyond") + " that scatter")
    if steady is not None:
        text += (f". The same runs put the graph-replayed steps at most {100 * (steady['slowest / fastest'] - 1):.1f}%"
                 " apart, so this chapter reads the switches from those columns (cudagraph, compile-ro)")
    return text + "."


def _values(by_mode: dict[str, float]) -> str:
    """'1.08× in cudagraph fp32, 1.02× in cudagraph tf32 (within 2%: no change)', slower ones marked."""
    def note(v: float) -> str:
        return f" (within {TIE_BAND:.0%}: no change)" if abs(v - 1) <= TIE_BAND else " (slower)" if v < 1 else ""
    return ", ".join(f"{v:.2f}× in {m}{note(v)}" for m, v in by_mode.items())


def _rms_line(by_mode: dict[str, float]) -> str:
    """RMSNorm against the introduction's expectation (one reduction fewer, so a faster step)."""
    if any(v > 1 + TIE_BAND for v in by_mode.values()):
        return f"- **RMSNorm**, one reduction instead of two: speed-up {_values(by_mode)}."
    return ("- **RMSNorm** computes one reduction instead of two, as the introduction lists it, yet makes no "
            f"graph-replayed step faster: {_values(by_mode)}.")


def _range(r: dict[str, Any]) -> str:
    c = "cost of the layout"
    return range_text(r[c], r[f"{c}, lowest run"], r[f"{c}, highest run"])


def chapter4_findings(effects: pd.DataFrame, runs: pd.DataFrame, ladder_runs: pd.DataFrame,
                      scatter: pd.DataFrame, steps: pd.DataFrame, cost: pd.DataFrame) -> str:
    """Markdown for 'What we found': the runs, each change in the graph-replayed modes, RMSNorm against
    the expectation, the ladder end to end and the cost of the original K/V layout."""
    runs_l = [r for r in records(runs) if r["runs"]]
    if not runs_l:
        return "Nothing of this chapter is measured on this device yet."
    lad_l = [r for r in records(ladder_runs) if r["runs"]]
    n = max(r["runs"] for r in runs_l + lad_l)
    m = max(r["machine starts"] for r in runs_l + lad_l)
    enough = n >= MIN_RUNS and m >= MIN_MACHINES
    lines = [f"- **Runs.** The grid is {_runs_text(runs_l)}"
             + (f", the ladder {_runs_text(lad_l)}" if lad_l else "")
             + ("." if enough else f": fewer than a verdict needs ({MIN_RUNS} runs on {MIN_MACHINES} machine "
                                   "starts), so the effects and the ladder below describe what was measured, "
                                   "not a verdict; the K/V layout's cost is over runs.")]
    by_sw = _effects(records(effects), GRAPH_MODES)
    for sw in SWITCHES:
        if sw != "RMS" and by_sw[sw]:
            name = SWITCH_NAMES[sw]
            lines.append(f"- **{name[0].upper()}{name[1:]}**: speed-up {_values(by_sw[sw])}.")
    if by_sw["RMS"]:
        lines.append(_rms_line(by_sw["RMS"]))
    best = [(mode, max((by_sw[sw][mode], sw) for sw in SWITCHES if mode in by_sw[sw]))
            for mode in GRAPH_MODES if any(mode in by_sw[sw] for sw in SWITCHES)]
    if best:
        said = "; ".join(f"{mode}, {SWITCH_NAMES[sw]} ({v:.2f}×)" for mode, (v, sw) in best)
        lines.append(f"- **The largest single change** per graph-replayed mode: {said}.")
    rungs = records(steps)
    if len(rungs) > 1:
        pairs = [(c, rungs[0].get(col(*c.split())), rungs[-1].get(col(*c.split()))) for c in GRAPH_MODES]
        ends = [f"{a / b:.2f}× as fast in {c} ({a:.2f} → {b:.2f} ms)" for c, a, b in pairs if a and b]
        if ends:
            lines.append(f"- **The ladder**, GPT-2 to the FastTransformer with every change: the step is "
                         f"{'; '.join(ends)}.")
    cost_l = [r for r in records(cost) if r["cost of the layout"] is not None]
    if cost_l:
        same = len({r["runs"] for r in cost_l}) == 1
        said = [f"{r['mode']} {_range(r)}" + ("" if same else f", {r['runs']}") + f", {r['verdict']}"
                for r in cost_l]
        lines.append("- **The original K/V layout**, (B, 1, T, d) handed to SDPA, takes this many times the expanded "
                     "view's step, each ratio within one run of the baselines suite"
                     + (f", over {cost_l[0]['runs']}" if same else "") + f": {'; '.join(said)}.")
    return "\n".join(lines)
