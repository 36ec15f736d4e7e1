"""The engine's goals (chapter 6): for each model and precision, a step time and a speed-up over the strongest
compiled step of the same run, set before the engine was measured, against what the current engine's runs
reached; where a goal is missed, what the step's profile says takes the time.

A goal's verdict follows the book's rule for any ratio (:func:`ftlib.views.baselines.verdict`): met only when
every run meets it, missed only when no run does, and neither without 3 runs on 2 machine starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ftlib.views import baselines as bv
from ftlib.views import ledger as ledgerview
from ftlib.views.bench import gpu_label
from ftlib.views.tables import table_view


@dataclass(frozen=True)
class EngineGoal:
    """A goal for the current engine on one model (``label``, as the baselines suite names it) and precision:
    a speed-up of at least ``min_speedup`` over the strongest compiled step of the same run and, where set,
    a step of at most ``max_ms``."""

    label: str
    precision: str
    min_speedup: float
    max_ms: float | None = None

    def __post_init__(self) -> None:
        if self.label not in bv.MODEL_NAMES:
            raise ValueError(f"EngineGoal: unknown model {self.label!r}; one of {sorted(bv.MODEL_NAMES)}")
        if self.precision not in ("fp32", "tf32", "bf16", "fp16"):
            raise ValueError(f"EngineGoal: unknown precision {self.precision!r}")
        if not self.min_speedup > 0:
            raise ValueError(f"EngineGoal: min_speedup must be positive, got {self.min_speedup}")
        if self.max_ms is not None and not self.max_ms > 0:
            raise ValueError(f"EngineGoal: max_ms must be positive or None, got {self.max_ms}")

    def text(self) -> str:
        """'≤ 1.0 ms and ≥ 1.5×' or '≥ 1.2×'."""
        speed = f"≥ {self.min_speedup:.1f}×"
        return speed if self.max_ms is None else f"≤ {self.max_ms:.1f} ms and {speed}"


# The goals, at the baselines suite's shape (B=32, T=256). FastTransformer in bf16: about twice the time its
# bytes take at DRAM bandwidth if each tensor moved once (chapter 2's accounting), where the compiled step
# sits several times above it; in tf32 its products run at half bf16's tensor-core rate, so the bound is
# looser. GPT-2 as written keeps its materialized T×T probabilities (the engine may fuse around them, not
# skip them), so its goal is a speed-up alone. Strict fp32 has none: the engine and the compiler run the
# same SIMT matrix products there (chapter 6's ceilings).
GOALS: tuple[EngineGoal, ...] = (
    EngineGoal("fasttransformer", "bf16", min_speedup=1.5, max_ms=1.0),
    EngineGoal("fasttransformer", "tf32", min_speedup=1.6, max_ms=1.5),
    EngineGoal("gpt2", "bf16", min_speedup=1.2),
    EngineGoal("gpt2", "tf32", min_speedup=1.2),
)

NOT_MEASURED = "not measured"


def _against(lo: float, hi: float, n_runs: int, n_machines: int, at_most: float | None = None,
             at_least: float | None = None) -> str:
    """'met', 'missed' or 'some runs meet it' over runs whose values lie in [lo, hi]; 'too few runs' without
    enough of them to give a verdict."""
    if not bv.enough_runs(n_runs, n_machines):
        return "too few runs"
    meets = (lambda v: v <= at_most) if at_most is not None else (lambda v: v >= at_least)
    if meets(lo) and meets(hi):
        return "met"
    if not meets(lo) and not meets(hi):
        return "missed"
    return "some runs meet it"


def _ms_range(median: float, lo: float, hi: float) -> str:
    """'1.395 ms (1.390–1.402 ms)' over runs; '1.395 ms' where they agree to the microsecond."""
    return f"{median:.3f} ms" if f"{lo:.3f}" == f"{hi:.3f}" else f"{median:.3f} ms ({lo:.3f}–{hi:.3f} ms)"


def _current_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: the current engine against the strongest baseline of that run (other engines left out)."""
    per_run = bv.speedups(runs)
    return per_run[per_run["engine_config"] == bv.TODAY]


