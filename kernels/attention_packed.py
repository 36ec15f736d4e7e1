"""Attention straight from the packed qkv projection (B, T, C + 2 nkv hs) to (B, T, C), and back, on the fused
kernels of :mod:`kernels.attention` with no layout copies: the launchers read q, k, v as strided views of the
projection's output, write o through a (B, T, nh, hs) view of the output and d(qkv) into one buffer.
``PackedAttentionFunction`` -> ``packed_attention`` (the engine's attention, ``ftlib.training.engine.attention``);
reference: :func:`ftlib.model.reference.causal_attention_ref` on the views.
"""

from __future__ import annotations

import torch

import kernels.attention as flash  # its launchers, looked up at each call (tests spy on them there)
from kernels.tiles import Tiles


def _packed_views(t: torch.Tensor, n_head: int, n_kv_head: int, head_size: int):
    """(q, k, v) views (B, nh|nkv, T, hs) of a packed (B, T, C + 2 nkv hs) [q | k | v] tensor."""
    B, T, _ = t.shape
    C, kvd = n_head * head_size, n_kv_head * head_size
    q = t[..., :C].view(B, T, n_head, head_size).transpose(1, 2)  # (B, nh, T, hs), a view
    k = t[..., C:C + kvd].view(B, T, n_kv_head, head_size).transpose(1, 2)  # (B, nkv, T, hs), a view
    v = t[..., C + kvd:].view(B, T, n_kv_head, head_size).transpose(1, 2)  # (B, nkv, T, hs), a view
    return q, k, v


class PackedAttentionFunction(torch.autograd.Function):
    """Attention straight from the packed qkv projection to (B, T, C), and back.

    With q, k, v as views of the qkv output and o as (B, nh, T, hs) the module needs
    ``o.transpose(1, 2).contiguous()`` forward and, backward, a copy of each of dq, dk, dv
    into (B, T, ...) order and a ``cat`` into d(qkv). Here the forward kernel writes o
    through a (B, T, nh, hs)-ordered view of the (B, T, C) output, and the backward writes
    dq (and copies the small dk, dv) into views of one d(qkv) buffer: no layout copies.
    """

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, n_head: int, n_kv_head: int, head_size: int, input_precision: str = "ieee",
                fwd_tiles: Tiles | None = None, bwd_tiles: Tiles | None = None, fuse_kv_split_sum: bool = False,
                kv_split: int | None = None, concurrent_bwd: bool = False, pack_heads: int = 1,
                heavy_first: bool = False) -> torch.Tensor:
        B, T, _ = qkv.shape
        q, k, v = _packed_views(qkv, n_head, n_kv_head, head_size)
        y = torch.empty((B, T, n_head * head_size), dtype=qkv.dtype, device=qkv.device)  # (B, T, C)
        o = y.view(B, T, n_head, head_size).transpose(1, 2)  # (B, nh, T, hs) view of y
        _, lse = flash.attention_fwd(q, k, v, None, input_precision, **_tile_kw(fwd_tiles), out=o,
                                     pack_heads=pack_heads, heavy_first=heavy_first)
        ctx.save_for_backward(qkv, y, lse)
        ctx.cfg = (n_head, n_kv_head, head_size, input_precision, bwd_tiles, fuse_kv_split_sum, kv_split,
                   concurrent_bwd, pack_heads, heavy_first)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qkv, y, lse = ctx.saved_tensors
        nh, nkv, hs, prec, bwd_tiles, fuse, kv_split, concurrent, pack, heavy = ctx.cfg
        B, T, C = y.shape
        q, k, v = _packed_views(qkv, nh, nkv, hs)
        o = y.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs) view
        do = dy.contiguous().view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs) view
        dqkv = torch.empty_like(qkv)
        dq, dk, dv = _packed_views(dqkv, nh, nkv, hs)
        flash.attention_bwd(do, q, k, v, o, lse, None, prec, **_tile_kw(bwd_tiles), dq_out=dq, dk_out=dk, dv_out=dv,
                      fuse_kv_split_sum=fuse, kv_split=kv_split, concurrent=concurrent, pack_heads=pack,
                      heavy_first=heavy)
        return dqkv, None, None, None, None, None, None, None, None, None, None, None


def _tile_kw(t: Tiles | None) -> dict[str, int | None]:
    """A pass's tiles as the launchers' keywords (all None: chosen from the device)."""
    if t is None:
        return dict(block_m=None, block_n=None, num_warps=None, num_stages=None)
    return dict(block_m=t.block_m, block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)


def packed_attention(
    qkv: torch.Tensor, n_head: int, n_kv_head: int, head_size: int, input_precision: str = "ieee",
    fwd_tiles: Tiles | None = None, bwd_tiles: Tiles | None = None, fuse_kv_split_sum: bool = False,
    kv_split: int | None = None, concurrent_bwd: bool = False, pack_heads: int = 1, heavy_first: bool = False,
) -> torch.Tensor:
    """Causal attention of a packed (B, T, C + 2 nkv hs) [q | k | v] tensor -> (B, T, C), heads side by side.
    ``fwd_tiles`` / ``bwd_tiles``: the forward's and the backward's kernels' tiles (both backward
    kernels take the same), None to choose them from the device (:mod:`kernels.tiles`).
    ``fuse_kv_split_sum``, ``kv_split``, ``concurrent_bwd`` (its ``concurrent``), ``pack_heads`` and
    ``heavy_first``: as in :func:`kernels.attention.attention_bwd`."""
    if qkv.dim() != 3 or qkv.shape[-1] != (n_head + 2 * n_kv_head) * head_size or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be (B, T, {(n_head + 2 * n_kv_head) * head_size}) with a unit last stride "
                         f"for n_head={n_head}, n_kv_head={n_kv_head}, head_size={head_size}; got "
                         f"{tuple(qkv.shape)} strides {qkv.stride()}")
    return PackedAttentionFunction.apply(qkv, n_head, n_kv_head, head_size, input_precision, fwd_tiles, bwd_tiles,
                                         fuse_kv_split_sum, kv_split, concurrent_bwd, pack_heads, heavy_first)
