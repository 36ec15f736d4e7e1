"""A norm with no residual add before it, its backward on the fused residual-norm kernel (kernels/norm_into.py),
against the fp64 reference on kernel_device (tests/conftest.py): the output and dx, and the weight and bias
gradients added into the buffers given (which may already hold a contribution)."""

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import layer_norm_ref, rms_norm_ref  # noqa: E402
from kernels.norm_into import norm_into  # noqa: E402

pytestmark = pytest.mark.kernels


def _inputs(shape, dtype, device, bias: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = shape[-1]
    x = (torch.randn(*shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(device, dtype)
    w = (1 + 0.3 * torch.randn(N, generator=g, dtype=torch.float64)).to(device, torch.float32)
    b = (0.2 * torch.randn(N, generator=g, dtype=torch.float64)).to(device, torch.float32) if bias else None
    dy = torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)
    return x, w, b, dy


# Interpreter tiles are 4 rows: 37 and 3 x 5 rows leave a partial tile; N = 40 and 33 a partial column block.
@pytest.mark.parametrize("kind", ["layernorm", "layernorm-no-bias", "rmsnorm"])
@pytest.mark.parametrize("shape,dtype", [((37, 40), torch.float32), ((3, 5, 33), torch.float32),
                                         ((37, 64), torch.bfloat16)], ids=["M37-N40", "3d-N33", "bf16"])
@pytest.mark.parametrize("sem", ["acq_rel", "relaxed"])  # the adds' memory order (kernels._common.ATOMIC_SEMS)
def test_output_dx_and_the_added_weight_gradients_match_the_reference(kind, shape, dtype, sem, kernel_device):
    ln, bias = kind.startswith("layernorm"), kind == "layernorm"
    x, w, b, dy = _inputs(shape, dtype, kernel_device, bias)
    N = shape[-1]
    before_w, before_b = torch.randn(N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    dw_out = before_w.to(kernel_device, torch.float32, copy=True)
    db_out = before_b.to(kernel_device, torch.float32, copy=True) if bias else None
    xg = x.detach().requires_grad_(True)
    y = norm_into(xg, w, b, 1e-5, ln, dw_out, db_out, sem=sem)
    (dx,) = torch.autograd.grad(y, xg, dy)
    ins = [t.detach().cpu().double().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    ref = layer_norm_ref(ins[0], ins[1], ins[2], 1e-5) if ln else rms_norm_ref(ins[0], ins[1], 1e-5)
    want = torch.autograd.grad(ref, [t for t in ins if t is not None], dy.cpu().double())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert y.dtype == dtype and dx.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.detach().cpu().double(), ref.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(dx.cpu().double(), want[0], atol=tol, rtol=tol)
    # The gradients of the weight (and bias) were added to what the buffers held.
    scale = max(1.0, want[1].abs().max().item())
    torch.testing.assert_close(dw_out.cpu().double() - before_w, want[1], atol=tol * scale, rtol=tol)
    if bias:
        torch.testing.assert_close(db_out.cpu().double() - before_b, want[2], atol=tol * scale, rtol=tol)
    assert w.grad is None  # autograd got no gradient for the weight: it is in the buffer


def test_a_misrouted_weight_gradient_fails_the_comparison(kernel_device, monkeypatch):
    """The comparison above catches a backward that adds the weight gradient anywhere but the buffer given."""
    import kernels.norm_into as NI

    def run():
        x, w, b, dy = _inputs((37, 40), torch.float32, kernel_device, True)
        dw_out, db_out = torch.zeros(40, device=kernel_device), torch.zeros(40, device=kernel_device)
        y = norm_into(x.requires_grad_(True), w, b, 1e-5, True, dw_out, db_out)
        torch.autograd.grad(y, x, dy)
        want = (dy.double() * torch.nn.functional.layer_norm(x.detach().double(), (40,))).sum(0)
        torch.testing.assert_close(dw_out.cpu().double(), want.cpu(), atol=1e-4, rtol=1e-5)

    run()
    real = NI.add_norm_bwd
    monkeypatch.setattr(NI, "add_norm_bwd", lambda *a, **k: real(*a, **{**k, "dw_out": k["dw_out"].clone()}))
    with pytest.raises(AssertionError):
        run()


def test_bad_buffers_are_refused(kernel_device):
    x, w, b, _ = _inputs((8, 16), torch.float32, kernel_device, True)
    z = torch.zeros(16, device=kernel_device)
    with pytest.raises(ValueError, match="db_out exactly when the norm has a bias"):
        norm_into(x, w, b, 1e-5, True, z, None)
    with pytest.raises(ValueError, match="db_out exactly when the norm has a bias"):
        norm_into(x, w, None, 1e-5, True, z, z.clone())
    with pytest.raises(ValueError, match="dw_out must be contiguous"):
        norm_into(x, w, b, 1e-5, True, torch.zeros(32, device=kernel_device)[::2], z)
    with pytest.raises(ValueError, match=r"dw_out must be \(16,\) in torch.float32"):
        norm_into(x, w, b, 1e-5, True, torch.zeros(16, device=kernel_device, dtype=torch.bfloat16), z)
    with pytest.raises(ValueError, match="only defined for LayerNorm"):
        norm_into(x, w, b, 1e-5, False, z, z.clone())
    with pytest.raises(ValueError, match="sem='release'; expected one of"):
        norm_into(x, w, b, 1e-5, True, z, z.clone(), sem="release")