def _judged(runs: pd.DataFrame, goals: Iterable[EngineGoal]) -> list[tuple[EngineGoal, int, dict[str, Any]]]:
    """Per device with runs of the current engine, and per goal: the goal, how many runs, and its line of
    :func:`goal_table` (a goal whose model and precision have no such run there is 'not measured')."""
    per_run, goals = _current_runs(runs), list(goals)  # the goals are read once per device
    out = []
    for dev in sorted(set(per_run["device_slug"])):
        for g in goals:
            sel = per_run[(per_run["device_slug"] == dev) & (per_run["label"] == g.label)
                          & (per_run["precision"] == g.precision)]
            if sel.empty:  # its runs (if any) measured an earlier engine
                out.append((g, 0, {"device": dev, "model": bv.MODEL_NAMES[g.label], "precision": g.precision,
                                   "goal": g.text(), "engine ms": "–", "speed-up": "–",
                                   "runs": "no run of the current engine",
                                   "step-time goal": "–" if g.max_ms is None else NOT_MEASURED,
                                   "speed-up goal": NOT_MEASURED, "closest run": "–"}))
                continue
            ms, x = sel["median_ms"], sel["speedup"]
            n, m = int(sel["run_id"].nunique()), int(sel["machine_id"].nunique())
            line = {"device": dev, "model": bv.MODEL_NAMES[g.label], "precision": g.precision, "goal": g.text(),
                    "engine ms": _ms_range(ms.median(), ms.min(), ms.max()),
                    "speed-up": bv.fmt_range(x.median(), x.min(), x.max()),
                    "runs": bv.runs_on_starts(n, m),
                    "step-time goal": "–" if g.max_ms is None else
                    _against(ms.min(), ms.max(), n, m, at_most=g.max_ms),
                    "speed-up goal": _against(x.min(), x.max(), n, m, at_least=g.min_speedup),
                    "closest run": f"{ms.min():.3f} ms; {x.max():.2f}×"}
            out.append((g, n, line))
    return out


@table_view
def goal_table(runs: pd.DataFrame, goals: Iterable[EngineGoal] = GOALS) -> list[dict[str, Any]]:
    """Per device and goal: the current engine's step (median over runs, fastest and slowest run), its speed-up
    over the strongest compiled step of each run (median, slowest and fastest run), the runs, a verdict on each
    half of the goal, and the closest single run (the fastest step, and the highest speed-up)."""
    return [line for _, _, line in _judged(runs, goals)]


def _limits(probe_rows: list[dict[str, Any]], device: str, goal: EngineGoal, top: int = 2) -> str:
    """Where the profiled default step of ``goal``'s model and precision spends the time above its floors."""
    case = next((r for r in ledgerview.figure_rows(probe_rows, device)
                 if r["label"] == goal.label and r["precision"] == goal.precision), None)
    if case is None:
        return " No profile of this step is stored, so what limits it is not measured yet."
    lines = [x for x in ledgerview.ledger.rows([case]) if x["above floor µs"]]
    far = sorted(lines, key=lambda x: -x["above floor µs"])[:top]
    total = ledgerview.ledger_totals.rows([case])[0]
    # A profile stored before the probe timed its replays back to back timed each one alone, the GPU waiting
    # for the host to launch it: that step runs above the runs' time, and the reader is told why.
    alone = ("" if case.get("step_timing") == "back to back" else
             ", timed one replay at a time with the GPU waiting for each launch, so above the runs' back-to-back "
             "time,")
    text = (f" Its profile (commit {str(case.get('commit', '?'))[:7]}) puts the captured step{alone} at "
            f"{total['captured step µs']:,.0f} µs against {total['sum of floors µs']:,.0f} µs of FLOP and byte "
            "floors; most of the time above them is in " +
            " and ".join(f"{x['class']} ({x['above floor µs']:,.0f} µs above)" for x in far))
    gaps = total["gaps µs (measured)"]
    return text + (f", and {gaps:,.0f} µs go between kernels." if gaps and gaps > 0 else ".")


