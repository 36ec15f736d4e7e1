"""The speedrun's rows read back (chapter 8): the verdict, the pooled verdict over repeats, the
loss curves, and the tables of runs and repeats (the leaderboard: :mod:`ftlib.views.leaderboard`)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from ftlib.harness.convergence import steady_time_to_target
from ftlib.harness.studies import REFERENCE, TARGET_LOSS
from ftlib.views.bench import gpu_label, model_title
from ftlib.views.candidates import id_of, short_ids
from ftlib.views.convergence import ok_runs
from ftlib.views.tables import table_view


def ok_runs_to_150(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The finished runs aimed at the speedrun's target, 1.50: a run aimed at a lower loss (the
    record suite's) trains to another horizon, and its time to 1.50 is no speedrun time."""
    return [r for r in ok_runs(rows) if r.get("target", TARGET_LOSS) == TARGET_LOSS]


def speedrun_pooled(rows: list[dict[str, Any]], repeats: list[dict[str, Any]], candidate: str,
                    n_boot: int = 4000) -> dict[str, Any] | None:
    """The reference against ``candidate`` over every run: first runs and repeats pooled.

    Two runs of one seed differ on the GPU as much as two seeds do, so each run is one sample
    of the time to 1.50 (excluding startup). The speed-up is the ratio of the pooled means; its
    90% interval is a percentile bootstrap (runs resampled within each side, fixed generator so
    the book prints the same interval every time). The reference (``torch.compile``'s default
    mode, a kernel launch per op) depends on the host's CPU, the captured engine hardly: a
    floor against the reference's fastest run is returned too. ``None`` without timed runs on
    both sides.
    """
    pool = ok_runs_to_150(rows) + ok_runs_to_150(repeats)
    ref = [t for r in pool if r["model"] == REFERENCE if (t := steady_time_to_target(r)) is not None]
    cand = [r for r in pool if r["model"] == candidate]
    times = [t for r in cand if (t := steady_time_to_target(r)) is not None]
    if not ref or not times:
        return None
    x = (sum(ref) / len(ref)) / (sum(times) / len(times))
    rng = random.Random(0)
    boot = sorted((sum(a) / len(a)) / (sum(b) / len(b)) for a, b in
                  ((rng.choices(ref, k=len(ref)), rng.choices(times, k=len(times))) for _ in range(n_boot)))
    lo, hi = boot[int(0.05 * n_boot)], boot[int(0.95 * n_boot) - 1]
    return {"candidate": candidate,
            "reference runs": len(ref), "candidate runs": len(cand), "reached": f"{len(times)}/{len(cand)}",
            "reference s (mean)": sum(ref) / len(ref), "candidate s (mean)": sum(times) / len(times),
            "candidate s (min)": min(times), "candidate s (max)": max(times),
            "speed-up excl. startup (pooled)": x, "90% interval": (lo, hi),
            # A floor: the reference's single fastest run against the candidate's mean.
            "speed-up vs fastest reference run": min(ref) / (sum(times) / len(times))}


def speedrun_curves(rows: list[dict[str, Any]], models: Iterable[str],
                    exclude_startup: bool = True) -> list[dict[str, Any]]:
    """Validation loss against training wall time for each run of ``models``, one entry per
    (model, seed): ``time_s``, ``tokens`` and ``val_loss`` lists from the run's evaluation history.

    With ``exclude_startup`` the one-off startup (compilation or the engine's JIT and capture)
    is taken off every point after step 0; runs stored before the startup was recorded are left out.
    """
    out = []
    for r in sorted(ok_runs(rows), key=lambda r: (r["model"], r["seed"])):
        if r["model"] not in models:
            continue
        startup = r.get("startup_s")
        if exclude_startup and startup is None:
            continue
        shift = startup if exclude_startup else 0.0
        hist = r.get("history") or []
        out.append({"model": r["model"], "seed": r["seed"],
                    "time_s": [max(0.0, h["time_s"] - shift) if h["step"] > 0 else 0.0 for h in hist],
                    "tokens": [h.get("tokens") for h in hist], "val_loss": [h["val_loss"] for h in hist]})
    return out


