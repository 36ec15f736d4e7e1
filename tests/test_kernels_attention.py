"""Fused causal attention (FlashAttention-2 style) vs ftlib.model.reference.causal_attention_ref, on kernel_device
(tests/conftest.py: the CPU interpreter, or compiled on CUDA with FTLIB_TEST_GPU=1); references in fp64 on the CPU.
The launch orders (heaviest block first, paired key blocks) are tested in test_kernels_attention_order.py."""

import pytest
import torch

pytest.importorskip("triton")

from attention_inputs import BLK, inputs, reference, rel_err  # noqa: E402
from kernel_tolerance import assert_within_lowp_error  # noqa: E402

from ftlib.model.reference import causal_attention_ref  # noqa: E402
from kernels.attention import FlashAttentionFunction, TritonCausalAttention, flash_attention  # noqa: E402
from kernels.tiles import Tiles  # noqa: E402

pytestmark = pytest.mark.kernels


# fp32 'ieee' is exact up to fp32 rounding; bf16 rounds P and the inputs to 8 mantissa bits.
# The interpreter runs 'tf32' dots in full fp32, so its bound here is the fp32 one; on a GPU
# tf32 (10-bit mantissa) errors are ~1e-3, checked by benchmarks/kernels/attention_dev.py.
CASES = [
    (torch.float32, "ieee", 1e-5),
    (torch.float32, "tf32", 5e-3),
    (torch.bfloat16, "ieee", 3e-2),
]


# hs=32 (the book's models) in every case; hs=64 on a subset to keep the interpreter suite short.
GRID = [(32, nkv, *c) for nkv in (1, 2, 4) for c in CASES]
GRID += [(64, nkv, *c) for nkv in (1, 4) for c in CASES if c[1] == "ieee"]


@pytest.mark.parametrize("hs,nkv,dtype,prec,tol", GRID)
def test_matches_reference(hs, nkv, dtype, prec, tol, kernel_device):
    q, k, v, do = inputs(2, 4, nkv, 37, hs, dtype, kernel_device)
    o = flash_attention(q, k, v, input_precision=prec, **BLK)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref = reference(q, k, v, do)
    assert o.dtype == dtype and o.shape == q.shape and o.device == q.device
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), ref):
        assert got.shape == want.shape, name
        assert rel_err(got, want) < tol, f"{name}: relative error {rel_err(got, want):.2e} >= {tol}"
    if dtype != torch.float32:
        # Also against the error of PyTorch's attention computed in bf16 from the same inputs
        # (tests/kernel_tolerance.py); it catches a systematic error the relative bound lets by.
        low = [t.detach().cpu().requires_grad_(True) for t in (q, k, v)]
        ol = causal_attention_ref(*low)
        lows = (ol, *torch.autograd.grad(ol, low, do.cpu()))
        for name, got, want, lowp in zip(("o", "dq", "dk", "dv"), (o, *grads), ref, lows):
            assert_within_lowp_error(got, want, lowp, name)
        with pytest.raises(AssertionError, match="dv"):  # the bound can fail: a gradient 4% off
            assert_within_lowp_error(grads[2] * 1.04, ref[3], lows[3], "dv")


def test_unequal_blocks_and_short_sequence(kernel_device):
    for T, blk in ((37, dict(block_m=32, block_n=16)), (37, dict(block_m=16, block_n=32)), (5, BLK)):
        q, k, v, do = inputs(1, 2, 1, T, 32, torch.float32, kernel_device, seed=T)
        o = flash_attention(q, k, v, **blk)
        grads = torch.autograd.grad(o, (q, k, v), do)
        for got, want in zip((o, *grads), reference(q, k, v, do)):
            assert rel_err(got, want) < 1e-5


def test_gradcheck_fp64(kernel_device):
    q, k, v, _ = inputs(1, 2, 1, 18, 16, torch.float64, kernel_device, seed=1)
    fn = lambda a, b, c: FlashAttentionFunction.apply(a, b, c, None, "ieee", 16, 16)
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_strided_views_from_the_model_layout(kernel_device):
    """q/k/v as the model makes them: split + view + transpose of one qkv projection, no copies."""
    B, T, nh, nkv, hs = 2, 21, 4, 1, 32
    C = nh * hs

    def heads(qkv):
        q, k, v = qkv.split([C, nkv * hs, nkv * hs], dim=-1)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs), strides (T*320, hs, 320, 1)
        k = k.view(B, T, nkv, hs).transpose(1, 2)
        v = v.view(B, T, nkv, hs).transpose(1, 2)
        return q, k, v

    qkv = torch.randn(B, T, C + 2 * nkv * hs, dtype=torch.float64).float()
    q, k, v = heads(qkv.to(kernel_device))
    assert not q.is_contiguous()
    out = TritonCausalAttention(block_m=16, block_n=16)(q, k, v)
    torch.testing.assert_close(out.cpu(), causal_attention_ref(*heads(qkv)), atol=1e-5, rtol=1e-5)


