"""The fused residual-norm backward with ``dw_partials="atomic"`` (kernels/residual_norm.py): the programs add
their weight-gradient rows into one output with atomic adds, optionally the caller's gradient buffer (then
nothing is returned to autograd for the weight). Against the per-tile default and the references, on
kernel_device (tests/conftest.py)."""

import pytest
import torch

pytest.importorskip("triton")

from test_norm_persistent import EPS, KINDS, _inputs, _reference, _run, _same  # noqa: E402

from kernels._common import ATOMIC_SEMS  # noqa: E402
from kernels.residual_norm import add_layer_norm, add_norm_bwd, add_norm_fwd, add_rms_norm  # noqa: E402

pytestmark = pytest.mark.kernels
FUSED = [k for k in KINDS if k.startswith("add-")]


@pytest.mark.parametrize("programs", [None, 1, 64], ids=["default-grid", "one-program", "more-programs-than-tiles"])
@pytest.mark.parametrize("kind", FUSED)
def test_atomic_matches_tile(kind, programs, kernel_device):
    t, douts = _inputs((37, 48), kernel_device, seed=4)
    _, base = _run(kind, t, douts)
    _, got = _run(kind, t, douts, dw_partials="atomic", programs=programs)
    (_, want), _ = _reference(kind, t, douts, torch.float32)
    for name, a, c, r in zip(KINDS[kind][2], got, base, want):
        _same(a, c, torch.float32, f"d{name}")
        torch.testing.assert_close(a.cpu().double(), r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("kind", FUSED)
def test_a_pipelined_loop_matches_the_plain_one(kind, stages, kernel_device):
    """loop_stages pipelines each program's loop over its tiles (RowGrid's ' s<k>'): the same gradients, on a grid
    of few programs so that each loops over several tiles."""
    t, douts = _inputs((37, 48), kernel_device, seed=5)
    _, plain = _run(kind, t, douts, dw_partials="atomic", programs=2)
    _, piped = _run(kind, t, douts, dw_partials="atomic", programs=2, loop_stages=stages)
    for name, a, c in zip(KINDS[kind][2], piped, plain):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6, msg=f"d{name}")


@pytest.mark.parametrize("sem", ATOMIC_SEMS)
@pytest.mark.parametrize("layer_norm", [False, True], ids=["add-rmsnorm", "add-layernorm"])
def test_into_the_callers_buffers_adds_and_returns_none(layer_norm, sem, kernel_device):
    t, (ds, dh) = _inputs((37, 40), kernel_device, seed=5)
    x, r, w, b = (t[k].detach() for k in "xrwb")
    bias = b if layer_norm else None
    s, _, rstd = add_norm_fwd(x, r, w, bias, EPS, layer_norm)
    dx, dr, dw, db = add_norm_bwd(ds, dh, s, w, rstd, layer_norm, layer_norm)
    # Buffers already holding a contribution (a tied or accumulated gradient): the kernel adds to it.
    dw_out = torch.full_like(w, 0.5)
    db_out = torch.full_like(w, -0.25) if layer_norm else None
    gx, gr, none_w, none_b = add_norm_bwd(ds, dh, s, w, rstd, layer_norm, layer_norm, dw_partials="atomic",
                                          programs=3, dw_out=dw_out, db_out=db_out, sem=sem)
    assert none_w is None and none_b is None
    _same(gx, dx, torch.float32, "dx")
    _same(gr, dr, torch.float32, "dr")
    _same(dw_out, dw + 0.5, torch.float32, "dw into the buffer")
    if layer_norm:
        _same(db_out, db - 0.25, torch.float32, "db into the buffer")
    # A buffer written twice would be caught: the contribution is not 2x.
    assert not torch.allclose(dw_out, 2 * dw + 0.5, atol=1e-4)


def test_autograd_leaves_the_weight_to_the_buffer(kernel_device):
    t, (ds, dh) = _inputs((37, 32), kernel_device, seed=6)
    x, r = t["x"], t["r"]
    w = t["w"].detach().clone().requires_grad_(True)
    w.grad = torch.zeros_like(w)  # the engine's view of its flat gradient, zeroed at the start of a step
    buf = w.grad
    s, h = add_rms_norm(x, r, w, EPS, dw_partials="atomic", dw_out=buf)
    torch.autograd.backward((s, h), (ds, dh))
    w2 = t["w"].detach().clone().requires_grad_(True)
    s2, h2 = add_rms_norm(x.detach().requires_grad_(True), r.detach(), w2, EPS)
    torch.autograd.backward((s2, h2), (ds, dh))
    assert w.grad is buf  # no tensor of autograd's was added or swapped in
    _same(w.grad, w2.grad, torch.float32, "dw")


