"""Chapter 8 in words: the record goals against the closest results (ftlib.views.record), and the fair comparison."""

from __future__ import annotations

import pytest

from ftlib.harness.studies import REFERENCE
from ftlib.views.record import closest, goal_verdicts, limits

B, T = 64, 256


def _run(model: str, seed: int, losses: list[float], target: float, t_per_step: float = 0.003,
         device: str = "h200") -> dict:
    """A stored run evaluated every 100 steps with these sampled validation losses; it stops at the first
    at or below ``target`` (its stored fields then say so), else runs them all."""
    hist, stop = [], None
    for i, v in enumerate(losses):
        s = 100 * i
        hist.append({"step": s, "tokens": s * B * T, "time_s": 1.0 + s * t_per_step if s else 0.0, "val_loss": v})
        if v <= target:
            stop = s
            break
    return {"device_slug": device, "model": model, "seed": seed, "status": "ok", "target": target,
            "config_hash": model, "params": 1, "config": {}, "recipe": {}, "history": hist, "startup_s": 1.0,
            "steps_to_target": stop, "time_to_target_excl_startup_s": stop * t_per_step if stop else None,
            "full_val_loss_at_target": None}


def test_closest_ranks_by_the_mean_best_loss_and_measures_the_rise():
    rows = ([_run("a", s, [4.0, 1.49, 1.48 - s / 100, 1.50], 1.47) for s in range(2)]  # bests 1.48, 1.47
            + [_run("b", s, [4.0, 1.476, 1.476], 1.47) for s in range(3)]
            + [_run("a", 0, [4.0, 1.0], 1.47, device="a100")])  # another GPU: never pooled
    board = {x["candidate"]: x for x in closest.rows(rows, "h200", 1.47)}
    assert list(board) == ["a", "b"]  # mean(1.48, 1.47) = 1.475 < 1.476
    a = board["a"]
    assert a["seeds"] == 2 and a["reached"] == 1 and a["best loss (min)"] == pytest.approx(1.47)
    assert a["rise after best (mean)"] == pytest.approx(0.02 / 2)  # seed 0 rose 0.02, seed 1 stopped at its best
    assert board["b"]["rise after best (mean)"] == 0 and board["b"]["best step (mean)"] == 100


def test_limits_splits_a_missed_goal_into_steps_and_step_time():
    # Five seeds reach 1.50 at step 200, 2 ms per step: 0.4 s against a goal of 0.3 s.
    rows = [_run("fast", s, [4.0, 1.6, 1.499 - s / 1000], 1.50, t_per_step=0.002) for s in range(5)]
    text = limits(rows, "h200", goals={1.50: 0.3})
    assert "goal 0.3 s missed by 1.33x: 0.40 s is 200 steps at 2.00 ms per step" in text
    assert "the goal needs 1.50 ms per step, at that step time 150 steps" in text
    assert "goal 1 s met" in limits(rows, "h200", goals={1.50: 1.0})


def test_limits_names_the_closest_where_no_candidate_reached():
    rows = ([_run("a", s, [4.0, 1.48, 1.50], 1.47) for s in range(3)]
            + [_run(REFERENCE, 0, [4.0, 1.46], 1.47)] + [_run(REFERENCE, s, [4.0, 1.475, 1.6], 1.47) for s in (1, 2)])
    text = limits(rows, "h200", goals={1.47: 3.0}, train_tokens=B * T * 50)
    # Candidates by short id: "a" ran first, so it is C1.
    assert "no candidate has a claimed time" in text
    assert "Of the candidates, the closest by the best validation loss: C1, 1.4800" in text
    assert "at step 100 on average, 2.0 epochs" in text and "risen 0.0200 above that best" in text
    # nanoGPT's recipe, the reference, is no candidate: its lower mean best loss is said as such.
    assert "nanoGPT's own recipe came closer: it reached 1.4700 on 1 of 3 seeds (best loss 1.4700 on average" in text
    worse_ref = rows[:3] + [_run(REFERENCE, s, [4.0, 1.49], 1.47) for s in range(2)]
    assert "nanoGPT's own recipe reached 1.4700 on 0 of 2 seeds (best loss 1.4900" in limits(
        worse_ref, "h200", goals={1.47: 3.0})
    # Runs that stop at 1.47 say nothing about 1.40.
    assert limits(rows, "h200", goals={1.40: 3.0}).endswith("no run aimed at it.")
    assert limits(rows, "a100", goals={1.47: 3.0}).endswith("no run aimed at it.")