def test_wrong_inputs_raise(kernel_device):
    q, k, v, _ = inputs(1, 4, 1, 8, 32, torch.float32, kernel_device)
    with pytest.raises(ValueError, match="must divide"):
        flash_attention(*inputs(1, 4, 3, 8, 32, torch.float32, kernel_device)[:3])
    with pytest.raises(TypeError, match="dtypes differ"):
        flash_attention(q, k.double(), v)
    with pytest.raises(ValueError, match="head size"):
        flash_attention(*inputs(1, 2, 1, 8, 24, torch.float32, kernel_device)[:3])
    with pytest.raises(ValueError, match="head dim must be contiguous"):
        flash_attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    with pytest.raises(ValueError, match="input_precision"):
        flash_attention(q, k, v, input_precision="bf16x3")
    with pytest.raises(ValueError, match="4 dims"):
        flash_attention(q[0], k[0], v[0])


def test_detects_non_causal_output(kernel_device):
    """The comparison can fail: full (non-causal) attention differs from the kernel."""
    q, k, v, _ = inputs(1, 2, 1, 20, 32, torch.float32, kernel_device)
    o = flash_attention(q, k, v, **BLK).detach()
    qc, kc, vc = (t.detach().cpu().double() for t in (q, k, v))
    full = torch.softmax(qc @ kc.transpose(-2, -1) / 32**0.5, dim=-1) @ vc
    assert rel_err(o, full) > 1e-2


