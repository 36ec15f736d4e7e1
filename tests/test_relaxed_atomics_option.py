"""The engine's ``relaxed_atomics`` option: the gradient kernels' atomic adds (the fused embeddings', the norms'
weight gradients, the fused head's dW) in relaxed memory order instead of Triton's acquire-release. The same adds,
so the step trains as without it; the note says which kernels took it, or why none did; it won its trial and is a
default, with its ablation and 100-step checks."""

from __future__ import annotations

import pytest
import torch
from kernel_tolerance import flat_grad_errors
from small_engines import FT, GPT2
from small_engines import train as _train

from ftlib.training.engine import EngineOptions

pytest.importorskip("triton")


def _record_sems(monkeypatch, module, launcher: str) -> list[str]:
    """The memory order each call of ``module.launcher`` is given, as the calls happen."""
    launched, original = [], getattr(module, launcher)
    monkeypatch.setattr(module, launcher, lambda *a, **kw: launched.append(kw.get("sem")) or original(*a, **kw))
    return launched


# Each model and each precision once (the interpreter's cost is per case; the cross product repeats paths).
@pytest.mark.parametrize("cfg,precision", [(FT, "bf16"), (GPT2, "fp32")], ids=["fasttransformer-bf16", "gpt2-fp32"])
def test_relaxed_adds_train_like_ordered_ones(kernel_device, cfg, precision, monkeypatch):
    import kernels.embedding_sum as es
    import kernels.norm_into as ni
    import kernels.residual_norm as rn

    embeddings = _record_sems(monkeypatch, es, "embedding_sum_bwd")
    norms = _record_sems(monkeypatch, rn, "add_norm_bwd")
    first_norm = _record_sems(monkeypatch, ni, "add_norm_bwd")  # norm_into's own name for it
    on, losses_on = _train(cfg, precision, kernel_device, relaxed_atomics=True, fuse_head_loss=False)
    for launched in (embeddings, norms, first_norm):
        assert launched and set(launched) == {"relaxed"}
        launched.clear()
    off, losses_off = _train(cfg, precision, kernel_device, relaxed_atomics=False, fuse_head_loss=False)
    for launched in (embeddings, norms, first_norm):
        assert launched and set(launched) == {"acq_rel"}
    for module in (on.model.embedding_sum, on.model.add_norm, on.model.blocks[0].norm1):
        assert module.sem == "relaxed"
    assert on.describe()["relaxed_atomics"] and not off.describe()["relaxed_atomics"]
    assert on.describe()["notes"]["relaxed_atomics"] == (
        "atomic adds in relaxed memory order for the embeddings' gradients (kernels/embedding_sum.py), the norms' "
        "weight gradients (kernels/residual_norm.py)")
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-4, atol=1e-4)
    for name, err in flat_grad_errors(on, off).items():
        assert err < 1e-4, (name, err)


@pytest.mark.parametrize("off", [{"fuse_embedding": False}, {"use_kernels": {"embedding": False}}],
                         ids=["unfused", "no-embedding-kernel"])
def test_where_a_kernel_keeps_its_adds_a_note_says_which(kernel_device, off):
    off = {**off, "fuse_head_loss": False}
    eng, _ = _train(FT, "bf16", kernel_device, steps=1, relaxed_atomics=True, **off)
    assert eng.describe()["relaxed_atomics"]  # the norms still take it
    assert eng.describe()["notes"]["relaxed_atomics"] == ("atomic adds in relaxed memory order for the norms' weight "
                                                          "gradients (kernels/residual_norm.py)")
    eng, _ = _train(FT, "bf16", kernel_device, steps=1, relaxed_atomics=True, norm_dw_into_buffer=False, **off)
    assert not eng.describe()["relaxed_atomics"]
    assert eng.describe()["notes"]["relaxed_atomics"] == (
        "not applied: needs fuse_embedding, norm_dw_into_buffer, fuse_head_loss or wgrad_splitk where they apply")


def test_the_fused_head_takes_relaxed_adds_too(kernel_device, monkeypatch):
    import kernels.linear_cross_entropy as lce

    launched = _record_sems(monkeypatch, lce, "linear_cross_entropy_bwd")
    on, losses_on = _train(FT, "bf16", kernel_device, fuse_head_loss=True, relaxed_atomics=True)
    assert launched and set(launched) == {"relaxed"} and on.model.head.sem == "relaxed"
    assert "the fused head's dW" in on.describe()["notes"]["relaxed_atomics"]
    assert "the embeddings' gradients" in on.describe()["notes"]["relaxed_atomics"]
    off, losses_off = _train(FT, "bf16", kernel_device, fuse_head_loss=True, relaxed_atomics=False)
    assert off.model.head.sem == "acq_rel" and not off.describe()["relaxed_atomics"]
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-4, atol=1e-4)
    for name, err in flat_grad_errors(on, off).items():
        assert err < 1e-4, (name, err)