def test_one_verdict_per_goal_needs_a_claimed_time_over_enough_seeds():
    # "fast" reaches 1.50 at step 200 (0.4 s) on five seeds; "few" at step 100 (0.2 s) on three seeds only.
    rows = ([_run("fast", s, [4.0, 1.6, 1.499 - s / 1000], 1.50, t_per_step=0.002) for s in range(5)]
            + [_run("few", s, [4.0, 1.490 - s / 1000], 1.50, t_per_step=0.002) for s in range(3)])
    (v,) = goal_verdicts.rows(rows, "h200", goals={1.50: 0.5})
    assert v["target"] == "1.5000" and v["fastest claimed"] == "C1" and v["verdict"] == "met" and v["seeds needed"] == 5
    (v,) = goal_verdicts.rows(rows, "h200", goals={1.50: 0.3})  # "few" is fast enough, on too few seeds
    assert v["fastest claimed"] == "C2" and v["verdict"] == "not met: 3 seeds, the goal needs 5"
    (v,) = goal_verdicts.rows(rows[:5], "h200", goals={1.50: 0.3})
    assert v["verdict"] == "not met: 0.40 s, 1.33x the goal"
    (v,) = goal_verdicts.rows(rows, "h200", goals={1.4697: 3.0})
    assert v["target"] == "1.4697" and v["verdict"] == "not met: no candidate has a claimed time"


def _fair(model: str, seed: int, best: float, device: str = "h200") -> dict:
    return {"device_slug": device, "model": model, "seed": seed, "status": "ok", "params": 1, "config_hash": model,
            "best_val_loss": best, "train_time_s": 10.0, "history": []}


def test_fair_findings_compare_fasttransformer_with_gpt2_per_device():
    from ftlib.views.convergence import fair_findings

    assert "no stored rows" in fair_findings([], "python ci/gpu_train.py --suites convergence")
    rows = ([_fair("gpt2", s, 1.50 + s / 100) for s in range(3)] + [_fair("fasttransformer", s, 1.55 + s / 100)
                                                                     for s in range(3)]
            + [_fair("fasttransformer", 0, 1.0, device="a100")])
    text = fair_findings(rows, "")
    # the models as the book names them, not by the rows' preset keys
    assert ("On the H200, the best validation loss of each model, lowest first: GPT-2 1.5100 (1.5000–1.5200, "
            "3 seeds)") in text
    assert "lowest first: FastTransformer 1.0000 (1 seed)." in text  # one seed: no range, no plural
    assert "FastTransformer's mean is 0.0500 above GPT-2's; their seed ranges do not overlap; Welch's t-test" in text
    assert "over 3 and 3 seeds gives p = 0.0036: a difference the seeds can tell apart." in text
    close = [_fair("gpt2", s, 1.50 + s / 100) for s in range(3)] + [_fair("fasttransformer", s, 1.505 + s / 100)
                                                                    for s in range(3)]
    assert "no difference the seeds can tell apart" in fair_findings(close, "")
    one = [_fair("gpt2", 0, 1.5), _fair("fasttransformer", 0, 1.6)]
    assert "Welch" not in fair_findings(one, "")  # one seed each: no test
    assert "On the A100" in text and text.count("FastTransformer's mean") == 1  # a100 has no GPT-2 to compare


def test_the_muon_trial_compares_the_two_executions_of_one_update():
    from ftlib.views.record import muon_trial

    grouped = "256x6 FT-style, engine + grouped Muon, Muon 0.02"
    per = "256x6 FT-style, engine, Muon 0.02"
    rows = ([{**_run(grouped, s, [4.0, 1.6, 1.49 + s / 1000], 1.50, t_per_step=0.003), "train_time_s": 1.6}
             for s in range(3)]
            + [{**_run(per, s, [4.0, 1.6, 1.48 + s / 1000], 1.50, t_per_step=0.005), "train_time_s": 2.0}
               for s in range(3)])
    tab, text = muon_trial(rows, "h200")
    t = tab.set_index("variant")
    assert t.loc["grouped", "seeds"] == 3 and t.loc["per matrix", "reached 1.50"] == 3
    assert t.loc["grouped", "time to 1.50 s (mean)"] == pytest.approx(0.6)  # 200 steps at 3 ms
    assert t.loc["grouped", "ms per step (mean)"] == pytest.approx(3.0)  # (1.6 s - 1.0 s startup) / 200 steps
    assert "grouped minus per-matrix mean best loss +0.0100" in text and "a difference beyond the seeds" in text
    same = [r for r in rows if r["model"] == grouped] + [{**r, "model": per} for r in rows if r["model"] == grouped]
    assert "within the seeds' spread" in muon_trial(same, "h200")[1]
    assert "no rows" in muon_trial(rows, "a100")[1]
