"""The training loop on a tiny model: it learns, evaluates on held-out data, checkpoints."""

import pytest
import torch

from ftlib import preset
from ftlib.training.data import load_tinyshakespeare
from ftlib.training.trainer import Recipe, load_checkpoint, recipe, train

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
    from ftlib.harness.convergence import run_study
    from ftlib.views.convergence import aggregate, seed_table

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
    (line,) = seed_table.rows(rows)
    assert line["seeds"] == 2 and "reached" not in line  # a fixed number of steps: no target to reach


# The engine's kernels need a head size in (16, 32, 64, 128): 64 / 4 = 16, one layer, T = 16.
ENGINE_TINY = dict(n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=16, init="gpt2", tie_weights=True)


def _final_params(out):
    return torch.cat([p.detach().reshape(-1) for _, p in sorted(out["model"].named_parameters())])


def test_engine_path_matches_plain_path(ds, tmp_path):
    # Same seed, batches, lr schedule (warm-up then cosine) and weight decay; grad_clip small
    # enough to clip every step. fp32 on CPU: the kernels only reorder float sums.
    rec = Recipe(steps=5, batch_size=2, block_size=16, lr=3e-3, min_lr=3e-4, warmup=2, decay_steps=5,
                 betas=(0.9, 0.99), weight_decay=0.1, grad_clip=0.05, eval_interval=5, eval_iters=1)
    cfg = preset("fasttransformer", **ENGINE_TINY)
    plain = train(cfg, rec, ds, progress=False)
    ck = tmp_path / "engine.pt"
    # Strict fp32 keeps SDPA's attention by default; the recipe's engine_options put the kernel in.
    eng = train(cfg, rec.replace(engine=True, engine_options=(("attention_precision", "ieee"),)), ds,
                progress=False, checkpoint=ck)
    assert {"rmsnorm", "attention", "cross_entropy", "adamw"} <= set(eng["engine"]["kernels"])
    assert eng["engine"]["grad_clip"] == 0.05 and plain["engine"] is None
    for a, b in zip(plain["history"], eng["history"], strict=True):
        assert a["step"] == b["step"]
        for k in ("train_loss", "val_loss", "batch_loss"):
            if a[k] is not None:
                assert b[k] == pytest.approx(a[k], rel=1e-5), (k, a["step"])
    w_plain, w_eng = _final_params(plain), _final_params(eng)
    assert float((w_eng - w_plain).norm() / w_plain.norm()) < 1e-5
    # Without clipping the weights end elsewhere: the tolerance above can see a missing clip.
    unclipped = _final_params(train(cfg, rec.replace(grad_clip=None), ds, progress=False))
    assert float((unclipped - w_plain).norm() / w_plain.norm()) > 1e-3
    # The returned model and the checkpoint are plain GPTs with the trained weights.
    model, _ = load_checkpoint(ck)
    x = torch.randint(0, 65, (2, 16))
    model.eval()
    eng["model"].eval()
    assert type(eng["model"]).__name__ == "GPT"
    torch.testing.assert_close(model(x)[0], eng["model"](x)[0])


def test_startup_is_timed_apart(ds):
    rec = Recipe(steps=6, batch_size=4, block_size=32, eval_interval=3, eval_iters=1)
    out = train(preset("fasttransformer", **TINY), rec, ds, progress=False)
    assert out["first_step_s"] > 0 and out["build_s"] > 0
    assert out["startup_s"] == pytest.approx(out["build_s"] + out["first_step_s"])
    times = [e["time_s"] for e in out["history"]]
    assert times[0] == 0 and times[1] >= out["startup_s"] and times == sorted(times)
    assert out["train_time_s"] == pytest.approx(times[-1])


def test_recipe_engine_validation_and_key():
    with pytest.raises(ValueError, match="engine=True with compile='default'"):
        Recipe(engine=True, compile="default")
    with pytest.raises(ValueError, match="decay_scheme='all'"):
        Recipe(engine=True, decay_scheme="all")
    with pytest.raises(ValueError, match="precision='fp64'"):
        Recipe(precision="fp64")
    # The key string leaves out fields added later while at their default (stored keys stay valid).
    r = recipe("nanogpt-char")
    assert "engine" not in r.key_repr()
    unset = (", engine=False", ", engine_options=()", ", optimizer='adamw'", ", muon_lr=0.02", ", schedule='cosine'",
             ", cooldown=None")
    want = repr(r)
    for field in unset:  # fields at their default stay out of the key, as before they existed
        want = want.replace(field, "")
    assert r.key_repr() == want
    with pytest.raises(ValueError, match="engine_options"):
        Recipe(engine_options=(("fuse_residual_norm", True),))  # needs engine=True
    with pytest.raises(ValueError, match="not in"):
        Recipe(engine=True, engine_options=(("capture", False),))
    assert "engine=True" in r.replace(compile=None, engine=True).key_repr()


