"""Fused residual add + RMSNorm / LayerNorm (kernels/residual_norm.py) vs ftlib.model.reference, on kernel_device
(tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import add_layer_norm_ref, add_rms_norm_ref  # noqa: E402
from kernels.residual_norm import (  # noqa: E402
    AddNormFunction,
    add_layer_norm,
    add_norm_fwd,
    add_rms_norm,
    keep_mask,
)

pytestmark = pytest.mark.kernels

# kind -> (kernel(x, r, w, b), reference(x, r, w, b), has bias)
KINDS = {
    "rms": (lambda x, r, w, b: add_rms_norm(x, r, w, 1e-5), lambda x, r, w, b: add_rms_norm_ref(x, r, w, 1e-5), False),
    "ln": (lambda x, r, w, b: add_layer_norm(x, r, w, b, 1e-5),
           lambda x, r, w, b: add_layer_norm_ref(x, r, w, b, 1e-5), True),
    "ln-nobias": (lambda x, r, w, b: add_layer_norm(x, r, w, None, 1e-5),
                  lambda x, r, w, b: add_layer_norm_ref(x, r, w, None, 1e-5), False),
}


def _inputs(shape, device, dtype=torch.float32, seed=0):
    # Drawn on the CPU (the same values on every device), then moved.
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    # A mean offset, so a LayerNorm that forgot to centre (or centred the padding) fails.
    x, r = (mk(*shape) + 0.7).requires_grad_(True), mk(*shape).requires_grad_(True)
    w = (1 + 0.1 * mk(shape[-1])).requires_grad_(True)
    b = (0.1 * mk(shape[-1])).requires_grad_(True)
    return x, r, w, b, mk(*shape), mk(*shape)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("use_s", [True, False], ids=["s-and-h-used", "only-h-used"])
@pytest.mark.parametrize("shape", [(37, 48), (2, 19, 64), (5, 256), (3, 7, 40)])
def test_outputs_and_every_gradient_match_reference(shape, use_s, kind, kernel_device):
    fn, ref, has_bias = KINDS[kind]
    x, r, w, b, ds, dh = _inputs(shape, kernel_device)
    s, h = fn(x, r, w, b)
    outs, grads_out = ((s, h), (ds, dh)) if use_s else ((h,), (dh,))
    params = (x, r, w, b) if has_bias else (x, r, w)
    got = torch.autograd.grad(outs, params, grads_out)
    ref_in = [t.detach().cpu().double().requires_grad_(True) for t in (x, r, w, b)]
    sr, hr = ref(*ref_in)
    ref_outs = (sr, hr) if use_s else (hr,)
    want = torch.autograd.grad(ref_outs, ref_in[: len(params)], [g.cpu().double() for g in grads_out])
    assert s.device == h.device == x.device
    torch.testing.assert_close(s.detach().cpu().double(), sr.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h.detach().cpu().double(), hr.detach(), atol=1e-5, rtol=1e-5)
    for name, a, c in zip(("dx", "dr", "dw", "db"), got, want):
        torch.testing.assert_close(a.cpu().double(), c, atol=1e-4, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("rows", [1, 4, 8, 32])
@pytest.mark.parametrize("layer_norm", [False, True], ids=["rms", "ln"])
def test_every_row_tile_gives_the_same_results(rows, layer_norm, kernel_device):
    # The tile sizes benchmarks/kernels/residual_norm_dev.py times: 37 rows leave a partial last tile.
    x, r, w, b, ds, dh = _inputs((37, 48), kernel_device, seed=3)
    b = b if layer_norm else None
    fn = (lambda rows: add_layer_norm(x, r, w, b, 1e-5, rows=rows)) if layer_norm else (
        lambda rows: add_rms_norm(x, r, w, 1e-5, rows=rows))
    params = (x, r, w, b) if layer_norm else (x, r, w)
    base = [*fn(16), *torch.autograd.grad(fn(16), params, (ds, dh))]
    got = [*fn(rows), *torch.autograd.grad(fn(rows), params, (ds, dh))]
    names = ["s", "h", "dx", "dr", "dw", "db"]
    # s, h, dx, dr: each row on its own. The interpreter gives them bit for bit; compiled, the tile's
    # shape (rows, and the warps that follow from it) may reorder a row's reduction, so a few ulp.
    for name, a, c in zip(names[:4], got, base):
        if a.device.type == "cpu":
            assert torch.equal(a, c), f"{name} with {rows}-row tiles: max diff {(a - c).abs().max().item():.3g}"
        else:
            torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    # dw, db: sums over the rows whose order the tiling sets (one fp32 partial per tile, then
    # summed), so the same sum rounded another way: up to about M * eps times the terms' size, with
    # the largest |sum| standing in for it. A lost or doubled row is off by one row's whole term.
    M = x.shape[0]
    for name, a, c in zip(names[4:], got[4:], base[4:]):
        atol = M * torch.finfo(c.dtype).eps * c.abs().max().item()
        torch.testing.assert_close(a, c, atol=atol, rtol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kind", list(KINDS))
def test_only_s_used_passes_its_gradient_through(kind, kernel_device):
    fn, _, _ = KINDS[kind]
    x, r, w, b, ds, _ = _inputs((7, 32), kernel_device)
    s, _ = fn(x, r, w, b)
    dx, dr = torch.autograd.grad(s, (x, r), ds)
    torch.testing.assert_close(dx, ds)
    torch.testing.assert_close(dr, ds)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_bf16_branch_into_fp32_residual(kind, kernel_device):
    """Under bf16 autocast the branch output is bf16 and the residual stream fp32."""
    fn, _, _ = KINDS[kind]
    x, r, w, b, ds, dh = _inputs((9, 64), kernel_device)
    rb = r.detach().bfloat16().requires_grad_(True)
    s, h = fn(x, rb, w, b)
    assert s.dtype == h.dtype == torch.float32
    dx, dr = torch.autograd.grad((s, h), (x, rb), (ds, dh))
    assert dr.dtype == torch.bfloat16
    torch.testing.assert_close(dr.float(), dx, atol=1e-2, rtol=1e-2)


def test_gradcheck_fp64_rms(kernel_device):
    x, r, w, _, _, _ = _inputs((3, 16), kernel_device, torch.float64)
    assert torch.autograd.gradcheck(lambda a, c, d: AddNormFunction.apply(a, c, d, None, 1e-5, False), (x, r, w))


def test_gradcheck_fp64_layernorm_with_bias(kernel_device):
    x, r, w, b, _, _ = _inputs((3, 20), kernel_device, torch.float64)  # N=20: padded to 32 columns
    assert torch.autograd.gradcheck(lambda a, c, d, e: AddNormFunction.apply(a, c, d, e, 1e-5, True), (x, r, w, b))


def test_shape_mismatch_raises(kernel_device):
    dev = kernel_device
    with pytest.raises(ValueError, match="one shape"):
        add_rms_norm(torch.randn(4, 8, device=dev), torch.randn(4, 9, device=dev), torch.ones(8, device=dev))
    with pytest.raises(ValueError, match="bias"):
        add_layer_norm(torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev), torch.ones(8, device=dev),
                       torch.zeros(7, device=dev))


def test_bias_without_layernorm_raises(kernel_device):
    dev = kernel_device
    with pytest.raises(ValueError, match="only defined for LayerNorm"):
        add_norm_fwd(torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev), torch.ones(8, device=dev),
                     torch.zeros(8, device=dev), 1e-5, False)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_bf16_output_equals_autocasts_cast_and_passes_gradients(kind, kernel_device):
    """h written in bf16 = the fp32 h rounded once (what the next Linear's autocast cast gives),
    and a bf16 dh reaches the same gradients as the same values in fp32.

    On the GPU Triton rounds fp32 -> bf16 to nearest even, like torch's cast; the CPU
    interpreter truncates, so here the two may differ by one bf16 unit (2^-7 relative)."""
    x, r, w, b, ds, dh = _inputs((11, 40), kernel_device)
    args = (x, r, w, b, 1e-5) if kind == "ln" else (x, r, w, 1e-5)
    fn = add_layer_norm if kind == "ln" else add_rms_norm
    s32, h32 = fn(*args)
    s16, h16 = fn(*args, out_dtype=torch.bfloat16)
    assert h16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    torch.testing.assert_close(h16.float(), h32, atol=0, rtol=2.0**-7)
    assert ((h16.float() - h32).abs() <= (h32.bfloat16().float() - h32).abs() + h32.abs() * 2.0**-7).all()
    torch.testing.assert_close(s16, s32, atol=0, rtol=0)
    dh16 = dh.bfloat16()
    params = (x, r, w, b) if kind == "ln" else (x, r, w)
    g16 = torch.autograd.grad((s16, h16), params, (ds, dh16))
    g32 = torch.autograd.grad((s32, h32), params, (ds, dh16.float()))
    for a, c in zip(g16, g32):
        assert a.dtype == c.dtype
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6)


# --- fused residual dropout -------------------------------------------------------------------

def _seed(device, v=12345):
    return torch.tensor([v], dtype=torch.int64, device=device)


@pytest.mark.parametrize("rng4", [True, False], ids=["philox-per-4", "philox-per-element"])
def test_keep_mask_statistics_and_streams(rng4, kernel_device):
    """Keep fraction ~ 1 - p; another salt or seed value gives another mask; the same gives the same."""
    seed = _seed(kernel_device)
    m = keep_mask(seed, (64, 256), 0.2, rng4=rng4)
    assert m.dtype == torch.bool and m.shape == (64, 256)
    frac = m.float().mean().item()
    assert abs(frac - 0.8) < 0.01, frac  # 16,384 draws: sd of the fraction ~0.003
    assert torch.equal(m, keep_mask(seed, (64, 256), 0.2, rng4=rng4))
    other_salt = keep_mask(seed, (64, 256), 0.2, salt=1, rng4=rng4)
    other_seed = keep_mask(_seed(kernel_device, 12346), (64, 256), 0.2, rng4=rng4)
    for o in (other_salt, other_seed):
        agree = (o == m).float().mean().item()
        assert abs(agree - (0.8**2 + 0.2**2)) < 0.02, agree  # independent masks agree on 68%
    # Rows are not repeated (the counter includes the row), nor are the columns of one 4-column
    # group (each takes its own Philox lane): neighbouring columns agree on ~68% like independent ones.
    assert not torch.equal(m[0], m[1])
    for lag in (1, 2, 3, 4):
        agree = (m[:, lag:] == m[:, :-lag]).float().mean().item()
        assert abs(agree - 0.68) < 0.02, (lag, agree)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("shape,rng4", [((37, 48), True), ((2, 19, 64), True), ((5, 30), True), ((37, 48), False),
                                        ((5, 30), False)])
@pytest.mark.parametrize("use_s", [True, False], ids=["s-and-h-used", "only-h-used"])
def test_dropout_outputs_and_every_gradient_match_reference(shape, rng4, kind, use_s, kernel_device):
    """s = x + r keep / (1 - p) with the mask keep_mask draws; every gradient against the reference."""
    _, _, has_bias = KINDS[kind]
    ln = kind != "rms"
    p, seed, salt = 0.3, _seed(kernel_device, 777), 5
    x, r, w, b, ds, dh = _inputs(shape, kernel_device, seed=1)
    b = b if has_bias else None
    keep = keep_mask(seed, shape, p, salt, rng4)
    if ln:
        s, h = add_layer_norm(x, r, w, b, 1e-5, p=p, seed=seed, salt=salt, rng4=rng4)
    else:
        s, h = add_rms_norm(x, r, w, 1e-5, p=p, seed=seed, salt=salt, rng4=rng4)
    params = (x, r, w, b) if has_bias else (x, r, w)
    outs, grads_out = ((s, h), (ds, dh)) if use_s else ((h,), (dh,))
    got = torch.autograd.grad(outs, params, grads_out)
    ref_in = [t.detach().cpu().double().requires_grad_(True) for t in params]
    keep64 = keep.cpu().double()
    rf = add_layer_norm_ref if ln else add_rms_norm_ref
    sr, hr = (rf(*ref_in[:3], ref_in[3] if has_bias else None, 1e-5, keep64, p) if ln
              else rf(*ref_in, 1e-5, keep64, p))
    want = torch.autograd.grad((sr, hr) if use_s else (hr,), ref_in, [g.cpu().double() for g in grads_out])
    torch.testing.assert_close(s.detach().cpu().double(), sr.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h.detach().cpu().double(), hr.detach(), atol=1e-5, rtol=1e-5)
    for name, a, c in zip(("dx", "dr", "dw", "db"), got, want):
        torch.testing.assert_close(a.cpu().double(), c, atol=1e-4, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    # The dropped entries of r get exactly zero gradient; about p of them are dropped.
    assert (got[1][~keep] == 0).all() and 0.15 < (~keep).float().mean().item() < 0.45


def test_dropout_only_s_used_and_bf16_branch(kernel_device):
    p, seed = 0.25, _seed(kernel_device, 3)
    x, r, w, _, ds, dh = _inputs((9, 64), kernel_device)
    keep = keep_mask(seed, (9, 64), p, 2)
    s, _ = add_rms_norm(x, r, w, p=p, seed=seed, salt=2)
    dx, dr = torch.autograd.grad(s, (x, r), ds)
    torch.testing.assert_close(dx, ds)
    torch.testing.assert_close(dr, ds * keep / (1 - p))
    # A bf16 branch: dr comes back in bf16 from the kernel, masked and scaled.
    rb = r.detach().bfloat16().requires_grad_(True)
    s, h = add_rms_norm(x, rb, w, p=p, seed=seed, salt=2)
    dx, dr = torch.autograd.grad((s, h), (x, rb), (ds, dh))
    assert dr.dtype == torch.bfloat16
    torch.testing.assert_close(dr.float(), dx * keep / (1 - p), atol=2e-2, rtol=1e-2)


def test_dropout_mask_follows_the_seed_tensor(kernel_device):
    """A captured graph replays the same kernel: a new value in the seed tensor must give a new mask."""
    seed = _seed(kernel_device, 10)
    x, r, w, _, _, _ = _inputs((16, 32), kernel_device)
    s1, _ = add_rms_norm(x, r, w, p=0.5, seed=seed)
    s1b, _ = add_rms_norm(x, r, w, p=0.5, seed=seed)
    seed.add_(1)
    s2, _ = add_rms_norm(x, r, w, p=0.5, seed=seed)
    assert torch.equal(s1, s1b) and not torch.equal(s1, s2)


def test_gradcheck_fp64_with_dropout(kernel_device):
    x, r, w, b, _, _ = _inputs((3, 20), kernel_device, torch.float64)
    seed = _seed(kernel_device, 99)
    assert torch.autograd.gradcheck(
        lambda a, c, d, e: AddNormFunction.apply(a, c, d, e, 1e-5, True, None, 4, 0.4, seed, 7), (x, r, w, b))


def test_dropout_argument_checks(kernel_device):
    dev = kernel_device
    x, r, w = torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev), torch.ones(8, device=dev)
    with pytest.raises(ValueError, match="must be in \\[0, 1\\)"):
        add_rms_norm(x, r, w, p=1.0, seed=_seed(kernel_device))
    with pytest.raises(ValueError, match="needs a seed"):
        add_rms_norm(x, r, w, p=0.1)
    with pytest.raises(TypeError, match="seed has dtype"):
        add_rms_norm(x, r, w, p=0.1, seed=torch.tensor([1.0], device=dev))
    with pytest.raises(ValueError, match="salt"):
        add_rms_norm(x, r, w, p=0.1, seed=_seed(kernel_device), salt=5000)
