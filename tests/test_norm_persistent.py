"""The norm backwards' persistent weight-gradient partials (``dw_partials="persistent"``, kernels/rmsnorm.py
and kernels/residual_norm.py) against the default per-tile partials and the plain-PyTorch references
(ftlib.model.reference), on kernel_device (tests/conftest.py); references on the CPU. Odd row counts, fewer
rows than programs, other row tiles and program counts, fused dropout (the same masks), the argument checks."""

import pytest
import torch

pytest.importorskip("triton")

from kernel_tolerance import assert_within_lowp_error  # noqa: E402

import kernels._common as common  # noqa: E402
from ftlib.model.reference import add_layer_norm_ref, add_rms_norm_ref, rms_norm_ref  # noqa: E402
from kernels._common import DW_PARTIALS, persistent_grid  # noqa: E402
from kernels.residual_norm import (  # noqa: E402
    AddNormFunction,
    add_layer_norm,
    add_norm_bwd,
    add_norm_fwd,
    add_rms_norm,
    keep_mask,
)
from kernels.rmsnorm import RMSNormFunction, TritonRMSNorm, rms_norm, rms_norm_bwd, rms_norm_fwd  # noqa: E402

pytestmark = pytest.mark.kernels

EPS = 1e-5
# kind -> (kernel(x, r, w, b, **kw) -> outputs, reference(x, r, w, b) -> outputs, the inputs differentiated)
KINDS = {
    "rmsnorm": (lambda x, r, w, b, **kw: (rms_norm(x, w, EPS, **kw),),
                lambda x, r, w, b: (rms_norm_ref(x, w, EPS),), ("x", "w")),
    "add-rmsnorm": (lambda x, r, w, b, **kw: add_rms_norm(x, r, w, EPS, **kw),
                    lambda x, r, w, b: add_rms_norm_ref(x, r, w, EPS), ("x", "r", "w")),
    "add-layernorm": (lambda x, r, w, b, **kw: add_layer_norm(x, r, w, b, EPS, **kw),
                      lambda x, r, w, b: add_layer_norm_ref(x, r, w, b, EPS), ("x", "r", "w", "b")),
    "add-layernorm-nobias": (lambda x, r, w, b, **kw: add_layer_norm(x, r, w, None, EPS, **kw),
                             lambda x, r, w, b: add_layer_norm_ref(x, r, w, None, EPS), ("x", "r", "w")),
}


def _inputs(shape, device, dtype=torch.float32, seed=0):
    """x, r, w, b (requiring grad) and one upstream gradient per output, drawn on the CPU then moved."""
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    t = {"x": mk(*shape) + 0.7, "r": mk(*shape), "w": 1 + 0.1 * mk(shape[-1]), "b": 0.1 * mk(shape[-1])}
    return {k: v.requires_grad_(True) for k, v in t.items()}, (mk(*shape), mk(*shape))


def _run(kind, t, douts, **kw):
    """Outputs and the gradients of every differentiated input, through the kernel."""
    fn, _, names = KINDS[kind]
    outs = fn(t["x"], t["r"], t["w"], t["b"], **kw)
    return outs, torch.autograd.grad(outs, [t[n] for n in names], douts[: len(outs)])


def _reference(kind, t, douts, dtype):
    """The reference's outputs and gradients in fp64 and in ``dtype`` (PyTorch's own error), on the CPU."""
    _, ref, names = KINDS[kind]
    out = {}
    for d in (torch.float64, dtype):
        ti = {k: v.detach().cpu().to(d).requires_grad_(True) for k, v in t.items()}
        outs = ref(ti["x"], ti["r"], ti["w"], ti["b"])
        out[d] = (outs, torch.autograd.grad(outs, [ti[n] for n in names], [g.cpu().to(d) for g in douts[: len(outs)]]))
    return out[torch.float64], out[dtype]


def _same(a, b, dtype, what):
    """Equal up to a couple of units of ``dtype`` (fp32: another summation order of the dweight partials)."""
    tol = 2 * torch.finfo(dtype).eps if dtype != torch.float32 else 2e-6
    torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_persistent_matches_tile_and_reference(kind, dtype, kernel_device):
    # 37 rows: ten 4-row tiles, the last one partial, over 4 programs in the interpreter (3, 3, 3 and 1 tiles).
    t, douts = _inputs((37, 64), kernel_device, dtype)
    outs_t, grads_t = _run(kind, t, douts)
    outs_p, grads_p = _run(kind, t, douts, dw_partials="persistent")
    (outs_r, grads_r), (outs_l, grads_l) = _reference(kind, t, douts, dtype)
    names = KINDS[kind][2]
    for name, a, c, r, lo in zip(names, grads_p, grads_t, grads_r, grads_l):
        assert a.dtype == c.dtype == dtype and a.device == c.device
        _same(a, c, dtype, f"d{name} persistent vs tile")
        assert_within_lowp_error(a, r, lo, f"d{name}")
    for a, c in zip(outs_p, outs_t):
        torch.testing.assert_close(a, c, atol=0, rtol=0)  # the forward does not depend on the option
    # The bound can fail: a weight gradient 4% off is caught in either dtype.
    dw = grads_p[names.index("w")]
    with pytest.raises(AssertionError, match="dweight"):
        assert_within_lowp_error(dw * 1.04, grads_r[names.index("w")], grads_l[names.index("w")], "dweight")


