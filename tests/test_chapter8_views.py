"""Chapter 8's readers' views: the post's experiment and the fair comparison's wall clock in words, the gap
figure, the leaderboard figure's drawing order and axis, the table of every run, a target without a claimed
time in one sentence, the repeats as noise, and a short provenance line."""

from __future__ import annotations

import math

import pytest

from ftlib.harness.studies import REFERENCE

B, T = 64, 256


def _conv(model: str, seed: int, losses: list[float], step_s: float, startup: float = 1.0,
          device: str = "h200", batch: list[float] | None = None) -> dict:
    """A convergence run evaluated every 100 steps with these validation losses, ``step_s`` s per 100 steps
    after a ``startup`` paid on the first step."""
    hist = [{"step": 100 * i, "tokens": 100 * i * B * T, "val_loss": v, "train_loss": v,
             "batch_loss": (batch or losses)[i], "time_s": startup + step_s * i if i else 0.0}
            for i, v in enumerate(losses)]
    return {"device_slug": device, "model": model, "seed": seed, "status": "ok", "params": 1,
            "config_hash": model, "best_val_loss": min(losses), "startup_s": startup,
            "train_time_s": hist[-1]["time_s"], "history": hist, "target": None}


def test_original_findings_compare_the_held_out_perplexity_with_seeds_behind_it():
    from ftlib.views.convergence import original_findings

    rows = ([_conv("gpt2", s, [4.0, 2.53 + s / 1000], 1.0) for s in (0, 1, 42)]
            + [_conv("fasttransformer", s, [4.0, 2.50 + s / 1000], 1.0) for s in (0, 1, 42)])
    text = original_findings(rows, "cmd")
    held = f"{math.exp(2.5 + 43 / 3000):.2f}"  # FastTransformer's mean over seeds 0, 1 and 42
    assert "after 100 steps (FastTransformer seeds 0, 1 and 42, GPT-2 seeds 0, 1 and 42)" in text
    assert f"exp(validation loss), {held} (" in text and "lower for FastTransformer" in text
    assert "Welch's t-test over 3 and 3 seeds" in text
    one = [r for r in rows if r["seed"] == 0]
    assert "Welch" not in original_findings(one, "cmd")  # one seed each: no verdict
    assert "lower for GPT-2" in original_findings(one[:1] + [{**one[1], "model": "x"},
                                                             _conv("fasttransformer", 0, [4.0, 2.6], 1.0)], "")
    assert "no stored rows" in original_findings([], "cmd") and "`cmd`" in original_findings([], "cmd")


def test_fair_findings_give_the_wall_clock_to_the_same_loss_without_the_startup():
    from ftlib.views.convergence import fair_findings

    # GPT-2 2 s per 100 steps, FastTransformer 1 s; both end at 1.50 after 300 steps. GPT-2's first seed
    # paid a long startup (a cold compile cache): it counts in the whole runs' time only.
    rows = ([_conv("gpt2", s, [4.0, 2.0, 1.6, 1.50 + s / 1000], 2.0, startup=30.0 if s == 0 else 1.0)
             for s in range(3)]
            + [_conv("fasttransformer", s, [4.0, 2.0, 1.502, 1.50 - s / 2000], 1.0) for s in range(3)])
    text = fair_findings(rows, "")
    assert "the 300 steps of a run took 3.0 s for FastTransformer against 6.0 s for GPT-2, GPT-2's 2.00×" in text
    # Every seed of both reaches 1.502 (GPT-2's highest best loss): FastTransformer at step 200, GPT-2 at 300.
    assert "To validation loss 1.5020, which every seed of both reaches: 2.0 s for FastTransformer" in text
    assert "against 6.0 s for GPT-2, GPT-2's 3.00× as long" in text
    assert "the whole runs took 4.0 s against 16.7 (7.0–36.0) s" in text
    no_clock = [{**r, "startup_s": None} for r in rows]
    assert "Wall clock" not in fair_findings(no_clock, "")
    one = [r for r in rows if r["seed"] == 0]
    assert "Wall clock" in fair_findings(one, "") and "Welch" not in fair_findings(one, "")


