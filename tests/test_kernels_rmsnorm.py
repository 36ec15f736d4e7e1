"""RMSNorm Triton kernel vs ftlib.reference.rms_norm_ref, on the CPU via the Triton interpreter."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

# When triton was imported before TRITON_INTERPRET=1 (torch imports it in some test modules),
# this process cannot interpret kernels (tests/conftest.py sets TRITON_INTERPRET before triton loads).
pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")

from ftlib.reference import rms_norm_ref  # noqa: E402
from kernels.rmsnorm import RMSNormFunction, TritonRMSNorm, rms_norm, rms_norm_fwd  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, dy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 48), (2, 5, 33), (3, 256)])
def test_forward_backward_match_reference(shape, dtype):
    x, w, dy = _inputs(shape, dtype)
    y = rms_norm(x, w, 1e-5)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    # Reference in fp64 from the same (rounded) inputs: the kernel accumulates in fp32.
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    yr = rms_norm_ref(xr, wr, 1e-5)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
    tol = TOL[dtype]
    assert y.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
    torch.testing.assert_close(y.double(), yr, atol=tol, rtol=tol)
    torch.testing.assert_close(dx.double(), dxr, atol=tol * 4, rtol=tol)
    torch.testing.assert_close(dw.double(), dwr, atol=tol * 4 * shape[0], rtol=tol)


def test_rstd_saved():
    x, w, _ = _inputs((5, 40), torch.float32)
    _, rstd = rms_norm_fwd(x.detach(), w.detach(), 1e-5)
    torch.testing.assert_close(rstd, torch.rsqrt(x.detach().pow(2).mean(-1) + 1e-5))


def test_gradcheck_fp64():
    x, w, _ = _inputs((3, 9), torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: RMSNormFunction.apply(a, b, 1e-5), (x, w))


def test_module_matches_ftlib_module():
    from ftlib.norm import RMSNorm

    ref, mod = RMSNorm(24), TritonRMSNorm(24)
    with torch.no_grad():
        ref.weight.normal_()
        mod.weight.copy_(ref.weight)
    x = torch.randn(2, 3, 24)
    torch.testing.assert_close(mod(x), ref(x), atol=1e-5, rtol=1e-5)


def test_non_contiguous_rows_and_wrong_inputs():
    x = torch.randn(6, 64)[:, :32]  # row stride 64, last-dim stride 1: accepted
    w = torch.randn(32)
    torch.testing.assert_close(rms_norm(x, w), rms_norm_ref(x, w, 1e-5), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="last dim"):
        rms_norm(torch.randn(32, 6).t(), torch.randn(32))  # last-dim stride 6
    with pytest.raises(TypeError, match="dtype"):
        rms_norm(torch.randint(0, 5, (4, 8)), torch.randn(8))
    with pytest.raises(ValueError, match="last dim must equal"):
        rms_norm(torch.randn(4, 8), torch.randn(9))
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(torch.randn(4, 8), torch.randn(8, 2)[:, 0])


def test_wrong_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # launcher re-reads it: CPU tensors now rejected
    with pytest.raises(ValueError, match="CUDA"):
        rms_norm(torch.randn(4, 8), torch.randn(8))


def test_detects_a_wrong_kernel():
    """The comparison can fail: a perturbed weight must not pass the tolerance."""
    x, w, _ = _inputs((4, 16), torch.float32)
    y = rms_norm(x.detach(), w.detach() * 1.001)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y, rms_norm_ref(x.detach(), w.detach(), 1e-5), atol=1e-5, rtol=1e-5)
