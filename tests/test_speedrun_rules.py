"""The speedrun's rules: evaluation off the clock, the whole-split loss at the stop, tokens to target,
the one-sided significance test, and a leaderboard per device that ranks only claimed times: every
seed at the target, at least three seeds, p < 0.01."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from scipy import stats

from ftlib import preset
from ftlib.harness.studies import REFERENCE
from ftlib.training.data import load_tinyshakespeare
from ftlib.training.trainer import Recipe, full_split_loss, train
from ftlib.views.leaderboard import (
    NOT_CLAIMED,
    SIGNIFICANT,
    STOP_LOSS,
    findings,
    leader,
    leaderboard,
    leaderboard_figure,
    p_value,
    seed_stops,
    standings,
)
from ftlib.views.tables import MISSING, table_bundle

TINY = dict(n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=16)
B, T = 64, 256


@pytest.fixture(scope="module")
def ds():
    return load_tinyshakespeare(download=False)


def test_full_split_loss_is_every_position_once():
    torch.manual_seed(0)
    model = __import__("ftlib").GPT(preset("fasttransformer", dropout=0.3, **TINY))  # dropout: eval mode matters
    data = torch.randint(0, 65, (5 * 16 + 7 + 1,))  # 87 positions: five whole windows and one of 7
    got, n = full_split_loss(model, data, 16, torch.device("cpu"), windows_per_batch=2)
    assert model.training and n == len(data) - 1
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, 16):  # one window at a time, each position's -log p of its next token
            x, y = data[i:min(i + 16, n)], data[i + 1:min(i + 17, n + 1)]
            logp = torch.log_softmax(model(x[None])[0][0].double(), dim=-1)
            total -= logp.gather(1, y[:, None]).sum().item()
    assert got == pytest.approx(total / n, rel=1e-6)


def test_evaluation_is_not_timed(ds, monkeypatch):
    # Evaluations that take eval_s each: none of it may enter the training time, nor the whole-split loss.
    # eval_s is long against three tiny steps, even on a loaded machine, so one timed evaluation shows.
    import ftlib.training.trainer as tr

    eval_s = 1.2

    calls = []

    def slow_estimate(*a, **k):
        time.sleep(eval_s)
        calls.append(1)
        return 5.0 - len(calls)  # the third evaluation (both splits: calls 5 and 6) is at or below 0.5 (the target)

    def slow_full(*a, **k):
        time.sleep(eval_s)
        return 0.25, 10

    monkeypatch.setattr(tr, "estimate_loss", slow_estimate)
    monkeypatch.setattr(tr, "full_split_loss", slow_full)
    rec = Recipe(steps=10, batch_size=2, block_size=16, eval_interval=2, eval_iters=1)
    out = train(preset("fasttransformer", **TINY), rec, ds, target_val_loss=0.5, progress=False)
    assert out["reached"]["step"] == 4 and len(calls) == 6
    # The steps after the first (tiny) hold no evaluation: three evaluations lie between them.
    assert out["reached"]["time_s"] - out["startup_s"] < eval_s and out["train_time_s"] == out["reached"]["time_s"]
    assert out["full_val_loss"] == 0.25 and out["full_val_s"] >= eval_s


def test_tiny_run_stores_the_rules_fields(ds, tmp_path, monkeypatch):
    from ftlib.harness.convergence import run_key, run_study

    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr("ftlib.harness.convergence.sample_text", lambda *a, **k: "")
    cfg = preset("fasttransformer", **TINY)
    rec = Recipe(steps=200, batch_size=8, block_size=16, lr=3e-3, eval_interval=10, eval_iters=2)
    (row,) = run_study("s", {"tiny": (cfg, rec)}, ds, [0], "cpu", target_val_loss=3.6, progress=False)
    assert row["key"] == run_key("s", cfg, rec, 3.6)  # the new fields leave the key as it was
    assert row["steps_to_target"] is not None and 0 < row["steps_to_target"] < 200
    assert row["tokens_to_target"] == row["steps_to_target"] * 8 * 16
    assert row["val_loss_at_target"] <= 3.6
    assert row["full_val_positions"] == len(ds.val) - 1 and row["full_val_eval_s"] > 0
    assert math.isfinite(row["full_val_loss_at_target"])
    assert abs(row["full_val_loss_at_target"] - row["val_loss_at_target"]) < 0.3
    # A run that does not reach its target records none of them.
    short = rec.replace(steps=2, eval_interval=2)
    (miss,) = run_study("s", {"tiny": (cfg, short)}, ds, [0], "cpu", target_val_loss=0.1, progress=False)
    assert miss["full_val_loss_at_target"] is None and miss["tokens_to_target"] is None


def _run(model: str, seed: int, stop_loss: float, steps: int | None, t: float | None = None, device: str = "h200",
         target: float = 1.5, startup: float = 2.0, full: float | None = None) -> dict:
    """A stored speedrun row: evaluations every 100 steps down to ``stop_loss`` at ``steps`` (None: never
    at or below the target, ending at ``stop_loss`` after 1,000 steps), ``t`` s of steps after the startup."""
    end = steps or 1000
    hist = [{"step": s, "tokens": s * B * T, "time_s": (startup + (t or 1.0) * s / end) if s else 0.0,
             "val_loss": 4.0 - (4.0 - stop_loss) * s / end} for s in range(0, end + 1, 100)]
    reached = steps is not None
    return {"device_slug": device, "model": model, "seed": seed, "status": "ok", "target": target,
            "config_hash": "c", "params": 1, "config": {"n_embd": 384 if model == REFERENCE else 256},
            "recipe": {"batch_size": B, "block_size": T, "lr": 1e-3 if model == REFERENCE else 3e-3},
            "history": hist, "startup_s": startup, "steps_to_target": steps,
            "time_to_target_excl_startup_s": t if reached else None,
            "full_val_loss_at_target": full}  # rows stored before the field lack it: full=None below


def test_p_value_is_the_one_sided_t_test():
    losses = [1.4986, 1.4992, 1.4988, 1.4995]
    want = stats.ttest_1samp(losses, 1.5, alternative="less").pvalue
    two = stats.ttest_1samp(losses, 1.5).pvalue
    assert p_value(losses, 1.5) == pytest.approx(want) and want < 0.01 < two  # two-sided would not pass
    rows = [_run("c", s, v, 1000, t=3.0) for s, v in enumerate(losses)]
    (line,) = standings(rows, "h200", (1.5,))
    assert line["p-value"] == pytest.approx(want) and line[SIGNIFICANT] is True
    # Losses above the target: the one-sided p is near 1 (two-sided it would be small).
    high = [1.52, 1.521, 1.519]
    assert p_value(high, 1.5) > 0.99 > 0.01 > stats.ttest_1samp(high, 1.5).pvalue
    assert p_value([1.49], 1.5) is None and p_value([1.49, 1.49], 1.5) is None  # one seed; no spread


def test_leaderboard_per_device_ranks_only_candidates_that_always_reached():
    rows = ([_run(REFERENCE, s, 1.490 - s / 1000, 1300, t=10.0 + s) for s in range(3)]
            + [_run("fast", s, 1.496 - s / 1000, 1200, t=3.0 + s / 10) for s in range(3)]
            + [_run("flaky", s, 1.495, 1000, t=2.0) for s in range(2)] + [_run("flaky", 2, 1.503, None)]
            # another GPU's runs of the same names: never pooled with the h200's
            + [_run("fast", s, 1.45 + s / 1000, 500, t=100.0, device="a100") for s in range(4)]
            + [_run("flaky", 2, 1.51, None, device="a100")])
    board = {b["candidate"]: b for b in standings(rows, "h200", (1.5,))}
    assert list(board) == ["fast", REFERENCE, "flaky"]  # claimed fastest first, the rest after
    fast, ref, flaky = board["fast"], board[REFERENCE], board["flaky"]
    assert fast["rank"] == 1 and ref["rank"] == 2 and flaky["rank"] is None
    assert fast["seeds reached"] == "3/3" and fast["time to target s (mean)"] == pytest.approx(3.1)
    assert fast["time to target s (min–max)"] == "3.00–3.20"
    assert fast["tokens to target (mean)"] == 1200 * B * T and fast["steps to target (mean)"] == 1200
    assert fast["speed-up vs nanoGPT"] == pytest.approx(11.0 / 3.1) and ref["speed-up vs nanoGPT"] == 1.0
    assert flaky["seeds reached"] == "2/3" and flaky["did not reach"] == 1
    assert flaky["time to target s (mean)"] is None and flaky["speed-up vs nanoGPT"] is None
    assert flaky[NOT_CLAIMED].startswith("2 of 3 seeds reached") and flaky[STOP_LOSS] is None
    a100 = {b["candidate"]: b for b in standings(rows, "a100", (1.5,))}
    assert a100["fast"]["seeds reached"] == "4/4" and a100["fast"]["time to target s (mean)"] == 100.0
    assert a100["flaky"]["seeds reached"] == "0/1"
    assert leaderboard(rows, "t4").empty
    assert "Tesla T4: no speedrun rows" in findings(rows, "t4")
    # The table for readers: short ids ("fast" ran first: C1), the target to four decimals.
    shown = leaderboard(rows, "h200", (1.5,))
    assert list(shown["id"]) == ["C1", "nanoGPT", "C2"] and set(shown["target"]) == {"1.5000"}
    assert "candidate" not in shown and max(len(str(v)) for v in shown["id"]) <= 8
    fig = leaderboard_figure(rows, "h200")
    assert {t.name for t in fig.data} == {"#2 nanoGPT (reference), 11.00 s", "#1 C1, 3.10 s"}
    assert len(fig.data) == 2 * 6  # six runs, each against time and against tokens


def test_a_time_is_claimed_only_with_three_seeds_and_p_below_001():
    # "solo" is the fastest, on one seed; "loose" reached on three seeds but its losses sit at the target
    # (p = 0.037); "sure" is slower and passes. Only "sure" and the reference are ranked and get a speed-up.
    rows = ([_run(REFERENCE, s, 1.490 - s / 1000, 1300, t=10.0 + s) for s in range(3)]
            + [_run("solo", 0, 1.49, 400, t=1.0)]
            + [_run("loose", s, v, 600, t=2.0) for s, v in enumerate((1.4985, 1.4990, 1.4995))]
            + [_run("sure", s, 1.496 - s / 1000, 900, t=4.0) for s in range(3)])
    board = {b["candidate"]: b for b in standings(rows, "h200", (1.5,))}
    assert 0.01 < board["loose"]["p-value"] < 0.05
    assert [c for c, b in board.items() if b["rank"] is not None] == ["sure", REFERENCE]
    assert board["sure"]["rank"] == 1 and board["sure"]["speed-up vs nanoGPT"] == pytest.approx(11.0 / 4.0)
    for name, why in (("solo", "1 seed (a claim needs 3)"), ("loose", f"p = {board['loose']['p-value']:.2g}")):
        assert board[name]["rank"] is None and board[name]["speed-up vs nanoGPT"] is None
        assert board[name][NOT_CLAIMED] == why
    assert list(board)[2:] == ["solo", "loose"]  # the unclaimed after the claimed, by time
    assert leader(rows, "h200") == "sure" and leader(rows[:3], "h200") is None
    text = findings(rows, "h200")
    assert "Fastest claimed, #1 C3" in text and "solo" not in text


def test_full_split_column_and_second_target():
    # Runs aimed at 1.50 say nothing about 1.4697; a run aimed at 1.4697 counts for both, its time to
    # 1.50 read off its history. Rows without the whole-split loss show a gap.
    rows = [_run("old", s, 1.498, 1000, t=4.0) for s in range(2)]
    rows += [_run("new", s, 1.4690, 1000, t=5.0, target=1.4697, full=1.470 + s / 100) for s in range(2)]
    board = standings(rows, "h200")
    second = [b for b in board if b["target"] == 1.4697]
    assert [b["candidate"] for b in second] == ["new"]
    assert second[0]["full-split loss at stop (mean)"] == pytest.approx(1.475)
    first = {b["candidate"]: b for b in board if b["target"] == 1.5}
    assert first["old"]["full-split loss at stop (mean)"] is None
    new = first["new"]  # 4.0 -> 1.469 over 1,000 steps: first at or below 1.50 at step 1,000 too
    assert new["steps to target (mean)"] == 1000 and new["full-split loss at stop (mean)"] == pytest.approx(1.475)
    text = table_bundle(board)["text/plain"]
    assert MISSING in text.splitlines()[2]  # the old row's gap
    assert "no run aimed at it" in findings(rows[:2], "h200")


def test_full_split_loss_shows_only_where_every_seed_has_it():
    rows = [_run("c", 0, 1.49, 1000, t=3.0, full=1.48), _run("c", 1, 1.49, 1000, t=3.0)]
    (line,) = standings(rows, "h200", (1.5,))
    assert line["full-split loss at stop (mean)"] is None
    assert np.isclose(line["val loss at stop (mean)"], 1.49)


def test_p_value_uses_the_whole_split_loss_where_every_seed_has_it():
    # Sampled losses below the target (selected by the stop), whole-split losses above it: the test on the
    # whole split is the one reported, and it does not pass.
    sampled, full = [1.4986, 1.4992, 1.4988, 1.4995], [1.503, 1.505, 1.502, 1.506]
    rows = [_run("c", s, v, 1000, t=3.0, full=f) for s, (v, f) in enumerate(zip(sampled, full))]
    (line,) = standings(rows, "h200", (1.5,))
    assert line["p-value from"] == "whole split" and line[SIGNIFICANT] is False
    assert line["p-value"] == pytest.approx(stats.ttest_1samp(full, 1.5, alternative="less").pvalue)
    rows[0]["full_val_loss_at_target"] = None  # one seed without it: back to the sampled estimates
    (line,) = standings(rows, "h200", (1.5,))
    assert line["p-value from"] == "sampled estimate" and line[SIGNIFICANT] is True


def test_the_figure_stops_each_curve_at_the_target():
    # A run aimed at 1.4697 crosses 1.50 on its way: the race to 1.50 ends there, its later
    # evaluations (training on, maybe overfitting) are not drawn in the figure for 1.50.
    rows = [_run("deep", s, 1.48 - s / 1000, 1000, t=5.0, target=1.4697) for s in range(3)]
    for r in rows:  # on past 1.50, then rising
        r["history"] += [{"step": 1000 + 100 * i, "tokens": (1000 + 100 * i) * B * T, "time_s": 7.0 + 0.5 * i,
                          "val_loss": 1.48 + 0.05 * i} for i in range(1, 5)]
    fig = leaderboard_figure(rows, "h200", target=1.5)
    assert len(fig.data) == 2 * 3
    for tr in fig.data:
        assert len(tr.y) == 11 and tr.y[-1] <= 1.48  # ends at the first point at or below 1.50


def test_a_seed_run_again_for_a_lower_target_is_one_sample():
    # The record suite re-runs a candidate's seeds aimed at 1.4697; for 1.50 each seed counts once,
    # from the run aimed at 1.50, or the lower-aimed run where the seed has no other.
    rows = [_run("c", s, 1.49, 1000, t=3.0) for s in range(2)]
    rows += [_run("c", s, 1.46, 2000, t=9.0, target=1.4697) for s in range(3)]
    (line,) = standings(rows, "h200", (1.5,))
    assert line["seeds reached"] == "3/3"
    stops = seed_stops(rows, 1.5)
    assert sorted(stops["seed"]) == [0, 1, 2] and (stops.set_index("seed")["step"][:2] == 1000).all()


def test_the_head_to_head_races_the_stored_leader():
    """The suite's candidate is the leaderboard's fastest claimed candidate of the stored H200 rows: when a new
    leader is claimed, this fails until HEAD_TO_HEAD names it."""
    from ftlib.harness.studies import HEAD_TO_HEAD, suites
    from ftlib.views.bench import ok_rows
    from ftlib.views.leaderboard import leader

    rows = [r for r in ok_rows("speedrun") + ok_rows("speedrun-record") if r["device_slug"] == "h200"]
    assert HEAD_TO_HEAD == (REFERENCE, leader(rows, "h200"))
    table = suites(False)["speedrun-head-to-head"]
    assert list(table["runs"]) == list(HEAD_TO_HEAD) and len(table["seeds"]) >= 5


def test_head_to_head_view_sets_the_two_sides_of_one_call_against_each_other():
    from ftlib.views.speedrun import head_to_head

    lead = "256x6 leader"
    rows = ([_run(REFERENCE, s, 1.49, 2000, t=12.0, full=1.488) for s in range(3)]
            + [_run(lead, s, 1.49, 600, t=2.0 + 0.5 * s, full=1.485) for s in range(3)])
    table, text = head_to_head(rows, "h200")
    ref, cand = table
    assert (ref["id"], ref["seeds"], ref["reached 1.50"], ref["time to 1.50 s (mean)"]) == ("nanoGPT", 3, 3, 12.0)
    assert cand["time to 1.50 s (mean)"] == 2.5 and cand["whole-split loss at the stop (mean)"] == 1.485
    assert "2.50 s of training steps against nanoGPT's 12.00 s: 4.80×" in text
    assert "no rows yet" in head_to_head(rows, "t4")[1]
    # The leaderboard's ids carry over: the leader keeps its own id, not the race's first free one.
    table, text = head_to_head(rows, "h200", ids={"an earlier candidate": "C1", lead: "C28"})
    assert table[1]["id"] == "C28" and text.split(": ", 1)[1].startswith("C28 reaches 1.50")
