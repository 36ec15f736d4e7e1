"""Scaled, causally masked softmax over materialized attention scores, in one pass each way.

kernels (``_causal_softmax_fwd`` / ``_causal_softmax_bwd``) -> launchers
(``causal_softmax_forward`` / ``causal_softmax_backward``) -> ``CausalSoftmaxFunction`` ->
:func:`causal_softmax` -> ``CausalSoftmax``. Reference: :func:`ftlib.attention.causal_softmax_ref`.

Why: GPT-2 as the post wrote it materializes the (B, nh, T, T) scores and runs
``att * scale``, ``masked_fill(~tril, -inf)`` and ``softmax`` as separate PyTorch kernels
(and their three backwards): at B=32, nh=8, T=256 every pass moves a 67 MB fp32 tensor.
torch.compile keeps the materialized softmax but fuses the three into one kernel forward
and one backward (chapter 1's profile of compile-ro GPT-2:
``triton_per_fused__softmax_exp_masked_fill_mul...``). This is that fusion as the engine's
own kernel: the same function, the probabilities still materialized for ``att @ v``.

With S (R, T) the scores flattened to rows (R = B * nh * T; row r is query position
i = r mod T) and scale = 1 / sqrt(hs):
    forward   z_j = scale * S_ij for j <= i, -inf for j > i
              P_ij = exp(z_j - max_j z) / sum_{j' <= i} exp(z_j' - max_j z)   (0 for j > i)
    backward  dS_ij = scale * P_ij * (dP_ij - sum_j' P_ij' dP_ij')               (softmax's Jacobian)
Both accumulate in fp32 (fp64 for fp64 storage) and read/write each element once.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels._common import FLOAT_DTYPES, check_tensor, compute_dtype, interpret_mode, row_tile_warps
from kernels.pdl import _grid_dependency, pdl_args

MAX_T = 4096  # one row per register tile: beyond this a row would need a loop (not needed here)


@triton.jit
def _causal_softmax_fwd(S, P, R, T, scale, ROWS: tl.constexpr, BLOCK_T: tl.constexpr, CD: tl.constexpr,
                        PDL: tl.constexpr = False):
    """P[r, j] = softmax_{j' <= r mod T}(scale * S[r, j']) at j <= r mod T, else 0, for ROWS rows.

    S and P are (R, T) contiguous; the row max is taken over the kept columns only (column 0
    is always kept, so every valid row has a finite max and a sum >= 1).
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]  # (ROWS, 1)
    cols = tl.arange(0, BLOCK_T)[None, :]  # (1, BLOCK_T)
    valid = (rows < R) & (cols < T)
    keep = valid & (cols <= rows % T)
    z = tl.load(S + rows * T + cols, mask=keep, other=float("-inf")).to(CD) * scale
    m = tl.max(z, axis=1)[:, None]
    m = tl.where(rows < R, m, 0.0)  # rows past R are all -inf: keep exp() away from inf - inf
    e = tl.where(keep, tl.exp(z - m), 0.0)
    d = tl.sum(e, axis=1)[:, None]
    p = e / tl.where(d > 0, d, 1.0)
    tl.store(P + rows * T + cols, p.to(P.dtype.element_ty), mask=valid)


