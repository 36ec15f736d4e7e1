"""GPT-2's explicit attention in three kernels (kernels/explicit_attention.py) vs the references: the output
and gradients against ftlib.model.reference.causal_attention_ref, the stored probabilities against
ftlib.model.attention.causal_softmax_ref, in fp64 on the CPU; on kernel_device (tests/conftest.py)."""

import pytest
import torch

pytest.importorskip("triton")

from kernel_tolerance import assert_within_lowp_error  # noqa: E402

import kernels.explicit_attention as explicit_module  # noqa: E402
from ftlib.model.attention import causal_softmax_ref  # noqa: E402
from ftlib.model.reference import causal_attention_ref  # noqa: E402
from kernels.explicit_attention import (  # noqa: E402
    ONE_PASS_MAX_T,
    TritonExplicitAttention,
    explicit_attention_bwd,
    explicit_attention_fwd,
    explicit_attention_packed,
    one_pass_tiles,
)
from kernels.tiles import Tiles  # noqa: E402

pytestmark = pytest.mark.kernels

SMALL = Tiles(16, 16)  # T=37 spans 3 blocks, the last ragged


def _inputs(B, nh, nkv, T, hs, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    return mk(B, nh, T, hs), mk(B, nkv, T, hs), mk(B, nkv, T, hs), mk(B, nh, T, hs)


def _reference(q, k, v, do):
    """fp64 (o, dq, dk, dv) and P on the CPU from the same (rounded) inputs."""
    qr, kr, vr = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    o = causal_attention_ref(qr, kr, vr)
    grads = torch.autograd.grad(o, (qr, kr, vr), do.cpu().double())
    kx = kr.detach().repeat_interleave(q.shape[1] // k.shape[1], 1)  # (B, nh, T, hs)
    p = causal_softmax_ref(qr.detach() @ kx.transpose(-2, -1), q.shape[-1] ** -0.5)
    return (o.detach(), *grads), p


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.detach().cpu().double() - ref).abs().max() / ref.abs().max()).item()


CASES = [(torch.float32, "ieee", 1e-5), (torch.float32, "tf32", 5e-3), (torch.bfloat16, "ieee", 3e-2)]
GRID = [(32, nkv, *c) for nkv in (1, 4) for c in CASES] + [(64, 2, torch.float32, "ieee", 1e-5)]
GRID.append((32, 1, torch.float16, "ieee", 1e-2))  # fp16 autocast's operands (the engine's fp16 step)


@pytest.mark.parametrize("hs,nkv,dtype,prec,tol", GRID)
def test_matches_reference(hs, nkv, dtype, prec, tol, kernel_device):
    q, k, v, do = _inputs(2, 4, nkv, 37, hs, dtype, kernel_device)
    o, p = explicit_attention_fwd(q, k, v, input_precision=prec, tiles=SMALL)
    grads = explicit_attention_bwd(do, q, k, v, p, prec, tiles=SMALL)
    ref, p_ref = _reference(q, k, v, do)
    assert p.shape == p_ref.shape and p.dtype == dtype and o.dtype == dtype
    assert _rel_err(p, p_ref) < tol, f"P: relative error {_rel_err(p, p_ref):.2e}"
    # Above the diagonal P is written, and written as zeros (GPT-2's masked softmax).
    upper = torch.ones(37, 37, dtype=torch.bool).triu(1)
    assert (p.cpu()[..., upper] == 0).all()
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), ref):
        assert got.shape == want.shape, name
        assert _rel_err(got, want) < tol, f"{name}: relative error {_rel_err(got, want):.2e} >= {tol}"
    if dtype == torch.bfloat16:
        # Against PyTorch's own bf16 attention's error too (tests/kernel_tolerance.py), which a
        # systematic error of a few percent fails.
        low = [t.detach().cpu().requires_grad_(True) for t in (q, k, v)]
        ol = causal_attention_ref(*low)
        lows = (ol, *torch.autograd.grad(ol, low, do.cpu()))
        for name, got, want, lowp in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, lows):
            assert_within_lowp_error(got, want, lowp, name)


def test_unequal_tiles_and_short_sequences(kernel_device):
    for T, tiles in ((37, Tiles(32, 16)), (37, Tiles(16, 32)), (5, SMALL), (16, SMALL)):
        q, k, v, do = _inputs(1, 2, 1, T, 32, torch.float32, kernel_device, seed=T)
        o, p = explicit_attention_fwd(q, k, v, tiles=tiles)
        grads = explicit_attention_bwd(do, q, k, v, p, tiles=tiles)
        ref, p_ref = _reference(q, k, v, do)
        assert _rel_err(p, p_ref) < 1e-5, (T, tiles)
        for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), ref):
            assert _rel_err(got, want) < 1e-5, (T, tiles, name)


