"""ftlib.views.option_trials: engine options on trial, each against the default engine of its own run."""

from __future__ import annotations

import pytest

from ftlib.views import engine as engineview
from ftlib.views import option_trials


def test_a_default_that_lost_its_own_trial_names_the_trial_that_set_it():
    def row(label, ms, extra, dev="h200"):
        return {"device_slug": dev, "run_id": "r1", "precision": "bf16", "mode": "engine", "label": label,
                "median_ms": ms, "p20_ms": ms - 0.001, "p80_ms": ms + 0.001, "check_ok": True, "extra": extra}

    head, both = {"fuse_head_loss": True}, {"fuse_head_loss": True, "relaxed_atomics": True}
    rows = [row("ft", 2.0, {}), row("ft +head", 2.0, head), row("ft +both", 1.9, both)]
    text = option_trials.candidate_summary(rows, [])
    line = next(x for x in text.splitlines() if "**+head**" in x)
    assert "in 0 of 1 case; the step changed by +0 µs (1.000x);" in line  # one case: no range of one value
    assert "since **+both**, which holds it, won (faster beyond the spread in 1 of 1 cases)" in line
    assert "since" not in next(x for x in text.splitlines() if "**+both**" in x)  # it won on its own
    # the same options won on another GPU: that trial is named with its GPU
    other = [row("ft", 2.0, {}, "h100-80gb-hbm3"), row("ft +split", 1.9, {"attention_kv_split": 2}, "h100-80gb-hbm3"),
             row("ft", 2.0, {}), row("ft +kv", 2.01, {"attention_kv_split": 2})]
    line = next(x for x in option_trials.candidate_summary(other, []).splitlines() if "**+kv**" in x)
    assert "since its trial **+split** on the H100 80GB HBM3 won" in line


def test_a_case_an_option_does_not_apply_to_is_no_case_of_its_trial():
    """The fused K/V split sum changes nothing where attention has no split to sum (GPT-2's own heads): its
    stored description equals the default's there, so its trial counts the cases it applied to and says how many
    more it ran unchanged. A description that does not report the option says nothing either way."""
    def row(label, ms, prec, kv, extra=None, engine=True):
        return {"device_slug": "h200", "run_id": "r1", "precision": prec, "mode": "engine", "label": label,
                "median_ms": ms, "p20_ms": ms - 0.001, "p80_ms": ms + 0.001, "check_ok": True,
                "extra": extra or {}, **({"engine": {"fuse_kv_split_sum": kv}} if engine else {})}

    on = {"fuse_kv_split_sum": True}
    rows = [row("ft", 2.0, "bf16", False), row("ft +sum", 1.9, "bf16", True, on),
            row("gpt2", 3.0, "bf16", False), row("gpt2 +sum", 3.0, "bf16", False, on),
            row("gpt2", 4.0, "tf32", False), row("gpt2 +sum", 4.01, "tf32", False, on)]
    line = next(x for x in option_trials.candidate_summary(rows, []).splitlines() if "**+sum**" in x)
    assert "in 1 of 1 case (in 2 more it does not apply: the step ran unchanged); the step changed by -100 µs" in line
    # A default that won only some of the cases it applied to names the ones it won.
    won_half = rows + [row("ft", 2.0, "tf32", False), row("ft +sum", 2.0, "tf32", True, on)]  # a default today
    line = next(x for x in option_trials.candidate_summary(won_half, []).splitlines() if "**+sum**" in x)
    assert "in 1 of 2 cases" in line and line.endswith("the engine's defaults set it, having won its cases of "
                                                       "ft bf16.")
    assert engineview.changes_the_step(rows[2], {**rows[3], "extra": {"other_option": True}}) is None
    # An option that applied nowhere keeps its cases, and says that it changed none of them.
    line = next(x for x in option_trials.candidate_summary(rows[2:], []).splitlines() if "**+sum**" in x)
    assert "in 0 of 2 cases (in none of them did it change the step: it does not apply here)" in line


