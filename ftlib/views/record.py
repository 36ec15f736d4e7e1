"""How close the speedrun came to its record goals, and what stopped it (chapter 8).

Two questions the leaderboard (``ftlib.views.leaderboard``) does not answer on its own. Where a
candidate reached a target on every seed: how far its time is from the goal, split into its steps
and its time per step, since either can close the gap. Where none did: which candidate came
closest, by the best validation loss each seed reached at any evaluation, and whether the loss
was still falling at that point or had turned up again (a run that turns up is overfitting the
training split: more steps would not help it). And the same-call trial of the grouped Muon update
against the per-matrix one it computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from scipy import stats

from ftlib.harness.studies import GOAL_SEEDS, RECORD_GOALS_S, REFERENCE, SIGNIFICANCE, TARGET_LOSS
from ftlib.views.bench import gpu_label
from ftlib.views.candidates import id_of, short_ids
from ftlib.views.leaderboard import on_device, one_run_per_seed, standings, stop_of
from ftlib.views.tables import table_view


def _best_of(row: dict[str, Any]) -> dict[str, Any] | None:
    """A run's lowest sampled validation loss, where it happened, and how far the loss rose after it."""
    hist = [h for h in row.get("history") or [] if h.get("val_loss") is not None]
    if row.get("status", "ok") != "ok" or not hist:
        return None
    best = min(hist, key=lambda h: h["val_loss"])
    return {"best loss": best["val_loss"], "best step": best["step"], "tokens at best": best["tokens"],
            "rise after best": hist[-1]["val_loss"] - best["val_loss"]}


@table_view
def closest(rows: list[dict[str, Any]], device: str, target: float) -> list[dict[str, Any]]:
    """Per candidate among the runs aimed at ``target`` on ``device``: its seeds, how many reached the
    target, the mean (and min) of the seeds' best sampled validation losses, the mean step and tokens
    at the best, and the mean rise of the loss from its best to the run's last evaluation (0 where a
    run stopped at its best, as runs that reach the target do). Lowest mean best loss first."""
    out = []
    for r in one_run_per_seed(on_device(rows, device), target):
        b = _best_of(r)
        if b is not None:
            out.append({"candidate": r["model"], "seed": r.get("seed"), "reached": b["best loss"] <= target, **b})
    if not out:
        return []
    g = pd.DataFrame(out).groupby("candidate", sort=False)
    board = pd.DataFrame({
        "seeds": g.size(), "reached": g["reached"].sum(), "best loss (mean)": g["best loss"].mean(),
        "best loss (min)": g["best loss"].min(), "best step (mean)": g["best step"].mean(),
        "tokens at best (mean)": g["tokens at best"].mean(), "rise after best (mean)": g["rise after best"].mean(),
    }).sort_values("best loss (mean)").reset_index()
    board.insert(0, "target", target)
    board.insert(0, "device", device)
    return board.to_dict("records")


def unclaimed(rows: list[dict[str, Any]], device: str, target: float, ids: Mapping[str, str] | None = None) -> str:
    """One sentence for a target no candidate has a claimed time to, in place of a board of unranked lines: how
    many candidates ran it and over how many seeds, the most seeds any reached it on, and the lowest mean best
    validation loss (:func:`closest`), by short id."""
    ids = short_ids(rows) if ids is None else ids
    board = closest.rows(rows, device, target)
    if not board:
        return f"{gpu_label(device)}, target {target:.4f}: no run aimed at it."
    n = sorted({int(x["seeds"]) for x in board})
    most = max(board, key=lambda x: (x["reached"], -x["seeds"]))
    low = board[0]
    return (f"{gpu_label(device)}, target {target:.4f}: {len(board)} candidates ran, "
            + (f"{n[0]} seeds each" if len(n) == 1 else f"{n[0]} to {n[-1]} seeds each")
            + ", and none has a claimed time. "
            + (f"The most seeds at the target: {id_of(ids, most['candidate'])}, {int(most['reached'])} of "
               f"{int(most['seeds'])}. " if most["reached"] else "No seed reached it. ")
            + f"The lowest best loss, on average over the seeds: {id_of(ids, low['candidate'])}, "
            f"{low['best loss (mean)']:.4f} over {int(low['seeds'])} seed{'s' if low['seeds'] != 1 else ''}"
            + (f" (lowest {low['best loss (min)']:.4f})." if low["seeds"] > 1 else "."))


