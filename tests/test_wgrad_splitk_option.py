"""The engine's ``wgrad_splitk`` option: each Linear's weight gradient added into the flat gradient by the
split-K kernel (kernels/wgrad.py) under bf16 and tf32; the step's gradients agree with cuBLAS's parameter by
parameter (the tied head's too, where the embedding adds after it), and where it does not apply (strict
fp32, grad_into_buffer off) nothing changes and a note or the description says so."""

from __future__ import annotations

import pytest
import torch
from gpu_breadth import case
from kernel_tolerance import TF32_GRAD_RTOL, flat_grad_errors

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 1, 16
FT = preset("fasttransformer", n_layer=2, n_embd=64, n_head=4, n_kv_head=1, block_size=T)
GPT2 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)  # biases
TIED = FT.replace(tie_weights=True)  # the head's gradient and the embedding's share one span


def _train(cfg, precision, device, **options):
    options = {"fuse_head_loss": False, **options}  # every Linear, the head too, on the split-K kernel
    eng = Engine(cfg, B, T, precision, device, seed=3, capture=False, **options)
    batches = pattern_batches(cfg.vocab_size, B, T, 3, seed=2, device=device)
    return eng, torch.stack([eng.step(x, y).detach().float().clone() for x, y in batches])


# Every model in bf16; tf32 (fp32 operands, TF32 products) on one. In the interpreter the FastTransformer's bf16
# case repeats the tied head's paths (tests/gpu_breadth.py).
@pytest.mark.parametrize("cfg,precision", [case(FT, "bf16", id="fasttransformer-bf16"),
                                           pytest.param(GPT2, "bf16", id="gpt2-bf16"),
                                           pytest.param(TIED, "bf16", id="tied-head-bf16"),
                                           pytest.param(FT, "tf32", id="fasttransformer-tf32")])
def test_the_split_k_weight_gradients_train_like_cublas(kernel_device, cfg, precision, monkeypatch):
    import kernels.wgrad as W

    calls = []
    real = W.wgrad_add_
    monkeypatch.setattr(W, "wgrad_add_", lambda *a, **k: calls.append(k) or real(*a, **k))
    on, losses_on = _train(cfg, precision, kernel_device, wgrad_splitk=True)
    n_linear = on.grad_into
    assert on.describe()["wgrad_splitk"] and "split-K" in on.describe()["notes"]["wgrad_splitk"]
    # one call per Linear per step, with the step's products (TF32 in a tf32 step)
    assert len(calls) == 3 * n_linear > 0
    assert {c["input_precision"] for c in calls} == {"tf32" if precision == "tf32" else "ieee"}
    off, losses_off = _train(cfg, precision, kernel_device)
    assert not off.describe()["wgrad_splitk"]
    # Under bf16 without an fp32-output GEMM (the CPU) cuBLAS's side rounds each dW to bf16 before the copy
    # into the fp32 buffer; the split-K kernel keeps fp32: they differ by bf16 rounding there.
    tol = 1e-3 if precision == "tf32" else 2e-2
    torch.testing.assert_close(losses_on, losses_off, rtol=tol, atol=tol)
    # The last step's gradients in the flat buffer agree parameter by parameter: fp32 sums of the same
    # products, in another order (a kernel that wrote instead of adding would lose the tied embedding's part).
    for name, err in flat_grad_errors(on, off).items():
        # In tf32 cuBLAS's TF32 GEMM and the split-K kernel's tl.dot round the products differently.
        assert err < (TF32_GRAD_RTOL if precision == "tf32" else tol), (name, err)


def test_where_it_does_not_apply_nothing_changes(kernel_device):
    eng, _ = _train(FT, "fp32", kernel_device, wgrad_splitk=True)
    assert not eng.describe()["wgrad_splitk"] and "strict fp32 keeps" in eng.describe()["notes"]["wgrad_splitk"]
    eng, _ = _train(FT, "bf16", kernel_device, wgrad_splitk=True, grad_into_buffer=False)
    assert not eng.describe()["wgrad_splitk"]  # autograd writes the weight gradients: no kernel to swap
    assert EngineOptions().wgrad_splitk is False  # its kernel lost to cuBLAS's: not a default
