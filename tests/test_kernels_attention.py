"""Fused causal attention (FlashAttention-2 style) vs ftlib.reference.causal_attention_ref (CPU interpreter)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton` (see kernels/README.md)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

# When triton was imported before TRITON_INTERPRET=1 (torch imports it in some test modules),
# this process cannot interpret kernels (tests/conftest.py sets TRITON_INTERPRET before triton loads).
pytestmark = pytest.mark.skipif(not interpreter_ready(), reason="triton imported before TRITON_INTERPRET=1")

from ftlib.reference import causal_attention_ref  # noqa: E402
from kernels.attention import FlashAttentionFunction, TritonCausalAttention, flash_attention  # noqa: E402

BLK = dict(block_m=16, block_n=16)  # small blocks: T=37 spans 3 blocks with a ragged last one


def _inputs(B, nh, nkv, T, hs, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    q, k, v = mk(B, nh, T, hs), mk(B, nkv, T, hs), mk(B, nkv, T, hs)
    do = torch.randn(B, nh, T, hs, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, do


def _reference(q, k, v, do):
    """fp64 reference output and gradients from the same (rounded) inputs."""
    qr, kr, vr = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o = causal_attention_ref(qr, kr, vr)
    return (o, *torch.autograd.grad(o, (qr, kr, vr), do.double()))


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


# fp32 'ieee' is exact up to fp32 rounding; bf16 rounds P and the inputs to 8 mantissa bits.
# The interpreter runs 'tf32' dots in full fp32, so its bound here is the fp32 one; on a GPU
# tf32 (10-bit mantissa) errors are ~1e-3, checked by kernels/dev/attention_dev.py.
CASES = [
    (torch.float32, "ieee", 1e-5),
    (torch.float32, "tf32", 5e-3),
    (torch.bfloat16, "ieee", 3e-2),
]


# hs=32 (the book's models) in every case; hs=64 on a subset to keep the interpreter suite short.
GRID = [(32, nkv, *c) for nkv in (1, 2, 4) for c in CASES]
GRID += [(64, nkv, *c) for nkv in (1, 4) for c in CASES if c[1] == "ieee"]


@pytest.mark.parametrize("hs,nkv,dtype,prec,tol", GRID)
def test_matches_reference(hs, nkv, dtype, prec, tol):
    q, k, v, do = _inputs(2, 4, nkv, 37, hs, dtype)
    o = flash_attention(q, k, v, input_precision=prec, **BLK)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref = _reference(q, k, v, do)
    assert o.dtype == dtype and o.shape == q.shape
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), ref):
        assert got.shape == want.shape, name
        assert _rel_err(got, want) < tol, f"{name}: relative error {_rel_err(got, want):.2e} >= {tol}"


def test_unequal_blocks_and_short_sequence():
    for T, blk in ((37, dict(block_m=32, block_n=16)), (37, dict(block_m=16, block_n=32)), (5, BLK)):
        q, k, v, do = _inputs(1, 2, 1, T, 32, torch.float32, seed=T)
        o = flash_attention(q, k, v, **blk)
        grads = torch.autograd.grad(o, (q, k, v), do)
        for got, want in zip((o, *grads), _reference(q, k, v, do)):
            assert _rel_err(got, want) < 1e-5


def test_gradcheck_fp64():
    q, k, v, _ = _inputs(1, 2, 1, 18, 16, torch.float64, seed=1)
    fn = lambda a, b, c: FlashAttentionFunction.apply(a, b, c, None, "ieee", 16, 16)
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_strided_views_from_the_model_layout():
    """q/k/v as the model makes them: split + view + transpose of one qkv projection, no copies."""
    B, T, nh, nkv, hs = 2, 21, 4, 1, 32
    C = nh * hs
    qkv = torch.randn(B, T, C + 2 * nkv * hs, dtype=torch.float64).float()
    q, k, v = qkv.split([C, nkv * hs, nkv * hs], dim=-1)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs), strides (T*320, hs, 320, 1)
    k = k.view(B, T, nkv, hs).transpose(1, 2)
    v = v.view(B, T, nkv, hs).transpose(1, 2)
    assert not q.is_contiguous()
    out = TritonCausalAttention(block_m=16, block_n=16)(q, k, v)
    torch.testing.assert_close(out, causal_attention_ref(q, k, v), atol=1e-5, rtol=1e-5)


def test_wrong_inputs_raise():
    q, k, v, _ = _inputs(1, 4, 1, 8, 32, torch.float32)
    with pytest.raises(ValueError, match="must divide"):
        flash_attention(*_inputs(1, 4, 3, 8, 32, torch.float32)[:3])
    with pytest.raises(TypeError, match="dtypes differ"):
        flash_attention(q, k.double(), v)
    with pytest.raises(ValueError, match="head size"):
        flash_attention(*_inputs(1, 2, 1, 8, 24, torch.float32)[:3])
    with pytest.raises(ValueError, match="head dim must be contiguous"):
        flash_attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    with pytest.raises(ValueError, match="input_precision"):
        flash_attention(q, k, v, input_precision="bf16x3")
    with pytest.raises(ValueError, match="4 dims"):
        flash_attention(q[0], k[0], v[0])


def test_detects_non_causal_output():
    """The comparison can fail: full (non-causal) attention differs from the kernel."""
    q, k, v, _ = _inputs(1, 2, 1, 20, 32, torch.float32)
    o = flash_attention(q, k, v, **BLK).detach()
    full = torch.softmax(q @ k.transpose(-2, -1) / 32**0.5, dim=-1) @ v
    assert _rel_err(o, full.detach().double()) > 1e-2


@pytest.mark.parametrize("nkv", [1, 2, 4])
def test_packed_attention_matches_reference_forward_and_qkv_gradient(nkv):
    """packed_attention: (B, T, C + 2 nkv hs) in, (B, T, C) out, d(qkv) in one buffer."""
    from kernels.attention import packed_attention

    B, T, nh, hs = 2, 37, 4, 16
    C = nh * hs
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, C + 2 * nkv * hs, generator=g, dtype=torch.float64).float().requires_grad_(True)
    dy = torch.randn(B, T, C, generator=g, dtype=torch.float64).float()
    y = packed_attention(qkv, nh, nkv, hs, block_m=16, block_n=16)
    (dqkv,) = torch.autograd.grad(y, qkv, dy)

    ref_in = qkv.detach().double().requires_grad_(True)
    q, k, v = ref_in.split([C, nkv * hs, nkv * hs], dim=-1)
    q = q.view(B, T, nh, hs).transpose(1, 2)
    k = k.view(B, T, nkv, hs).transpose(1, 2)
    v = v.view(B, T, nkv, hs).transpose(1, 2)
    yr = causal_attention_ref(q, k, v).transpose(1, 2).reshape(B, T, C)
    (dr,) = torch.autograd.grad(yr, ref_in, dy.double())
    assert y.shape == (B, T, C) and y.is_contiguous() and dqkv.shape == qkv.shape
    torch.testing.assert_close(y.double(), yr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dqkv.double(), dr, atol=1e-5, rtol=1e-5)


def test_packed_attention_rejects_a_mismatched_width():
    from kernels.attention import packed_attention

    with pytest.raises(ValueError, match="qkv must be"):
        packed_attention(torch.randn(1, 8, 100), 4, 1, 16)