def test_the_buffers_are_checked(kernel_device):
    t, _ = _inputs((8, 16), kernel_device, seed=7)
    x, r, w, b = (t[k].detach() for k in "xrwb")
    with pytest.raises(ValueError, match="need dw_partials='atomic'"):
        add_rms_norm(x, r, w, EPS, dw_out=torch.zeros_like(w))
    with pytest.raises(ValueError, match="must be \\(16,\\) in torch.float32"):
        add_rms_norm(x, r, w, EPS, dw_partials="atomic", dw_out=torch.zeros(8, device=kernel_device))
    with pytest.raises(ValueError, match="db_out exactly when the norm has a bias"):
        add_layer_norm(x, r, w, b, EPS, dw_partials="atomic", dw_out=torch.zeros_like(w))
    with pytest.raises(ValueError, match="expected one of"):
        add_rms_norm(x, r, w, EPS, dw_partials="atom")
    s, _, rstd = add_norm_fwd(x, r, w, None, EPS, layer_norm=False)
    for bad, partials in ((2, "tile"), (5, "atomic"), (0, "persistent")):  # persistent grids only, 1 to 4 stages
        with pytest.raises(ValueError, match="loop_stages"):
            add_norm_bwd(None, torch.ones_like(s), s, w, rstd, False, False, dw_partials=partials, loop_stages=bad)


# drb_out: the column sums of r's gradient (a branch bias's gradient) added by the same programs.
@pytest.mark.parametrize("p", [0.0, 0.2], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("layer_norm", [False, True], ids=["add-rmsnorm", "add-layernorm"])
@pytest.mark.parametrize("sem", ATOMIC_SEMS)
def test_the_branch_bias_gradient_is_the_column_sum_of_dr(layer_norm, p, sem, kernel_device):
    t, (ds, dh) = _inputs((37, 40), kernel_device, seed=7)
    x, r, w, b = (t[k].detach() for k in "xrwb")
    bias = b if layer_norm else None
    seed = torch.tensor([123], dtype=torch.int64, device=kernel_device)
    s, _, rstd = add_norm_fwd(x, r, w, bias, EPS, layer_norm, p=p, seed=seed, salt=3)
    kw = dict(p=p, seed=seed, salt=3, dw_partials="atomic", programs=3, sem=sem)
    _, dr, _, _ = add_norm_bwd(ds, dh, s, w, rstd, layer_norm, layer_norm, **kw)
    drb_out = torch.full((40,), 0.5, device=kernel_device)  # a contribution there already: the kernel adds
    _, dr2, _, _ = add_norm_bwd(ds, dh, s, w, rstd, layer_norm, layer_norm, drb_out=drb_out, **kw)
    _same(dr2, dr, torch.float32, "dr")
    torch.testing.assert_close(drb_out.cpu().double(), dr.cpu().double().sum(0) + 0.5, atol=1e-4, rtol=1e-5)
    assert p == 0 or (dr == 0).any()  # the dropped columns are in the sums as zeros


def test_the_branch_bias_gradient_through_autograd_and_its_checks(kernel_device):
    t, (ds, dh) = _inputs((37, 32), kernel_device, seed=8)
    x, r, w = t["x"], t["r"], t["w"]
    drb_out = torch.zeros(32, device=kernel_device)
    s, h = add_rms_norm(x, r, w, EPS, dw_partials="atomic", drb_out=drb_out)
    torch.autograd.backward((s, h), (ds, dh))
    torch.testing.assert_close(drb_out, r.grad.sum(0), atol=1e-4, rtol=1e-5)  # dr = r's gradient (no dropout)
    # h unused: the gradient of s alone reaches r, and its column sums still reach the buffer.
    r2, drb2 = r.detach().clone().requires_grad_(True), torch.zeros(32, device=kernel_device)
    s2, _ = add_rms_norm(x.detach(), r2, w.detach(), EPS, dw_partials="atomic", drb_out=drb2)
    s2.backward(ds)
    torch.testing.assert_close(drb2, ds.sum(0), atol=1e-4, rtol=1e-5)
    s, _, rstd = add_norm_fwd(x.detach(), r.detach(), w.detach(), None, EPS, False)
    with pytest.raises(ValueError, match="drb_out needs dw_partials='atomic'"):
        add_norm_bwd(ds, dh, s, w.detach(), rstd, False, False, drb_out=torch.zeros(32, device=kernel_device))
    with pytest.raises(ValueError, match=r"drb_out must be \(32,\) in torch.float32"):
        add_norm_bwd(ds, dh, s, w.detach(), rstd, False, False, dw_partials="atomic",
                     drb_out=torch.zeros(31, device=kernel_device))
