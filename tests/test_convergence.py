"""The speedrun's bookkeeping: stored keys stay valid, candidates are well-formed, rows old and new
are summarized, a failed run is stored and retried, and the reference and the fastest get more seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ftlib import preset
from ftlib.harness.convergence import run_key, run_study, speedrun_finalists
from ftlib.harness.studies import (
    ALL_SEEDS,
    EXPLORING,
    EXPLORING_FASTER,
    EXPLORING_GROUPED,
    EXPLORING_SMALL_BATCH,
    EXPLORING_SMALLER,
    FINALIST_SEEDS,
    REFERENCE,
    speedrun_candidates,
    suites,
)
from ftlib.training.data import load_tinyshakespeare
from ftlib.training.trainer import Recipe
from ftlib.views.convergence import seed_table, suite_rows

STORED = Path(__file__).resolve().parent.parent / "data" / "results" / "h200"
BENCHES = ("convergence-original", "convergence", "convergence-nanogpt", "speedrun")


def _suite_keys(bench: str, spec: dict) -> set[str]:
    seeds = tuple(spec["seeds"]) + tuple(spec.get("more_seeds", ()))
    return {run_key(bench, cfg, rec.replace(seed=s), spec["target"])
            for s in seeds for cfg, rec in spec["runs"].values()}


def test_stored_rows_keep_their_keys():
    # The rows of every run the studies still list are found again by their keys (else they would be
    # run again); rows of candidates no longer listed keep their keys too (tests/test_keys.py).
    table = suites(smoke=False)
    found = 0
    for bench in BENCHES:
        path = STORED / f"{bench}.jsonl"
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        listed = {r["key"] for r in rows if r["model"] in table[bench]["runs"]}
        assert listed <= _suite_keys(bench, table[bench]), bench
        found += len(listed)
    if not found:
        pytest.skip("no stored GPU rows in this tree")
    # The reference's key, literally: its stored seed-0 row.
    cfg, rec = speedrun_candidates()[REFERENCE]
    assert run_key("speedrun", cfg, rec, 1.50) == "bcbdd6faa70679a7"


def test_rows_of_candidates_no_longer_listed_are_still_shown():
    rows = [json.loads(line) for line in (STORED / "speedrun.jsonl").read_text().splitlines() if line.strip()]
    shown = suite_rows("speedrun", rows)
    assert len(shown) == len(rows) and {r["model"] for r in shown} - set(speedrun_candidates())
    assert suite_rows("speedrun", rows, smoke=True) == []


def test_speedrun_candidates_are_well_formed():
    cands = speedrun_candidates()
    exploring = [name for name, *_ in EXPLORING + EXPLORING_GROUPED + EXPLORING_FASTER + EXPLORING_SMALL_BATCH
                 + EXPLORING_SMALLER]
    assert list(cands) == [REFERENCE, *ALL_SEEDS, *exploring]
    engine = {n: (c, r) for n, (c, r) in cands.items() if r.engine}
    assert set(engine) == set(ALL_SEEDS) | set(exploring)
    assert all(r.compile is None and r.precision == "bf16" for _, r in engine.values())
    assert all("engine" in n for n in engine)
    for name, (cfg, rec) in cands.items():
        cfg.check_sequence(rec.block_size)
        if "cosine to" in name:  # a horizon (<= 160k sequences), named in the label; steps capped at twice it
            assert rec.decay_steps * rec.batch_size <= 160_000 and f"{rec.decay_steps:,}" in name
            assert rec.steps == 2 * rec.decay_steps
            assert f"dropout {cfg.dropout}" in name and cfg.attn_dropout == 0.0
        if "trapezoid to" in name:  # the held-then-cooled schedule, its horizon and cool-down in the label
            assert rec.schedule == "trapezoid" and f"{rec.decay_steps:,}" in name and f"{rec.cooldown}" in name
            assert rec.steps == 2 * rec.decay_steps and rec.optimizer == "muon" and f"Muon {rec.muon_lr:g}" in name
            assert ("ReLU²" in name) == (cfg.activation == "relu2") and ("QK-norm" in name) == cfg.qk_norm
            assert ("grouped Muon" in name) == (("muon_grouped", True) in rec.engine_options)
            assert f"AdamW {rec.lr:.0e}".replace("e-03", "e-3") in name and rec.min_lr == pytest.approx(rec.lr / 10)
        assert ("batch 32" in name) == (rec.batch_size == 32), name  # a batch other than 64 is named
        width, depth = name.split(" ", 1)[0].split("x") if name[0].isdigit() else (None, None)
        if width is not None:  # a label that opens with the model's shape names it right
            assert (cfg.n_embd, cfg.n_layer) == (int(width), int(depth)), name


def _row(model, seed, t=None, startup=None, status="ok"):
    r = {"model": model, "seed": seed, "status": status, "params": 10, "best_val_loss": 1.49,
         "train_time_s": 5.0, "target": 1.5, "time_to_target_s": t, "history": [],
         "steps_to_target": 100 if t is not None else None}
    if startup is not None:  # rows stored before startup was recorded have neither field
        r["startup_s"] = startup
        r["time_to_target_excl_startup_s"] = t - startup if t is not None else None
    return r


def test_summary_reads_old_and_new_rows_and_finalists():
    rows = [_row(REFERENCE, 0, 40.0), _row(REFERENCE, 1, 44.0, startup=30.0),
            _row("a", 0, 20.0, startup=2.0), _row("b", 0, 9.0, startup=1.0), _row("c", 0, None, startup=1.0),
            _row("old", 0, 5.0), _row("d", 0, status="error")]
    table = {r["model"]: r for r in seed_table.rows(rows)}
    assert set(table) == {REFERENCE, "a", "b", "c", "old"}  # the failed run is left out
    ref = table[REFERENCE]
    assert ref["time to target s (mean)"] == 42.0 and ref["excl. startup s (mean)"] == 14.0
    assert ref["startup s (mean)"] == 30.0 and ref["reached"] == "2/2"
    assert table["old"]["excl. startup s (mean)"] is None and table["c"]["reached"] == "0/1"
    # Seeds 1 and 2 go to the reference and the fastest excluding startup ('old' has no such figure).
    assert speedrun_finalists(rows) == [REFERENCE, "b"]
    assert speedrun_finalists([_row(REFERENCE, 0, 40.0)]) == [REFERENCE]
    # Named candidates get the seeds too, once each, after the fastest.
    assert speedrun_finalists(rows, always=("c", "b")) == [REFERENCE, "b", "c"]
    assert all(n in speedrun_candidates() for n in ALL_SEEDS)
    # A suite without a target trains a fixed number of steps: no target, so no time to it and no "reached";
    # its startup stands beside the training time that includes it, where the rows record one.
    plain = seed_table.rows([{**_row("m", 0), "target": None}])[0]
    assert not {"excl. startup s (mean)", "time to target s (mean)", "reached"} & set(plain)
    assert "startup s (mean)" not in plain  # this row records none
    timed = seed_table.rows([{**_row("m", 0, startup=2.0), "target": None}])[0]
    assert timed["train time s (mean)"] == 5.0 and timed["startup s (mean)"] == 2.0


def test_failed_run_is_stored_and_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path))
    ds = load_tinyshakespeare(download=False)
    tiny = preset("fasttransformer", n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=16)
    rec = Recipe(steps=2, batch_size=2, block_size=32, eval_interval=2, eval_iters=1)  # T=32 > block_size=16
    (row,) = run_study("s", {"too long": (tiny, rec)}, ds, [0], "cpu", progress=False)
    assert row["status"] == "error" and "block_size=16" in row["error"]
    (again,) = run_study("s", {"too long": (tiny, rec)}, ds, [0], "cpu", progress=False)
    assert again["key"] == row["key"] and again["status"] == "error"  # tried again, not skipped
    assert seed_table.rows([row]) == []


def test_speedrun_smoke_runs_engine_candidates_and_extra_seeds(tmp_path, monkeypatch):
    # The whole speedrun suite at smoke size on CPU (engine candidates uncaptured, on PyTorch
    # ops): every candidate with seed 0, then FINALIST_SEEDS for the reference and the fastest.
    from ftlib.harness.convergence import run_suites

    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path))
    # Kernels off (the engine reads this when built): Triton's interpreter would take minutes here;
    # tests/test_trainer.py checks the engine path with its kernels.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr("ftlib.harness.convergence.sample_text", lambda *a, **k: "")  # sampling is tested elsewhere
    rows = run_suites(["speedrun"], "cpu", smoke=True)
    n = len(speedrun_candidates())
    assert [r["status"] for r in rows] == ["ok"] * len(rows), [r.get("error") for r in rows]
    assert [r["seed"] for r in rows[:n]] == [0] * n
    extra = rows[n:]
    # The reference, ALL_SEEDS, and the fastest if one reached the target (it may be in ALL_SEEDS).
    seeds = sorted(r["seed"] for r in extra)
    assert seeds in (sorted(FINALIST_SEEDS * (k + len(ALL_SEEDS))) for k in (1, 2)), seeds
    assert {r["model"] for r in extra} >= {REFERENCE, *ALL_SEEDS}
    eng = [r for r in rows if r["execution"] == "engine"]
    assert len(eng) >= 5 and all(r["engine"] is not None and r["startup_s"] > 0 for r in eng)
    assert run_suites(["speedrun"], "cpu", smoke=True) == []  # resumable: nothing left


def test_speedrun_curves_take_the_startup_off_and_skip_runs_without_it():
    from ftlib.views.speedrun import speedrun_curves

    hist = [{"step": 0, "time_s": 0.0, "val_loss": 4.0}, {"step": 50, "time_s": 12.0, "val_loss": 2.0},
            {"step": 100, "time_s": 13.0, "val_loss": 1.49}]
    rows = [{**_row("a", 0, 13.0, startup=10.0), "history": hist},
            {**_row("a", 1, 13.0), "history": hist},  # no startup recorded
            {**_row("b", 0, 13.0, startup=1.0), "history": hist}]
    got = speedrun_curves(rows, ["a"])
    assert [(c["model"], c["seed"]) for c in got] == [("a", 0)]
    assert got[0]["time_s"] == [0.0, 2.0, 3.0] and got[0]["val_loss"] == [4.0, 2.0, 1.49]
    assert len(speedrun_curves(rows, ["a"], exclude_startup=False)) == 2


def test_keyless_engine_option_keeps_the_keys_of_earlier_runs():
    """("dropout_rng4", False) pins what runs stored before the option ran: same key without it."""
    from ftlib.training.trainer import recipe

    base = recipe("nanogpt-char").replace(compile=None, engine=True, engine_options=(("fuse_dropout", True),))
    pinned = base.replace(engine_options=base.engine_options + (("dropout_rng4", False),))
    new = base.replace(engine_options=base.engine_options + (("dropout_rng4", True),))
    assert pinned.key_repr() == base.key_repr() != new.key_repr()


def test_repeat_table_pairs_a_repeat_with_its_first_run():
    from ftlib.views.speedrun import repeat_table

    first = [dict(_row("m", 0, t=4.0), key="k0", time_to_target_excl_startup_s=3.0),
             dict(_row("m", 1, t=4.0), key="k1", time_to_target_excl_startup_s=3.5)]
    rep = [dict(_row("m", 0, t=5.0), key="k0", repeat_of_key="k0", time_to_target_excl_startup_s=3.6),
           dict(_row("m", 2), key="k9")]  # no first run stored: left out
    table = repeat_table.rows(first, rep)
    assert len(table) == 1 and table[0]["seed"] == 0
    assert table[0]["repeat / first"] == pytest.approx(1.2)


def test_repeat_runs_are_keyed_as_repeats_and_resume(tmp_path, monkeypatch):
    """A repeat suite stores '<first key>-repeat1' with repeat_of_key, once per run; rows stored
    before the option (key == first key, repeat_of_key set) count as that repeat."""
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr("ftlib.harness.convergence.sample_text", lambda *a, **k: "")
    ds = load_tinyshakespeare(download=False)
    tiny = preset("fasttransformer", n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=16)
    rec = Recipe(steps=2, batch_size=2, block_size=16, eval_interval=2, eval_iters=1, compile=None)
    runs = {"tiny": (tiny, rec)}
    (first,) = run_study("first", runs, ds, [0], "cpu", progress=False)
    (rep,) = run_study("again", runs, ds, [0], "cpu", progress=False, repeat_of="first")
    assert rep["status"] == "ok" and rep["key"] == first["key"] + "-repeat1"
    assert rep["repeat_of_key"] == first["key"]
    assert run_study("again", runs, ds, [0], "cpu", progress=False, repeat_of="first") == []
    # An older repeat row (same key as its first run) of seed 1 stands for seed 1's repeat.
    base1 = run_key("first", tiny, rec.replace(seed=1), None)
    (tmp_path / "cpu" / "again.jsonl").open("a").write(
        json.dumps({"key": base1, "repeat_of_key": base1, "status": "ok"}) + "\n")
    assert run_study("again", runs, ds, [1], "cpu", progress=False, repeat_of="first") == []
    (rep2,) = run_study("again", runs, ds, [2], "cpu", progress=False, repeat_of="first")
    assert rep2["seed"] == 2


def test_repeat_suite_repeats_the_reference_and_the_named_candidates():
    from ftlib.harness.studies import REPEATED, SUITE_ORDER

    table = suites(smoke=False)
    rep = table["speedrun-repeat"]
    assert rep["repeat_of"] == "speedrun" and set(rep["runs"]) == {REFERENCE, *REPEATED}
    assert set(REPEATED) <= set(ALL_SEEDS) and set(rep["seeds"]) == {0, *FINALIST_SEEDS}
    assert SUITE_ORDER.index("speedrun") < SUITE_ORDER.index("speedrun-repeat")
    assert all(rep["runs"][n] == table["speedrun"]["runs"][n] for n in rep["runs"])


def test_speedrun_pooled_pools_first_runs_and_repeats():
    from ftlib.views.speedrun import speedrun_pooled

    ref = [_row(REFERENCE, s, 10.0 + s, startup=0.0) for s in range(3)] + [_row(REFERENCE, 3, 40.0)]  # no excl.
    cand = [_row("c", s, 3.0, startup=0.0) for s in range(3)]
    reps = [_row(REFERENCE, 0, 12.0, startup=0.0), _row("c", 0, 4.0, startup=0.0)]
    p = speedrun_pooled(ref + cand, reps, "c")
    assert p["reference runs"] == 4 and p["candidate runs"] == 4 and p["reached"] == "4/4"
    assert p["speed-up excl. startup (pooled)"] == pytest.approx((45 / 4) / (13 / 4))
    lo, hi = p["90% interval"]
    assert lo <= p["speed-up excl. startup (pooled)"] <= hi and lo < hi
    assert p["speed-up vs fastest reference run"] == pytest.approx(10.0 / (13 / 4))
    assert speedrun_pooled(ref + cand, reps, "c") == p  # the same interval every time
    missed = speedrun_pooled(ref + cand, reps + [_row("c", 1, None, startup=0.0)], "c")
    assert missed["reached"] == "4/5" and missed["candidate runs"] == 5
    assert speedrun_pooled(cand, reps[1:], "c") is None  # no timed reference run


def test_checkpoint_roundtrip_reloads_the_trained_model(tmp_path):
    from ftlib.harness.convergence import checkpoint_roundtrip

    ds = load_tinyshakespeare(download=False)
    ck = checkpoint_roundtrip(ALL_SEEDS[-1], ds, "cpu", tmp_path / "ck.pt", smoke=True)
    assert (tmp_path / "ck.pt").exists() and ck["steps"] == 20
    assert ck["max |logit difference|"] == 0.0 and ck["same sample"] and ck["config hash matches"]
    assert ck["saved"] == ["config", "recipe", "result", "state_dict"] and len(ck["sample"]) == 300


def _stored_speedrun_runs():
    from ftlib.harness.results import ResultStore
    from ftlib.harness.studies import REPEATED

    root = Path(__file__).resolve().parent.parent / "data" / "results"
    rows, reps = ResultStore("speedrun", "h200", root).rows(), ResultStore("speedrun-repeat", "h200", root).rows()
    return [(rows, reps, c) for c in REPEATED]


def _synthetic_speedrun_runs():
    rng = np.random.default_rng(7)
    ref = [_row(REFERENCE, s, float(t), startup=0.0) for s, t in enumerate(rng.normal(60.0, 6.0, 9))]
    cand = [_row("c", s, float(t), startup=0.0) for s, t in enumerate(rng.normal(20.0, 3.0, 7))]
    return [(ref + cand, [], "c")]


@pytest.mark.parametrize("rows,repeats,candidate", _synthetic_speedrun_runs() + _stored_speedrun_runs())
def test_speedrun_interval_is_the_90_percent_percentile_bootstrap(rows, repeats, candidate):
    # An independent computation: scipy's two-sample percentile bootstrap of the ratio of means,
    # each side resampled on its own. The endpoints agree within Monte Carlo error (about 1% of
    # the width at 4,000 resamples); a 50% or 80% interval labelled 90% is 10-30% off.
    from scipy.stats import bootstrap

    from ftlib.harness.convergence import steady_time_to_target
    from ftlib.views.speedrun import speedrun_pooled

    p = speedrun_pooled(rows, repeats, candidate)
    pool = [r for r in rows + repeats if r.get("status", "ok") == "ok"]
    ref = np.array([t for r in pool if r["model"] == REFERENCE if (t := steady_time_to_target(r)) is not None])
    cand = np.array([t for r in pool if r["model"] == candidate if (t := steady_time_to_target(r)) is not None])
    assert len(ref) >= 5 and len(cand) >= 5
    ratio = lambda a, b, axis=-1: a.mean(axis=axis) / b.mean(axis=axis)  # noqa: E731
    assert p["speed-up excl. startup (pooled)"] == pytest.approx(ratio(ref, cand))
    ci = bootstrap((ref, cand), ratio, vectorized=True, paired=False, confidence_level=0.90, method="percentile",
                   n_resamples=40_000, rng=np.random.default_rng(3)).confidence_interval
    lo, hi = p["90% interval"]
    width = ci.high - ci.low
    assert width > 0
    assert abs(lo - ci.low) < 0.05 * width and abs(hi - ci.high) < 0.05 * width, ((lo, hi), (ci.low, ci.high))


def _run(dev: str, params: int, cfg: str, seed: int) -> dict:
    return {"device_slug": dev, "model": "gpt2", "config_hash": cfg, "params": params, "seed": seed, "status": "ok",
            "best_val_loss": 1.5 + seed / 100, "train_time_s": 1.0, "target": None, "history": []}


def test_convergence_summary_never_pools_devices_or_sizes():
    # The stored GPU runs of the full model, and a CPU smoke run of a tiny one under the same name.
    rs = [_run("h200", 4_837_888, "full", s) for s in (0, 1, 2)] + [_run("cpu", 12_345, "tiny", s) for s in (0, 1, 2)]
    rs += [_run("h200", 12_345, "tiny", 0)]  # a smoke run stored on the GPU
    lines = {(r["device"], r["params"]): r for r in seed_table.rows(rs)}
    assert set(lines) == {("h200", 4_837_888), ("cpu", 12_345), ("h200", 12_345)}
    assert lines[("h200", 4_837_888)]["seeds"] == 3 and lines[("cpu", 12_345)]["seeds"] == 3


def test_the_time_axis_leaves_out_each_runs_startup():
    """A cold compile cache makes the first seed's startup long and the others' short: over the steps
    after it, the seeds ran alike, and the curve's clock must say so."""
    from ftlib.views.convergence import aggregate, loss_figures

    def run(seed: int, startup: float) -> dict:
        hist = [{"step": k, "tokens": k * 10, "time_s": 0.0 if k == 0 else startup + 0.01 * (k - 1),
                 "val_loss": 2.0 - k / 1000, "train_loss": 2.0} for k in (0, 100, 200)]
        return {**_run("h200", 1_000, "full", seed), "history": hist, "startup_s": startup}

    rows = [run(0, 10.0), run(1, 0.1), run(2, 0.1)]
    pts = aggregate(rows)["GPT-2"]  # named as the book names the model
    assert [p["steady_s"] for p in pts] == pytest.approx([0.0, 0.99, 1.99])
    assert pts[1]["time_s"] == pytest.approx(0.99 + 10.2 / 3)  # the clock with the startup: skewed by seed 0
    (time_fig,) = [f for name, f in loss_figures(rows) if "steady_s" in name]
    assert list(time_fig.data[0].x) == pytest.approx([0.0, 0.99, 1.99])
    assert "excluding startup" in time_fig.layout.xaxis.title.text
    # the axis is cut above the second evaluation, and the title says what runs off it
    assert time_fig.layout.yaxis.range[1] == pytest.approx(1.95)
    assert "the axis stops at 1.95: the first evaluation (up to 2.00) runs off the top" in time_fig.layout.title.text


