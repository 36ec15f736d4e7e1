"""attention_bwd(concurrent=True): the dK/dV kernel forms D = rowsum(dO * O) itself and, on CUDA, runs on a
side stream beside the dQ kernel. It must give the gradients of the fp64 reference and of the sequential
launch, through the packed layout too, on kernel_device (the CPU interpreter, or compiled on CUDA with
FTLIB_TEST_GPU=1)."""

import pytest
import torch

pytest.importorskip("triton")

from ftlib.model.reference import causal_attention_ref  # noqa: E402
from kernels.attention import attention_bwd, attention_fwd, packed_attention  # noqa: E402
from kernels.tiles import Tiles  # noqa: E402

pytestmark = pytest.mark.kernels

BLK = dict(block_m=16, block_n=16)  # T=37 spans 3 blocks with a ragged last one


def _inputs(B, nh, nkv, T, hs, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    return mk(B, nh, T, hs), mk(B, nkv, T, hs), mk(B, nkv, T, hs), mk(B, nh, T, hs)


def _reference(q, k, v, do):
    qr, kr, vr = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    o = causal_attention_ref(qr, kr, vr)
    return torch.autograd.grad(o, (qr, kr, vr), do.cpu().double())


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.detach().cpu().double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("nkv,kv_split,fused", [(1, 1, False), (1, 2, True), (1, 4, False), (2, 2, True),
                                                (4, 1, False)])
def test_concurrent_backward_gives_the_reference_and_the_sequential_gradients(nkv, kv_split, fused,
                                                                              kernel_device):
    q, k, v, do = _inputs(2, 4, nkv, 37, 32, torch.float32, kernel_device, seed=5)
    want = _reference(q, k, v, do)
    o, lse = attention_fwd(q, k, v, **BLK)
    kw = dict(**BLK, kv_split=kv_split, fuse_kv_split_sum=fused)
    seq = attention_bwd(do, q, k, v, o, lse, **kw)
    got = attention_bwd(do, q, k, v, o, lse, **kw, concurrent=True)
    if kernel_device.type == "cuda":
        torch.cuda.synchronize()
    for name, g, s, ref in zip("qkv", got, seq, want):
        assert _rel_err(g, ref) < 1e-5, name
        # The same sums in the same kernels; D formed by the same expression in both kernels.
        torch.testing.assert_close(g, s, rtol=1e-6, atol=1e-6, msg=f"d{name}")


def test_a_wrong_delta_would_show(kernel_device):
    """The comparison above can fail: a dO scaled only for the dK/dV kernel's own D changes dk."""
    q, k, v, do = _inputs(1, 4, 1, 37, 32, torch.float32, kernel_device, seed=6)
    o, lse = attention_fwd(q, k, v, **BLK)
    _, dk, _ = attention_bwd(do, q, k, v, o, lse, **BLK, concurrent=True)
    _, dk2, _ = attention_bwd(do, q, k, v, 2 * o, lse, **BLK, concurrent=True)  # D doubled in the dK/dV kernel
    assert _rel_err(dk2, _reference(q, k, v, do)[1]) > 1e-2 and _rel_err(dk, _reference(q, k, v, do)[1]) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_packed_layout_concurrent_backward(dtype, tol, kernel_device):
    """The engine's path: d(qkv) in one buffer, dq written by the main stream's kernel and dk/dv summed into
    their slices by the side stream's, then the result read right after the call."""
    B, T, nh, nkv, hs = 2, 37, 4, 1, 32
    C = nh * hs
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(B, T, C + 2 * nkv * hs, generator=g, dtype=torch.float64)
    dy = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    grads = []
    for concurrent in (False, True):
        x = qkv.to(kernel_device, dtype).requires_grad_(True)
        y = packed_attention(x, nh, nkv, hs, fwd_tiles=Tiles(16, 16), bwd_tiles=Tiles(16, 16),
                             fuse_kv_split_sum=True, concurrent_bwd=concurrent)
        (d,) = torch.autograd.grad(y, x, dy.to(kernel_device, dtype))
        grads.append(d.float().cpu())
    ref = qkv.clone().requires_grad_(True)
    q, k, v = ref.split([C, nkv * hs, nkv * hs], dim=-1)
    yr = causal_attention_ref(q.view(B, T, nh, hs).transpose(1, 2), k.view(B, T, nkv, hs).transpose(1, 2),
                              v.view(B, T, nkv, hs).transpose(1, 2)).transpose(1, 2).reshape(B, T, C)
    (dr,) = torch.autograd.grad(yr, ref, dy)
    assert _rel_err(grads[1], dr) < tol
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6 if dtype == torch.float32 else 1e-2,
                               atol=1e-6 if dtype == torch.float32 else 1e-2)
