"""Fused scaled causal softmax (kernels/causal_softmax.py) vs ftlib.attention.causal_softmax_ref, on
kernel_device (tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1): values,
the gradient, odd T, bf16 output, fp64 gradcheck, checks. References in fp64 on the CPU."""

import math

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import causal_attention_ref, causal_softmax_ref  # noqa: E402
from kernels.causal_softmax import CausalSoftmax, causal_softmax  # noqa: E402

pytestmark = pytest.mark.kernels


def _scores(shape, device, dtype=torch.float32, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(*shape, generator=g, dtype=torch.float64) * 3).to(device, dtype).requires_grad_(True)
    dp = torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)
    return s, dp


# The interpreter takes 2 rows per program: T = 1, 5 and 17 (not powers of two) leave padded
# columns; R = B*nh*T odd leaves a half-empty last program.
@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 1, 17, 17), (3, 1, 1), (2, 8, 8)],
                         ids=["B2-h3-T5", "T17", "T1", "3d-T8"])
def test_forward_and_gradient_match_reference(shape, kernel_device):
    scale = 1 / math.sqrt(7)
    s, dp = _scores(shape, kernel_device)
    p = causal_softmax(s, scale)
    (ds,) = torch.autograd.grad(p, s, dp)
    sr = s.detach().cpu().double().requires_grad_(True)
    pr = causal_softmax_ref(sr, scale)
    (dsr,) = torch.autograd.grad(pr, sr, dp.cpu().double())
    assert p.dtype == ds.dtype == torch.float32 and p.shape == ds.shape == s.shape and p.device == s.device
    p, ds = p.detach().cpu(), ds.cpu()
    torch.testing.assert_close(p.double(), pr, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ds.double(), dsr, atol=1e-6, rtol=1e-5)
    T = shape[-1]
    upper = ~torch.ones(T, T, dtype=torch.bool).tril()
    assert (p[..., upper] == 0).all() and (ds[..., upper] == 0).all()  # masked: exactly 0 both ways


def test_bf16_output_and_gradient_in_the_input_dtype(kernel_device):
    s, dp = _scores((2, 2, 9, 9), kernel_device, seed=1)
    p = causal_softmax(s, 0.5, torch.bfloat16)  # what the next matmul reads under autocast
    (ds,) = torch.autograd.grad(p, s, dp.to(torch.bfloat16))
    assert p.dtype == torch.bfloat16 and ds.dtype == torch.float32
    want = causal_softmax_ref(s.detach().cpu().double(), 0.5)
    torch.testing.assert_close(p.detach().cpu().double(), want, atol=2e-3, rtol=2 ** -8)  # rounded once from fp32
    sb, dpb = s.detach().to(torch.bfloat16).requires_grad_(True), dp.to(torch.bfloat16)
    pb = causal_softmax(sb, 0.5)
    (dsb,) = torch.autograd.grad(pb, sb, dpb)
    assert pb.dtype == dsb.dtype == torch.bfloat16


def test_gradcheck_fp64(kernel_device):
    s = torch.randn(1, 2, 6, 6, dtype=torch.float64, device=kernel_device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: causal_softmax(s, 0.7), (s,))


def test_module_in_explicit_attention_matches_the_model_reference(kernel_device):
    # q k^T -> fused softmax -> @ v gives the model's explicit attention (MHA and MQA).
    g = torch.Generator().manual_seed(2)
    for nkv in (4, 1):
        q = torch.randn(2, 4, 11, 8, generator=g, dtype=torch.float64)
        k, v = (torch.randn(2, nkv, 11, 8, generator=g, dtype=torch.float64) for _ in range(2))
        qd, kd, vd = (t.to(kernel_device) for t in (q, k, v))
        qg = qd.view(2, nkv, 4 // nkv, 11, 8)
        att = CausalSoftmax(1 / math.sqrt(8))(qg @ kd.unsqueeze(2).transpose(-2, -1))
        y = (att @ vd.unsqueeze(2)).reshape(2, 4, 11, 8)
        torch.testing.assert_close(y.cpu(), causal_attention_ref(q, k, v))


def test_launcher_rejects_what_it_cannot_take(kernel_device):
    from kernels.causal_softmax import causal_softmax_forward

    dev = kernel_device
    with pytest.raises(ValueError, match=r"\(\.\.\., T, T\)"):
        causal_softmax(torch.zeros(2, 3, 4, device=dev), 1.0)
    with pytest.raises(TypeError, match="dtype"):
        causal_softmax(torch.zeros(2, 4, 4, dtype=torch.int32, device=dev), 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        causal_softmax_forward(torch.zeros(4, 4, device=dev).t(), 1.0)


@pytest.mark.parametrize("rows", [1, 4, 8])
def test_any_rows_per_program_gives_the_same_result(rows, kernel_device):
    # The dev driver times other row tiles; each must compute the same values and gradient.
    s, dp = _scores((2, 2, 7, 7), kernel_device, seed=4)
    p = causal_softmax(s, 0.3, rows=rows)
    (ds,) = torch.autograd.grad(p, s, dp)
    p0 = causal_softmax(s, 0.3)
    (ds0,) = torch.autograd.grad(p0, s, dp)
    torch.testing.assert_close(p, p0, rtol=0, atol=1e-7)
    torch.testing.assert_close(ds, ds0, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="power of two"):
        causal_softmax(s, 0.3, rows=3)


@pytest.mark.parametrize("shape", [(2, 3, 0, 0), (0, 0), (0, 4, 4)], ids=["T0", "T0-2d", "no-rows"])
def test_empty_scores_give_the_empty_result_the_reference_gives(shape, kernel_device):
    s = torch.zeros(shape, device=kernel_device, requires_grad=True)
    p = causal_softmax(s, 0.5)
    want = causal_softmax_ref(torch.zeros(shape, dtype=torch.float64), 0.5)
    assert p.shape == want.shape == s.shape and p.dtype == s.dtype
    (ds,) = torch.autograd.grad(p, s, torch.ones_like(p))
    assert ds.shape == s.shape
