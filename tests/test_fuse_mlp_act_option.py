"""The engine's ``fuse_mlp_act`` option: each MLP's GELU in the Triton GEMM's epilogues (kernels/gelu_mlp.py)
under bf16 and tf32, with the Linears' bf16 shadows and flat-gradient views kept; the step trains as without
it, parameter names do not change, and where it does not apply (strict fp32, ReLU²) a note says why."""

from __future__ import annotations

import pytest
import torch
from kernel_tolerance import flat_grad_errors
from small_engines import FT, GPT2, T
from small_engines import train as _train

from ftlib.model.config import preset
from ftlib.training.engine import EngineOptions

pytest.importorskip("triton")


# Each model and each precision once (the interpreter's cost is per case; the cross product repeats paths).
@pytest.mark.parametrize("cfg,precision", [(FT, "bf16"), (GPT2, "tf32")], ids=["fasttransformer-bf16", "gpt2-tf32"])
def test_the_fused_mlps_train_like_the_unfused_ones(kernel_device, cfg, precision):
    from ftlib.training.engine.fused_mlp import FusedMLP

    on, losses_on = _train(cfg, precision, kernel_device, fuse_mlp_act=True)
    off, losses_off = _train(cfg, precision, kernel_device)
    mlps = [blk.mlp for blk in on.model.blocks]
    assert all(type(m) is FusedMLP for m in mlps) and on.describe()["fuse_mlp_act"]
    assert not off.describe()["fuse_mlp_act"]
    assert mlps[0].dw1_out is not None  # the gradient views kept, and the bf16 shadows where the Linears had them
    # bf16 shadows where the Linears had them: every Linear under bf16 (GPT-2's bias-kernel Linears with
    # bf16_bias_weights, a default); with it off, GPT-2's cast their weights instead
    assert (mlps[0].w1c is not None) == (precision == "bf16")
    if cfg is GPT2 and precision == "bf16":
        cast, _ = _train(cfg, precision, kernel_device, fuse_mlp_act=True, bf16_bias_weights=False)
        assert cast.model.blocks[0].mlp.w1c is None
    assert mlps[0].input_precision == ("tf32" if precision == "tf32" else "ieee")
    assert [n for n, _ in on.model.named_parameters()] == [n for n, _ in off.model.named_parameters()]
    assert "GEMM epilogues" in on.describe()["notes"]["fuse_mlp_act"]
    # Both compute the same step in bf16: the fused GELU rounds z once, as F.linear then F.gelu do.
    torch.testing.assert_close(losses_on, losses_off, rtol=2e-2, atol=2e-2)
    assert losses_on[-1] < losses_on[0]
    # The last step's gradients, as they reached the flat buffer (through the fused backward for the
    # MLP weights), agree parameter by parameter to bf16 rounding.
    for name, err in flat_grad_errors(on, off).items():
        assert err < 3e-2, (name, err)


def test_in_strict_fp32_or_without_gelu_the_option_leaves_the_mlp_and_says_why(kernel_device):
    from ftlib.model.mlp import MLP

    eng, _ = _train(FT, "fp32", kernel_device, fuse_mlp_act=True)
    assert all(type(blk.mlp) is MLP for blk in eng.model.blocks) and not eng.describe()["fuse_mlp_act"]
    assert "strict fp32 keeps" in eng.describe()["notes"]["fuse_mlp_act"]
    relu2 = preset("fasttransformer", n_layer=1, n_embd=64, n_head=4, n_kv_head=1, block_size=T, activation="relu2")
    eng, _ = _train(relu2, "bf16", kernel_device, fuse_mlp_act=True)
    assert "not GELU" in eng.describe()["notes"]["fuse_mlp_act"]
    assert EngineOptions().fuse_mlp_act is False  # on trial, not a default