@pytest.mark.parametrize("dtype,prec,tol", CASES)
def test_one_pass_matches_the_reference_and_the_two_passes(dtype, prec, tol, kernel_device):
    """The one-pass forward and dQ kernels (a whole row per key tile): the same P, output and gradients,
    up to the order of float sums, at the default one-pass tiles (two row blocks, the last ragged) and at
    16-row ones, with grouped K/V heads."""
    q, k, v, do = _inputs(2, 4, 2, 37, 32, dtype, kernel_device)
    ref, p_ref = _reference(q, k, v, do)
    o2, p2 = explicit_attention_fwd(q, k, v, input_precision=prec, tiles=SMALL)
    two = (o2, *explicit_attention_bwd(do, q, k, v, p2, prec, tiles=SMALL))
    for one_pass in (True, Tiles(16, 64, 4, 1)):
        o, p = explicit_attention_fwd(q, k, v, input_precision=prec, one_pass=one_pass)
        grads = explicit_attention_bwd(do, q, k, v, p, prec, tiles=SMALL, one_pass=one_pass)
        assert _rel_err(p, p_ref) < tol and (p.cpu()[..., torch.ones(37, 37, dtype=torch.bool).triu(1)] == 0).all()
        for name, got, want, other in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, two):
            assert _rel_err(got, want) < tol, (one_pass, name, _rel_err(got, want))
            assert _rel_err(got, other.cpu().double()) < tol, (one_pass, name)


def test_one_pass_short_rows_and_its_own_kernels(kernel_device, monkeypatch):
    """Rows shorter than the smallest tile, and a row that fills it exactly; the two-pass kernels never run."""

    class Unused:
        def __getitem__(self, grid):
            raise AssertionError("a two-pass kernel ran")

    monkeypatch.setattr(explicit_module, "_explicit_attn_fwd_kernel", Unused())
    monkeypatch.setattr(explicit_module, "_explicit_attn_bwd_dq_kernel", Unused())
    for T in (5, 16):
        q, k, v, do = _inputs(1, 2, 1, T, 32, torch.float32, kernel_device, seed=T)
        o, p = explicit_attention_fwd(q, k, v, one_pass=True)
        grads = explicit_attention_bwd(do, q, k, v, p, tiles=SMALL, one_pass=True)
        ref, p_ref = _reference(q, k, v, do)
        assert _rel_err(p, p_ref) < 1e-5, T
        for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), ref):
            assert _rel_err(got, want) < 1e-5, (T, name)
    with pytest.raises(AssertionError, match="two-pass kernel ran"):
        explicit_attention_fwd(q, k, v)


def test_backward_reads_the_stored_probabilities(kernel_device):
    """The backward uses P as stored, not a recomputation: scaling P's rows changes dV accordingly."""
    q, k, v, do = _inputs(1, 2, 2, 37, 32, torch.float64, kernel_device)
    o, p = explicit_attention_fwd(q, k, v, tiles=SMALL)
    _, _, dv = explicit_attention_bwd(do, q, k, v, p, tiles=SMALL)
    _, _, dv2 = explicit_attention_bwd(do, q, k, v, 2 * p, tiles=SMALL)
    torch.testing.assert_close(dv2.cpu(), 2 * dv.cpu())


def test_probabilities_in_a_lower_dtype(kernel_device):
    """fp32 operands, P stored in bf16 (what autocast's ``att @ v`` reads): O is P as stored times v."""
    q, k, v, _ = _inputs(1, 2, 1, 37, 32, torch.float32, kernel_device)
    o, p = explicit_attention_fwd(q, k, v, torch.bfloat16, tiles=SMALL)
    assert p.dtype == torch.bfloat16 and o.dtype == torch.float32
    want = p.cpu().double() @ v.cpu().double()  # (B, 2, T, hs): one K/V head broadcast
    assert _rel_err(o, want) < 1e-5


@pytest.mark.parametrize("fwd_one_pass,dq_one_pass", [(False, False), (True, True), (False, Tiles(64, 64, 4, 1))],
                         ids=["two-pass", "one-pass", "dq-one-pass-64-rows"])