def test_a_default_narrowed_to_some_precisions_says_where_it_applies():
    """The weight gradients' side stream was timed in bf16 and tf32 and is a default in bf16/fp16 only: its line
    says so, by today's engine, though the tf32 rows ran it (their engine noted it as applied). The precisions
    are the engine's rules for the option, the ones the option views count by too."""
    def row(label, ms, prec, extra=None):
        return {"device_slug": "h200", "run_id": "r1", "precision": prec, "mode": "engine", "label": label,
                "median_ms": ms, "p20_ms": ms - 0.001, "p80_ms": ms + 0.001, "check_ok": True,
                "extra": extra or {}, "engine": {"wgrad_side_stream": bool(extra), "grad_into_buffer": True}}

    on = {"wgrad_side_stream": True}
    rows = [row("ft", 2.0, "bf16"), row("ft +side", 1.9, "bf16", on),
            row("ft", 3.0, "tf32"), row("ft +side", 2.9, "tf32", on)]
    line = next(x for x in option_trials.candidate_summary(rows, []).splitlines() if "**+side**" in x)
    assert line.endswith("the engine's defaults set it, but not in tf32, where the current engine does not apply "
                         "it.")
    # A trial of two options, one of which tf32 leaves off: the line names that one.
    both = {**on, "relaxed_atomics": True}
    two = [{**r, "extra": both if r["extra"] else {}} for r in rows]
    line = next(x for x in option_trials.candidate_summary(two, []).splitlines() if "**+side**" in x)
    assert line.endswith("the engine's defaults set it, though in tf32 the current engine leaves wgrad_side_stream "
                         "off.")
    # Timed in bf16 alone: nothing to add.
    line = next(x for x in option_trials.candidate_summary(rows[:2], []).splitlines() if "**+side**" in x)
    assert line.endswith("the engine's defaults set it.")


def test_candidates_pair_with_the_default_of_their_own_run():
    def row(label, ms, run="r1", prec="bf16", spread=0.01):
        extra = {"run": run, **({"opt": True} if label.endswith("+opt") else {}),
                 **({"flash": True} if "+flash" in label else {})}
        return {"device_slug": "h200", "run_id": run, "precision": prec, "mode": "engine", "label": label,
                "median_ms": ms, "p20_ms": ms - spread, "p80_ms": ms + spread, "check_ok": True, "extra": extra}

    rows = [row("ft", 2.0), row("ft +opt", 1.8), row("gpt2", 3.0), row("gpt2 +flash", 2.5),
            row("gpt2 +flash +opt", 2.49, spread=0.05), row("ft", 1.0, run="r2")]  # r2 has no option case
    table = option_trials.candidate_table.rows(rows)
    got = {(d["engine"], d["option"]): d for d in table}
    assert set(got) == {("ft", "+opt"), ("gpt2 +flash", "+opt")}  # "gpt2 +flash" is a default: "+opt" extends it
    assert got[("ft", "+opt")]["delta µs"] == pytest.approx(-200) and got[("ft", "+opt")]["beyond spread"]
    assert not got[("gpt2 +flash", "+opt")]["beyond spread"]  # 10 µs faster, inside the spread
    assert got[("gpt2 +flash", "+opt")]["options"] == {"opt": True}  # the base's own options are not the option's
    checks = [{"device_slug": "h200", "precision": "bf16", "extra": {"opt": True}, "ok": False}]
    text = option_trials.candidate_summary([r for r in rows if "flash" not in r["label"]], checks)
    assert "1 of 1 case;" in text and "check failed" in text
    assert "no 100-step check" in option_trials.candidate_summary(rows, [])
    other = [{"device_slug": "h200", "precision": "bf16", "extra": {"other": True}, "ok": True}]  # another option
    assert "no 100-step check" in option_trials.candidate_summary(rows, other)
    # A default's checks train with it without setting it: the check row's engine reports it as applied.
    ran_with = [{"device_slug": "h200", "precision": "bf16", "extra": {"run": "c"}, "opt": True, "ok": True}]
    assert "its 100-step check passed;" in option_trials.candidate_summary(rows, ran_with)
    # Timed in tf32 too, checked in bf16 only: the line says which precision lacks its check.
    tf32 = rows + [row("ft", 2.0, prec="tf32"), row("ft +opt", 1.8, prec="tf32")]
    assert "its 100-step check passed in bf16; none is stored in tf32" in option_trials.candidate_summary(
        [r for r in tf32 if "flash" not in r["label"]], ran_with)
    ran_without = [{"device_slug": "h200", "precision": "bf16", "extra": {"run": "c"}, "opt": False, "ok": True}]
    assert "no 100-step check" in option_trials.candidate_summary(rows, ran_without)