def _order(ids: Mapping[str, str]):
    """Sort key of a run by its candidate's id: the reference first, then C1, C2, ..."""
    def key(r: dict[str, Any]) -> tuple[int, str, Any]:
        i = id_of(ids, r["model"])
        return (0 if r["model"] == REFERENCE else 1, f"{int(i[1:]):06d}" if i[1:].isdigit() else i, r.get("seed"))
    return key


@table_view
def repeat_table(rows: list[dict[str, Any]], repeats: list[dict[str, Any]],
                 ids: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each repeated run (``speedrun-repeat.jsonl``: the same key, i.e. candidate, recipe and seed,
    run again on a fresh machine from the same commit) next to its stored first run, the candidate by
    its short id (``ids``, :func:`ftlib.views.candidates.short_ids` of both by default).

    The GPU's run-to-run nondeterminism (atomic adds in the embedding backward, reduction orders)
    makes two runs of one seed part ways within steps; near a loss floor that moves the step at
    which 1.50 is first reached. The spread between the two is the noise the speed-up sits in.
    """
    ids = short_ids(rows + repeats) if ids is None else ids
    first = {r["key"]: r for r in rows}
    out = []
    for rep in sorted(repeats, key=_order(ids)):
        a = first.get(rep.get("repeat_of_key", rep["key"]))
        if a is None:
            continue
        ta, tb = steady_time_to_target(a), steady_time_to_target(rep)
        out.append({"device": rep.get("device_slug"), "id": id_of(ids, rep["model"]), "seed": rep["seed"],
                    "steps to target (first)": a.get("steps_to_target"),
                    "steps to target (repeat)": rep.get("steps_to_target"),
                    "excl. startup s (first)": ta, "excl. startup s (repeat)": tb,
                    "repeat / first": (tb / ta) if (ta and tb) else None,
                    "best val loss (first)": a["best_val_loss"], "best val loss (repeat)": rep["best_val_loss"]})
    return out


@table_view
def noise_table(rows: list[dict[str, Any]], repeats: list[dict[str, Any]],
                ids: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Per candidate run twice on the same seeds (:func:`repeat_table`), by short id: how many runs were
    repeated, how many reached the target both times, and over those the repeat's time to it over the first's
    (min, median, max), its time per step over the first's (median), and the most the step of reaching it moved."""
    pairs = _both(repeat_table.rows(rows, repeats, ids))
    out = []
    for i in dict.fromkeys(p["id"] for p in pairs):
        mine = [p for p in pairs if p["id"] == i]
        both = [p for p in mine if p["both"]]
        ratios = sorted(p["repeat / first"] for p in both)
        per_step = sorted(p["per step"] for p in both)
        out.append({"id": i, "runs repeated": len(mine), "reached both times": len(both),
                    "repeat / first (min)": ratios[0] if both else None,
                    "repeat / first (median)": _median(ratios),
                    "repeat / first (max)": ratios[-1] if both else None,
                    "step time, repeat / first (median)": _median(per_step),
                    "steps moved (max)": max(p["moved"] for p in both) if both else None})
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _both(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`repeat_table`'s pairs with ``both`` (each run reached the target and was timed), and for those
    ``per step`` (the repeat's time per step over the first's) and ``moved`` (steps between their stops)."""
    out = []
    for p in pairs:
        sa, sb = p["steps to target (first)"], p["steps to target (repeat)"]
        both = p["repeat / first"] is not None and bool(sa) and bool(sb)
        out.append({**p, "both": both, "per step": p["repeat / first"] * sa / sb if both else None,
                    "moved": abs(sb - sa) if both else None})
    return out


def noise_findings(rows: list[dict[str, Any]], repeats: list[dict[str, Any]], leader: str | None,
                   ids: Mapping[str, str] | None = None) -> str:
    """The repeats in words: how far a second run of the same seed lands from the first, over every repeated
    pair; the speed-up over nanoGPT's recipe with every run counted (:func:`speedrun_pooled`) for each
    candidate repeated on as many seeds as the reference, with its interval; and whether ``leader`` (its
    stored name) is among the repeated candidates."""
    ids = short_ids(rows + repeats) if ids is None else ids
    pairs = _both(repeat_table.rows(rows, repeats, ids))
    both = [p for p in pairs if p["both"]]
    if not both:
        return "No run has been repeated to the target both times yet."
    ratios = sorted(p["repeat / first"] for p in both)
    moved = [p["moved"] for p in both if p["moved"]]
    text = (f"{len(pairs)} runs of {len({p['id'] for p in pairs})} candidates were run a second time with the "
            f"same seed; {len(both)} reached {TARGET_LOSS:.2f} both times. The second run's time to it was "
            f"{ratios[0]:.2f}× to {ratios[-1]:.2f}× the first's (median {_median(ratios):.2f}×), and {len(moved)} "
            f"of the {len(both)} reached it at another step" + (f", by up to {max(moved)} steps" if moved else "")
            + ".")
    n_ref = sum(p["id"] == id_of(ids, REFERENCE) for p in pairs)
    full = [n for n in dict.fromkeys(r["model"] for r in repeats) if n != REFERENCE
            and sum(p["id"] == id_of(ids, n) for p in pairs) >= n_ref > 0]
    pooled = [(n, speedrun_pooled(rows, repeats, n)) for n in full]
    said = [f"{id_of(ids, n)} {p['speed-up excl. startup (pooled)']:.2f}× (90% interval {p['90% interval'][0]:.2f}–"
            f"{p['90% interval'][1]:.2f}×, {p['reached'].replace('/', ' of its ')} runs reached it)"
            for n, p in pooled if p]
    if said:
        text += (f" Counting every run, first or repeat, as one sample of the time to {TARGET_LOSS:.2f}, the "
                 f"candidates repeated on as many seeds as nanoGPT's recipe ({n_ref}) reach it faster than the "
                 "recipe by: " + "; ".join(said) + ".")
    repeated = {r["model"] for r in repeats}
    if leader:
        text += (f" The leader, {id_of(ids, leader)}, is among the repeated candidates." if leader in repeated else
                 f" The leader, {id_of(ids, leader)}, has no second run of a seed here.")
    return text


# ---------------------------------------------------------------------------------------
# Chapter 8's speedrun tables and samples, per device (``rows``: one device's ok runs).

RUNS_PREVIEW = ("id", "seed", "target", "startup s", "steps to target", "excl. startup s", "best val loss")

def _leading(r: dict[str, Any], first: Iterable[str]) -> bool:
    """Whether a run is one of ``first``'s (stored names) aimed at the speedrun's target, 1.50."""
    return r["model"] in set(first) and r.get("target", TARGET_LOSS) == TARGET_LOSS


def leading_runs(rows: list[dict[str, Any]], first: Iterable[str]) -> int:
    """How many of ``rows`` :func:`runs_of` lists first: the runs of ``first`` aimed at 1.50."""
    first = list(first)
    return sum(_leading(r, first) for r in rows)


@table_view
def runs_of(rows: list[dict[str, Any]], device: str, ids: Mapping[str, str] | None = None,
            first: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Per run of one device: its candidate's short id (the legend says what it runs), its startup, and
    when it reached its target. The runs aimed at 1.50 of the candidates named in ``first`` (stored names)
    come first (:func:`leading_runs` counts them), then the others; each part by target (1.50 first), then
    by time to it, runs that did not reach it last."""
    ids = short_ids(rows) if ids is None else ids
    first = list(first)

    def key(r: dict[str, Any]) -> tuple:
        t = r.get("time_to_target_excl_startup_s")
        return (not _leading(r, first), -r.get("target", TARGET_LOSS), t is None, t or 0.0, r.get("seed") or 0)

    return [{"device": device, "id": id_of(ids, r["model"]), "seed": r["seed"],
             "target": f"{r.get('target', TARGET_LOSS):.4f}", "execution": r.get("execution"),
             "startup s": r.get("startup_s"), "steps to target": r.get("steps_to_target"),
             "time to target s": r.get("time_to_target_s"), "excl. startup s": r.get("time_to_target_excl_startup_s"),
             "best val loss": r["best_val_loss"]}
            for r in sorted(rows, key=key)]


def samples(fair: list[dict[str, Any]], speed: list[dict[str, Any]], leaders: Mapping[str, str | None],
            ids: Mapping[str, str] | None = None) -> str:
    """What the trained models write: each fair-comparison model's seed-0 sample, then per device of
    ``leaders`` (device -> the stored name of its leader, the fastest claimed candidate, or None) the leader's
    seed-0 run and the reference's among the ``speed`` runs aimed at 1.50."""
    ids = short_ids(speed) if ids is None else ids
    out = []
    for r in sorted(fair, key=lambda r: (r["device_slug"], r["model"])):
        if r["seed"] == 0:
            out += [f"--- {model_title(r['model'])} ({gpu_label(r['device_slug'])}, seed 0, best validation loss "
                    f"{r['best_val_loss']:.4f})",
                    r["sample"]]
    for dev, leader in leaders.items():
        for name in dict.fromkeys(n for n in (leader, REFERENCE) if n):
            r = next((r for r in ok_runs_to_150(speed) if r["device_slug"] == dev and r["model"] == name
                      and r["seed"] == 0), None)
            if r is not None:
                what = "the leader" if name == leader else "the reference"
                stop = (f"stopped at step {r['steps_to_target']}" if r.get("steps_to_target") is not None
                        else "did not reach 1.50")
                out += [f"--- speedrun, {what}: {id_of(ids, name)} ({gpu_label(dev)}, seed 0, {stop}, "
                        f"best validation loss {r['best_val_loss']:.4f})", r["sample"]]
    return "\n".join(out)


def head_to_head(rows: list[dict[str, Any]], device: str,
                 ids: Mapping[str, str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """The same-call race of nanoGPT's recipe and the leader (suite ``speedrun-head-to-head``) on ``device``:
    one line per side (seeds, seeds at 1.50, mean time to it, whole-split loss at the stop), then the speed-up
    of the means with its bootstrap interval (:func:`speedrun_pooled`), in a sentence. ``ids``: the short ids
    of the leaderboard's candidates (:func:`short_ids` of its rows), so that a candidate keeps its id here;
    without them the race numbers its own."""
    mine = [r for r in ok_runs_to_150(rows) if r.get("device_slug") == device]
    if not mine:
        return [], (f"{gpu_label(device)}: the head-to-head has no rows yet "
                    "(python ci/gpu_train.py --suites speedrun-head-to-head on a GPU).")
    ids = short_ids(mine) if ids is None else ids
    table = []
    for name in dict.fromkeys(r["model"] for r in mine):
        runs = [r for r in mine if r["model"] == name]
        times = [t for r in runs if (t := steady_time_to_target(r)) is not None]
        full = [r["full_val_loss_at_target"] for r in runs if r.get("full_val_loss_at_target") is not None]
        table.append({"id": id_of(ids, name), "seeds": len(runs), "reached 1.50": len(times),
                      "time to 1.50 s (mean)": sum(times) / len(times) if times else None,
                      "whole-split loss at the stop (mean)": sum(full) / len(full) if full else None})
    cand = next((n for n in dict.fromkeys(r["model"] for r in mine) if n != REFERENCE), None)
    p = speedrun_pooled(mine, [], cand) if cand else None
    if p is None:
        return table, f"{gpu_label(device)}: the head-to-head needs timed runs of both sides."
    lo, hi = p["90% interval"]
    return table, (f"{gpu_label(device)}, the same seeds alternating in one process: {id_of(ids, cand)} reaches "
                   "1.50 in "
                   f"{p['candidate s (mean)']:.2f} s of training steps against nanoGPT's "
                   f"{p['reference s (mean)']:.2f} s: {p['speed-up excl. startup (pooled)']:.2f}× (90% interval "
                   f"{lo:.2f}–{hi:.2f}×, {p['reached']} of its runs reached it).")