def test_the_gap_figure_draws_each_model_minus_gpt2_per_step():
    from ftlib.views.convergence import gap_figures

    rows = ([_conv("gpt2", s, [4.0, 2.0 + s / 100, 1.6], 1.0) for s in range(2)]
            + [_conv("fasttransformer", s, [4.0, 2.1, 1.55], 1.0) for s in range(2)])
    ((name, fig),) = gap_figures(rows)
    assert name == "convergence-val-gap-h200"
    band, ft = fig.data
    assert ft.name == "FastTransformer" and list(ft.x) == [100, 200]  # step 0 left out; the book's name
    assert band.name == "GPT-2's own seed range" and "minus GPT-2's" in fig.layout.title.text
    assert list(ft.y) == pytest.approx([2.1 - 2.005, 1.55 - 1.6])
    assert max(band.y) == pytest.approx(0.005) and min(band.y) == pytest.approx(-0.005)  # GPT-2's seed range
    assert gap_figures([r for r in rows if r["model"] != "gpt2"]) == []


def _speed(model: str, seed: int, steps: int | None, t: float, target: float = 1.5, stop: float = 1.49) -> dict:
    end = steps or 1000
    hist = [{"step": s, "tokens": s * B * T, "time_s": (1.0 + t * s / end) if s else 0.0,
             "val_loss": 4.0 - (4.0 - stop) * s / end} for s in range(0, end + 1, 100)]
    return {"device_slug": "h200", "model": model, "seed": seed, "status": "ok", "target": target,
            "config_hash": model, "params": 1, "config": {}, "recipe": {}, "history": hist, "startup_s": 1.0,
            "steps_to_target": steps, "time_to_target_s": t + 1.0 if steps else None,
            "time_to_target_excl_startup_s": t if steps else None, "best_val_loss": stop,
            "full_val_loss_at_target": None, "execution": "engine"}


def test_the_leaderboard_figure_draws_the_leader_last_on_a_log_time_axis():
    from ftlib.views.leaderboard import leaderboard_figure

    rows = ([_speed(REFERENCE, s, 1000, 10.0 + s / 10, stop=1.49 - s / 1000) for s in range(3)]
            + [_speed("lead", s, 500, 2.0 + s / 10, stop=1.49 - s / 1000) for s in range(3)]
            + [_speed("second", s, 700, 4.0 + s / 10, stop=1.49 - s / 1000) for s in range(3)])
    fig = leaderboard_figure(rows, "h200")
    assert fig.data[0].name.startswith("#3 nanoGPT") and fig.data[-1].name.startswith("#1 ")
    assert [t.legendrank for t in fig.data if t.showlegend] == [3, 2, 1]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type != "log"
    lo, hi = fig.layout.xaxis.range
    assert 10 ** hi > 10.2 and 10 ** lo > 0  # the reference's end is inside the frame


def test_the_runs_table_puts_the_leaders_and_the_references_runs_first_by_time():
    from ftlib.views.speedrun import leading_runs, runs_of

    rows = ([_speed("slow", s, 900, 5.0 - s) for s in range(2)] + [_speed("lead", s, 500, 2.0 - s / 10)
                                                                   for s in range(2)]
            + [_speed(REFERENCE, 0, 1000, 9.0), _speed(REFERENCE, 1, None, 0.0, target=1.4697)]
            + [_speed("lead", 0, None, 0.0, target=1.4697)])
    first = ["lead", REFERENCE]
    table = runs_of.rows(rows, "h200", first=first)  # "slow" appears first: C1; "lead" is C2
    assert leading_runs(rows, first) == 3
    got = [(x["id"], x["seed"], x["target"]) for x in table]
    assert got[:3] == [("C2", 1, "1.5000"), ("C2", 0, "1.5000"), ("nanoGPT", 0, "1.5000")]
    assert got[3:5] == [("C1", 1, "1.5000"), ("C1", 0, "1.5000")]  # the others by time, fastest first
    assert [g[2] for g in got[5:]] == ["1.4697", "1.4697"]