def test_suite_rows_keep_the_suites_own_size():
    full, smoke = (suites(s)["convergence"]["runs"]["gpt2"][0].config_hash() for s in (False, True))
    rs = [{"model": "gpt2", "config_hash": full}, {"model": "gpt2", "config_hash": smoke},
          {"model": "not a suite model", "config_hash": full}]
    assert suite_rows("convergence", rs) == rs[:1]
    assert suite_rows("convergence", rs, smoke=True) == rs[1:2]


def test_runs_aimed_at_a_lower_loss_do_not_replace_speedrun_runs():
    """The record suite trains the same candidates to 1.4697; its runs of a seed must not stand in for
    that seed's speedrun run (a longer horizon, so a slower time to 1.50, or none recorded)."""
    from ftlib.views.speedrun import speedrun_pooled

    rows = [_row(m, s, t, startup=1.0) for m, t in ((REFERENCE, 31.0), ("fast", 11.0)) for s in range(3)]
    record = [{**_row("fast", s, None, startup=1.0), "target": 1.4697} for s in range(2)]
    for extra in ([], record):
        p = speedrun_pooled(rows + extra, [], "fast")
        assert p["candidate runs"] == 3 and p["reached"] == "3/3"
        assert p["speed-up excl. startup (pooled)"] == pytest.approx(3.0)