@triton.jit
def _causal_softmax_bwd(P, DP, DS, R, T, scale, ROWS: tl.constexpr, BLOCK_T: tl.constexpr, CD: tl.constexpr,
                        PDL: tl.constexpr = False):
    """DS[r, j] = scale * P[r, j] * (DP[r, j] - sum_j' P[r, j'] DP[r, j']) for ROWS rows.

    Masked columns have P = 0, so their DS is 0 without a mask of its own.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]  # (ROWS, 1)
    cols = tl.arange(0, BLOCK_T)[None, :]
    valid = (rows < R) & (cols < T)
    p = tl.load(P + rows * T + cols, mask=valid, other=0.0).to(CD)
    dp = tl.load(DP + rows * T + cols, mask=valid, other=0.0).to(CD)
    dot = tl.sum(p * dp, axis=1)[:, None]
    ds = scale * p * (dp - dot)
    tl.store(DS + rows * T + cols, ds.to(DS.dtype.element_ty), mask=valid)


def _tiles(T: int, rows: int | None = None) -> tuple[int, int, int]:
    """(ROWS, BLOCK_T, num_warps): about 4,096 elements per program on the GPU (T = 256: 16 rows,
    4 warps); 4 rows in the interpreter so odd shapes cross program boundaries. ``rows``
    overrides the rows per program (``benchmarks/kernels/causal_softmax_dev.py`` times others);
    warps follow the tile size."""
    block_t = triton.next_power_of_2(T)
    if rows is not None and (rows < 1 or rows & (rows - 1)):
        raise ValueError(f"rows={rows} per program must be a power of two (a tl.arange extent)")
    if rows is None:
        rows = 4 if interpret_mode() else max(1, 4096 // block_t)
    return rows, block_t, row_tile_warps(rows, block_t)


def _check_scores(name: str, s: torch.Tensor) -> int:
    check_tensor(name, s, dtypes=FLOAT_DTYPES)
    if s.dim() < 2 or s.shape[-1] != s.shape[-2]:
        raise ValueError(f"{name} must be (..., T, T) attention scores, got shape {tuple(s.shape)}")
    T = s.shape[-1]
    if T > MAX_T:
        raise ValueError(f"{name} has T={T} > {MAX_T}: one row must fit one tile")
    return T


def causal_softmax_forward(s: torch.Tensor, scale: float, out_dtype: torch.dtype | None = None,
                           rows: int | None = None) -> torch.Tensor:
    """P = causal softmax(scale * s) over the last dim; s (..., T, T) contiguous. ``out_dtype``:
    the dtype P is written in (default s's; bf16 under autocast, which the next matmul reads)."""
    T = _check_scores("scores", s)
    p = torch.empty(s.shape, dtype=out_dtype or s.dtype, device=s.device)
    R = s.numel() // T if T else 0  # T = 0: an empty result, as the PyTorch reference returns
    if R == 0:
        return p
    rows, block_t, warps = _tiles(T, rows)
    _causal_softmax_fwd[(triton.cdiv(R, rows),)](s, p, R, T, float(scale), ROWS=rows, BLOCK_T=block_t,
                                                CD=compute_dtype(s.dtype), num_warps=warps, **pdl_args(s))
    return p


def causal_softmax_backward(p: torch.Tensor, dp: torch.Tensor, scale: float, out_dtype: torch.dtype,
                            rows: int | None = None) -> torch.Tensor:
    """dS from the saved probabilities P and their gradient dP (both (..., T, T) contiguous)."""
    T = _check_scores("probs", p)
    check_tensor("grad_probs", dp, dtypes=FLOAT_DTYPES)
    if dp.shape != p.shape:
        raise ValueError(f"grad_probs shape {tuple(dp.shape)} != probs shape {tuple(p.shape)}")
    ds = torch.empty(p.shape, dtype=out_dtype, device=p.device)
    R = p.numel() // T if T else 0
    if R == 0:
        return ds
    rows, block_t, warps = _tiles(T, rows)
    cd = compute_dtype(torch.float64 if torch.float64 in (p.dtype, dp.dtype) else p.dtype)
    _causal_softmax_bwd[(triton.cdiv(R, rows),)](p, dp, ds, R, T, float(scale), ROWS=rows, BLOCK_T=block_t,
                                                CD=cd, num_warps=warps, **pdl_args(p))
    return ds


class CausalSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: torch.Tensor, scale: float, out_dtype: torch.dtype | None = None,
                rows: int | None = None) -> torch.Tensor:
        p = causal_softmax_forward(s.contiguous(), scale, out_dtype, rows)
        ctx.save_for_backward(p)
        ctx.scale, ctx.s_dtype, ctx.rows = scale, s.dtype, rows
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, dp: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (p,) = ctx.saved_tensors
        return causal_softmax_backward(p, dp.contiguous(), ctx.scale, ctx.s_dtype, ctx.rows), None, None, None


def causal_softmax(s: torch.Tensor, scale: float, out_dtype: torch.dtype | None = None,
                   rows: int | None = None) -> torch.Tensor:
    """Differentiable fused ``softmax(masked_fill(s * scale, ~tril, -inf), -1)``; gradient in s's dtype.
    ``rows``: rows of the scores per program (None: the launcher's choice)."""
    return CausalSoftmaxFunction.apply(s, scale, out_dtype, rows)


class CausalSoftmax(nn.Module):
    """Thin module over :func:`causal_softmax` with a fixed scale (1 / sqrt(head size))."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = float(scale)

    def forward(self, s: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return causal_softmax(s, self.scale, out_dtype)

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}"