def _packed_reference(qkv: torch.Tensor, dy: torch.Tensor, nh: int, nkv: int, hs: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 (y, d(qkv)) on the CPU for a packed (B, T, C + 2 nkv hs) [q | k | v] input and dy (B, T, C)."""
    B, T, _ = qkv.shape
    C = nh * hs
    ref_in = qkv.detach().cpu().double().requires_grad_(True)
    q, k, v = ref_in.split([C, nkv * hs, nkv * hs], dim=-1)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, T, C) -> (B, nh, T, hs)
    k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, T, nkv hs) -> (B, nkv, T, hs)
    v = v.view(B, T, nkv, hs).transpose(1, 2)
    yr = causal_attention_ref(q, k, v).transpose(1, 2).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
    (dr,) = torch.autograd.grad(yr, ref_in, dy.cpu().double())
    return yr.detach(), dr


@pytest.mark.parametrize("nkv", [1, 2, 4])
def test_packed_attention_matches_reference_forward_and_qkv_gradient(nkv, kernel_device):
    """packed_attention: (B, T, C + 2 nkv hs) in, (B, T, C) out, d(qkv) in one buffer."""
    from kernels.attention_packed import packed_attention

    B, T, nh, hs = 2, 37, 4, 16
    C = nh * hs
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, C + 2 * nkv * hs, generator=g, dtype=torch.float64).float()
    dy = torch.randn(B, T, C, generator=g, dtype=torch.float64).float()
    qkv_d = qkv.to(kernel_device).requires_grad_(True)
    y = packed_attention(qkv_d, nh, nkv, hs, fwd_tiles=Tiles(16, 16), bwd_tiles=Tiles(16, 16))
    (dqkv,) = torch.autograd.grad(y, qkv_d, dy.to(kernel_device))
    assert y.is_contiguous() and y.device == dqkv.device == qkv_d.device
    y, dqkv = y.detach().cpu(), dqkv.cpu()

    yr, dr = _packed_reference(qkv, dy, nh, nkv, hs)
    assert y.shape == (B, T, C) and y.is_contiguous() and dqkv.shape == qkv.shape
    torch.testing.assert_close(y.double(), yr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dqkv.double(), dr, atol=1e-5, rtol=1e-5)


def test_packed_attention_rejects_a_mismatched_width(kernel_device):
    from kernels.attention_packed import packed_attention

    with pytest.raises(ValueError, match="qkv must be"):
        packed_attention(torch.randn(1, 8, 100, device=kernel_device), 4, 1, 16)


@pytest.mark.parametrize("kv_split", [1, 2, 4])
def test_every_split_of_the_query_heads_gives_the_same_gradients(kv_split, kernel_device, monkeypatch):
    """MQA's dK/dV with the shared K/V head's 4 query heads on 1, 2 or 4 programs: 1 writes dk/dv directly,
    more write fp32 partials that are summed (on torch, or the fused sum)."""
    import kernels.attention as A
    from kernels.attention import attention_bwd, attention_fwd

    # The split given is the split run: the launcher's own choice is not asked for.
    monkeypatch.setattr(A, "_kv_split", lambda *a: pytest.fail("kv_split was given; _kv_split must not run"))

    q, k, v, do = inputs(2, 4, 1, 37, 32, torch.float32, kernel_device, seed=4)
    _, *want = reference(q, k, v, do)
    o, lse = attention_fwd(q.detach(), k.detach(), v.detach(), **BLK)
    for fused in (False, True):
        dq, dk, dv = attention_bwd(do, q.detach(), k.detach(), v.detach(), o, lse, **BLK, kv_split=kv_split,
                                   fuse_kv_split_sum=fused)
        for got, ref in zip((dq, dk, dv), want):
            assert rel_err(got, ref) < 1e-5


def test_a_split_that_does_not_divide_the_query_heads_is_refused(kernel_device):
    from kernels.attention import attention_bwd, attention_fwd

    q, k, v, do = inputs(1, 4, 1, 16, 32, torch.float32, kernel_device)
    o, lse = attention_fwd(q.detach(), k.detach(), v.detach(), **BLK)
    for bad in (3, 8, 0, True):
        with pytest.raises(ValueError, match="kv_split"):
            attention_bwd(do, q.detach(), k.detach(), v.detach(), o, lse, kv_split=bad)


# attention_bwd(concurrent=True): the dK/dV kernel forms D = rowsum(dO * O) itself and, on CUDA, runs on a side
# stream beside the dQ kernel. It must give the reference's gradients and the sequential launch's.

@pytest.mark.parametrize("nkv,kv_split,fused", [(1, 1, False), (1, 2, True), (1, 4, False), (2, 2, True),
                                                (4, 1, False)])
def test_concurrent_backward_gives_the_reference_and_the_sequential_gradients(nkv, kv_split, fused,
                                                                              kernel_device):
    from kernels.attention import attention_bwd, attention_fwd

    q, k, v, do = (t.detach() for t in inputs(2, 4, nkv, 37, 32, torch.float32, kernel_device, seed=5))
    _, *want = reference(q, k, v, do)
    o, lse = attention_fwd(q, k, v, **BLK)
    kw = dict(**BLK, kv_split=kv_split, fuse_kv_split_sum=fused)
    seq = attention_bwd(do, q, k, v, o, lse, **kw)
    got = attention_bwd(do, q, k, v, o, lse, **kw, concurrent=True)
    if kernel_device.type == "cuda":
        torch.cuda.synchronize()
    for name, g, s, ref in zip("qkv", got, seq, want):
        assert rel_err(g, ref) < 1e-5, name
        # The same sums in the same kernels; D formed by the same expression in both kernels.
        torch.testing.assert_close(g, s, rtol=1e-6, atol=1e-6, msg=f"d{name}")


def test_a_wrong_delta_in_the_concurrent_backward_would_show(kernel_device):
    """The comparison above can fail: an O scaled only for the dK/dV kernel's own D changes dk."""
    from kernels.attention import attention_bwd, attention_fwd

    q, k, v, do = (t.detach() for t in inputs(1, 4, 1, 37, 32, torch.float32, kernel_device, seed=6))
    want_dk = reference(q, k, v, do)[2]
    o, lse = attention_fwd(q, k, v, **BLK)
    _, dk, _ = attention_bwd(do, q, k, v, o, lse, **BLK, concurrent=True)
    _, dk2, _ = attention_bwd(do, q, k, v, 2 * o, lse, **BLK, concurrent=True)  # D doubled in the dK/dV kernel
    assert rel_err(dk2, want_dk) > 1e-2 and rel_err(dk, want_dk) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_packed_layout_concurrent_backward(dtype, tol, kernel_device):
    """The engine's path: d(qkv) in one buffer, dq written by the main stream's kernel and dk/dv summed into
    their slices by the side stream's, then the result read right after the call."""
    from kernels.attention_packed import packed_attention

    B, T, nh, nkv, hs = 2, 37, 4, 1, 32
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(B, T, (nh + 2 * nkv) * hs, generator=g, dtype=torch.float64)
    dy = torch.randn(B, T, nh * hs, generator=g, dtype=torch.float64)
    grads = []
    for concurrent in (False, True):
        x = qkv.to(kernel_device, dtype).requires_grad_(True)
        y = packed_attention(x, nh, nkv, hs, fwd_tiles=Tiles(16, 16), bwd_tiles=Tiles(16, 16),
                             fuse_kv_split_sum=True, concurrent_bwd=concurrent)
        (d,) = torch.autograd.grad(y, x, dy.to(kernel_device, dtype))
        grads.append(d.float().cpu())
    _, dr = _packed_reference(qkv, dy, nh, nkv, hs)
    assert rel_err(grads[1], dr) < tol
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6 if dtype == torch.float32 else 1e-2,
                               atol=1e-6 if dtype == torch.float32 else 1e-2)