def _met(x: dict[str, Any], goal: float) -> str:
    """Where a ranked candidate stands against a time goal, split into steps and time per step."""
    t, steps = x["time to target s (mean)"], x["steps to target (mean)"]
    ms = 1e3 * t / steps
    if t <= goal:
        return f"goal {goal:g} s met: {t:.2f} s ({steps:.0f} steps at {ms:.2f} ms)"
    return (f"goal {goal:g} s missed by {t / goal:.2f}x: {t:.2f} s is {steps:.0f} steps at {ms:.2f} ms per step; "
            f"at that step count the goal needs {1e3 * goal / steps:.2f} ms per step, at that step time "
            f"{goal / ms * 1e3:.0f} steps")


def _claimed(rows: list[dict[str, Any]], device: str, target: float) -> list[dict[str, Any]]:
    """The candidates other than the reference with a claimed time to ``target``, fastest first."""
    return [x for x in standings(rows, device, (target,)) if x["rank"] is not None and x["candidate"] != REFERENCE]


@table_view
def goal_verdicts(rows: list[dict[str, Any]], device: str, goals: Mapping[float, float] = RECORD_GOALS_S,
                  ids: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One verdict per record goal on ``device``: a goal is met by a claimed time (every seed at the target,
    p below the significance level) over at least ``GOAL_SEEDS`` seeds at or under the goal's seconds. The
    line names the candidate that meets it, else the fastest claimed one and what it misses."""
    ids = short_ids(rows) if ids is None else ids
    mine = on_device(rows, device)
    out = []
    for target, goal in goals.items():
        claimed = _claimed(mine, device, target)
        met = [x for x in claimed if x["seeds"] >= GOAL_SEEDS and x["time to target s (mean)"] <= goal]
        x = (met or claimed or [None])[0]
        if met:
            why = "met"
        elif x is None:
            why = "not met: no candidate has a claimed time"
        elif x["time to target s (mean)"] > goal:
            why = f"not met: {x['time to target s (mean)']:.2f} s, {x['time to target s (mean)'] / goal:.2f}x the goal"
        else:
            why = f"not met: {x['seeds']} seeds, the goal needs {GOAL_SEEDS}"
        out.append({"device": device, "target": f"{target:.4f}", "goal s": goal, "seeds needed": GOAL_SEEDS,
                    "fastest claimed": id_of(ids, x["candidate"]) if x else None,
                    "seeds reached": x["seeds reached"] if x else None,
                    "time s (mean)": x["time to target s (mean)"] if x else None, "verdict": why})
    return out


def limits(rows: list[dict[str, Any]], device: str, goals: Mapping[float, float] = RECORD_GOALS_S,
           train_tokens: int | None = None, ids: Mapping[str, str] | None = None) -> str:
    """Per target, the record goal against the closest result on ``device`` (module docstring), each
    candidate by its short id (``ids``, :func:`ftlib.views.candidates.short_ids` of ``rows`` by default).
    ``train_tokens``, the training split's length, turns tokens at the best loss into epochs."""
    ids = short_ids(rows) if ids is None else ids
    mine = on_device(rows, device)
    lines = []
    for target, goal in goals.items():
        claimed = _claimed(mine, device, target)
        head = f"{gpu_label(device)}, {target:.4f} in at most {goal:g} s"
        if claimed:
            x = claimed[0]
            lines.append(f"{head}: fastest claimed time, {id_of(ids, x['candidate'])} over {x['seeds reached']} "
                         f"seeds, {_met(x, goal)}.")
            continue
        near = closest.rows(mine, device, target)
        cands = [x for x in near if x["candidate"] != REFERENCE]
        if not cands:
            lines.append(f"{head}: no run aimed at it.")
            continue
        c = cands[0]
        epochs = (f", {c['tokens at best (mean)'] / train_tokens:.1f} epochs of the training split"
                  if train_tokens else "")
        line = (f"{head}: no candidate has a claimed time. Of the candidates, the closest by the best validation "
                f"loss: {id_of(ids, c['candidate'])}, {c['best loss (mean)']:.4f} on average over "
                f"{c['seeds']} seeds (lowest {c['best loss (min)']:.4f}; {c['reached']} of {c['seeds']} reached "
                f"{target:.4f}), at step {c['best step (mean)']:.0f} on average{epochs}; by its last evaluation the "
                f"loss had risen {c['rise after best (mean)']:.4f} above that best.")
        ref = next((x for x in near if x["candidate"] == REFERENCE), None)
        if ref is not None:
            closer = ref["best loss (mean)"] < c["best loss (mean)"]
            line += (f" nanoGPT's own recipe{' came closer: it' if closer else ''} reached {target:.4f} on "
                     f"{ref['reached']} of {ref['seeds']} seeds "
                     f"(best loss {ref['best loss (mean)']:.4f} on average, lowest {ref['best loss (min)']:.4f}).")
        lines.append(line)
    return "\n".join(lines)


def muon_trial(rows: list[dict[str, Any]], device: str) -> tuple[pd.DataFrame, str]:
    """The same-call trial of the grouped Muon update against the per-matrix one (suite
    ``speedrun-muon-trial``) on ``device``: per variant, seeds, seeds that reached 1.50, mean time to it and
    time per step, and the mean best validation loss; then a sentence with Welch's t-test (scipy) on the
    seeds' best losses, which the two executions of one update should leave equal."""
    out = []
    for r in on_device(rows, device):
        b, s = _best_of(r), stop_of(r, TARGET_LOSS)
        if b is None or s is None:
            continue
        steps = r["history"][-1]["step"]
        out.append({"variant": "grouped" if "grouped Muon" in r["model"] else "per matrix", "seed": r.get("seed"),
                    "reached": s["reached"], "time to 1.50 s": s["time_s"], "best loss": b["best loss"],
                    # the steps after the first: the startup (compilation, capture) is not a step's time
                    "ms per step": 1e3 * (r["train_time_s"] - r.get("startup_s", 0.0)) / steps if steps else None})
    if not out:
        return pd.DataFrame(), (f"{gpu_label(device)}: the Muon trial has no rows "
                                "(python ci/gpu_train.py --suites speedrun-muon-trial).")
    df = pd.DataFrame(out)
    g = df.groupby("variant")
    tab = pd.DataFrame({"seeds": g.size(), "reached 1.50": g["reached"].sum(),
                        "time to 1.50 s (mean)": g["time to 1.50 s"].mean(),
                        "ms per step (mean)": g["ms per step"].mean(),
                        "best loss (mean)": g["best loss"].mean(), "best loss (min)": g["best loss"].min(),
                        "best loss (max)": g["best loss"].max()}).reset_index()
    losses = {v: d["best loss"].to_numpy() for v, d in g}
    if set(losses) != {"grouped", "per matrix"} or min(len(x) for x in losses.values()) < 2:
        return tab, f"{gpu_label(device)}: the Muon trial needs both variants with at least two seeds each."
    t = stats.ttest_ind(losses["grouped"], losses["per matrix"], equal_var=False)
    diff = losses["grouped"].mean() - losses["per matrix"].mean()
    return tab, (f"{gpu_label(device)}: grouped minus per-matrix mean best loss {diff:+.4f} over "
                 f"{len(losses['grouped'])} and {len(losses['per matrix'])} seeds (Welch's t-test p = {t.pvalue:.2g}: "
                 + ("a difference beyond the seeds)." if t.pvalue < SIGNIFICANCE else "within the seeds' spread)."))
