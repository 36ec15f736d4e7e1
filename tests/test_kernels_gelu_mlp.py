"""The MLP with GELU in its GEMM epilogues (kernels/gelu_mlp.py) against the plain-PyTorch reference
(ftlib.model.reference.gelu_mlp_ref) on kernel_device (tests/conftest.py: the CPU interpreter, or compiled
on CUDA with FTLIB_TEST_GPU=1): each launcher, the autograd function (gradients, the fp32 weight-gradient
buffers), and the argument checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ftlib.model.reference import gelu_mlp_ref  # noqa: E402
from kernels.gelu_mlp import gelu_mlp, gemm_dgelu, gemm_gelu  # noqa: E402

pytestmark = pytest.mark.kernels

# (M, C, F): a shape off every tile multiple, and one the interpreter's 16-wide tiles fill exactly.
SHAPES = [(37, 24, 50), (32, 32, 64)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-12)).item()


def _inputs(M, C, F_, dtype, device, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g)).to(device, dtype)  # noqa: E731
    x, w1, w2 = mk(M, C), mk(F_, C, scale=C ** -0.5), mk(C, F_, scale=F_ ** -0.5)
    b1, b2 = (mk(F_, scale=0.5), mk(C, scale=0.5)) if bias else (None, None)
    return x, w1, b1, w2, b2


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype,prec", [(torch.float32, "ieee"), (torch.float32, "tf32"), (torch.bfloat16, "ieee")])
@pytest.mark.parametrize("M,C,F_", SHAPES)
def test_the_launchers_match_gelu_and_its_derivative(kernel_device, approximate, dtype, prec, M, C, F_):
    x, w1, b1, w2, _ = _inputs(M, C, F_, dtype, kernel_device)
    tol = TOL[dtype] if prec == "ieee" else 5e-3  # TF32 products: 10 explicit mantissa bits
    z, a = gemm_gelu(x, w1.t(), b1, approximate, prec)
    z_ref = F.linear(x.double(), w1.double(), b1.double())
    assert z.dtype == a.dtype == dtype and z.shape == a.shape == (M, F_)
    assert _rel(z, z_ref) < tol
    # The activation is gelu of z as stored, rounded to its dtype (what F.gelu of F.linear's output gives).
    assert _rel(a, F.gelu(z.double(), approximate=approximate)) < TOL[dtype] / 4
    dy = torch.randn(M, C, generator=torch.Generator().manual_seed(1)).to(kernel_device, dtype)
    zz = z.double().requires_grad_(True)
    (da_ref,) = torch.autograd.grad(F.gelu(zz, approximate=approximate), zz, dy.double() @ w2.double())
    assert _rel(gemm_dgelu(dy, w2, z, approximate, prec), da_ref) < tol


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_mlp_trains_like_the_reference(kernel_device, approximate, bias):
    M, C, F_ = SHAPES[0]
    ins = _inputs(M, C, F_, torch.float32, kernel_device, bias=bias)
    ins = [t.requires_grad_(True) if t is not None else None for t in ins]
    x3 = ins[0].view(1, M, C)  # a leading batch dim, as in a block
    y = gelu_mlp(x3, *ins[1:], approximate=approximate)
    ref = [t.detach().double().requires_grad_(True) if t is not None else None for t in ins]
    y_ref = gelu_mlp_ref(ref[0].view(1, M, C), *ref[1:], approximate=approximate)
    assert y.shape == (1, M, C) and _rel(y, y_ref) < 1e-5
    dy = torch.randn(1, M, C, generator=torch.Generator().manual_seed(2)).to(kernel_device)
    leaves = [t for t in ins if t is not None]
    got = torch.autograd.grad(y, leaves, dy)
    want = torch.autograd.grad(y_ref, [t for t in ref if t is not None], dy.double())
    for name, g, w in zip(["x", "w1", "b1", "w2", "b2"] if bias else ["x", "w1", "w2"], got, want):
        assert _rel(g, w) < 1e-5, name


def test_weight_gradients_are_written_into_the_buffers_in_bf16(kernel_device):
    M, C, F_ = SHAPES[1]
    x, w1, _, w2, _ = _inputs(M, C, F_, torch.float32, kernel_device, bias=False)
    x, w1, w2 = (t.requires_grad_(True) for t in (x, w1, w2))
    bufs = [torch.full_like(w, 7.0) for w in (w1, w2)]  # written, not added: the 7s must go
    with torch.autocast(kernel_device.type, dtype=torch.bfloat16):
        y = gelu_mlp(x.to(torch.bfloat16), w1, None, w2, None, w1c=w1.detach().to(torch.bfloat16),
                     dw1_out=bufs[0], dw2_out=bufs[1])
    assert y.dtype == torch.bfloat16
    dy = torch.randn(M, C, generator=torch.Generator().manual_seed(3)).to(kernel_device)
    y.backward(dy.to(torch.bfloat16))
    assert w1.grad is None and w2.grad is None and x.grad is not None  # the buffers took the weights' gradients
    ref = [t.detach().double().requires_grad_(True) for t in (x, w1, w2)]
    want = torch.autograd.grad(gelu_mlp_ref(ref[0], ref[1], None, ref[2], None), ref[1:], dy.double())
    for buf, w in zip(bufs, want):
        assert buf.dtype == torch.float32 and _rel(buf, w) < 3e-2


def test_bad_arguments_are_refused_with_clear_messages(kernel_device):
    x, w1, b1, w2, b2 = _inputs(8, 16, 32, torch.float32, kernel_device)
    with pytest.raises(ValueError, match="approximate="):
        gemm_gelu(x, w1.t(), approximate="sigmoid")
    with pytest.raises(ValueError, match="needs a \\(M, K\\) and b \\(K, N\\)"):
        gemm_gelu(x, w1)
    with pytest.raises(TypeError, match="dtype"):
        gemm_gelu(x, w1.t().to(torch.float64))
    with pytest.raises(ValueError, match="bias must be"):
        gemm_gelu(x, w1.t(), b2)
    with pytest.raises(ValueError, match="z must be a contiguous"):
        gemm_dgelu(x, w1.t(), torch.empty(32, 8, device=kernel_device).t())
    with pytest.raises(ValueError, match="input_precision="):
        gemm_dgelu(x, w1.t(), torch.empty(8, 32, device=kernel_device), input_precision="tf32x3")
    with pytest.raises(ValueError, match="dw1_out must be fp32"):
        gelu_mlp(x, w1, b1, w2, b2, dw1_out=torch.empty_like(w1, dtype=torch.bfloat16))
