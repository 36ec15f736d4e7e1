"""The training studies' rows read back (chapter 8): losses over seeds, the speedrun's verdicts,
curves and repeats.

Seeds are pooled only within one device and one model config, so a smoke run's tiny model stored
under a full-size name never mixes with it, and nor do two GPUs.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from ftlib.harness.convergence import steady_time_to_target
from ftlib.harness.studies import REFERENCE, TARGET_SPEEDUP, is_smoke, suites
from ftlib.views.tables import group_rows


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of finished runs (failed runs are stored too, with status 'error' and no history)."""
    return [r for r in rows if r.get("status", "ok") == "ok"]


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _runs_of_one_config(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Finished runs grouped by (device, model, config hash): the seeds of one model at one size on
    one device, never pooled with another device's runs or a smoke run's smaller model."""
    return group_rows(_ok(rows), "device_slug", "model", "config_hash")


def aggregate(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per model, per evaluated step: mean, min and max over seeds of val/train loss and time.

    Seeds are pooled only within one device and one config; where a model name has runs on
    several devices or at several sizes, each gets its own entry, named with its device and
    parameter count.
    """
    groups = _runs_of_one_config(rows)
    names = [model for _, model, _ in groups]
    out: dict[str, list[dict[str, Any]]] = {}
    for (dev, model, _), rs in groups.items():
        name = model if names.count(model) == 1 else f"{model} ({dev}, {rs[0].get('params', 0):,} params)"
        by_step: dict[int, list[dict]] = {}
        for r in rs:
            for ev in r["history"]:
                by_step.setdefault(ev["step"], []).append(ev)
        pts = []
        for step in sorted(by_step):
            evs = by_step[step]
            vals = [e["val_loss"] for e in evs]
            pts.append({
                "step": step, "tokens": evs[0]["tokens"], "n_seeds": len(evs),
                "time_s": sum(e["time_s"] for e in evs) / len(evs),
                "val_mean": sum(vals) / len(vals), "val_min": min(vals), "val_max": max(vals),
                "train_mean": sum(e["train_loss"] for e in evs) / len(evs),
            })
        out[name] = pts
    return out


def seed_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per device, model and config: seeds, best validation loss (mean, min, max), time to target.

    Time to target twice: all training-step wall time (startup included), and without the
    startup (first step: compilation, or the engine's JIT and capture). A row without a recorded
    startup has no value for the second; its mean is over the seeds that have one.
    Runs of different devices or sizes are separate lines (``device``, ``params``).
    """
    groups = _runs_of_one_config(rows)
    speedrun = any(r.get("target") is not None for rs in groups.values() for r in rs)  # else no timing columns
    table = []
    for (dev, model, _), rs in groups.items():
        best = [r["best_val_loss"] for r in rs]
        ttt = [r["time_to_target_s"] for r in rs if r.get("time_to_target_s") is not None]
        line = {
            "device": dev, "model": model, "params": rs[0]["params"], "seeds": len(rs),
            "best val loss (mean)": sum(best) / len(best), "min": min(best), "max": max(best),
            "time to target s (mean)": sum(ttt) / len(ttt) if ttt else None,
        }
        if speedrun:
            line["excl. startup s (mean)"] = _mean([steady_time_to_target(r) for r in rs])
            line["startup s (mean)"] = _mean([r.get("startup_s") for r in rs])
            line["steps to target (mean)"] = _mean([r.get("steps_to_target") for r in rs])
        line["reached"] = f"{len(ttt)}/{len(rs)}"
        line["train time s (mean)"] = sum(r["train_time_s"] for r in rs) / len(rs)
        table.append(line)
    return table


def suite_rows(bench: str, rows: Iterable[dict[str, Any]], smoke: bool = False) -> list[dict[str, Any]]:
    """The rows of ``bench`` at the suite's size (``smoke`` picks which).

    A smoke run stores tiny models under the same names as the full-size ones: a row of a model the
    suite still runs must have that model's config hash at that size; a row of a candidate no longer
    listed is kept by its size alone (it is labelled by its own ``model`` field). Repeats are matched
    against the runs they repeat.
    """
    table = suites(smoke)
    if bench not in table:
        return list(rows)
    runs = table[table[bench].get("repeat_of") or bench]["runs"]
    return [r for r in rows if (r.get("config_hash") == runs[r["model"]][0].config_hash() if r.get("model") in runs
                                else bench.startswith("speedrun") and is_smoke(r.get("config") or {}) == smoke)]


def speedrun_verdict(rows: list[dict[str, Any]], target: float = TARGET_SPEEDUP,
                     min_seeds: int = 3) -> dict[str, Any] | None:
    """The fastest candidate that reached the target on every seed it ran (at least ``min_seeds``),
    against the reference on the seeds both recorded: the speed-up with and without startup.

    A candidate that missed 1.50 on one seed has not met the target however fast its other
    seeds were, so only candidates that reached it on all of their (>= ``min_seeds``) seeds
    can get 'met'. When none qualifies, the fastest candidate by mean time excluding startup
    over the seeds that reached it is reported, with 'not met' and how many seeds reached.
    Seeds are matched because a seed's batches and the state of the compile cache change a
    run's time; the ratio is of the sums over the common seeds (a ratio of means). ``None``
    without a reference or a candidate that reached the target.
    """
    by: dict[str, dict[int, dict]] = {}
    for r in _ok(rows):
        by.setdefault(r["model"], {})[r["seed"]] = r
    ref = {s: r for s, r in by.pop(REFERENCE, {}).items() if r.get("time_to_target_s") is not None}
    steady = {m: _mean([steady_time_to_target(r) for r in rs.values()]) for m, rs in by.items()}
    steady = {m: t for m, t in steady.items() if t is not None}
    if not ref or not steady:
        return None

    def reached(rs: dict[int, dict]) -> int:
        return sum(r.get("time_to_target_s") is not None for r in rs.values())

    qualified = [m for m in steady if len(by[m]) >= min_seeds and reached(by[m]) == len(by[m])]
    best = min(qualified or steady, key=steady.get)
    cand = {s: r for s, r in by[best].items() if r.get("time_to_target_s") is not None}

    def ratio(key) -> tuple[float | None, list[int]]:
        seeds = sorted(s for s in set(ref) & set(cand) if key(ref[s]) is not None and key(cand[s]) is not None)
        if not seeds:
            return None, []
        return sum(key(ref[s]) for s in seeds) / sum(key(cand[s]) for s in seeds), seeds

    def verdict(x: float | None) -> str | None:
        if x is None:
            return None
        return "met" if x >= target and best in qualified else "not met"

    x_steady, seeds_steady = ratio(steady_time_to_target)
    x_all, seeds_all = ratio(lambda r: r["time_to_target_s"])
    return {"candidate": best, "target": target, "seeds reached": f"{reached(by[best])}/{len(by[best])}",
            "qualified": best in qualified,
            "speed-up excl. startup": x_steady, "seeds excl. startup": seeds_steady,
            "speed-up incl. startup": x_all, "seeds incl. startup": seeds_all,
            "verdict excl. startup": verdict(x_steady), "verdict incl. startup": verdict(x_all)}


def speedrun_pooled(rows: list[dict[str, Any]], repeats: list[dict[str, Any]], candidate: str,
                    target: float = TARGET_SPEEDUP, n_boot: int = 4000) -> dict[str, Any] | None:
    """The reference against ``candidate`` over every run: first runs and repeats pooled.

    Two runs of one seed differ on the GPU as much as two seeds do, so each run is one sample
    of the time to 1.50 (excluding startup). The speed-up is the ratio of the pooled means; its
    90% interval is a percentile bootstrap (runs resampled within each side, fixed generator so
    the book prints the same interval every time). 'met' needs every candidate run to have
    reached the target and the pooled ratio at or above ``target``; ``interval clears target``
    says whether the interval's lower end does too. The reference (``torch.compile``'s default
    mode, a kernel launch per op) depends on the host's CPU, the captured engine hardly: a
    floor against the reference's fastest run is returned too. ``None`` without timed runs on
    both sides.
    """
    pool = _ok(rows) + _ok(repeats)
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
    reached_all = len(times) == len(cand)
    return {"candidate": candidate, "target": target,
            "reference runs": len(ref), "candidate runs": len(cand), "reached": f"{len(times)}/{len(cand)}",
            "reference s (mean)": sum(ref) / len(ref), "candidate s (mean)": sum(times) / len(times),
            "candidate s (min)": min(times), "candidate s (max)": max(times),
            "speed-up excl. startup (pooled)": x, "90% interval": (lo, hi),
            # A floor: the reference's single fastest run against the candidate's mean.
            "speed-up vs fastest reference run": min(ref) / (sum(times) / len(times)),
            "verdict": "met" if reached_all and x >= target else "not met",
            "interval clears target": reached_all and lo >= target}


def speedrun_curves(rows: list[dict[str, Any]], models: Iterable[str],
                    exclude_startup: bool = True) -> list[dict[str, Any]]:
    """Validation loss against training wall time for each run of ``models``, one entry per
    (model, seed): ``time_s`` and ``val_loss`` lists from the run's evaluation history.

    With ``exclude_startup`` the one-off startup (compilation or the engine's JIT and capture)
    is taken off every point after step 0; runs stored before the startup was recorded are left out.
    """
    out = []
    for r in sorted(_ok(rows), key=lambda r: (r["model"], r["seed"])):
        if r["model"] not in models:
            continue
        startup = r.get("startup_s")
        if exclude_startup and startup is None:
            continue
        shift = startup if exclude_startup else 0.0
        hist = r.get("history") or []
        out.append({"model": r["model"], "seed": r["seed"],
                    "time_s": [max(0.0, h["time_s"] - shift) if h["step"] > 0 else 0.0 for h in hist],
                    "val_loss": [h["val_loss"] for h in hist]})
    return out


def repeat_table(rows: list[dict[str, Any]], repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each repeated run (``speedrun-repeat.jsonl``: the same key, i.e. candidate, recipe and seed,
    run again on a fresh machine from the same commit) next to its stored first run.

    The GPU's run-to-run nondeterminism (atomic adds in the embedding backward, reduction orders)
    makes two runs of one seed part ways within steps; near a loss floor that moves the step at
    which 1.50 is first reached. The spread between the two is the noise the speed-up sits in.
    """
    first = {r["key"]: r for r in rows}
    out = []
    for rep in repeats:
        a = first.get(rep.get("repeat_of_key", rep["key"]))
        if a is None:
            continue
        ta, tb = steady_time_to_target(a), steady_time_to_target(rep)
        out.append({"device": rep.get("device_slug"), "model": rep["model"], "seed": rep["seed"],
                    "steps to target (first)": a.get("steps_to_target"),
                    "steps to target (repeat)": rep.get("steps_to_target"),
                    "excl. startup s (first)": ta, "excl. startup s (repeat)": tb,
                    "repeat / first": (tb / ta) if (ta and tb) else None,
                    "best val loss (first)": a["best_val_loss"], "best val loss (repeat)": rep["best_val_loss"]})
    return out