@pytest.mark.parametrize("programs", [1, 3, 64], ids=["one-program", "three-programs", "more-programs-than-tiles"])
@pytest.mark.parametrize("kind", ["rmsnorm", "add-rmsnorm", "add-layernorm"])
def test_every_program_count_gives_the_tile_result(kind, programs, kernel_device):
    t, douts = _inputs((37, 48), kernel_device, seed=1)
    _, base = _run(kind, t, douts)
    _, got = _run(kind, t, douts, dw_partials="persistent", programs=programs)
    for name, a, c in zip(KINDS[kind][2], got, base):
        _same(a, c, torch.float32, f"d{name}")


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("layer_norm", [False, True], ids=["add-rmsnorm", "add-layernorm"])
def test_persistent_on_other_row_tiles(rows, layer_norm, kernel_device):
    """The launchers' ``rows`` (the tile height the drivers vary), the persistent loop running over those tiles."""
    t, (ds, dh) = _inputs((37, 40), kernel_device, seed=2)
    x, r, w, b = (t[k].detach() for k in "xrwb")
    s, _, rstd = add_norm_fwd(x, r, w, b if layer_norm else None, EPS, layer_norm, rows=rows)
    base = add_norm_bwd(ds, dh, s, w, rstd, layer_norm, layer_norm, rows=rows)
    got = add_norm_bwd(ds, dh, s, w, rstd, layer_norm, layer_norm, rows=rows, dw_partials="persistent", programs=2)
    for name, a, c in zip(("dx", "dr", "dw", "db"), got, base):
        if c is not None:
            _same(a, c, torch.float32, name)
    _, rstd1 = rms_norm_fwd(x, w, EPS, rows)
    base1 = rms_norm_bwd(dh, x, w, rstd1, rows)
    got1 = rms_norm_bwd(dh, x, w, rstd1, rows, dw_partials="persistent", programs=2)
    for name, a, c in zip(("dx", "dw"), got1, base1):
        _same(a, c, torch.float32, f"rmsnorm {name}")


@pytest.mark.parametrize("M", [1, 3, 0])
@pytest.mark.parametrize("kind", ["rmsnorm", "add-layernorm"])
def test_fewer_rows_than_programs(kind, M, kernel_device):
    """M below one tile and below the number of programs (one program launched); M = 0 launches nothing."""
    t, douts = _inputs((M, 24), kernel_device, seed=3)
    _, base = _run(kind, t, douts)
    _, got = _run(kind, t, douts, dw_partials="persistent", programs=64)
    (_, want), _ = _reference(kind, t, douts, torch.float32)
    for name, a, c, r in zip(KINDS[kind][2], got, base, want):
        _same(a, c, torch.float32, f"d{name}")
        torch.testing.assert_close(a.cpu().double(), r, atol=1e-5, rtol=1e-5)


def test_persistent_grid_covers_every_tile_once(monkeypatch):
    from ftlib.training.engine.options import NORM_DW_PARTIALS

    assert NORM_DW_PARTIALS == DW_PARTIALS  # the engine option's values are the launchers'
    cpu = torch.device("cpu")
    assert persistent_grid(cpu, 0) == (0, 0)
    assert persistent_grid(cpu, 10) == (4, 3)  # the interpreter's 4 programs: 3 + 3 + 3 + 1 tiles
    for n_tiles in range(1, 40):
        for programs in (None, 1, 2, 3, 7, 64):
            grid, per = persistent_grid(cpu, n_tiles, programs)
            assert 1 <= grid <= (programs or 4) and grid <= n_tiles
            # contiguous runs of ``per`` tiles: the last program starts inside the range and the runs cover it
            assert (grid - 1) * per < n_tiles <= grid * per, (n_tiles, programs, grid, per)
    # On a GPU the default grid keeps PERSISTENT_WARPS_PER_SM = 4 warps per SM: an H200 (132 SMs) at
    # M = 8192 rows has 2048 four-row tiles of 1 warp (4 programs per SM: 512 programs of 4 tiles) or
    # 512 sixteen-row tiles of 4 warps (one program per SM: 128 programs of 4 tiles).
    monkeypatch.setattr(common, "num_programs", lambda device, work: max(1, min(132, work)))
    cuda = torch.device("cuda")
    assert persistent_grid(cuda, 2048, None, 1) == (512, 4)
    assert persistent_grid(cuda, 512, None, 4) == (128, 4)
    assert persistent_grid(cuda, 2048, 132, 1) == (128, 16)  # an explicit count wins
    assert persistent_grid(cuda, 3, None, 1) == (3, 1)  # never more programs than tiles


