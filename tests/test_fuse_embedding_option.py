"""The engine's ``fuse_embedding`` option: the token and position embeddings summed by one kernel and both
gradients added into the flat gradient by another (kernels/embedding_sum.py), in the model's ``embedding_sum``
seam (a default); the step trains as without it (a tied head's gradient and the embedding's add up in the shared view),
parameter names and evaluation do not change, and where it does not apply a note says why."""

from __future__ import annotations

import pytest
import torch
from kernel_tolerance import flat_grad_errors
from small_engines import FT, GPT2, B, T, engine
from small_engines import train as _train

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.gpt import EmbeddingSum
from ftlib.training.engine import EngineOptions

pytest.importorskip("triton")


# Each model and each precision once (the interpreter's cost is per case; the cross product repeats paths).
@pytest.mark.parametrize("cfg,precision", [(FT, "fp32"), (GPT2, "bf16")], ids=["fasttransformer-fp32", "gpt2-bf16"])
def test_the_fused_embeddings_train_like_the_unfused_ones(kernel_device, cfg, precision):
    from ftlib.training.engine.embedding import FusedEmbeddingSum

    on, losses_on = _train(cfg, precision, kernel_device, fuse_embedding=True)
    off, losses_off = _train(cfg, precision, kernel_device, fuse_embedding=False)
    assert type(on.model.embedding_sum) is FusedEmbeddingSum and type(off.model.embedding_sum) is EmbeddingSum
    assert on.describe()["fuse_embedding"] and not off.describe()["fuse_embedding"]
    assert "one kernel" in on.describe()["notes"]["fuse_embedding"]
    assert (on.model.head.weight is on.model.wte.weight) == cfg.tie_weights  # the tied head stays tied
    assert [n for n, _ in on.model.named_parameters()] == [n for n, _ in off.model.named_parameters()]
    # The same sums in another order (atomic adds): the same step up to fp32 rounding.
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-4, atol=1e-4)
    assert losses_on[-1] < losses_on[0]
    # The last step's gradients as they reached the flat buffer: the tables' through the fused backward (the tied
    # table's added to what the head wrote there), every other parameter's as before.
    errors = flat_grad_errors(on, off)
    assert {"wte.weight", "wpe.weight"} <= set(errors)
    for name, err in errors.items():
        assert err < 1e-4, (name, err)


def test_the_table_gradients_are_what_the_reference_gives(kernel_device):
    """The fused backward's two gradients against autograd through the reference model's embedding lookups, for
    one step's loss from the same weights: a dropped position sum or a token's rows added to another would show."""
    on = engine(FT, "fp32", kernel_device)
    off = engine(FT, "fp32", kernel_device, use_kernels={"embedding": False})
    assert not off.describe()["fuse_embedding"]
    x, y = pattern_batches(FT.vocab_size, B, T, 1, seed=5, device=kernel_device)[0]
    on.step(x, y)
    off.step(x, y)
    for name, err in flat_grad_errors(on, off).items():
        assert err < 1e-5, (name, err)


def test_outside_the_step_the_kernel_still_gives_the_sum(kernel_device):
    on = engine(FT, "fp32", kernel_device, fuse_embedding=True)
    off = engine(FT, "fp32", kernel_device, fuse_embedding=False)
    x = torch.randint(0, FT.vocab_size, (B, T), device=kernel_device)
    with torch.no_grad():
        logits_on, _ = on.model(x)
        logits_off, _ = off.model(x)
    torch.testing.assert_close(logits_on, logits_off, rtol=0, atol=0)


def test_without_the_embedding_kernel_a_note_says_why(kernel_device):
    eng, _ = _train(FT, "bf16", kernel_device, steps=1, fuse_embedding=True, use_kernels={"embedding": False})
    assert not eng.describe()["fuse_embedding"] and type(eng.model.embedding_sum) is EmbeddingSum
    assert "needs the embedding kernel" in eng.describe()["notes"]["fuse_embedding"]
    assert EngineOptions().fuse_embedding is True  # it won its trial: a default


def test_the_fused_embeddings_won_their_trial_and_have_an_ablation_and_checks():
    """A default now: the engine suite switches it off again for both models in both precisions it won in, the
    candidates no longer list it, its 100-step checks stay, and a row that ran without it is an earlier engine's
    only where the embedding kernel ran."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES, SUITES
    from ftlib.views.engine_config import options_off

    assert not [c for c in CANDIDATES if "fuse_embedding" in c[1]]
    ablations = {(c.precision, c.label): c.extra for c in SUITES["engine"].cases() if "fused-embedding" in c.label}
    assert ablations == {(p, f"{m} -fused-embedding"): {"fuse_embedding": False}
                         for p in ("bf16", "tf32") for m in ("fasttransformer", "gpt2")}
    assert ("bf16", "fasttransformer", {"fuse_embedding": True}) in CHECKS
    row = {"mode": "engine", "config": {}, "extra": {}, "engine": {"kernels": ["embedding"], "notes": {}}}
    assert "fuse_embedding" in options_off(row)
    assert "fuse_embedding" not in options_off({**row, "engine": {"kernels": [], "notes": {}}})
    assert "fuse_embedding" not in options_off({**row, "extra": {"fuse_embedding": False}})  # the ablation itself