def test_progress_bar_is_quiet_without_importing_tqdm_auto():
    import subprocess
    import sys

    # A fresh interpreter: tqdm.auto must not be imported by a run without a bar (it warns in
    # notebooks without ipywidgets), and must be by a run with one.
    code = ("import sys; from ftlib.core.progress import progress_bar; b = progress_bar(range(3), False); "
            "b.set_postfix(a=1); b.set_postfix_str('x'); assert list(b) == [0, 1, 2]; "
            "assert 'tqdm.auto' not in sys.modules; "
            "t = progress_bar(range(3), True, disable=True); assert list(t) == [0, 1, 2]; "
            "assert 'tqdm.auto' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)



def test_the_trapezoid_holds_then_cools_down_linearly():
    r = Recipe(steps=100, lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=100, schedule="trapezoid", cooldown=40)
    assert r.lr_at(0) == pytest.approx(1e-3 / 11) and r.lr_at(10) == r.lr_at(59) == 1e-3
    assert r.lr_at(60) == 1e-3 and r.lr_at(80) == pytest.approx(5.5e-4) and r.lr_at(100) == pytest.approx(1e-4)
    assert "schedule='trapezoid'" in r.key_repr() and "cooldown=40" in r.key_repr()
    with pytest.raises(ValueError, match="needs cooldown"):
        Recipe(min_lr=1e-4, schedule="trapezoid")
    with pytest.raises(ValueError, match="applies to schedule='trapezoid' only"):
        Recipe(cooldown=10)
    with pytest.raises(ValueError, match="optimizer='sgd' is not one of"):
        Recipe(optimizer="sgd")


def test_a_muon_recipe_trains_both_ways(tmp_path):
    """optimizer='muon' through plain steps and through the engine, on the CPU: both lower the loss."""
    ds = load_tinyshakespeare()
    cfg = preset("fasttransformer", n_layer=1, n_embd=32, n_head=2, n_kv_head=1, block_size=16)
    rec = Recipe(steps=20, batch_size=4, block_size=16, lr=3e-3, min_lr=3e-4, warmup=2, decay_steps=20,
                 schedule="trapezoid", cooldown=10, optimizer="muon", muon_lr=0.02, eval_interval=20, eval_iters=2)
    plain = train(cfg, rec, ds, "cpu", progress=False)
    engine = train(cfg, rec.replace(engine=True, engine_options=(("use_kernels", False),)), ds, "cpu",
                   progress=False)
    for r in (plain, engine):
        first, last = r["history"][0]["val_loss"], r["history"][-1]["val_loss"]
        assert last < first - 0.3, (first, last)
    assert engine["engine"]["optimizer"].startswith("muon + ")


def test_the_grouped_muon_trains_as_the_per_matrix_muon(tmp_path):
    """The engine's muon_grouped option computes the per-matrix update in batches: the same losses."""
    ds = load_tinyshakespeare()
    cfg = preset("fasttransformer", n_layer=2, n_embd=32, n_head=2, n_kv_head=1, block_size=16)
    rec = Recipe(steps=12, batch_size=4, block_size=16, lr=3e-3, min_lr=3e-4, warmup=2, decay_steps=12,
                 optimizer="muon", muon_lr=0.02, eval_interval=4, eval_iters=2, engine=True)
    off = (("use_kernels", False),)
    per = train(cfg, rec.replace(engine_options=off), ds, "cpu", progress=False)
    grouped = train(cfg, rec.replace(engine_options=off + (("muon_grouped", True),)), ds, "cpu", progress=False)
    assert grouped["engine"]["muon_grouped"] and not per["engine"]["muon_grouped"]
    a = [h["val_loss"] for h in per["history"]]
    b = [h["val_loss"] for h in grouped["history"]]
    assert len(a) == len(b) >= 3
    assert a[-1] < a[0] - 0.2  # it trained, so agreeing below says something
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3, (a, b)