def goal_state(line: dict[str, Any]) -> str:
    """A line of :func:`goal_table` as a whole: 'not measured' (no run of the current engine), 'met' (every half
    of the goal met), 'too few runs' (a half without a verdict), else 'not met'."""
    verdicts = [v for v in (line["step-time goal"], line["speed-up goal"]) if v != "–"]
    if NOT_MEASURED in verdicts:
        return NOT_MEASURED
    if all(v == "met" for v in verdicts):
        return "met"
    return "too few runs" if "too few runs" in verdicts else "not met"


def goal_findings(runs: pd.DataFrame, probe_rows: Iterable[dict[str, Any]], goals: Iterable[EngineGoal] = GOALS) -> str:
    """Markdown, one item per device and goal with rows: the goal, what the runs reached and the verdicts, and
    for a goal not met what the step's profile says takes the time (chapter 6's ledger)."""
    probes = list(probe_rows)
    items = []
    for g, n, line in _judged(runs, goals):
        state = goal_state(line)
        head = f"* **{line['model']} {line['precision']}, {gpu_label(line['device'])}** (goal {line['goal']}): "
        if state == NOT_MEASURED:
            items.append(head + "not measured yet; the runs of this model and precision measured an earlier engine.")
            continue
        text = (head + f"{line['engine ms']}, {line['speed-up']} the strongest compiled step, {line['runs']}: "
                f"{state}" + (f" (step time {line['step-time goal']}, speed-up {line['speed-up goal']})"
                              if state == "not met" and g.max_ms is not None else "")
                + (f"; the closest run reached {line['closest run']}." if n > 1 else "."))
        if state != "met":
            text += _limits(probes, line["device"], g)
        items.append(text)
    return "\n".join(items) if items else "No run has measured the current engine against its baselines yet."


def _states(judged: list[tuple[EngineGoal, int, dict[str, Any]]], device: str) -> str:
    """:func:`goal_states` of lines already judged (:func:`_judged`)."""
    states: dict[str, list[str]] = {}
    for g, _, line in judged:
        if line["device"] == device:
            state = goal_state(line)
            missed = [half for half, v in (("step time", line["step-time goal"]), ("speed-up", line["speed-up goal"]))
                      if v not in ("met", "–")]
            # A two-part goal not met names the half that missed (the other may be met).
            named = state == "not met" and len(missed) == 1 and g.max_ms is not None
            met = "speed-up" if missed and missed[0] == "step time" else "step time"
            which = f"; its {met} met, its {missed[0]} not" if named else ""
            label = {"too few runs": "too few runs to judge", NOT_MEASURED: "not measured at the current engine"}
            states.setdefault(label.get(state, state), []).append(
                f"{line['model']} {line['precision']} ({line['goal']}{which})")
    return "; ".join(f"{state}: {', '.join(names)}" for state, names in states.items())


def goal_states(runs: pd.DataFrame, device: str, goals: Iterable[EngineGoal] = GOALS) -> str:
    """'met: …; not met: …; too few runs to judge: …': ``device``'s goals by the state of their runs ('' without
    runs of the current engine)."""
    return _states(_judged(runs, goals), device)


def goal_summary(runs: pd.DataFrame, goals: Iterable[EngineGoal] = GOALS) -> str:
    """One sentence per device: which goals the current engine's runs meet, miss, or are too few to judge."""
    judged = _judged(runs, goals)
    devices = sorted({line["device"] for _, _, line in judged})
    return "\n\n".join(f"**The engine's goals, {gpu_label(dev)}:** {_states(judged, dev)}." for dev in devices)
