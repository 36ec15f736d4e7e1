"""The fused head and loss (kernels/linear_cross_entropy.py) vs ftlib.model.reference.linear_cross_entropy_ref, on
kernel_device (tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references in
fp64 on the CPU, bounded by PyTorch's own error in the same dtype (tests/kernel_tolerance.py)."""

import pytest
import torch

pytest.importorskip("triton")

from kernel_tolerance import assert_within_lowp_error  # noqa: E402

from ftlib.model.reference import linear_cross_entropy_ref  # noqa: E402
from kernels._common import ATOMIC_SEMS  # noqa: E402
from kernels.linear_cross_entropy import (  # noqa: E402
    MAX_V,
    LinearCrossEntropyLoss,
    linear_cross_entropy,
    linear_cross_entropy_bwd,
    linear_cross_entropy_fwd,
)

pytestmark = pytest.mark.kernels


def _inputs(n, k, v, dtype, device, seed=0, scale=1.0):
    """Rows x (n, k), a head (v, k) and targets (n,), drawn on the CPU (the same values on every device)."""
    g = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(n, k, generator=g, dtype=torch.float64)).to(device, dtype).requires_grad_(True)
    w = (torch.randn(v, k, generator=g, dtype=torch.float64) / k ** 0.5).to(device, dtype).requires_grad_(True)
    t = torch.randint(0, v, (n,), generator=g).to(device)
    return x, w, t


def _grads(x, w, t, dtype=None, ignore_index=-100, grad_out=2.5):
    """(loss, dx, dw) of the reference on CPU copies of x and w in ``dtype`` (their own by default)."""
    xr = x.detach().cpu().to(dtype or x.dtype).requires_grad_(True)
    wr = w.detach().cpu().to(dtype or w.dtype).requires_grad_(True)
    loss = linear_cross_entropy_ref(xr, wr, t.cpu(), ignore_index)
    dx, dw = torch.autograd.grad(grad_out * loss, (xr, wr))
    return loss, dx, dw


def _check_against_reference(x, w, t, ignore_index=-100):
    loss = linear_cross_entropy(x, w, t, ignore_index=ignore_index)
    dx, dw = torch.autograd.grad(2.5 * loss, (x, w))  # grad_out != 1: the backward's scale is read
    ref = _grads(x, w, t, torch.float64, ignore_index)
    low = _grads(x, w, t, None, ignore_index)  # PyTorch in the kernel's dtype sets the bound
    assert loss.dtype == torch.float32 and dx.dtype == x.dtype and dw.dtype == w.dtype
    for name, got, r, lo in zip(("loss", "dx", "dW"), (loss, dx, dw), ref, low):
        assert_within_lowp_error(got, r, lo, name)
    return dx, ref, low


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 37])
def test_matches_reference_v65(n, dtype, kernel_device):
    # V = 65 (the character vocabulary, padded to 128 columns); K = 40 ends in a partial step of K; 37 rows end in
    # a partial block of rows.
    x, w, t = _inputs(n, 40, 65, dtype, kernel_device)
    dx, ref, low = _check_against_reference(x, w, t)
    with pytest.raises(AssertionError, match="dx"):  # the bound can fail: a gradient 4% off
        assert_within_lowp_error(dx * 1.04, ref[1], low[1], "dx")


def test_ignored_rows_and_large_logits(kernel_device):
    x, w, t = _inputs(19, 32, 65, torch.float32, kernel_device, seed=1, scale=30.0)  # the max subtraction matters
    t[[0, 4, 18]] = -100
    _check_against_reference(x, w, t)
    x, w, t = _inputs(5, 32, 65, torch.float32, kernel_device, seed=2)
    t[:] = 7
    t[1] = 3  # another ignore_index: row 1 adds nothing to the loss, dx or dW
    loss = linear_cross_entropy(x, w, t, ignore_index=3)
    dx, dw = torch.autograd.grad(loss, (x, w))
    assert dx[1].abs().max().item() == 0.0
    keep = torch.tensor([0, 2, 3, 4])
    ref = linear_cross_entropy_ref(x.detach().cpu().double()[keep], w.detach().cpu().double(), t.cpu()[keep])
    assert abs(loss.item() - ref.item()) < 1e-5


