"""Fused cross-entropy kernel vs ftlib.model.reference.cross_entropy_ref, on kernel_device (tests/conftest.py:
the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

from kernel_tolerance import assert_within_lowp_error  # noqa: E402

from ftlib.model.reference import cross_entropy_ref  # noqa: E402
from kernels.cross_entropy import (  # noqa: E402
    MAX_BLOCK_V,
    CrossEntropyFunction,
    TritonCrossEntropyLoss,
    cross_entropy,
    cross_entropy_fwd,
)

pytestmark = pytest.mark.kernels

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
    # PyTorch's loss from the same logits in the same dtype (fp32 inside, as the kernel) sets
    # the bound: tests/kernel_tolerance.py.
    zl = _cpu_leaf(z)
    ll = cross_entropy_ref(zl, t.cpu())
    (dzl,) = torch.autograd.grad(2.5 * ll, zl)
    assert loss.dtype == torch.float32 and dz.dtype == dtype and dz.device == z.device
    assert_within_lowp_error(loss, lr, ll, "loss")
    assert_within_lowp_error(dz, dzr, dzl, "dlogits")
    with pytest.raises(AssertionError, match="dlogits"):  # the bound can fail: a gradient 4% off
        assert_within_lowp_error(dz * 1.04, dzr, dzl, "dlogits")


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


@pytest.mark.parametrize("bad", [65, 1000, -1, -101])
def test_out_of_range_targets_raise_like_f_cross_entropy(bad, kernel_device):
    # F.cross_entropy refuses them; before the check the kernel read another row's logits (or
    # past the tensor) and returned a finite loss.
    z, t = _inputs(6, 65, torch.float32, kernel_device, seed=5)
    t[3] = bad
    with pytest.raises(IndexError, match="out of bounds"):
        torch.nn.functional.cross_entropy(z.detach().cpu(), t.cpu())
    with pytest.raises(ValueError, match=rf"targets must be class indices in \[0, 65\) or ignore_index=-100; "
                                         rf"1 of 6 are not, e.g. \[{bad}\] at rows \[3\]"):
        cross_entropy(z, t)
    with pytest.raises(ValueError, match="targets must be class indices"):
        TritonCrossEntropyLoss()(z, t)


def test_ignore_index_is_not_out_of_range_and_the_check_can_be_skipped(kernel_device):
    z, t = _inputs(6, 65, torch.float32, kernel_device, seed=6)
    t[1] = -1
    want = cross_entropy_ref(z.detach().cpu(), t.cpu(), ignore_index=-1)
    torch.testing.assert_close(cross_entropy(z, t, ignore_index=-1).detach().cpu(), want)
    t[2] = 64  # the last class: in range
    cross_entropy(z, t, ignore_index=-1)
    t[2] = 65
    with pytest.raises(ValueError, match="ignore_index=-1"):
        cross_entropy(z, t, ignore_index=-1)
    # Without the check (no host sync; the caller vouches for its targets) the kernel takes a
    # target of 65 in row 2 as row 3's first logit: finite and wrong, what the check prevents.
    assert torch.isfinite(cross_entropy(z, t, ignore_index=-1, check_targets=False)).item()
