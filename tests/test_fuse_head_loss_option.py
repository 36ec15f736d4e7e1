"""The engine's ``fuse_head_loss`` option: the output head and the cross-entropy in the two kernels of
kernels/linear_cross_entropy.py, with the head's bf16 shadow and flat-gradient view kept (a default under bf16 and
fp16); the step trains as without it, parameter names and evaluation do not change, and where it does not apply a
note says why."""

from __future__ import annotations

import pytest
import torch
from kernel_tolerance import flat_grad_errors
from small_engines import FT, GPT2, B, T, engine
from small_engines import train as _train

from ftlib.model.config import preset
from ftlib.training.engine import EngineOptions

pytest.importorskip("triton")


# Each model and each precision once (the interpreter's cost is per case; the cross product repeats paths).
@pytest.mark.parametrize("cfg,precision", [(FT, "fp16"), (GPT2, "bf16")], ids=["fasttransformer-fp16", "gpt2-bf16"])
def test_the_fused_head_trains_like_the_unfused_one(kernel_device, cfg, precision):
    from ftlib.training.engine.head_loss import HeadIntoLoss

    on, losses_on = _train(cfg, precision, kernel_device)
    off, losses_off = _train(cfg, precision, kernel_device, fuse_head_loss=False)
    head = on.model.head
    assert type(head) is HeadIntoLoss and on.describe()["fuse_head_loss"] and not off.describe()["fuse_head_loss"]
    assert (head.w16 is not None) == (precision == "bf16") and head.grad is not None
    assert head.input_precision == "ieee"
    assert (head.weight is on.model.wte.weight) == cfg.tie_weights  # the tied head stays tied
    assert [n for n, _ in on.model.named_parameters()] == [n for n, _ in off.model.named_parameters()]
    assert "two kernels" in on.describe()["notes"]["fuse_head_loss"]
    # The logits are fp32 inside the kernels where the unfused bf16 step rounds them to bf16: the same step
    # up to that rounding.
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-2, atol=1e-2)
    assert losses_on[-1] < losses_on[0]
    # The last step's gradients, as they reached the flat buffer (the head's through the fused backward, the
    # tied embedding's with the embedding's own part added after it), agree parameter by parameter.
    for name, err in flat_grad_errors(on, off).items():
        assert err < 3e-2, (name, err)


def test_outside_the_step_the_head_returns_logits(kernel_device):
    # Built, not trained: the same initial weights.
    on = engine(FT, "bf16", kernel_device)
    off = engine(FT, "bf16", kernel_device, fuse_head_loss=False)
    assert on.describe()["fuse_head_loss"] and not off.describe()["fuse_head_loss"]
    x = torch.randint(0, FT.vocab_size, (B, T), device=kernel_device)
    # Under the step's autocast, as evaluation runs: the bf16 engine's Linears read bf16 weights.
    with torch.no_grad(), torch.autocast(kernel_device.type, dtype=torch.bfloat16):
        logits_on, _ = on.model(x)
        logits_off, _ = off.model(x)
    assert logits_on.shape == (B, T, FT.vocab_size)
    torch.testing.assert_close(logits_on, logits_off)


def test_where_the_kernels_cannot_take_the_head_a_note_says_why(kernel_device):
    from ftlib.training.engine.grad_into import GradIntoLinear

    for cfg, precision, options, why in (
            (FT, "fp32", {}, "strict fp32 keeps"),
            (FT, "tf32", {}, "bf16 and fp16 only"),
            (FT, "bf16", {"use_kernels": {"cross_entropy": False}}, "needs the cross-entropy kernel"),
            (FT, "bf16", {"grad_into_buffer": False}, "needs the head on grad_into_buffer"),
            (preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T,
                    logit_softcap=30.0), "bf16", {}, "soft-cap"),
            (preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T,
                    vocab_size=300), "bf16", {}, "vocabulary above 256")):
        eng, _ = _train(cfg, precision, kernel_device, steps=1, fuse_head_loss=True, **options)
        assert not eng.describe()["fuse_head_loss"] and why in eng.describe()["notes"]["fuse_head_loss"], why
        assert type(eng.model.head) is not GradIntoLinear or options.get("grad_into_buffer", True)
    assert EngineOptions().fuse_head_loss is True  # it won its trial in bf16: a default there
