"""Fused causal attention, forward and backward, FlashAttention-2 style, with MQA/GQA K/V.

kernels (:mod:`kernels.attention_kernels`: ``_attn_fwd_kernel``, ``_attn_bwd_dq_kernel``,
``_attn_bwd_dkdv_kernel``, where the algorithm is stated) -> launchers (``attention_fwd``,
``attention_bwd``) -> ``FlashAttentionFunction`` -> ``TritonCausalAttention``; the packed-qkv layout's
Function is in :mod:`kernels.attention_packed`. Reference: :func:`ftlib.model.reference.causal_attention_ref`.

K/V heads: q is (B, nh, T, hs), k and v are (B, nkv, T, hs) with nkv | nh; query head h
reads kv head h // (nh // nkv) by pointer arithmetic (Ainslie et al. 2023's grouping), so a
single MQA head (the FastTransformer's nkv = 1) is never copied or expanded.

Tiles: unless the caller fixes them, each kernel takes the first of ``TILE_CANDIDATES`` (64 x
64 first) whose shared-memory estimate fits the device's opt-in limit per block
(``kernels/tiles.py``; 64 KB on a T4, where the fp32 dK/dV kernel at head size 64 and 64 x 64
tiles needs 80 KB), and on a GPU falls back to the next if the compiled kernel still does not
load. ``benchmarks/benchmarks/kernels/aot.py`` compiles the choices for sm_75/80/90 on the CPU (tests/test_aot.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import triton

from kernels._common import (
    accum_dtype,
    check_tensor,
    compute_dtype,
    dot_precision,
    out_tensor,
    same_device,
    upcast_dots,
)
from kernels.attention_kernels import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _attn_fwd_kernel
from kernels.kv_split_sum import kv_split_sum
from kernels.pdl import pdl_args
from kernels.tiles import TILE_CANDIDATES, Tiles, launch_tiled, tiles_to_try

LOG2E = 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2 e), exp2 is the fast unit
# 'tf32x3' splits each fp32 operand into a TF32 head and a TF32 tail and adds three tensor-core
# products (Triton's F32DotTC pass; CUTLASS's 3xTF32, NVIDIA/cutlass discussion 385): close to
# fp32 accuracy at tensor-core speed, where 'ieee' runs on the far slower FMA units.
PRECISIONS = ("ieee", "tf32", "tf32x3")


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, input_precision: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes=_DTYPES, ndim=4, contiguous=False)
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s head dim must be contiguous (stride 1), got strides {t.stride()}")
    same_device(("q", q), ("k", k), ("v", v))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    B, nh, T, hs = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != T or k.shape[3] != hs:
        raise ValueError(
            f"k/v must be (B, nkv, T, hs) = ({B}, nkv, {T}, {hs}); got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    nkv = k.shape[1]
    if nkv < 1 or nh % nkv:
        raise ValueError(f"n_kv_head={nkv} must divide n_head={nh}")
    if hs not in (16, 32, 64, 128):
        raise ValueError(f"head size {hs} not supported; tl.dot needs a power of two in [16, 128]")
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision {input_precision!r}; expected one of {PRECISIONS}")


def _kv_split(B: int, nkv: int, group: int, key_blocks: int, device: torch.device) -> int:
    """How many programs share one K/V head's query-head group in the dK/dV kernel.

    Enough that the grid has ~2 programs per SM (a power of two dividing the group); 1 when
    the grid is already that large (MHA, long sequences). In the interpreter 2 when it can,
    so the CPU tests exercise the partial-sum path.
    """
    if group == 1:
        return 1
    if device.type != "cuda":
        return 2 if group % 2 == 0 else 1
    target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    n = 1
    while n < group and group % (2 * n) == 0 and key_blocks * B * nkv * n < target:
        n *= 2
    return n


def _divides_group(n: object, group: int) -> bool:
    """Whether ``n`` is a power of two (an int, not a bool) dividing the ``group`` query heads per K/V head:
    how many programs share a group (``kv_split``) or how many of its heads share a tile (``pack_heads``)."""
    return not isinstance(n, bool) and isinstance(n, int) and n >= 1 and not n & (n - 1) and group % n == 0


def _check_pack(pack: int, group: int) -> None:
    """``pack_heads``: a power of two dividing the query heads per K/V head (1: one head a tile), at most 16,
    the fewest rows a tile has (so it divides every tile's rows)."""
    if not _divides_group(pack, group) or pack > 16:
        raise ValueError(f"pack_heads={pack!r} must be a power of two dividing the {group} query heads per K/V head"
                         ", at most 16")


def _explicit(block_m: int | None, block_n: int | None, num_warps: int | None, num_stages: int | None
              ) -> Tiles | None:
    """Tiles the caller fixed (any of the four given), the unset ones at the defaults; None: choose."""
    if block_m is None and block_n is None and num_warps is None and num_stages is None:
        return None
    d = TILE_CANDIDATES[0]
    return Tiles(block_m or d.block_m, block_n or d.block_n, num_warps or d.num_warps, num_stages or d.num_stages)


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _grid(blocks: int, rows: int, heavy_first: bool) -> tuple[int, int]:
    """A kernel's grid: (blocks, rows), one program per block of positions and row (batch and head); with
    ``heavy_first`` (rows, blocks), so that, launched x fastest, each row's first program on the blocks axis,
    which the kernels map to the block with the most causal work, starts before any lighter one."""
    return (rows, blocks) if heavy_first else (blocks, rows)


def attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
    input_precision: str = "ieee", block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None, out: torch.Tensor | None = None,
    pack_heads: int = 1, heavy_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax(q k^T * scale) v; returns (o (B, nh, T, hs) contiguous, lse2 (B, nh, T)).

    lse2 is the row log-sum-exp of the scaled scores in base 2 (log2 e * natural lse), in
    fp32 (fp64 for fp64 inputs). input_precision: 'ieee' (strict fp32) or 'tf32' for fp32 q/k/v.
    Tiles: ``block_m``, ``block_n``, ``num_warps``, ``num_stages`` as given, or all None to
    choose them from the device's shared memory (:func:`choose_tiles`). ``pack_heads``: query heads of one K/V
    head per tile (a power of two dividing nh // nkv; the block's rows are block_m / pack_heads positions of
    each), so each K/V block loaded serves them all (``kernels.attention_kernels._query_program``).
    ``heavy_first``: launch every row's last query block, the one that visits the most key blocks, first
    (:func:`_grid`); the same programs and sums in another order.
    """
    _check_qkv(q, k, v, input_precision)
    B, nh, T, hs = q.shape
    nkv = k.shape[1]
    _check_pack(pack_heads, nh // nkv)
    _check_flag("heavy_first", heavy_first)
    sm_scale = 1.0 / math.sqrt(hs) if sm_scale is None else sm_scale
    cd = accum_dtype(q.dtype)
    o = out_tensor("out", out, (B, nh, T, hs), q.dtype, q.device)
    lse = torch.empty((B, nh, T), dtype=cd, device=q.device)
    if B * nh * T == 0:
        return o, lse

    def launch(t: Tiles) -> None:
        _attn_fwd_kernel[_grid(triton.cdiv(T, t.block_m // pack_heads), B * nh // pack_heads, heavy_first)](
            q, k, v, o, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            nh, T, sm_scale * LOG2E, nh // nkv,
            HS=hs, BLOCK_M=t.block_m, BLOCK_N=t.block_n, PREC=dot_precision(q.dtype, input_precision),
            UPCAST=upcast_dots(q.dtype), CD=compute_dtype(q.dtype), PACK=pack_heads, HEAVY_FIRST=heavy_first,
            num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(q),
        )

    key, order = tiles_to_try("fwd", hs, q.dtype, T, q.device, _explicit(block_m, block_n, num_warps, num_stages))
    launch_tiled("fwd", launch, order, key)
    return o, lse


def attention_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    sm_scale: float | None = None, input_precision: str = "ieee", block_m: int | None = None,
    block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
    dq_out: torch.Tensor | None = None, dk_out: torch.Tensor | None = None, dv_out: torch.Tensor | None = None,
    fuse_kv_split_sum: bool = False, kv_split: int | None = None, concurrent: bool = False, pack_heads: int = 1,
    heavy_first: bool = False, pair_key_blocks: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) for o, lse = attention_fwd(q, k, v, ...); dk, dv have k's shape (B, nkv, T, hs).

    ``dq_out``/``dk_out``/``dv_out``: strided views to write into (e.g. slices of one packed
    d(qkv) buffer); dq is written in place by the kernel, dk/dv (small for MQA) are copied in.
    Tiles as in :func:`attention_fwd`, chosen per kernel when not given (the dK/dV kernel holds
    the most in shared memory and may get smaller tiles than the dQ kernel).
    ``fuse_kv_split_sum``: where the dK/dV kernel is split over query heads (MQA/GQA), sum its
    partials, cast and write them into dk/dv in one launch (:mod:`kernels.kv_split_sum`) instead
    of PyTorch's sum, cast and copy for each of dK and dV. ``kv_split``: how many programs share one
    K/V head's query heads in the dK/dV kernel (a power of two dividing nh // nkv); None: enough for about
    two programs per SM (``_kv_split``). 1 writes dk/dv directly, with no partials to sum.
    ``concurrent``: the dK/dV kernel forms D = rowsum(dO * O) itself instead of reading the dQ kernel's, so
    the two kernels share no data; on CUDA it (and the sum of its partials) is queued first on a side stream
    and the dQ kernel beside it on the current stream, which waits for the side stream before this returns.
    Each kernel alone fills only part of the GPU at short sequences (a few hundred programs).
    ``pack_heads``: the dQ kernel's query heads per tile, as :func:`attention_fwd`'s. ``heavy_first``: the dQ
    kernel's last query block and the dK/dV kernel's first key block, the ones with the most blocks to visit,
    launched first (:func:`_grid`). ``pair_key_blocks``: each dK/dV program takes key blocks j and n - 1 - j, so
    all have the same causal work, in half as many key-block slots (the kernel's ``PAIRED``); the split over the
    query heads (``_kv_split``) sees the halved grid.
    """
    _check_qkv(q, k, v, input_precision)
    group = q.shape[1] // k.shape[1]
    _check_pack(pack_heads, group)
    _check_flag("heavy_first", heavy_first)
    _check_flag("pair_key_blocks", pair_key_blocks)
    if kv_split is not None and not _divides_group(kv_split, group):
        raise ValueError(f"kv_split={kv_split!r} must be a power of two dividing the {group} query heads per "
                         "K/V head, or None")
    check_tensor("do", do, dtypes=(q.dtype,), ndim=4, contiguous=False)
    if do.shape != q.shape:
        raise ValueError(f"do shape {tuple(do.shape)} != q shape {tuple(q.shape)}")
    if do.stride(-1) != 1:
        do = do.contiguous()
    B, nh, T, hs = q.shape
    nkv = k.shape[1]
    sm_scale = 1.0 / math.sqrt(hs) if sm_scale is None else sm_scale
    dq = torch.empty((B, nh, T, hs), dtype=q.dtype, device=q.device) if dq_out is None else dq_out
    delta = torch.empty_like(lse)
    if B * nh * T == 0:
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        return dq, dk_out.copy_(dk) if dk_out is not None else dk, dv_out.copy_(dv) if dv_out is not None else dv
    explicit = _explicit(block_m, block_n, num_warps, num_stages)
    prec, upcast, cdt = dot_precision(q.dtype, input_precision), upcast_dots(q.dtype), compute_dtype(q.dtype)
    qs, ks, vs = q.stride()[:3], k.stride()[:3], v.stride()[:3]

    def launch_dq(t: Tiles) -> None:
        # Runs first: it also computes D = rowsum(dO * O), which the dK/dV kernel reads.
        _attn_bwd_dq_kernel[_grid(triton.cdiv(T, t.block_m // pack_heads), B * nh // pack_heads, heavy_first)](
            q, k, v, o, do, lse, delta, dq, *qs, *ks, *vs, *o.stride()[:3], *do.stride()[:3], *dq.stride()[:3],
            nh, T, sm_scale * LOG2E, sm_scale, nh // nkv, HS=hs, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            PREC=prec, UPCAST=upcast, CD=cdt, PACK=pack_heads, HEAVY_FIRST=heavy_first, num_warps=t.num_warps,
            num_stages=t.num_stages, **pdl_args(q),
        )

    def launch_dkdv(t: Tiles) -> tuple[torch.Tensor, torch.Tensor, int]:
        slots = triton.cdiv(triton.cdiv(T, t.block_n), 2 if pair_key_blocks else 1)  # key-block slots of the grid
        n_split = kv_split or _kv_split(B, nkv, nh // nkv, slots, q.device)
        # With n_split > 1 the dK/dV kernel writes fp32 partials per split, summed below.
        part_dtype = k.dtype if n_split == 1 else accum_dtype(k.dtype)
        dk = torch.empty((B, nkv * n_split, T, hs), dtype=part_dtype, device=k.device)
        dv = torch.empty((B, nkv * n_split, T, hs), dtype=part_dtype, device=v.device)
        _attn_bwd_dkdv_kernel[_grid(slots, B * nkv * n_split, heavy_first)](
            q, k, v, o, do, lse, delta, dk, dv, *qs, *ks, *vs, *o.stride()[:3], *do.stride()[:3],
            nh, nkv, T, sm_scale * LOG2E, sm_scale, nh // nkv, n_split, HS=hs, BLOCK_M=t.block_m,
            BLOCK_N=t.block_n, PREC=prec, UPCAST=upcast, CD=cdt, DELTA_HERE=concurrent, HEAVY_FIRST=heavy_first,
            PAIRED=pair_key_blocks, num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(q),
        )
        return dk, dv, n_split

    def dkdv() -> tuple[torch.Tensor, torch.Tensor]:
        key, order = tiles_to_try("bwd_dkdv", hs, q.dtype, T, q.device, explicit)
        dk, dv, n_split = launch_tiled("bwd_dkdv", launch_dkdv, order, key)
        return _finish_dkdv(dk, dv, n_split, k, v, dk_out, dv_out, fuse_kv_split_sum)

    def dq_pass() -> None:
        key, order = tiles_to_try("bwd_dq", hs, q.dtype, T, q.device, explicit)
        launch_tiled("bwd_dq", launch_dq, order, key)

    if not concurrent:
        dq_pass()  # first: the dK/dV kernel reads its D
        return (dq, *dkdv())
    side = _side_stream(q.device)  # None off CUDA (the interpreter): one stream, the same launches in order
    if side is None:
        dk, dv = dkdv()
        dq_pass()
        return dq, dk, dv
    main = torch.cuda.current_stream(q.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        dk, dv = dkdv()
    dq_pass()
    main.wait_stream(side)
    for t in (dk, dv):  # made on the side stream, used on the main one from here
        t.record_stream(main)
    return dq, dk, dv


def _finish_dkdv(dk: torch.Tensor, dv: torch.Tensor, n_split: int, k: torch.Tensor, v: torch.Tensor,
                 dk_out: torch.Tensor | None, dv_out: torch.Tensor | None, fuse_kv_split_sum: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The dK/dV kernel's output as (dk, dv) of k's shape, in ``dk_out``/``dv_out`` where given."""
    B, nkv, T, hs = k.shape
    if n_split > 1 and fuse_kv_split_sum:
        # (B, nkv * n_split, T, hs) partials -> (B, nkv, T, hs), written through the destination's strides
        dk_dst = torch.empty((B, nkv, T, hs), dtype=k.dtype, device=k.device) if dk_out is None else dk_out
        dv_dst = torch.empty((B, nkv, T, hs), dtype=v.dtype, device=v.device) if dv_out is None else dv_out
        return kv_split_sum(dk, dv, dk_dst, dv_dst)
    if n_split > 1:
        # (B, nkv * n_split, T, hs) partial sums over the query heads' split -> (B, nkv, T, hs)
        dk = dk.view(B, nkv, n_split, T, hs).sum(2).to(k.dtype)
        dv = dv.view(B, nkv, n_split, T, hs).sum(2).to(v.dtype)
    if dk_out is not None:
        dk = dk_out.copy_(dk)
    if dv_out is not None:
        dv = dv_out.copy_(dv)
    return dk, dv


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """One side stream per CUDA device for ``attention_bwd(concurrent=True)``, made on first use; None for
    another device. It picks where the launches go, never which launches are made."""
    if device.type != "cuda":
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


class FlashAttentionFunction(torch.autograd.Function):
    """Saves q, k, v, o and the (B, nh, T) logsumexp; never the (T, T) probabilities."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                input_precision: str = "ieee", block_m: int | None = None, block_n: int | None = None,
                fuse_kv_split_sum: bool = False, pack_heads: int = 1, heavy_first: bool = False,
                pair_key_blocks: bool = False) -> torch.Tensor:
        o, lse = attention_fwd(q, k, v, sm_scale, input_precision, block_m, block_n, pack_heads=pack_heads,
                               heavy_first=heavy_first)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cfg = (sm_scale, input_precision, block_m, block_n)
        ctx.kw = dict(fuse_kv_split_sum=fuse_kv_split_sum, pack_heads=pack_heads, heavy_first=heavy_first,
                      pair_key_blocks=pair_key_blocks)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_bwd(do, q, k, v, o, lse, *ctx.cfg, **ctx.kw)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
    input_precision: str = "ieee", block_m: int | None = None, block_n: int | None = None,
    fuse_kv_split_sum: bool = False, pack_heads: int = 1, heavy_first: bool = False, pair_key_blocks: bool = False,
) -> torch.Tensor:
    """Causal attention through the fused kernels; q (B, nh, T, hs), k/v (B, nkv, T, hs).
    Blocks None: each kernel's tiles chosen from the device's shared memory (:func:`choose_tiles`).
    ``fuse_kv_split_sum``, ``pair_key_blocks``: as in :func:`attention_bwd`; ``pack_heads``, ``heavy_first``: as
    in :func:`attention_fwd`."""
    return FlashAttentionFunction.apply(q, k, v, sm_scale, input_precision, block_m, block_n, fuse_kv_split_sum,
                                        pack_heads, heavy_first, pair_key_blocks)


class TritonCausalAttention(nn.Module):
    """Thin module over :func:`flash_attention` (no parameters: the projections stay in
    :class:`ftlib.attention.CausalSelfAttention`)."""

    def __init__(self, input_precision: str = "ieee", block_m: int | None = None, block_n: int | None = None,
                 fuse_kv_split_sum: bool = False) -> None:
        super().__init__()
        self.input_precision, self.block_m, self.block_n = input_precision, block_m, block_n
        self.fuse_kv_split_sum = fuse_kv_split_sum

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attention(q, k, v, None, self.input_precision, self.block_m, self.block_n,
                               self.fuse_kv_split_sum)