def test_a_target_without_a_claimed_time_is_one_sentence():
    from ftlib.views.record import unclaimed

    rows = ([_speed(REFERENCE, s, None, 0.0, target=1.47, stop=1.48 + s / 1000) for s in range(3)]
            + [_speed("a", 0, 800, 3.0, target=1.47, stop=1.469), _speed("a", 1, None, 0.0, target=1.47, stop=1.475)])
    text = unclaimed(rows, "h200", 1.47)
    assert text.startswith("H200, target 1.4700: 2 candidates ran, 2 to 3 seeds each, and none has a claimed time.")
    assert "The most seeds at the target: C1, 1 of 2." in text
    assert "The lowest best loss, on average over the seeds: C1, 1.4720 over 2 seeds (lowest 1.4690)." in text
    assert "No seed reached it." in unclaimed(rows[:3], "h200", 1.47)
    assert unclaimed(rows, "a100", 1.47).endswith("no run aimed at it.")


def test_the_repeats_say_how_far_a_second_run_of_a_seed_lands():
    from ftlib.views.speedrun import noise_findings, noise_table

    def pair(model: str, seed: int, t1: float, s1: int | None, t2: float, s2: int | None) -> tuple[dict, dict]:
        a = {**_speed(model, seed, s1, t1), "key": f"{model}{seed}"}
        return a, {**_speed(model, seed, s2, t2), "key": f"{model}{seed}-repeat1", "repeat_of_key": f"{model}{seed}"}

    pairs = ([pair(REFERENCE, s, 10.0, 1000, 12.0, 1000) for s in range(2)]  # slower steps, same stop
             + [pair("c", 0, 2.0, 500, 2.4, 600), pair("c", 1, 2.0, 500, 0.0, None)])
    first, rep = [a for a, _ in pairs], [b for _, b in pairs]
    table = {x["id"]: x for x in noise_table.rows(first, rep)}
    ref = table["nanoGPT"]
    assert ref["runs repeated"] == 2 and ref["reached both times"] == 2 and ref["repeat / first (median)"] == 1.2
    assert ref["step time, repeat / first (median)"] == pytest.approx(1.2) and ref["steps moved (max)"] == 0
    c = table["C1"]
    assert c["reached both times"] == 1 and c["step time, repeat / first (median)"] == pytest.approx(1.0)
    assert c["steps moved (max)"] == 100
    text = noise_findings(first, rep, "lead")
    assert text.startswith("4 runs of 2 candidates were run a second time with the same seed; 3 reached 1.50 both")
    assert "1.20× to 1.20× the first's (median 1.20×), and 1 of the 3 reached it at another step, by up to 100" in text
    assert "C1 " in text.split("faster than the recipe by:")[1]  # repeated on as many seeds as the reference
    assert text.endswith("The leader, lead, has no second run of a seed here.")
    assert "No run has been repeated" in noise_findings(first, [], None)


def test_provenance_short_counts_commits_past_two_sources():
    from ftlib.views.bench import provenance_line, provenance_short

    rows = [{"device": "NVIDIA H200", "torch": "2.11", "date": f"2026-12-0{d}T00:00:00Z", "commit": c}
            for d, c in ((2, "a"), (3, "b"), (4, "c"), (4, "c"))]
    assert provenance_short(rows) == "NVIDIA H200, torch 2.11, 3 commits, 2026-12-02 to 2026-12-04"
    assert provenance_short(rows[2:]) == provenance_line(rows[2:]) == "NVIDIA H200, torch 2.11, 2026-12-04, commit c"