@pytest.mark.parametrize("sem", ATOMIC_SEMS)
def test_adds_into_dw_out_and_reads_w_compute(sem, kernel_device):
    """The engine's use: fp32 master weight, products on its bf16 copy, dW added into a gradient view (the adds in
    either memory order)."""
    x, w, t = _inputs(37, 48, 65, torch.bfloat16, kernel_device, seed=3)
    master = w.detach().float().requires_grad_(True)
    dw_out = torch.ones(65, 48, device=kernel_device)  # what is there is added to, not overwritten
    loss = linear_cross_entropy(x, master, t, w_compute=w.detach(), dw_out=dw_out, sem=sem)
    loss.backward()
    assert master.grad is None  # its gradient went into dw_out
    ref = _grads(x, w, t, torch.float64, grad_out=1.0)
    low = _grads(x, w, t, None, grad_out=1.0)
    assert_within_lowp_error(dw_out - 1.0, ref[2], low[2], "dW added")
    assert_within_lowp_error(x.grad, ref[1], low[1], "dx")


def test_module_and_launchers(kernel_device):
    x, w, t = _inputs(20, 32, 10, torch.float32, kernel_device, seed=4)
    loss = LinearCrossEntropyLoss()(x, w, t)
    assert abs(loss.item() - linear_cross_entropy_ref(x.detach().cpu(), w.detach().cpu(), t.cpu()).item()) < 1e-5
    loss, lse, n_valid = linear_cross_entropy_fwd(x.detach(), w.detach(), t)
    assert lse.shape == (20,) and n_valid.item() == 20
    ref_lse = torch.logsumexp(x.detach().cpu().double() @ w.detach().cpu().double().T, dim=1)
    assert (lse.cpu().double() - ref_lse).abs().max().item() < 1e-5
    dw = torch.zeros(10, 32, device=kernel_device)
    dx = linear_cross_entropy_bwd(x.detach(), w.detach(), t, lse, n_valid, torch.zeros((), device=kernel_device), dw)
    assert dx.abs().max().item() == 0.0 and dw.abs().max().item() == 0.0  # grad_out 0: nothing flows


def test_launcher_rejects_what_it_cannot_take(kernel_device):
    x, w, t = _inputs(4, 32, 10, torch.float32, kernel_device)
    x, w = x.detach(), w.detach()
    with pytest.raises(ValueError, match="input_precision"):
        linear_cross_entropy_fwd(x, w, t, input_precision="tf32x3")
    with pytest.raises(ValueError, match="sem='release'; expected one of"):
        linear_cross_entropy(x, w, t, sem="release")
    with pytest.raises(TypeError, match="share a dtype"):
        linear_cross_entropy_fwd(x, w.bfloat16(), t)
    with pytest.raises(ValueError, match="K=32"):
        linear_cross_entropy_fwd(x, w[:, :16], t)
    with pytest.raises(ValueError, match="3 entries for 4 rows"):
        linear_cross_entropy_fwd(x, w, t[:3])
    big = torch.zeros(MAX_V + 1, 32, device=kernel_device)
    with pytest.raises(ValueError, match=f"V={MAX_V + 1}"):
        linear_cross_entropy_fwd(x, big, t)
    _, lse, n_valid = linear_cross_entropy_fwd(x, w, t)
    with pytest.raises(ValueError, match="dw_out"):
        linear_cross_entropy_bwd(x, w, t, lse, n_valid, torch.ones((), device=kernel_device),
                                 torch.zeros(10, 32, dtype=torch.bfloat16, device=kernel_device))
    with pytest.raises(ValueError, match="lse must be"):
        linear_cross_entropy_bwd(x, w, t, lse[:3], n_valid, torch.ones((), device=kernel_device),
                                 torch.zeros(10, 32, device=kernel_device))
    with pytest.raises(ValueError, match="one value"):
        linear_cross_entropy_bwd(x, w, t, lse, n_valid, torch.ones(2, device=kernel_device),
                                 torch.zeros(10, 32, device=kernel_device))