def _seed(device, v):
    return torch.tensor([v], dtype=torch.int64, device=device)


@pytest.mark.parametrize("rng4", [True, False], ids=["philox-per-4", "philox-per-element"])
@pytest.mark.parametrize("kind", ["add-rmsnorm", "add-layernorm"])
def test_dropout_masks_are_the_same_on_the_persistent_grid(kind, rng4, kernel_device):
    """The backward redraws the forward's mask from the element's (row, column): the persistent grid gives the
    same dr (and the dropped entries exactly zero) as the tile grid, and both match the reference."""
    shape, p, salt = (37, 48), 0.3, 5
    seed = _seed(kernel_device, 777)
    t, douts = _inputs(shape, kernel_device, seed=4)
    drop = dict(p=p, seed=seed, salt=salt, rng4=rng4)
    _, base = _run(kind, t, douts, **drop)
    _, got = _run(kind, t, douts, dw_partials="persistent", programs=3, **drop)
    names = KINDS[kind][2]
    for name, a, c in zip(names, got, base):
        _same(a, c, torch.float32, f"d{name}")
    keep = keep_mask(seed, shape, p, salt, rng4)
    assert (got[1][~keep] == 0).all() and (got[1][keep] != 0).all()
    ti = {k: v.detach().cpu().double().requires_grad_(True) for k, v in t.items()}
    keep64 = keep.cpu().double()
    outs = (add_layer_norm_ref(ti["x"], ti["r"], ti["w"], ti["b"], EPS, keep64, p) if kind == "add-layernorm"
            else add_rms_norm_ref(ti["x"], ti["r"], ti["w"], EPS, keep64, p))
    want = torch.autograd.grad(outs, [ti[n] for n in names], [g.cpu().double() for g in douts])
    for name, a, c in zip(names, got, want):
        torch.testing.assert_close(a.cpu().double(), c, atol=1e-4, rtol=1e-5, msg=lambda m, n=name: f"d{n}: {m}")


def test_gradcheck_fp64_persistent_with_dropout(kernel_device):
    """Three 1-row tiles over 2 programs (2 + 1 tiles): the loop and the partial sum in fp64 (gradcheck's fast
    mode: random projections of the Jacobian, which a wrong partial sum changes as surely as the full one)."""
    t, _ = _inputs((3, 12), kernel_device, torch.float64, seed=5)
    seed = _seed(kernel_device, 99)
    assert torch.autograd.gradcheck(
        lambda a, c, d, e: AddNormFunction.apply(a, c, d, e, EPS, True, None, 1, 0.4, seed, 7, True, "persistent", 2),
        (t["x"], t["r"], t["w"], t["b"]), fast_mode=True)
    assert torch.autograd.gradcheck(lambda a, d: RMSNormFunction.apply(a, d, EPS, "persistent", 2), (t["x"], t["w"]),
                                    fast_mode=True)


def test_argument_checks(kernel_device):
    dev = kernel_device
    x, r, w = torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev), torch.ones(8, device=dev)
    rstd = torch.ones(4, device=dev)
    # The fused residual-norm also takes 'atomic' (tests/test_norm_atomic.py); the standalone RMSNorm does not.
    bad_mode = "dw_partials='tiles'; expected one of \\('tile', 'persistent'"
    for call in (lambda: add_rms_norm(x, r, w, dw_partials="tiles"),
                 lambda: add_layer_norm(x, r, w, dw_partials="tiles"),
                 lambda: add_norm_bwd(None, x, x, w, rstd, False, False, dw_partials="tiles"),
                 lambda: rms_norm(x, w, dw_partials="tiles"),
                 lambda: rms_norm_bwd(x, x, w, rstd, dw_partials="tiles"),
                 lambda: TritonRMSNorm(8, dw_partials="tiles")):
        with pytest.raises(ValueError, match=bad_mode):
            call()
    for call in (lambda: rms_norm(x, w, dw_partials="atomic"), lambda: TritonRMSNorm(8, dw_partials="atomic")):
        with pytest.raises(ValueError, match="dw_partials='atomic'; expected one of \\('tile', 'persistent'\\)"):
            call()
    for programs in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="programs="):
            add_rms_norm(x, r, w, dw_partials="persistent", programs=programs)
        with pytest.raises(ValueError, match="programs="):
            rms_norm_bwd(x, x, w, rstd, dw_partials="persistent", programs=programs)
    # The module passes its choice on.
    mod = TritonRMSNorm(8, dw_partials="persistent").to(dev)
    xg = x.clone().requires_grad_(True)
    dx, dw = torch.autograd.grad(mod(xg), (xg, mod.weight), r)
    dx_t, dw_t = torch.autograd.grad(rms_norm(xg, mod.weight), (xg, mod.weight), r)
    _same(dx, dx_t, torch.float32, "dx")
    _same(dw, dw_t, torch.float32, "dw")
