"""The training loop on a tiny model: it learns, evaluates on held-out data, checkpoints."""

import pytest
import torch

from ftlib import preset
from ftlib.data import load_tinyshakespeare
from ftlib.trainer import Recipe, load_checkpoint, recipe, train

TINY = dict(n_layer=1, n_embd=32, n_head=4, n_kv_head=1, block_size=32)


@pytest.fixture(scope="module")
def ds():
    return load_tinyshakespeare(download=False)


def test_tiny_model_learns_and_checkpoints(ds, tmp_path):
    rec = Recipe(steps=60, batch_size=8, block_size=32, lr=3e-3, eval_interval=20, eval_iters=4)
    ck = tmp_path / "ck.pt"
    out = train(preset("fasttransformer", **TINY), rec, ds, progress=False, checkpoint=ck)
    h = out["history"]
    assert [e["step"] for e in h] == [0, 20, 40, 60]
    assert h[-1]["val_loss"] < h[0]["val_loss"] - 0.5
    assert h[-1]["time_s"] > 0 and out["best_val_loss"] == min(e["val_loss"] for e in h)
    model, meta = load_checkpoint(ck)
    x = torch.randint(0, 65, (2, 16))
    out["model"].eval()
    model.eval()
    torch.testing.assert_close(model(x)[0], out["model"](x)[0])
    assert meta["result"]["config_hash"] == preset("fasttransformer", **TINY).config_hash()


def test_target_stops_early(ds):
    rec = Recipe(steps=200, batch_size=8, block_size=32, lr=3e-3, eval_interval=10, eval_iters=2)
    out = train(preset("fasttransformer", **TINY), rec, ds, target_val_loss=3.6, progress=False)
    assert out["reached"] is not None and out["reached"]["val_loss"] <= 3.6
    assert out["steps_done"] < 200


def test_lr_schedule_matches_nanogpt():
    r = recipe("nanogpt-char")
    assert r.lr_at(0) == pytest.approx(1e-3 / 101)
    assert r.lr_at(100) == pytest.approx(1e-3)
    assert r.lr_at(5000) == pytest.approx(1e-4)
    assert r.lr_at(2550) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert recipe("original").lr_at(150) == 3e-4


def test_bad_recipe():
    with pytest.raises(ValueError, match="sampler='shuffled'"):
        Recipe(sampler="shuffled")
    with pytest.raises(ValueError, match="unknown recipe"):
        recipe("nope")


def test_study_is_resumable_and_aggregates(ds, tmp_path, monkeypatch):
    from ftlib.convergence import aggregate, run_study, summary

    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path))
    rec = Recipe(steps=10, batch_size=4, block_size=32, eval_interval=5, eval_iters=2)
    runs = {"tiny": (preset("fasttransformer", **TINY), rec)}
    rows = run_study("conv", runs, ds, [0, 1], "cpu", progress=False)
    assert len(rows) == 2 and rows[0]["history"][-1]["batch_loss"] is not None
    assert len(rows[0]["sample"]) == 300 and set(rows[0]["sample"]) <= set(ds.chars)
    assert run_study("conv", runs, ds, [0, 1], "cpu", progress=False) == []  # nothing left to do
    agg = aggregate(rows)["tiny"]
    assert [p["step"] for p in agg] == [0, 5, 10] and all(p["n_seeds"] == 2 for p in agg)
    assert agg[-1]["val_min"] <= agg[-1]["val_mean"] <= agg[-1]["val_max"]
    (line,) = summary(rows)
    assert line["seeds"] == 2 and line["reached"] == "0/2"
