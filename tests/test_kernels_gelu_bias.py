"""GELU's backward fused with the preceding Linear's bias gradient (kernels/bias_linear.py, gelu_bwd_bias_add_ and
gelu_bias_grad) against ftlib.model.reference.gelu_bias_grad_ref, on kernel_device (tests/conftest.py)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ftlib.model.reference import gelu_bias_grad_ref  # noqa: E402
from kernels.bias_linear import gelu_bias_grad, gelu_bwd_bias_add_  # noqa: E402

pytestmark = pytest.mark.kernels


def _inputs(lead, N, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    z = (2 * mk(*lead, N)).to(device, dtype)  # both GELU tails and its middle
    da = (mk(*lead, N) + 0.3).to(device, dtype)  # an offset: a dropped or doubled row shows in the sums
    return z, da


# Interpreter tiles are 8 rows x 16 columns: N = 40 and 29 leave partial column blocks, M = 5 is less than a
# row tile, M = 300 spans several row splits (each adding its partial row into the buffer).
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("lead,N,dtype", [((37,), 40, torch.float32), ((2, 150), 29, torch.float32),
                                          ((5,), 16, torch.float64), ((300,), 24, torch.bfloat16)],
                         ids=["M37-N40", "3d-M300-N29", "fp64-M5", "bf16-M300"])
def test_matches_gelu_backward_and_the_column_sums(lead, N, dtype, approximate, kernel_device):
    z, da = _inputs(lead, N, dtype, kernel_device)
    start = torch.linspace(-1.0, 1.0, N, dtype=torch.promote_types(dtype, torch.float32), device=kernel_device)
    db = start.clone()
    dz = gelu_bwd_bias_add_(z, da, db, approximate)
    dz_ref, db_ref = gelu_bias_grad_ref(z.cpu(), da.cpu(), approximate)
    assert dz.shape == z.shape and dz.dtype == dtype
    if dtype == torch.bfloat16:  # both round the fp32 product to bf16: at most one bf16 step apart
        torch.testing.assert_close(dz.cpu(), dz_ref, rtol=8e-3, atol=1e-2)
        # The sums are of the kernel's own dz as stored.
        want = start.cpu() + dz.cpu().float().reshape(-1, N).sum(0)
        torch.testing.assert_close(db.cpu(), want, rtol=1e-5, atol=1e-4)
    else:
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(dz.cpu(), dz_ref, rtol=tol, atol=tol)
        torch.testing.assert_close(db.cpu() - start.cpu(), db_ref, rtol=tol, atol=10 * tol)


def test_function_is_f_gelu_forward_and_adds_the_bias_gradient(kernel_device):
    z, da = _inputs((3, 21), 40, torch.float64, kernel_device, seed=2)
    z.requires_grad_(True)
    db = torch.zeros(40, dtype=torch.float64, device=kernel_device)
    a = gelu_bias_grad(z, "tanh", db)
    torch.testing.assert_close(a, F.gelu(z, approximate="tanh"), rtol=0, atol=0)
    (dz,) = torch.autograd.grad(a, z, da)
    dz_ref, db_ref = gelu_bias_grad_ref(z.detach().cpu(), da.cpu(), "tanh")
    torch.testing.assert_close(dz.cpu(), dz_ref)
    torch.testing.assert_close(db.cpu(), db_ref)
    assert torch.autograd.gradcheck(lambda t: gelu_bias_grad(t, "none", torch.zeros(40, dtype=torch.float64,
                                                                                   device=kernel_device)),
                                    (z.detach()[:1, :5].clone().requires_grad_(True),), eps=1e-6, atol=1e-6)


def test_bad_arguments_say_what_is_wrong(kernel_device):
    z, da = _inputs((8,), 16, torch.float32, kernel_device)
    db = torch.zeros(16, device=kernel_device)
    with pytest.raises(ValueError, match="approximate must be one of"):
        gelu_bwd_bias_add_(z, da, db, "erf")
    with pytest.raises(ValueError, match="da must have z's shape"):
        gelu_bwd_bias_add_(z, da[:4], db)
    with pytest.raises(TypeError, match="da has dtype"):
        gelu_bwd_bias_add_(z, da.double(), db)
    with pytest.raises(ValueError, match=r"db_out must be \(16,\) torch.float32"):
        gelu_bwd_bias_add_(z, da, db[:8])
    with pytest.raises(ValueError, match="z must be contiguous"):
        gelu_bwd_bias_add_(z.t(), da.t(), db)
