"""Triton linear layer (kernels/linear.py) vs ftlib.model.reference.linear_ref, on kernel_device (tests/conftest.py:
the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references in fp64 on the CPU."""

import pytest
import torch
import torch.nn as nn

pytest.importorskip("triton")

from ftlib.model.reference import linear_ref  # noqa: E402
from kernels.linear import LinearFunction, TritonLinear, linear, matmul  # noqa: E402

pytestmark = pytest.mark.kernels


def _inputs(lead, K, N, bias, device, dtype=torch.float32, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, K, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_(True)
    w = (torch.randn(N, K, generator=g, dtype=torch.float64) / K**0.5).to(device, dtype).requires_grad_(True)
    b = torch.randn(N, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_(True) if bias else None
    dy = torch.randn(*lead, N, generator=g, dtype=torch.float64).to(device, dtype)
    return x, w, b, dy


@pytest.mark.parametrize("prec", ["tf32x3", "ieee"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead,K,N", [((37,), 40, 29), ((2, 19), 48, 65), ((3, 11), 70, 17)])
def test_forward_and_every_gradient_match_reference(lead, K, N, bias, prec, kernel_device):
    x, w, b, dy = _inputs(lead, K, N, bias, kernel_device)
    y = linear(x, w, b, prec)
    inputs = (x, w) + ((b,) if bias else ())
    grads = torch.autograd.grad(y, inputs, dy)
    ref_in = [t.detach().cpu().double().requires_grad_(True) for t in inputs]
    yr = linear_ref(ref_in[0], ref_in[1], ref_in[2] if bias else None)
    ref_grads = torch.autograd.grad(yr, ref_in, dy.cpu().double())
    assert y.shape == (*lead, N) and y.dtype == torch.float32 and y.device == x.device
    torch.testing.assert_close(y.detach().cpu().double(), yr.detach(), atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert g.shape == r.shape
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_split_k_sums_every_slice(split, kernel_device):
    g = torch.Generator().manual_seed(1)
    a64 = torch.randn(70, 23, generator=g).double()
    b64 = torch.randn(70, 31, generator=g).double()
    a = a64.float().to(kernel_device).t()  # (23, 70): a transposed view, as dW's dy^T
    got = matmul(a, b64.float().to(kernel_device), split_k=split)
    torch.testing.assert_close(got.cpu(), (a64.t() @ b64).float(), atol=1e-4, rtol=1e-5)


def test_gradcheck_fp64(kernel_device):
    x, w, b, _ = _inputs((4,), 6, 5, True, kernel_device, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, c, d: LinearFunction.apply(a, c, d, "ieee"), (x, w, b))


def test_module_shares_parameters_and_matches_nn_linear(kernel_device):
    torch.manual_seed(0)
    ref = nn.Linear(24, 40)  # the CPU reference
    lin = nn.Linear(24, 40)
    lin.load_state_dict(ref.state_dict())
    lin.to(kernel_device)
    mod = TritonLinear(lin)
    assert mod.weight is lin.weight and mod.bias is lin.bias
    x = torch.randn(3, 5, 24)
    torch.testing.assert_close(mod(x.to(kernel_device)).detach().cpu(), ref(x).detach(), atol=1e-5, rtol=1e-5)


def test_launcher_rejects_bad_arguments(kernel_device):
    dev = kernel_device
    a, b = torch.randn(4, 8, device=dev), torch.randn(8, 3, device=dev)
    with pytest.raises(ValueError, match="a \\(M, K\\) and b \\(K, N\\)"):
        matmul(a, torch.randn(7, 3, device=dev))
    with pytest.raises(TypeError, match="float32"):
        matmul(a.bfloat16(), b.bfloat16())
    with pytest.raises(ValueError, match="input_precision"):
        matmul(a, b, input_precision="fp8")
    with pytest.raises(ValueError, match="bias must be"):
        matmul(a, b, bias=torch.randn(4, device=dev))
