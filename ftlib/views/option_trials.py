"""Engine options on trial (suite ``engine_candidates``) for chapter 6: each option against the default
engine case of the same run, and which options of the suite have no rows yet.

An option becomes a default when it is faster than the default engine of the same run beyond the
spread and passes its 100-step check; :func:`candidate_table` shows each trial's outcome.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ftlib.harness.engine_suites import CANDIDATES
from ftlib.training.engine.options import EngineOptions
from ftlib.views.bench import gpu_of, model_title
from ftlib.views.engine import changes_the_step
from ftlib.views.engine_config import PRECISIONS
from ftlib.views.per_run import and_list
from ftlib.views.tables import table_view


@table_view
def candidate_table(candidate_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Engine options on trial, each against the default engine case of the same run, model and precision:
    the base is the case whose label the option's label extends (a case that another extends is a default
    case). ``beyond spread``: the two cases' p20-p80 ranges do not overlap; only a win beyond the spread,
    with a passing 100-step check, makes an option a default. ``changes the step`` is False where the option
    does not apply to the case (:func:`ftlib.views.engine.changes_the_step`): its delta is only noise.
    """
    rows = [r for r in candidate_rows if r.get("mode") == "engine" and r.get("median_ms") is not None]

    def group(r: dict[str, Any]) -> tuple:
        return r.get("device_slug"), r.get("run_id"), r.get("precision")

    out = []
    for r in rows:
        peers = [b for b in rows if b is not r and group(b) == group(r)]
        same = [b for b in peers if r["label"].startswith(b["label"])]
        if not same or any(b["label"].startswith(r["label"]) for b in peers):
            continue  # a default case (GPT-2 with the attention kernel is one too: options extend it)
        base = max(same, key=lambda b: len(b["label"]))
        # The engine options the case sets beyond its base's: what a 100-step check of it must set too.
        own, base_extra = r.get("extra") or {}, base.get("extra") or {}
        options = {k: v for k, v in own.items() if k != "run" and base_extra.get(k) != v}
        out.append({"device": r["device_slug"], "precision": r["precision"], "engine": base["label"],
                    "option": r["label"][len(base["label"]):].strip(), "default ms": base["median_ms"],
                    "option ms": r["median_ms"], "delta µs": 1e3 * (r["median_ms"] - base["median_ms"]),
                    "speed-up": base["median_ms"] / r["median_ms"],
                    "beyond spread": bool(r["p80_ms"] < base["p20_ms"] or r["p20_ms"] > base["p80_ms"]),
                    "changes the step": changes_the_step(base, r),
                    "check ok": r.get("check_ok"), "run": r.get("run_id"), "options": options})
    return sorted(out, key=lambda d: (d["device"], d["precision"], d["engine"], d["option"]))


