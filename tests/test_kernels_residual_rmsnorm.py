"""Fused residual add + RMSNorm (kernels/residual_rmsnorm.py) vs ftlib.reference.add_rms_norm_ref, interpreter."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")

from ftlib.reference import add_rms_norm_ref  # noqa: E402
from kernels.residual_rmsnorm import AddRMSNormFunction, add_rms_norm  # noqa: E402


def _inputs(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    x, r = mk(*shape).requires_grad_(True), mk(*shape).requires_grad_(True)
    w = (1 + 0.1 * mk(shape[-1])).requires_grad_(True)
    return x, r, w, mk(*shape), mk(*shape)


@pytest.mark.parametrize("use_s", [True, False], ids=["s-and-h-used", "only-h-used"])
@pytest.mark.parametrize("shape", [(37, 48), (2, 19, 64), (5, 256)])
def test_outputs_and_every_gradient_match_reference(shape, use_s):
    x, r, w, ds, dh = _inputs(shape)
    s, h = add_rms_norm(x, r, w, 1e-5)
    outs, grads_out = ((s, h), (ds, dh)) if use_s else ((h,), (dh,))
    got = torch.autograd.grad(outs, (x, r, w), grads_out)
    ref_in = [t.detach().double().requires_grad_(True) for t in (x, r, w)]
    sr, hr = add_rms_norm_ref(*ref_in, 1e-5)
    ref_outs = (sr, hr) if use_s else (hr,)
    want = torch.autograd.grad(ref_outs, ref_in, [g.double() for g in grads_out])
    torch.testing.assert_close(s.double(), sr, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h.double(), hr, atol=1e-5, rtol=1e-5)
    for name, a, b in zip(("dx", "dr", "dw"), got, want):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_only_s_used_passes_its_gradient_through():
    x, r, w, ds, _ = _inputs((7, 32))
    s, _ = add_rms_norm(x, r, w)
    dx, dr = torch.autograd.grad(s, (x, r), ds)
    torch.testing.assert_close(dx, ds)
    torch.testing.assert_close(dr, ds)


def test_bf16_branch_into_fp32_residual():
    """Under bf16 autocast the branch output is bf16 and the residual stream fp32."""
    x, r, w, ds, dh = _inputs((9, 64))
    rb = r.detach().bfloat16().requires_grad_(True)
    s, h = add_rms_norm(x, rb, w)
    assert s.dtype == h.dtype == torch.float32
    dx, dr = torch.autograd.grad((s, h), (x, rb), (ds, dh))
    assert dr.dtype == torch.bfloat16
    torch.testing.assert_close(dr.float(), dx, atol=1e-2, rtol=1e-2)


def test_gradcheck_fp64():
    x, r, w, _, _ = _inputs((3, 16), torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: AddRMSNormFunction.apply(a, b, c, 1e-5), (x, r, w))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="one shape"):
        add_rms_norm(torch.randn(4, 8), torch.randn(4, 9), torch.ones(8))
