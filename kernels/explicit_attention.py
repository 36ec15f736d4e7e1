"""GPT-2's explicit attention, its (B, nh, T, T) probabilities written, in three kernels.

kernels (:mod:`kernels.explicit_attention_kernels`, where the algorithm is stated) -> launchers
(``explicit_attention_fwd``, ``explicit_attention_bwd``) -> ``ExplicitPackedAttentionFunction`` ->
:func:`explicit_attention_packed`. References: :func:`ftlib.model.reference.causal_attention_ref`
for the output and the gradients, :func:`ftlib.model.attention.causal_softmax_ref` for P.

Why: GPT-2 as written materializes the softmax (its definition of the model, kept by the book's
GPT-2 baseline), and on PyTorch ops each (T, T) tensor around it (the scores, the probabilities, their
gradients) crosses memory several times, with layout copies for the batched GEMMs on strided q, k, v.
These kernels keep what GPT-2 writes, P, and fuse everything else: the products with K and V read q,
k, v straight from the packed qkv projection and write the output (B, T, C) and d(qkv) in place.

Tiles: as the flash-attention kernels choose theirs (``kernels/tiles.py``; the operand tiles are the
same, the stored P tile is registers forward and one more tile load backward), under their own cache
entries (``family='explicit'``).

One pass (``one_pass``): for rows of at most ``ONE_PASS_MAX_T`` keys the forward and the dQ kernel can
each take every key of a row in one tile and pass over the keys once instead of twice (the kernels module
says how); the dK/dV kernel is the same either way. Each is asked for on its own (``fwd_one_pass``,
``dq_one_pass``), off unless asked for: which is faster at a shape, and at which tile, is measured
(``benchmarks/kernels/explicit_tiles_dev.py``), not assumed.

Bias gradient (``db_out``, off unless given): the backward kernels can also add the column sums of dq, dk
and dv as they store them into a buffer, the gradient of the qkv projection's bias, so that no column-sum
kernel reads d(qkv) back (the kernels module says how; the engine's option ``qkv_bias_into_attention``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import triton

from kernels._common import accum_dtype, check_tensor, compute_dtype, dot_precision, out_tensor, upcast_dots
from kernels.attention import LOG2E, _check_flag, _check_qkv, _grid
from kernels.attention_packed import _packed_views
from kernels.explicit_attention_kernels import (
    _explicit_attn_bwd_dkdv_kernel,
    _explicit_attn_bwd_dq_kernel,
    _explicit_attn_bwd_dq_one_pass_kernel,
    _explicit_attn_fwd_kernel,
    _explicit_attn_fwd_one_pass_kernel,
)
from kernels.pdl import pdl_args
from kernels.tiles import Tiles, launch_tiled, tiles_to_try

FAMILY = "explicit"  # the tile cache's name for these kernels (kernels.tiles.tiles_to_try)
# The one-pass kernels hold a (BLOCK_M, row) tile of scores and its exponentials in registers: past 512
# keys that is more than a block's registers at the smallest BLOCK_M, and spills.
ONE_PASS_MAX_T = 512


def one_pass_tiles(T: int, block_m: int = 32, num_warps: int | None = None) -> Tiles:
    """Tiles of the one-pass kernels for rows of T keys: BLOCK_M query rows, the row as the key tile
    (BLOCK_N = T's power of two, at least 16), one stage (there is no loop to pipeline). ``num_warps``
    None: 4, or 8 where a (BLOCK_M, BLOCK_N) fp32 tile would take more than 64 registers a thread at 4
    (each kernel holds two such tiles: the scores and their exponentials, or P and dP)."""
    if not 0 < T <= ONE_PASS_MAX_T:
        raise ValueError(f"the one-pass kernels take rows of 1 to {ONE_PASS_MAX_T} keys, got T={T}")
    block_t = max(16, 1 << (T - 1).bit_length())
    if num_warps is None:
        num_warps = 4 if block_m * block_t <= 64 * 32 * 4 else 8
    return Tiles(block_m, block_t, num_warps, 1)


def _row_tiles(one_pass: bool | Tiles, T: int) -> Tiles | None:
    """The one-pass kernels' tiles (None: two passes): ``one_pass`` True takes :func:`one_pass_tiles`,
    a :class:`Tiles` must span the row."""
    if one_pass is False:
        return None
    tiles = one_pass_tiles(max(T, 1)) if one_pass is True else one_pass  # T = 0: nothing launches
    if not isinstance(tiles, Tiles) or tiles.block_n < T or T > ONE_PASS_MAX_T:
        raise ValueError(f"one_pass must be a bool or Tiles whose block_n spans the row (>= T={T}, T <= "
                         f"{ONE_PASS_MAX_T}); got {one_pass!r}")
    return tiles


def _launch_once(kernel: str, launch, tiles: Tiles) -> None:
    launch_tiled(kernel, launch, [tiles], None)  # explicit tiles: no fallback, a clear error if they do not load


def explicit_attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_dtype: torch.dtype | None = None,
    input_precision: str = "ieee", tiles: Tiles | None = None, out: torch.Tensor | None = None,
    one_pass: bool | Tiles = False, heavy_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o (B, nh, T, hs), p (B, nh, T, T)) with p = softmax(q k^T / sqrt(hs) + causal mask), zeros above the
    diagonal, stored in ``p_dtype`` (None: q's dtype; bf16 under bf16 autocast, what GPT-2's ``att @ v``
    casts it to), and o = p v from p as stored. q (B, nh, T, hs) and k, v (B, nkv, T, hs) may be strided
    views (unit last stride); ``out``: a strided view to write o into (e.g. of the (B, T, C) output).
    ``input_precision``: the products' tl.dot precision for fp32 operands ('ieee', 'tf32', 'tf32x3').
    ``tiles``: the two-pass kernel's (None: chosen from the device); ``one_pass``: True or row-spanning
    :class:`Tiles` for the one-pass kernel instead (then ``tiles`` must be None). ``heavy_first``: each row's last
    query block, the one with the most causal work, launched first (:func:`kernels.attention._grid`)."""
    _check_qkv(q, k, v, input_precision)
    _check_flag("heavy_first", heavy_first)
    B, nh, T, hs = q.shape
    nkv = k.shape[1]
    row = _row_tiles(one_pass, T)
    if row is not None and tiles is not None:
        raise ValueError("give the forward's tiles as one_pass=Tiles(...) for the one-pass kernel, not as tiles")
    p_dtype = q.dtype if p_dtype is None else p_dtype
    if p_dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"p_dtype {p_dtype} is not a float dtype the kernels store")
    o = out_tensor("out", out, (B, nh, T, hs), q.dtype, q.device)
    p = torch.empty((B, nh, T, T), dtype=p_dtype, device=q.device)
    if B * nh * T == 0:
        return o, p

    # The one-pass kernel takes the two-pass kernel's arguments; its BLOCK_N is the whole row.
    kernel = _explicit_attn_fwd_kernel if row is None else _explicit_attn_fwd_one_pass_kernel

    def launch(t: Tiles) -> None:
        kernel[_grid(triton.cdiv(T, t.block_m), B * nh, heavy_first)](
            q, k, v, o, p, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            nh, T, LOG2E / math.sqrt(hs), nh // nkv, HS=hs, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            PREC=dot_precision(q.dtype, input_precision), UPCAST=upcast_dots(q.dtype), CD=compute_dtype(q.dtype),
            HEAVY_FIRST=heavy_first, num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(q),
        )

    if row is not None:
        _launch_once("fwd", launch, row)
        return o, p
    key, order = tiles_to_try("fwd", hs, q.dtype, T, q.device, tiles, family=FAMILY)
    launch_tiled("fwd", launch, order, key)
    return o, p