def test_packed_writes_the_layout_of_the_module(kernel_device, fwd_one_pass, dq_one_pass):
    """From the packed qkv to (B, T, C) and d(qkv), the same as the strided views through the reference; with
    the forward and the dQ kernel each in one or two passes."""
    B, T, nh, nkv, hs = 2, 37, 4, 2, 32
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, (nh + 2 * nkv) * hs, generator=g, dtype=torch.float64).to(kernel_device)
    qkv.requires_grad_(True)
    dy = torch.randn(B, T, nh * hs, generator=g, dtype=torch.float64).to(kernel_device)
    y = TritonExplicitAttention(nh, nkv, hs, fwd_one_pass=fwd_one_pass, dq_one_pass=dq_one_pass)(qkv)
    (dqkv,) = torch.autograd.grad(y, qkv, dy)
    ref_in = qkv.detach().cpu().requires_grad_(True)
    q, k, v = ref_in.split([nh * hs, nkv * hs, nkv * hs], dim=-1)
    q, k, v = (t.view(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hs)
    y_ref = causal_attention_ref(q, k, v).transpose(1, 2).reshape(B, T, nh * hs)
    (dqkv_ref,) = torch.autograd.grad(y_ref, ref_in, dy.cpu())
    torch.testing.assert_close(y.detach().cpu(), y_ref.detach())
    torch.testing.assert_close(dqkv.cpu(), dqkv_ref)


@pytest.mark.parametrize("nkv,dtype,one_pass", [(4, torch.float32, False), (1, torch.float32, True),
                                                 (2, torch.bfloat16, Tiles(64, 64, 4, 1))],
                         ids=["mha-two-pass", "mqa-one-pass", "gqa-bf16-one-pass-64-rows"])
def test_bias_gradient_adds_the_column_sums_of_dqkv(kernel_device, nkv, dtype, one_pass):
    """db_out: the backward kernels add the column sums of dq, dk and dv as stored (over the batch and the
    sequence, heads side by side in the packed [q | k | v] order) to what db_out holds, and the gradients
    themselves do not change. Several programs add to each column (2 sequences of 3 query or key blocks).
    The K heads' sums are zero in exact arithmetic (each row of dS sums to zero: softmax ignores a shift that a
    key bias adds to a whole row of scores), so the Q and V slices are what this can tell apart."""
    B, nh, T, hs = 2, 4, 37, 32
    q, k, v, do = _inputs(B, nh, nkv, T, hs, dtype, kernel_device)
    _, p = explicit_attention_fwd(q, k, v, tiles=SMALL)
    plain = explicit_attention_bwd(do, q, k, v, p, tiles=SMALL, one_pass=one_pass)
    start = torch.linspace(-1.0, 1.0, (nh + 2 * nkv) * hs, device=kernel_device)  # what the buffer held before
    db = start.clone()
    grads = explicit_attention_bwd(do, q, k, v, p, tiles=SMALL, one_pass=one_pass, db_out=db)
    for name, got, want in zip(("dq", "dk", "dv"), grads, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    sums = torch.cat([g.cpu().double().sum(dim=(0, 2)).reshape(-1) for g in grads])  # (B, h, T, hs) -> (h hs,)
    added = db.cpu().double() - start.cpu().double()
    torch.testing.assert_close(added, sums, rtol=1e-5, atol=1e-5 * sums.abs().max().item())


def test_module_adds_its_bias_gradient_into_the_buffer_it_is_given(kernel_device):
    """TritonExplicitAttention()(qkv, db_out): the backward adds d(qkv)'s column sums into db_out; without it,
    into nothing (the module holds no parameter either way)."""
    B, T, nh, nkv, hs = 2, 21, 2, 1, 16
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, T, (nh + 2 * nkv) * hs, generator=g).to(kernel_device).requires_grad_(True)
    dy = torch.randn(B, T, nh * hs, generator=g).to(kernel_device)
    module = TritonExplicitAttention(nh, nkv, hs)
    assert list(module.parameters()) == []
    db = torch.zeros((nh + 2 * nkv) * hs, device=kernel_device)
    (dqkv,) = torch.autograd.grad(module(qkv, db), qkv, dy)
    torch.testing.assert_close(db, dqkv.sum(dim=(0, 1)), rtol=1e-5, atol=1e-5)
    (plain,) = torch.autograd.grad(module(qkv), qkv, dy)
    torch.testing.assert_close(plain, dqkv, rtol=0, atol=0)


def test_gradcheck(kernel_device):
    """Finite differences against the kernels' backward in fp64. Fast mode compares one random projection of the
    Jacobian (u^T J v) instead of all 576 x 288 entries, a few kernel calls instead of over a thousand; with
    tolerances near fp64's finite-difference error it still fails on a row of q's gradient 1% off (the
    element-wise comparisons with the reference above catch single entries)."""
    qkv = torch.randn(1, 9, 4 * 16, dtype=torch.float64).to(kernel_device).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: explicit_attention_packed(t, 2, 1, 16), (qkv,), eps=1e-6, atol=1e-8,
                                     rtol=1e-7, fast_mode=True)