def test_the_split_k_weight_gradients_take_relaxed_adds_too(kernel_device, monkeypatch):
    import kernels.wgrad as W

    launched = _record_sems(monkeypatch, W, "wgrad_add_")  # before setup, which binds the launcher with its options
    on, losses_on = _train(FT, "bf16", kernel_device, steps=2, wgrad_splitk=True, relaxed_atomics=True)
    assert launched and set(launched) == {"relaxed"}
    assert on.describe()["notes"]["relaxed_atomics"].endswith(", the split-K weight gradients (kernels/wgrad.py)")
    launched.clear()
    off, losses_off = _train(FT, "bf16", kernel_device, steps=2, wgrad_splitk=True, relaxed_atomics=False)
    assert launched and set(launched) == {"acq_rel"}
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-4, atol=1e-4)


def test_relaxed_atomics_won_its_trial_and_has_an_ablation_and_checks():
    """A default now, with the fused head on it in bf16: the engine suite switches each off again where it won;
    nothing is on trial; their 100-step checks stay; a row that ran without one is an earlier engine's only where
    it could apply."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import SUITES
    from ftlib.views.engine_config import options_off

    assert EngineOptions().relaxed_atomics is True
    models = ("fasttransformer", "gpt2")
    ablations = {(c.precision, c.label): c.extra for c in SUITES["engine"].cases() if "relaxed" in c.label}
    assert ablations == {(p, f"{m} -relaxed-atomics"): {"relaxed_atomics": False} for p in ("bf16", "tf32")
                         for m in models}
    heads = {(c.precision, c.label): c.extra for c in SUITES["engine"].cases() if "fused-head" in c.label}
    assert heads == {("bf16", f"{m} -fused-head"): {"fuse_head_loss": False} for m in models}
    assert not any({"relaxed_atomics", "fuse_head_loss"} & set(c.extra) for c in SUITES["engine_candidates"].cases())
    assert {(p, m) for p, m, o in CHECKS if o == {"relaxed_atomics": True}} == {
        ("bf16", "fasttransformer"), ("bf16", "gpt2"), ("tf32", "fasttransformer")}
    assert {(p, m) for p, m, o in CHECKS if o == {"fuse_head_loss": True}} == {
        ("bf16", "fasttransformer"), ("bf16", "gpt2")}
    ran = {"kernels": ["embedding", "rmsnorm"], "notes": {}, "fuse_embedding": True, "norm_dw_into_buffer": True,
           "fuse_residual_norm": True}
    row = {"mode": "engine", "config": {}, "extra": {}, "engine": {**ran, "relaxed_atomics": False}}
    assert "relaxed_atomics" in options_off(row)
    assert "relaxed_atomics" not in options_off({**row, "engine": {**ran, "relaxed_atomics": True}})
    assert "relaxed_atomics" not in options_off({**row, "extra": {"relaxed_atomics": False}})  # the ablation itself
    unfused = {**ran, "fuse_embedding": False, "norm_dw_into_buffer": False}  # no kernel adds atomically
    assert "relaxed_atomics" not in options_off({**row, "engine": unfused})
    assert "relaxed_atomics" in options_off({**row, "engine": {**unfused, "fuse_head_loss": True}})


def test_the_fused_head_counts_as_missing_only_where_it_could_apply():
    from ftlib.views.engine_config import options_off

    ran = {"kernels": ["cross_entropy"], "notes": {}, "relaxed_atomics": True, "fuse_head_loss": False}
    row = {"mode": "engine", "config": {}, "extra": {}, "precision": "bf16", "engine": ran}
    assert "fuse_head_loss" in options_off(row)
    assert "fuse_head_loss" not in options_off({**row, "precision": "tf32"})  # bf16 and fp16 only
    assert "fuse_head_loss" not in options_off({**row, "engine": {**ran, "kernels": []}})  # no loss kernel
    assert "fuse_head_loss" not in options_off({**row, "engine": {**ran, "grad_into_buffer": False}})
    assert "fuse_head_loss" not in options_off({**row, "extra": {"fuse_head_loss": False}})  # the ablation itself
