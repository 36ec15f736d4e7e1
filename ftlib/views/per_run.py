"""Stored benchmark rows read run by run: values paired within one run, then summarized over runs.

A run is one process on one machine (``run_id``); a machine start is ``machine_id``. A ratio divides
two rows of the same run, never rows of different runs, and a table shows its median over runs with
the slowest and fastest run. Rows that do not name their run cannot be paired and are left out.
The verdict rule is the baselines' (:func:`ftlib.views.baselines.verdict`): at least ``MIN_RUNS`` runs
on ``MIN_MACHINES`` machine starts, and every run on one side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from ftlib.views.baselines import enough_runs, fmt_range, runs_on_starts, verdict

PAIR_COLUMNS = ["run_id", "machine_id", "slow", "fast", "ratio"]


def run_values(rows: Iterable[dict[str, Any]], field: str, **match: Any) -> pd.DataFrame:
    """Per run: the median of ``field`` over the rows matching ``match``. Columns run_id, machine_id, value."""
    recs = [{"run_id": r["run_id"], "machine_id": r.get("machine_id") or "", "value": r[field]}
            for r in rows if r.get("run_id") and r.get(field) is not None
            and all(r.get(k) == v for k, v in match.items())]
    if not recs:
        return pd.DataFrame(columns=["run_id", "machine_id", "value"])
    return pd.DataFrame(recs).groupby(["run_id", "machine_id"], as_index=False)["value"].median()


def pair_runs(rows: Iterable[dict[str, Any]], field: str, slow: dict[str, Any], fast: dict[str, Any],
              **match: Any) -> pd.DataFrame:
    """Per run that measured both: ``field`` of the ``slow`` rows, of the ``fast`` rows, and slow / fast
    (above 1: the ``fast`` side is the faster). Columns run_id, machine_id, slow, fast, ratio."""
    rows = list(rows)
    a = run_values(rows, field, **match, **slow).rename(columns={"value": "slow"})
    b = run_values(rows, field, **match, **fast).rename(columns={"value": "fast"})
    both = a.merge(b, on=["run_id", "machine_id"])
    if both.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    return both.assign(ratio=both["slow"] / both["fast"])[PAIR_COLUMNS]


def summary(per_run: pd.DataFrame, value: str = "ratio") -> dict[str, Any] | None:
    """Median, min and max of ``value`` over runs, the runs and machine starts behind it, and the
    verdict ('faster', 'slower', 'ties', the runs disagree, or too few runs); None without runs."""
    if per_run.empty:
        return None
    v = per_run[value].astype(float)
    n, m = per_run["run_id"].nunique(), per_run["machine_id"].nunique()
    lo, hi = float(v.min()), float(v.max())
    return {"median": float(v.median()), "min": lo, "max": hi, "runs": n, "machines": m,
            "enough": enough_runs(n, m), "verdict": verdict(lo, hi, n, m),
            "range": fmt_range(float(v.median()), lo, hi), "runs text": runs_on_starts(n, m)}


def span_text(lo: float, hi: float, fmt: str) -> str:
    """'1.4–2.8' (``lo`` and ``hi`` in ``fmt``), or one value where both print the same."""
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}–{b}"


def and_list(items: Sequence[Any]) -> str:
    """'128', '128 and 256', '128, 256 and 512': a list as prose."""
    words = [str(x) for x in items]
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"