def explicit_attention_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor,
    input_precision: str = "ieee", tiles: Tiles | None = None, dq_out: torch.Tensor | None = None,
    dk_out: torch.Tensor | None = None, dv_out: torch.Tensor | None = None, one_pass: bool | Tiles = False,
    db_out: torch.Tensor | None = None, heavy_first: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) for _, p = explicit_attention_fwd(q, k, v, ...), from the stored p (never recomputed; the
    output is not needed: the softmax backward's row sums come from p and dP).
    ``dq_out``/``dk_out``/``dv_out``: strided views to write into (e.g. of one packed d(qkv) buffer).
    ``tiles``: both kernels' (None: chosen from the device); ``one_pass``: True or row-spanning
    :class:`Tiles` run the dQ kernel in one pass at those tiles (``tiles`` then go to the dK/dV kernel).
    ``db_out``: an fp32 ((nh + 2 nkv) hs,) tensor into which the kernels add the column sums of dq, dk and dv
    as stored, over the batch and the sequence, heads side by side in the packed [q | k | v] order: the
    gradient of a bias added to the packed qkv projection (e.g. its view of a flat gradient, zeroed
    before the step: the kernels add, never write). ``heavy_first``: the dQ kernel's last query block and the
    dK/dV kernel's first key block, the ones with the most causal work, launched first."""
    _check_qkv(q, k, v, input_precision)
    _check_flag("heavy_first", heavy_first)
    B, nh, T, hs = q.shape
    nkv = k.shape[1]
    row = _row_tiles(one_pass, T)
    check_tensor("do", do, dtypes=(q.dtype,), ndim=4, contiguous=False)
    check_tensor("p", p, ndim=4)
    if do.shape != q.shape or do.stride(-1) != 1:
        raise ValueError(f"do must be {tuple(q.shape)} with a unit last stride; got {tuple(do.shape)} strides "
                         f"{do.stride()}")
    if tuple(p.shape) != (B, nh, T, T):
        raise ValueError(f"p must be (B, nh, T, T) = {(B, nh, T, T)}, got {tuple(p.shape)}")
    dq = out_tensor("dq_out", dq_out, (B, nh, T, hs), q.dtype, q.device)
    dk = out_tensor("dk_out", dk_out, (B, nkv, T, hs), k.dtype, k.device)
    dv = out_tensor("dv_out", dv_out, (B, nkv, T, hs), v.dtype, v.device)
    if db_out is not None:
        check_tensor("db_out", db_out, dtypes=(torch.float32,), ndim=1)
        if db_out.numel() != (nh + 2 * nkv) * hs or db_out.device != q.device:
            raise ValueError(f"db_out must hold (nh + 2 nkv) hs = {(nh + 2 * nkv) * hs} values on {q.device}, got "
                             f"{db_out.numel()} on {db_out.device}")
    if B * nh * T == 0:
        return dq, dk.zero_(), dv.zero_()
    delta = torch.empty((B, nh, T), dtype=accum_dtype(q.dtype), device=q.device)
    prec, upcast, cd = dot_precision(q.dtype, input_precision), upcast_dots(q.dtype), compute_dtype(q.dtype)
    sm_scale = 1.0 / math.sqrt(hs)
    db = delta if db_out is None else db_out  # without db_out the kernels never touch their DB argument

    # The one-pass dQ kernel takes the two-pass kernel's arguments; its BLOCK_N is the whole row.
    dq_kernel = _explicit_attn_bwd_dq_kernel if row is None else _explicit_attn_bwd_dq_one_pass_kernel

    def launch_dq(t: Tiles) -> None:  # first: it also writes D = rowsum(P * dP) for the dK/dV kernel
        dq_kernel[_grid(triton.cdiv(T, t.block_m), B * nh, heavy_first)](
            k, v, do, p, delta, dq, db, *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
            *dq.stride()[:3], nh, T, sm_scale, nh // nkv, HS=hs, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            PREC=prec, UPCAST=upcast, CD=cd, HAS_DB=db_out is not None, HEAVY_FIRST=heavy_first,
            num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(q),
        )

    def launch_dkdv(t: Tiles) -> None:
        _explicit_attn_bwd_dkdv_kernel[_grid(triton.cdiv(T, t.block_n), B * nkv, heavy_first)](
            q, v, do, p, delta, dk, dv, db, *q.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3],
            *dv.stride()[:3], nh, nkv, T, sm_scale, nh // nkv, HS=hs, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            PREC=prec, UPCAST=upcast, CD=cd, HAS_DB=db_out is not None, HEAVY_FIRST=heavy_first,
            num_warps=t.num_warps, num_stages=t.num_stages, **pdl_args(q),
        )

    if row is not None:
        _launch_once("bwd_dq", launch_dq, row)
    else:
        key, order = tiles_to_try("bwd_dq", hs, q.dtype, T, q.device, tiles, family=FAMILY)
        launch_tiled("bwd_dq", launch_dq, order, key)
    key, order = tiles_to_try("bwd_dkdv", hs, q.dtype, T, q.device, tiles, family=FAMILY)
    launch_tiled("bwd_dkdv", launch_dkdv, order, key)
    return dq, dk, dv