def candidate_summary(candidate_rows: Iterable[dict[str, Any]], check_rows: Iterable[dict[str, Any]]) -> str:
    """One line per device and option of :func:`candidate_table`: how often it was faster beyond the spread,
    by how much, whether a 100-step check of it is stored (rows of ``engine_check`` that set the option as
    its cases do, or whose engine ran with it as applied: a default's checks train with it) in each precision
    it was timed in and passed, and whether the engine's defaults set it so. A default that did not win most of its
    own cases names the winning trial that set it (:func:`won_by`)."""
    candidate_rows = list(candidate_rows)
    table = candidate_table.rows(candidate_rows)
    checks = list(check_rows)
    defaults = EngineOptions()

    def is_default(options: dict[str, Any]) -> bool:
        return bool(options) and all(getattr(defaults, k, None) == v for k, v in options.items())

    # (device, option) -> (its cases, the cases it won beyond the spread); a case the option does not apply to
    # (the step ran unchanged) is no case of its trial.
    trials, idle = {}, {}
    for key in dict.fromkeys((d["device"], d["option"]) for d in table):
        mine = [d for d in table if (d["device"], d["option"]) == key]
        applied = [d for d in mine if d["changes the step"] is not False] or mine
        idle[key] = len(mine) - len(applied)
        trials[key] = applied, [d for d in applied if d["beyond spread"] and d["delta µs"] < 0]

    def won_by(dev: str, option: str, options: dict[str, Any]) -> str:
        """Where a default lost its own trial: the winning trial (most of its cases) that set it, the same
        options on another GPU or more options that hold these, on ``dev`` first; '' where none did."""
        part = [(d == dev, len(w) / len(m), opt, d, len(w), len(m), len(m[0]["options"]) > len(options))
                for (d, opt), (m, w) in trials.items()
                if (d, opt) != (dev, option) and 2 * len(w) > len(m) and is_default(m[0]["options"])
                and (d != dev or len(m[0]["options"]) > len(options))
                and all(k in m[0]["options"] and m[0]["options"][k] == v for k, v in options.items())]
        if not part:
            return ""
        _, _, opt, d, w, n, more = max(part)
        where = "" if d == dev else f" on the {gpu_of(candidate_rows, d)}"
        return (f", since **{opt}**{where}, which holds it, won" if more else f", since its trial **{opt}**{where} won"
                ) + f" (faster beyond the spread in {w} of {n} cases)"

    lines = []
    for (dev, option), (mine, wins) in trials.items():
        options = mine[0]["options"]
        checked = [c for c in checks if c.get("device_slug") == dev and options
                   and all((c.get("extra") or {}).get(k, c.get(k)) == v for k, v in options.items())]
        precs = sorted({d["precision"] for d in mine})
        unchecked = [p for p in precs if not any(c.get("precision") == p for c in checked)]
        check = ("no 100-step check of it is stored" if not checked else
                 "its 100-step check failed" if not all(c.get("ok", c.get("check_ok")) for c in checked) else
                 "its 100-step check passed" if not unchecked else
                 f"its 100-step check passed in {', '.join(p for p in precs if p not in unchecked)}; none is stored "
                 f"in {', '.join(unchecked)}")
        lo, hi = min(d["delta µs"] for d in mine), max(d["delta µs"] for d in mine)
        s_lo, s_hi = min(d["speed-up"] for d in mine), max(d["speed-up"] for d in mine)
        moved = (f"{lo:+.0f} µs ({s_lo:.3f}x)" if len(mine) == 1 else
                 f"{lo:+.0f} to {hi:+.0f} µs ({s_lo:.3f}x to {s_hi:.3f}x)")
        split = is_default(options) and 2 * len(wins) <= len(mine)
        setter = won_by(dev, option, options) if split else ""
        default = ("the engine's defaults do not set it" if not is_default(options) else "the engine's defaults set it"
                   + _only_in(mine, options) + setter)
        if split and wins and not setter:
            # A default that won only some of its cases: the cases it won, by model and precision.
            won = sorted({f"{model_title(d['engine'])} {d['precision']}" for d in wins})
            default += f", having won its cases of {and_list(won)}"
        unchanged = idle[(dev, option)]
        where = (f" (in {unchanged} more it does not apply: the step ran unchanged)" if unchanged else
                 " (in none of them did it change the step: it does not apply here)"
                 if all(d["changes the step"] is False for d in mine) else "")
        lines.append(f"* **{option}** on the {gpu_of(candidate_rows, dev)}: faster than the default engine of the "
                     f"same run beyond the spread in {len(wins)} of {len(mine)} case{'s' * (len(mine) != 1)}{where}; "
                     f"the step changed by {moved}; {check}; {default}.")
    return "\n".join(lines) or "No engine option is waiting to be measured."


def _only_in(cases: list[dict[str, Any]], options: dict[str, Any]) -> str:
    """For a default whose trial timed precisions that the current engine leaves it off in, wholly or in part
    (:data:`ftlib.views.engine_config.PRECISIONS`): ', but not in tf32, where the current engine does not apply
    it', or ', though in tf32 the current engine leaves fuse_head_loss off' for a trial of several options; ''
    where all of it applies in every precision it was timed in."""
    left = {p: [k for k in options if p not in PRECISIONS.get(k, (p,))] for p in dict.fromkeys(
        d["precision"] for d in cases)}
    whole = [p for p, names in left.items() if names and len(names) == len(options)]
    part = [f"in {p} the current engine leaves {and_list(names)} off" for p, names in left.items()
            if names and p not in whole]
    return ((f", but not in {and_list(whole)}, where the current engine does not apply it" if whole else "")
            + (f", though {'; '.join(part)}" if part else ""))


def unmeasured(candidate_rows: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(option label, engine option name) of each option on trial in ``ftlib.harness.engine_suites.CANDIDATES``
    that no stored row measured yet."""
    labels = {str(r.get("label", "")) for r in candidate_rows}
    missing: dict[str, dict[str, Any]] = {}  # one line per label: the widest option set given for it
    for suffix, extra, *_ in CANDIDATES:
        if not any(label.endswith(suffix) for label in labels) and len(extra) > len(missing.get(suffix.strip(), {})):
            missing[suffix.strip()] = extra
    return [(label, ", ".join(extra)) for label, extra in missing.items()]


def unmeasured_text(candidate_rows: Iterable[dict[str, Any]]) -> str:
    """A sentence naming the options on trial with no rows yet ('' when every one has rows)."""
    missing = unmeasured(candidate_rows)
    if not missing:
        return ""
    names = ", ".join(f"`{opt}` ({label})" for label, opt in missing)
    return (f"Not measured yet: {names}. Their cases are in the `engine_candidates` suite and no stored row "
            "times them, so the table above holds no trial of them.")
