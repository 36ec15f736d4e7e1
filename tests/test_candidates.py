"""Chapter 8's short ids and legend (ftlib.views.candidates), the leader's sample, and the checkpoint's size label."""

from __future__ import annotations

import dataclasses

from ftlib.harness.studies import REFERENCE, SMOKE_MODEL, speedrun_candidates
from ftlib.views.candidates import id_of, in_words, legend, short_ids
from ftlib.views.convergence import checkpoint_table
from ftlib.views.speedrun import samples


def _row(model: str, date: str, seed: int = 0, **extra) -> dict:
    cfg, rec = speedrun_candidates()[model] if model in speedrun_candidates() else speedrun_candidates()[REFERENCE]
    return {"model": model, "date": date, "seed": seed, "config": cfg.to_dict(), "recipe": dataclasses.asdict(rec),
            **extra}


def test_ids_follow_the_first_run_and_stay_when_candidates_are_added():
    names = [n for n in speedrun_candidates() if n != REFERENCE]
    rows = [_row(names[2], "2026-12-01"), _row(REFERENCE, "2026-12-01"), _row(names[0], "2026-12-02"),
            _row(names[2], "2026-12-03", seed=1), _row(names[1], "2026-12-02")]
    ids = short_ids(rows)
    assert ids == {REFERENCE: "nanoGPT", names[2]: "C1", names[0]: "C2", names[1]: "C3"}
    # A candidate run later gets the next id; one whose later runs are listed first keeps its own.
    later = [_row(names[3], "2026-12-04")] + rows
    assert short_ids(later) == {**ids, names[3]: "C4"}
    assert id_of(ids, names[0] + " (1,234 params)") == "C2 (1,234 params)" and id_of(ids, "other") == "other"


def test_legend_is_one_short_line_per_id():
    names = [n for n in speedrun_candidates() if n != REFERENCE]
    muon = next(n for n in names if speedrun_candidates()[n][1].optimizer == "muon")
    rows = [_row(REFERENCE, "2026-12-01"), _row(muon, "2026-12-01"), _row(muon, "2026-12-01", seed=1)]
    table = legend.rows(rows)
    assert [x["id"] for x in table] == ["nanoGPT", "C1"]
    ref, c1 = table
    assert ref["model"] == "384x6 GPT-2 style" and ref["execution"] == "compile default"
    assert c1["model"].startswith("256x6 FT-style") and c1["optimizer (lr)"].startswith("Muon ")
    assert c1["schedule"].startswith("trapezoid (cool-down ") and "bf16 weights and norms" in c1["engine options"]
    assert all(len(str(v)) < 70 for x in table for v in x.values())  # no stored name in the legend
    assert len(in_words(rows[1])) < 200 and len(muon) > len(in_words(rows[1])) / 2


def test_samples_show_the_leader_not_the_fastest_seed_0():
    # "quick" has the fastest seed 0 but is not the leader: the leader's sample is shown, and the reference's.
    rows = [{"model": m, "seed": 0, "device_slug": "h200", "status": "ok", "target": 1.5, "history": [],
             "steps_to_target": s, "time_to_target_s": t, "best_val_loss": 1.49, "sample": f"text of {m}"}
            for m, s, t in (("quick", 300, 1.0), ("lead", 600, 2.0), (REFERENCE, 1200, 12.0))]
    text = samples([], rows, {"h200": "lead"}, ids={REFERENCE: "nanoGPT", "quick": "C1", "lead": "C2"})
    assert "text of lead" in text and "text of quick" not in text and f"text of {REFERENCE}" in text
    assert "the leader: C2 (H200, seed 0, stopped at step 600" in text
    assert "text of quick" not in samples([], rows, {"h200": None})


def test_checkpoint_table_says_when_the_model_is_a_tiny_smoke_model():
    check = {"model": "long name", "steps": 20, "best val loss": 3.49, "sample": "x"}
    (smoke,) = checkpoint_table.rows({**check, "config": dict(SMOKE_MODEL, n_head=6)}, "C1")
    assert smoke["model"] == "C1" and smoke["trained"].startswith("tiny smoke model")
    (full,) = checkpoint_table.rows({**check, "config": {"n_layer": 6, "n_embd": 256, "block_size": 256}})
    assert full["model"] == "long name" and full["trained"] == "full size: 6 layers of width 256"
    assert "sample" not in full and "config" not in full