# pack_heads: the forward and dQ kernels take the query heads of one K/V head in one tile (row r: position
# r // pack of head r % pack), so each K/V block loaded serves them all. The same sums as one head a tile.

@pytest.mark.parametrize("nh,nkv,pack,dtype,tol", [(4, 1, 4, torch.float32, 1e-5), (4, 1, 2, torch.float32, 1e-5),
                                                   (8, 2, 4, torch.float32, 1e-5), (4, 1, 4, torch.bfloat16, 3e-2)])
def test_packed_heads_give_the_reference_and_the_unpacked_results(nh, nkv, pack, dtype, tol, kernel_device):
    from kernels.attention import attention_bwd, attention_fwd

    q, k, v, do = (t.detach() for t in inputs(2, nh, nkv, 37, 32, dtype, kernel_device, seed=9))
    want = reference(q, k, v, do)
    blk = dict(block_m=32, block_n=16)  # 32 / pack positions a tile: T=37 ends in a ragged block
    o, lse = attention_fwd(q, k, v, **blk, pack_heads=pack)
    o1, lse1 = attention_fwd(q, k, v, **blk)
    grads = attention_bwd(do, q, k, v, o, lse, **blk, pack_heads=pack)
    grads1 = attention_bwd(do, q, k, v, o1, lse1, **blk)
    for name, got, one, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), (o1, *grads1), want):
        assert rel_err(got, ref) < tol, f"{name}: relative error {rel_err(got, ref):.2e} >= {tol}"
        # the same sums as one head a tile, rounded alike up to the order a matrix product adds in (a row's
        # place in the tile may change it by an ulp)
        close = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got, one, **close, msg=name)
    torch.testing.assert_close(lse, lse1, rtol=1e-5, atol=1e-6)


def test_a_packed_tile_that_mixed_up_heads_would_show(kernel_device):
    """The comparison above can fail: q's heads swapped pairwise give each packed row another head's output."""
    from kernels.attention import attention_fwd

    q, k, v, _ = (t.detach() for t in inputs(1, 4, 1, 37, 32, torch.float32, kernel_device, seed=10))
    o, _ = attention_fwd(q, k, v, block_m=32, block_n=16, pack_heads=4)
    o_swapped, _ = attention_fwd(q[:, [1, 0, 3, 2]], k, v, block_m=32, block_n=16, pack_heads=4)
    assert rel_err(o_swapped[:, [1, 0, 3, 2]], o.cpu().double()) < 1e-6 and rel_err(o_swapped, o.cpu().double()) > 0.1


def test_a_pack_that_does_not_divide_the_group_is_refused(kernel_device):
    from kernels.attention import attention_bwd, attention_fwd

    q, k, v, do = (t.detach() for t in inputs(1, 4, 2, 16, 32, torch.float32, kernel_device))
    o, lse = attention_fwd(q, k, v, **BLK)
    for bad in (4, 3, 0, True, 32):  # 2 query heads per K/V head here
        with pytest.raises(ValueError, match="pack_heads"):
            attention_fwd(q, k, v, pack_heads=bad)
        with pytest.raises(ValueError, match="pack_heads"):
            attention_bwd(do, q, k, v, o, lse, pack_heads=bad)
