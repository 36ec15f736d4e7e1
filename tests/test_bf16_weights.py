"""ftlib.training.engine.bf16_weights: a Linear on a bf16 shadow of its weight computes what autocast computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ftlib.training.engine.bf16_weights import ShadowLinear


def _pair(bias: bool, seed: int = 0):
    torch.manual_seed(seed)
    ref = nn.Linear(24, 40, bias=bias)
    lin = nn.Linear(24, 40, bias=bias)
    lin.load_state_dict(ref.state_dict())
    w16 = lin.weight.detach().to(torch.bfloat16)
    return ref, ShadowLinear(lin, w16)


@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_gradients_equal_autocast(bias):
    ref, sh = _pair(bias)
    x = torch.randn(3, 7, 24)
    xr, xs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    dy = torch.randn(3, 7, 40).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yr, ys = ref(xr), sh(xs)
    assert ys.dtype == yr.dtype == torch.bfloat16
    torch.testing.assert_close(ys, yr, atol=0, rtol=0)
    yr.backward(dy)
    ys.backward(dy)
    torch.testing.assert_close(xs.grad, xr.grad, atol=1e-6, rtol=1e-6)
    assert sh.weight.grad.dtype == torch.float32
    torch.testing.assert_close(sh.weight.grad, ref.weight.grad, atol=1e-6, rtol=1e-6)
    if bias:
        torch.testing.assert_close(sh.bias.grad, ref.bias.grad, atol=1e-6, rtol=1e-6)


def test_a_stale_shadow_is_used_in_training_and_not_in_evaluation():
    ref, sh = _pair(True)
    sh.w16.zero_()  # what a shadow that was never refreshed would hold
    x = torch.randn(5, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_out = sh(x)
        sh.eval()
        with torch.no_grad():
            eval_out, want = sh(x), ref(x)
    torch.testing.assert_close(train_out.float(), sh.bias.detach().bfloat16().float().expand(5, 40))
    torch.testing.assert_close(eval_out, want)


def test_rejects_a_wrong_shadow():
    lin = nn.Linear(8, 4)
    with pytest.raises(ValueError, match="bf16 of shape"):
        ShadowLinear(lin, torch.zeros(4, 8))
    with pytest.raises(ValueError, match="bf16 of shape"):
        ShadowLinear(lin, torch.zeros(8, 4, dtype=torch.bfloat16))
