"""RMSNorm Triton kernel vs ftlib.model.reference.rms_norm_ref, on kernel_device (tests/conftest.py:
the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references in fp64 on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

from kernel_tolerance import assert_within_lowp_error  # noqa: E402

from ftlib.model.reference import rms_norm_ref  # noqa: E402
from kernels.rmsnorm import RMSNormFunction, TritonRMSNorm, rms_norm, rms_norm_fwd  # noqa: E402

pytestmark = pytest.mark.kernels


def _inputs(shape, dtype, device, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g, dtype=torch.float64)).to(device, dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(device, dtype)
    return x, w, dy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 33), (3, 256), (37, 64)])
def test_forward_backward_match_reference(shape, dtype, kernel_device):
    x, w, dy = _inputs(shape, dtype, kernel_device)
    y = rms_norm(x, w, 1e-5)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    # Reference in fp64 on the CPU from the same (rounded) inputs: the kernel accumulates in fp32.
    xr, wr = (t.detach().cpu().double().requires_grad_(True) for t in (x, w))
    yr = rms_norm_ref(xr, wr, 1e-5)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.cpu().double())
    # PyTorch's own op in the same dtype from the same inputs: the error a correct implementation
    # makes, which sets the bound (tests/kernel_tolerance.py).
    xl, wl = (t.detach().cpu().requires_grad_(True) for t in (x, w))
    yl = rms_norm_ref(xl, wl, 1e-5)
    dxl, dwl = torch.autograd.grad(yl, (xl, wl), dy.cpu())
    assert y.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
    assert y.device == dx.device == dw.device == x.device
    for name, got, ref, lowp in (("y", y, yr, yl), ("dx", dx, dxr, dxl), ("dweight", dw, dwr, dwl)):
        assert_within_lowp_error(got, ref, lowp, name)
    # The bound can fail: a weight gradient 4% off (uniformly) is caught in every dtype.
    with pytest.raises(AssertionError, match="dweight"):
        assert_within_lowp_error(dw * 1.04, dwr, dwl, "dweight")


def test_rstd_saved(kernel_device):
    x, w, _ = _inputs((5, 40), torch.float32, kernel_device)
    _, rstd = rms_norm_fwd(x.detach(), w.detach(), 1e-5)
    xc = x.detach().cpu()
    torch.testing.assert_close(rstd.cpu(), torch.rsqrt(xc.pow(2).mean(-1) + 1e-5))


def test_gradcheck_fp64(kernel_device):
    x, w, _ = _inputs((3, 9), torch.float64, kernel_device)
    assert torch.autograd.gradcheck(lambda a, b: RMSNormFunction.apply(a, b, 1e-5), (x, w))


def test_module_matches_ftlib_module(kernel_device):
    from ftlib.model.norm import RMSNorm

    ref, mod = RMSNorm(24), TritonRMSNorm(24).to(kernel_device)
    with torch.no_grad():
        ref.weight.normal_()
        mod.weight.copy_(ref.weight)
    x = torch.randn(2, 3, 24)
    torch.testing.assert_close(mod(x.to(kernel_device)).cpu(), ref(x), atol=1e-5, rtol=1e-5)


def test_non_contiguous_rows_and_wrong_inputs(kernel_device):
    dev = kernel_device
    xc, w = torch.randn(6, 64), torch.randn(32)
    x = xc.to(dev)[:, :32]  # row stride 64, last-dim stride 1: accepted
    assert x.stride() == (64, 1)
    torch.testing.assert_close(rms_norm(x, w.to(dev)).cpu(), rms_norm_ref(xc[:, :32], w, 1e-5), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="last dim"):
        rms_norm(torch.randn(32, 6, device=dev).t(), torch.randn(32, device=dev))  # last-dim stride 6
    with pytest.raises(TypeError, match="dtype"):
        rms_norm(torch.randint(0, 5, (4, 8), device=dev), torch.randn(8, device=dev))
    with pytest.raises(ValueError, match="last dim must equal"):
        rms_norm(torch.randn(4, 8, device=dev), torch.randn(9, device=dev))
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(torch.randn(4, 8, device=dev), torch.randn(8, 2, device=dev)[:, 0])


def test_wrong_device(monkeypatch):
    # CPU tensors on purpose: without the interpreter (the launcher re-reads the variable) they
    # are rejected, in either test mode.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        rms_norm(torch.randn(4, 8), torch.randn(8))


def test_detects_a_wrong_kernel(kernel_device):
    """The comparison can fail: a perturbed weight must not pass the tolerance."""
    x, w, _ = _inputs((4, 16), torch.float32, kernel_device)
    y = rms_norm(x.detach(), w.detach() * 1.001)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y.cpu(), rms_norm_ref(x.detach().cpu(), w.detach().cpu(), 1e-5), atol=1e-5,
                                   rtol=1e-5)
