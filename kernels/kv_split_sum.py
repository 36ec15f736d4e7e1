"""The MQA/GQA dK/dV split sums of the attention backward in one launch.

kernel (``_kv_split_sum_kernel``) -> launcher (:func:`kv_split_sum`), used by
:func:`kernels.attention.attention_bwd` when asked (``fuse_kv_split_sum``). Reference: the
plain PyTorch it replaces, ``part.view(B, nkv, n_split, T, hs).sum(2).to(dtype)`` then
``out.copy_(...)``, for dK and for dV.

Why: with several query heads per K/V head the dK/dV kernel is split over those query heads
(``n_split`` programs per K/V head, so the grid fills the GPU) and each split writes an fp32
partial. Summing them in PyTorch takes up to six launches per layer: two sums, two casts to the
storage dtype (bf16/fp16), two strided copies into the packed d(qkv) buffer. Here one program
reads the n_split partial tiles of dK and of dV, adds them in fp32 and stores the cast result
straight through the destination's strides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import FLOAT_DTYPES, check_tensor, compute_dtype, interpret_mode, same_device
from kernels.pdl import _grid_dependency, pdl_args

# Elements per (BLOCK_T, BLOCK_D) tile: 2,048 fp32 values (8 KB) per tensor and partial on a GPU, so
# the FastTransformer's (B=32, nkv=1, T=256, hs=32) gives 128 programs, about one per SM of an H100
# or H200. Interpreter: 8 rows, so the tests' short sequences span several row tiles and a partial one.
_GPU_TILE_ELEMS, _GPU_WARPS = 2048, 4
_CPU_BLOCK_T = 8


@triton.jit
def _kv_split_sum_kernel(DKP, DVP, DK, DV, nkv, n_split, T, HS,
                         sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, CD: tl.constexpr, PDL: tl.constexpr = False):
    """For both (part, out) = (DKP, DK) and (DVP, DV), over the rows t of this program's tile:

        out[b, h, t, :] = cast(sum_{s = 0 .. n_split - 1} part[b, h * n_split + s, t, :])

    accumulated in CD (fp32; fp64 for fp64 partials) in the fixed order s = 0, 1, ..., n_split - 1,
    then cast to out's dtype. Program (pt, pbh) takes rows [pt BLOCK_T, (pt + 1) BLOCK_T) of
    (b, h) = divmod(pbh, nkv). The partials are contiguous (B, nkv n_split, T, HS), so partial
    (b, h, s) starts at ((b nkv + h) n_split + s) T HS; DK and DV are (B, nkv, T, HS) with any
    strides (views into a packed d(qkv) buffer).
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pt = tl.program_id(0)
    pbh = tl.program_id(1).to(tl.int64)  # int64: offsets into the partials may pass 2^31
    b = pbh // nkv
    h = pbh % nkv
    rows = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < T) & (cols[None, :] < HS)
    tile = rows[:, None] * HS + cols[None, :]  # offsets within one contiguous (T, HS) partial
    first = pbh * n_split * T * HS  # partial (b, h, s = 0)
    acc_k = tl.zeros((BLOCK_T, BLOCK_D), CD)
    acc_v = tl.zeros((BLOCK_T, BLOCK_D), CD)
    for s in range(0, n_split):
        off = first + s * T * HS + tile
        acc_k += tl.load(DKP + off, mask=mask, other=0.0).to(CD)
        acc_v += tl.load(DVP + off, mask=mask, other=0.0).to(CD)
    ok = b * sdk_b + h * sdk_h + rows[:, None] * sdk_t + cols[None, :] * sdk_d
    ov = b * sdv_b + h * sdv_h + rows[:, None] * sdv_t + cols[None, :] * sdv_d
    tl.store(DK + ok, acc_k.to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + ov, acc_v.to(DV.dtype.element_ty), mask=mask)


def _blocks(hs: int, tile_elems: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) for head size ``hs``: whole rows of the head dim per tile, about
    ``tile_elems`` elements (default ``_GPU_TILE_ELEMS``; the interpreter takes ``_CPU_BLOCK_T`` rows)."""
    block_d = triton.next_power_of_2(hs)
    if interpret_mode():
        return _CPU_BLOCK_T, block_d, 1
    return max(1, (tile_elems or _GPU_TILE_ELEMS) // block_d), block_d, _GPU_WARPS


def kv_split_sum(dk_part: torch.Tensor, dv_part: torch.Tensor, dk_out: torch.Tensor, dv_out: torch.Tensor,
                 tile_elems: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the split partials of dK and dV into ``dk_out`` and ``dv_out`` in one launch; returns them.

    ``dk_part``, ``dv_part``: contiguous (B, nkv n_split, T, hs) fp32 (or fp64) partials, the
    split s of K/V head h at index h n_split + s (the dK/dV kernel's layout). ``dk_out``,
    ``dv_out``: (B, nkv, T, hs) of any float dtype and any strides (e.g. views of one packed
    d(qkv) buffer); n_split = dk_part.shape[1] // nkv. ``tile_elems``: elements per program's tile on
    a GPU (the default's, when None; ``benchmarks/kernels/kv_split_sum_dev.py`` times others).
    """
    for name, t in (("dk_part", dk_part), ("dv_part", dv_part)):
        check_tensor(name, t, dtypes=(torch.float32, torch.float64), ndim=4, contiguous=True)
    for name, t in (("dk_out", dk_out), ("dv_out", dv_out)):
        check_tensor(name, t, dtypes=FLOAT_DTYPES, ndim=4, contiguous=False)
    same_device(("dk_part", dk_part), ("dv_part", dv_part), ("dk_out", dk_out), ("dv_out", dv_out))
    if dk_part.shape != dv_part.shape or dk_part.dtype != dv_part.dtype:
        raise ValueError(f"dk_part and dv_part must match: {tuple(dk_part.shape)} {dk_part.dtype} vs "
                         f"{tuple(dv_part.shape)} {dv_part.dtype}")
    B, nsplits, T, hs = dk_part.shape
    nkv = dk_out.shape[1]
    if dk_out.shape != dv_out.shape:
        raise ValueError(f"dk_out {tuple(dk_out.shape)} and dv_out {tuple(dv_out.shape)} must have the same shape")
    if nkv < 1 or nsplits % nkv or dk_out.shape != (B, nkv, T, hs):
        raise ValueError(f"outputs must be (B, nkv, T, hs) = ({B}, nkv, {T}, {hs}) with nkv dividing the "
                         f"partials' {nsplits} heads; got {tuple(dk_out.shape)}")
    n_split = nsplits // nkv
    if B * nkv * T * hs == 0:
        return dk_out, dv_out
    if tile_elems is not None and tile_elems < 1:
        raise ValueError(f"tile_elems must be positive, got {tile_elems}")
    block_t, block_d, num_warps = _blocks(hs, tile_elems)
    _kv_split_sum_kernel[(triton.cdiv(T, block_t), B * nkv)](
        dk_part, dv_part, dk_out, dv_out, nkv, n_split, T, hs, *dk_out.stride(), *dv_out.stride(),
        BLOCK_T=block_t, BLOCK_D=block_d, CD=compute_dtype(dk_part.dtype), num_warps=num_warps,
        **pdl_args(dk_part))
    return dk_out, dv_out