def test_bad_arguments_say_what_is_wrong(kernel_device):
    q, k, v, do = _inputs(1, 4, 1, 8, 32, torch.float32, kernel_device)
    with pytest.raises(ValueError, match="n_kv_head=3 must divide"):
        explicit_attention_fwd(q, torch.cat([k] * 3, 1), torch.cat([v] * 3, 1))
    with pytest.raises(TypeError, match="p_dtype"):
        explicit_attention_fwd(q, k, v, torch.int32)
    with pytest.raises(ValueError, match="out must be"):
        explicit_attention_fwd(q, k, v, out=torch.empty(1, 4, 8, 16, device=kernel_device))
    o, p = explicit_attention_fwd(q, k, v)
    with pytest.raises(ValueError, match=r"p must be \(B, nh, T, T\)"):
        explicit_attention_bwd(do, q, k, v, p[..., :4].contiguous())
    with pytest.raises(ValueError, match=r"db_out must hold \(nh \+ 2 nkv\) hs = 192"):
        explicit_attention_bwd(do, q, k, v, p, db_out=torch.zeros(128, device=kernel_device))
    with pytest.raises(TypeError, match="db_out has dtype"):
        explicit_attention_bwd(do, q, k, v, p, db_out=torch.zeros(192, dtype=torch.float64, device=kernel_device))
    with pytest.raises(ValueError, match="dk_out must be"):
        explicit_attention_bwd(do, q, k, v, p, dk_out=torch.empty(1, 2, 8, 32, device=kernel_device))
    with pytest.raises(ValueError, match="qkv must be"):
        explicit_attention_packed(torch.empty(1, 8, 100, device=kernel_device), 4, 1, 32)
    with pytest.raises(ValueError, match="as one_pass=Tiles"):
        explicit_attention_fwd(q, k, v, tiles=SMALL, one_pass=True)
    with pytest.raises(ValueError, match="must be a bool or Tiles"):
        explicit_attention_bwd(do, q, k, v, p, one_pass="rows")
    q, k, v, _ = _inputs(1, 4, 1, 37, 32, torch.float32, kernel_device)
    with pytest.raises(ValueError, match=r"spans the row \(>= T=37"):
        explicit_attention_fwd(q, k, v, one_pass=Tiles(16, 32))
    with pytest.raises(ValueError, match="rows of 1 to"):
        one_pass_tiles(ONE_PASS_MAX_T + 1)


# heavy_first: each grid's axes swapped so every row's block with the most causal work launches first (as the flash
# kernels', tests/test_kernels_attention_order.py). The same programs compute the same sums, so the default order's
# results bit for bit, with the outputs allocated NaN-filled (tests/conftest.py's nan_empty) so that a block
# left unwritten shows; and a grid the kernels read the other way round does show.

def _both_passes(q, k, v, do, one_pass, **kw) -> tuple[torch.Tensor, ...]:
    fwd_tiles = None if one_pass else SMALL
    o, p = explicit_attention_fwd(q, k, v, input_precision="ieee", tiles=fwd_tiles, one_pass=one_pass, **kw)
    return (o, p, *explicit_attention_bwd(do, q, k, v, p, "ieee", tiles=SMALL, one_pass=one_pass, **kw))


@pytest.mark.parametrize("nkv", [4, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("one_pass", [False, True], ids=["two-pass", "one-pass"])
def test_heavy_first_gives_the_default_orders_results_bit_for_bit(nkv, one_pass, kernel_device, nan_empty):
    q, k, v, do = _inputs(2, 4, nkv, 37, 32, torch.float32, kernel_device, seed=7)
    default = _both_passes(q, k, v, do, one_pass)
    heavy = _both_passes(q, k, v, do, one_pass, heavy_first=True)
    for name, a, b in zip(("o", "p", "dq", "dk", "dv"), heavy, default):
        assert torch.equal(a, b), name
    ref, _ = _reference(q, k, v, do)
    for name, got, want in zip(("o", "dq", "dk", "dv"), (heavy[0], *heavy[2:]), ref):
        assert _rel_err(got, want) < 1e-5, (name, _rel_err(got, want))


def test_heavy_first_read_on_the_wrong_axes_would_show(kernel_device, monkeypatch, nan_empty):
    """Two K/V heads, so that read the wrong way round every grid still indexes batches and heads that exist
    (B * nkv = 4 rows >= 3 blocks): the results are wrong, not out of bounds."""
    q, k, v, do = _inputs(2, 4, 2, 37, 32, torch.float32, kernel_device, seed=7)
    default = _both_passes(q, k, v, do, False)
    monkeypatch.setattr(explicit_module, "_grid", lambda blocks, rows, heavy_first: (blocks, rows))
    wrong = _both_passes(q, k, v, do, False, heavy_first=True)
    assert not all(torch.equal(a, b) for a, b in zip(wrong, default))
    with pytest.raises(TypeError, match="heavy_first must be a bool"):
        explicit_attention_fwd(q, k, v, heavy_first=1)
