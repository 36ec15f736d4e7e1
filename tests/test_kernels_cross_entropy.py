"""Fused cross-entropy kernel vs ftlib.reference.cross_entropy_ref, on kernel_device (tests/conftest.py:
the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

from ftlib.reference import cross_entropy_ref  # noqa: E402
from kernels.cross_entropy import (  # noqa: E402
    MAX_BLOCK_V,
    CrossEntropyFunction,
    TritonCrossEntropyLoss,
    cross_entropy,
    cross_entropy_fwd,
)

pytestmark = pytest.mark.kernels

TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def _inputs(n, v, dtype, device, seed=0, scale=3.0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    z = (scale * torch.randn(n, v, generator=g, dtype=torch.float64)).to(device, dtype).requires_grad_(True)
    t = torch.randint(0, v, (n,), generator=g).to(device)
    return z, t


def _cpu_leaf(z, dtype=None):
    """A CPU copy of z (in ``dtype``) that the reference can differentiate."""
    return z.detach().cpu().to(dtype or z.dtype).requires_grad_(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 37, 64])
def test_matches_reference_v65(n, dtype, kernel_device):
    z, t = _inputs(n, 65, dtype, kernel_device)
    loss = cross_entropy(z, t)
    (dz,) = torch.autograd.grad(2.5 * loss, z)  # grad_output != 1 exercises the backward scale
    zr = _cpu_leaf(z, torch.float64)
    lr = cross_entropy_ref(zr, t.cpu())
    (dzr,) = torch.autograd.grad(2.5 * lr, zr)
    tol = TOL[dtype]
    assert loss.dtype == torch.float32 and dz.dtype == dtype and dz.device == z.device
    torch.testing.assert_close(loss.detach().cpu().double(), lr.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(dz.cpu().double(), dzr, atol=tol / n, rtol=tol * 10)


def test_ignore_index_and_large_logits(kernel_device):
    z, t = _inputs(9, 65, torch.float32, kernel_device, seed=1, scale=30.0)  # large logits: max-subtraction matters
    t[[0, 4, 8]] = -100
    loss = cross_entropy(z, t)
    (dz,) = torch.autograd.grad(loss, z)
    zr = _cpu_leaf(z)
    lr = cross_entropy_ref(zr, t.cpu())
    (dzr,) = torch.autograd.grad(lr, zr)
    torch.testing.assert_close(loss.detach().cpu(), lr.detach(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(dz.cpu(), dzr, atol=1e-7, rtol=1e-5)
    assert (dz[[0, 4, 8]] == 0).all()


def test_vocab_larger_than_one_block(kernel_device):
    v = MAX_BLOCK_V + 77  # two blocks: exercises the online max/sum across blocks
    z, t = _inputs(3, v, torch.float32, kernel_device, seed=2)
    loss, dz = cross_entropy_fwd(z.detach(), t)
    zr = _cpu_leaf(z)
    lr = cross_entropy_ref(zr, t.cpu())
    (dzr,) = torch.autograd.grad(lr, zr)
    torch.testing.assert_close(loss.cpu(), lr.detach(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(dz.cpu(), dzr, atol=1e-8, rtol=1e-5)


def test_gradcheck_fp64(kernel_device):
    z, t = _inputs(5, 7, torch.float64, kernel_device, seed=3)
    assert torch.autograd.gradcheck(lambda a: CrossEntropyFunction.apply(a, t, -100), (z,))


def test_module_and_strided_rows(kernel_device):
    z, t = _inputs(6, 130, torch.float32, kernel_device, seed=4)
    zs = z.detach()[:, :65]  # row stride 130: accepted without a copy
    assert zs.stride() == (130, 1)
    got = TritonCrossEntropyLoss()(zs, t % 65)
    torch.testing.assert_close(got.cpu(), cross_entropy_ref(zs.cpu(), t.cpu() % 65))


def test_wrong_inputs_raise(kernel_device):
    z, t = _inputs(4, 65, torch.float32, kernel_device)
    with pytest.raises(TypeError, match="targets has dtype"):
        cross_entropy(z, t.float())
    with pytest.raises(ValueError, match="2 dims"):
        cross_entropy(z.view(2, 2, 65), t)
    with pytest.raises(ValueError, match="entries"):
        cross_entropy(z, t[:3])
    with pytest.raises(ValueError, match="last dim"):
        cross_entropy(torch.randn(65, 4, device=kernel_device).t(), t)


def test_detects_a_wrong_target(kernel_device):
    z, t = _inputs(8, 65, torch.float32, kernel_device)
    want = cross_entropy_ref(z.detach().cpu(), t.cpu())
    torch.testing.assert_close(cross_entropy(z, t).detach().cpu(), want)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(cross_entropy(z, (t + 1) % 65).detach().cpu(), want)