class ExplicitPackedAttentionFunction(torch.autograd.Function):
    """From the packed qkv projection (B, T, C + 2 nkv hs) to the (B, T, C) output and back: q, k, v are
    read as strided views, o is written through a (B, nh, T, hs) view of the output and dq, dk, dv
    through views of one d(qkv) buffer, so no layout copy runs either way. Saves qkv and P. ``db_out``: where the
    backward adds the qkv projection's bias gradient (:func:`explicit_attention_bwd`); None: nowhere."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, n_head: int, n_kv_head: int, head_size: int,
                p_dtype: torch.dtype | None = None, input_precision: str = "ieee", fwd_tiles: Tiles | None = None,
                bwd_tiles: Tiles | None = None, fwd_one_pass: bool | Tiles = False,
                dq_one_pass: bool | Tiles = False, db_out: torch.Tensor | None = None,
                heavy_first: bool = False) -> torch.Tensor:
        B, T, _ = qkv.shape
        q, k, v = _packed_views(qkv, n_head, n_kv_head, head_size)
        y = torch.empty((B, T, n_head * head_size), dtype=qkv.dtype, device=qkv.device)  # (B, T, C)
        o = y.view(B, T, n_head, head_size).transpose(1, 2)  # (B, nh, T, hs) view of y
        _, p = explicit_attention_fwd(q, k, v, p_dtype, input_precision, fwd_tiles, out=o, one_pass=fwd_one_pass,
                                      heavy_first=heavy_first)
        ctx.save_for_backward(qkv, p)
        ctx.cfg = (n_head, n_kv_head, head_size, input_precision, bwd_tiles, dq_one_pass, db_out, heavy_first)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qkv, p = ctx.saved_tensors
        nh, nkv, hs, prec, tiles, dq_one_pass, db_out, heavy_first = ctx.cfg
        B, T, _ = qkv.shape
        q, k, v = _packed_views(qkv, nh, nkv, hs)
        do = dy.contiguous().view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs) view (dy is contiguous here)
        dqkv = torch.empty_like(qkv)
        dq, dk, dv = _packed_views(dqkv, nh, nkv, hs)
        explicit_attention_bwd(do, q, k, v, p, prec, tiles, dq_out=dq, dk_out=dk, dv_out=dv, one_pass=dq_one_pass,
                               db_out=db_out, heavy_first=heavy_first)
        return dqkv, None, None, None, None, None, None, None, None, None, None, None


def explicit_attention_packed(
    qkv: torch.Tensor, n_head: int, n_kv_head: int, head_size: int, p_dtype: torch.dtype | None = None,
    input_precision: str = "ieee", fwd_tiles: Tiles | None = None, bwd_tiles: Tiles | None = None,
    fwd_one_pass: bool | Tiles = False, dq_one_pass: bool | Tiles = False, db_out: torch.Tensor | None = None,
    heavy_first: bool = False,
) -> torch.Tensor:
    """GPT-2's explicit causal attention of a packed (B, T, C + 2 nkv hs) [q | k | v] tensor -> (B, T, C),
    its probabilities written in ``p_dtype`` (None: qkv's dtype) as :func:`explicit_attention_fwd` says.
    ``fwd_tiles``/``bwd_tiles``: the forward's and the two backward kernels' tiles (None: chosen from the
    device's shared memory, :mod:`kernels.tiles`); ``fwd_one_pass``, ``dq_one_pass``: the forward, the dQ
    kernel in one pass, True at :func:`one_pass_tiles` or at row-spanning :class:`Tiles` (the forward's then
    replace ``fwd_tiles``, which must be None; with the dQ kernel's, ``bwd_tiles`` go to the dK/dV kernel);
    ``db_out``: where the backward adds the gradient of the qkv projection's bias (:func:`explicit_attention_bwd`);
    ``heavy_first``: every grid's heaviest causal block launched first (:func:`explicit_attention_bwd`)."""
    if qkv.dim() != 3 or qkv.shape[-1] != (n_head + 2 * n_kv_head) * head_size or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be (B, T, {(n_head + 2 * n_kv_head) * head_size}) with a unit last stride "
                         f"for n_head={n_head}, n_kv_head={n_kv_head}, head_size={head_size}; got "
                         f"{tuple(qkv.shape)} strides {qkv.stride()}")
    return ExplicitPackedAttentionFunction.apply(qkv, n_head, n_kv_head, head_size, p_dtype, input_precision,
                                                 fwd_tiles, bwd_tiles, fwd_one_pass, dq_one_pass, db_out,
                                                 heavy_first)


class TritonExplicitAttention(nn.Module):
    """Thin module over :func:`explicit_attention_packed` (no parameters: the projections stay with the
    attention block that owns them). ``forward``'s ``db_out``: where the backward adds the qkv projection's
    bias gradient (a buffer the caller zeroes before each step); None: nowhere, the projection sums its own."""

    def __init__(self, n_head: int, n_kv_head: int, head_size: int, p_dtype: torch.dtype | None = None,
                 input_precision: str = "ieee", fwd_tiles: Tiles | None = None, bwd_tiles: Tiles | None = None,
                 fwd_one_pass: bool | Tiles = False, dq_one_pass: bool | Tiles = False,
                 heavy_first: bool = False) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = n_head, n_kv_head, head_size
        self.heavy_first = heavy_first
        self.p_dtype, self.input_precision = p_dtype, input_precision
        self.fwd_tiles, self.bwd_tiles = fwd_tiles, bwd_tiles
        self.fwd_one_pass, self.dq_one_pass = fwd_one_pass, dq_one_pass

    def forward(self, qkv: torch.Tensor, db_out: torch.Tensor | None = None) -> torch.Tensor:
        return explicit_attention_packed(qkv, self.n_head, self.n_kv_head, self.head_size, self.p_dtype,
                                         self.input_precision, self.fwd_tiles, self.bwd_tiles, self.fwd_one_pass,
                                         self.dq_one_pass, db_out, self.heavy_first)
