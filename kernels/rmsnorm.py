"""RMSNorm forward and backward in Triton (Zhang & Sennrich 2019), Liger-Kernel layering.

kernel (``_rms_norm_fwd_kernel``, ``_rms_norm_bwd_kernel`` / ``_rms_norm_bwd_persistent_kernel``)
-> launcher (``rms_norm_fwd``, ``rms_norm_bwd``) -> ``RMSNormFunction`` -> ``TritonRMSNorm``. Reference:
:func:`ftlib.model.reference.rms_norm_ref`. Layering after Liger-Kernel's ``rms_norm.py``
(linkedin/Liger-Kernel, src/liger_kernel/ops/rms_norm.py): rstd saved in the forward,
per-program partial dweight sums in the backward. Unlike Liger, each program takes a tile of
ROWS rows both ways: the measured winner of benchmarks/kernels/rmsnorm_dev.py (v5; the first
version, one row per program forward and a persistent backward grid, was v3).

The backward's dweight partials: one row per tile by default (``dw_partials="tile"``, summed by
the launcher), or with ``dw_partials="persistent"`` one row per program of a grid of a few
programs per SM (``kernels._common.persistent_grid``), each looping over a contiguous run of
ROWS-row tiles with its partial in registers (Liger's layout, but on row tiles rather than single
rows), so the final sum reads n_programs rows instead of cdiv(M, ROWS).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import (
    accum_dtype,
    check_dw_partials,
    check_tensor,
    compute_dtype,
    persistent_grid,
    row_tile_warps,
    same_device,
)
from kernels.pdl import _grid_dependency, pdl_args

MAX_FUSED_BYTES = 65536  # one row must fit in one block (as in Liger); C=256 is far below this


# Rows per program: the fastest of 1, 4 and 16 for forward + backward at 8192 x 256 in a CUDA graph
# (benchmarks/kernels; the kernel table of chapter 6 shows each from data/results/<device>/kernels.jsonl).
# One row per program leaves most of each program's warps idle at C = 256.
ROWS = 4


@triton.jit
def _rms_norm_fwd_kernel(
    X, W, Y, RSTD,  # X, Y: (M, N) row-major; W: (N,); RSTD: (M,) fp32/fp64
    stride_x, stride_y, M, N, eps,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Rows [pid ROWS, (pid + 1) ROWS):  rstd = 1 / sqrt(mean_j x_j^2 + eps),  y_j = x_j * rstd * w_j.

    A (ROWS, N) tile per program so the loads of several rows are in flight together (one
    1 KB row per program was latency-bound: benchmarks/kernels/rmsnorm_rows.py). Accumulation is in
    CD (fp32, or fp64 for fp64 inputs) whatever the storage dtype; the product x * rstd * w
    is formed in CD and rounded once to Y's dtype. rstd is stored for the backward pass so it
    needs no second reduction over x.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # int64: M * N may exceed 2^31
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)  # (ROWS,)
    tl.store(RSTD + rows, rstd, mask=rmask)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty),
             mask=mask)


@triton.jit
def _rms_norm_bwd_rows(DY, X, RSTD, DX, w, rows, cols, stride_dy, stride_x, stride_dx, M, N, CD: tl.constexpr):
    """dx for the rows ``rows`` of a (ROWS, BLOCK_N) tile, stored; returns dy * xhat (the tile's dweight terms)."""
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(CD)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(CD)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0).to(CD)
    xhat = x * rstd[:, None]
    dyw = dy * w[None, :]
    c = tl.sum(dyw * xhat, axis=1) / N  # (ROWS,)
    dx = rstd[:, None] * (dyw - xhat * c[:, None])
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    return dy * xhat  # (ROWS, BLOCK_N); zero outside the mask


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL,  # DY, X, DX: (M, N); W: (N,); RSTD: (M,); DW_PARTIAL: (cdiv(M, ROWS), N)
    stride_dy, stride_x, stride_dx, M, N,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The backward pass for the tile's rows, with xhat = x * rstd:

        dx_j = rstd * (dy_j w_j - xhat_j * mean_k(dy_k w_k xhat_k))
        dw_j = sum_rows dy_j xhat_j      (this tile's partial sum, row pid of DW_PARTIAL)

    Derivation: y = xhat * w, d rstd / d x_k = -rstd^3 x_k / N. The launcher sums the
    partials (cdiv(M, ROWS) x N values).
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    dwt = _rms_norm_bwd_rows(DY, X, RSTD, DX, w, rows, cols, stride_dy, stride_x, stride_dx, M, N, CD)
    tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dwt, axis=0), mask=cols < N)


@triton.jit
def _rms_norm_bwd_persistent_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL,  # as above, but DW_PARTIAL: (grid, N), one row per program
    stride_dy, stride_x, stride_dx, M, N, tiles_per_program,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The same dx and dw on a persistent grid (Liger-Kernel's rms_norm backward: a few programs
    per SM, the weight gradient accumulated in registers). Program pid takes the
    ``tiles_per_program`` consecutive (ROWS, N) tiles from tile pid * tiles_per_program on, rows
    [pid P, (pid + 1) P) with P = tiles_per_program * ROWS (the last run clipped at M); per row

        dx_j = rstd * (dy_j w_j - xhat_j * mean_k(dy_k w_k xhat_k))

    and it accumulates, in a (ROWS, BLOCK_N) register tile in CD, acc_j += dy_j xhat_j over all
    its tiles, then writes DW_PARTIAL[pid, j] = sum over the tile's ROWS axis of acc_j. The
    launcher sums the grid's rows (a few per SM instead of cdiv(M, ROWS)): the partial
    buffer and the reduction that reads it shrink by a factor ~tiles_per_program.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=CD)
    for i in range(tiles_per_program):
        rows = ((pid * tiles_per_program + i) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        acc += _rms_norm_bwd_rows(DY, X, RSTD, DX, w, rows, cols, stride_dy, stride_x, stride_dx, M, N, CD)
    tl.store(DW_PARTIAL + pid * N + cols, tl.sum(acc, axis=0), mask=cols < N)


def _block_n(x: torch.Tensor) -> int:
    N = x.shape[-1]
    block = triton.next_power_of_2(N)
    if block * x.element_size() > MAX_FUSED_BYTES:
        raise ValueError(f"rows of {N} {x.dtype} elements do not fit one block ({MAX_FUSED_BYTES} bytes)")
    return block


def _check_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_tensor("x", x, contiguous=False)
    check_tensor("weight", weight, ndim=1)
    same_device(("x", x), ("weight", weight))
    if x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"x's last dim must equal weight's length: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if x.stride(-1) != 1:
        raise ValueError(f"x's last dim must be contiguous (stride 1), got strides {x.stride()}")


def rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, rows: int = ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = rms_norm(x) * weight over the last dim; returns (y, rstd) with rstd (M,) fp32 (fp64 for fp64 x).

    x: (..., N) with unit last-dim stride; weight: (N,). y has x's dtype and shape. ``rows``: rows
    per program (a power of two; benchmarks/kernels/rmsnorm_rows.py times other values).
    """
    _check_inputs(x, weight)
    x2 = x.reshape(-1, x.shape[-1])  # (M, N); a view for contiguous x
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, dtype=accum_dtype(x.dtype), device=x.device)
    BLOCK_N = _block_n(x2)
    if M > 0:
        _rms_norm_fwd_kernel[(triton.cdiv(M, rows),)](
            x2, weight, y, rstd, x2.stride(0), y.stride(0), M, N, eps,
            ROWS=rows, BLOCK_N=BLOCK_N, CD=compute_dtype(x.dtype), num_warps=row_tile_warps(rows, BLOCK_N),
            **pdl_args(x2),
        )
    return y.view(x.shape), rstd  # (M, N) -> x's (..., N)


def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, rows: int = ROWS,
    dw_partials: str = "tile", programs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) for y = rms_norm_fwd(x, weight)[0]; dy like x, dweight like weight.

    ``dw_partials``: "tile" (one program per tile of ``rows`` rows, one dweight partial row each)
    or "persistent" (about ``programs`` programs, default a few per SM: ``kernels._common.persistent_grid``,
    each looping over its run of tiles into one partial row); the launcher sums the partial rows either way."""
    check_dw_partials(dw_partials, programs)
    _check_inputs(x, weight)
    check_tensor("dy", dy, contiguous=False)
    if dy.shape != x.shape:
        raise ValueError(f"dy shape {tuple(dy.shape)} != x shape {tuple(x.shape)}")
    N = x.shape[-1]
    x2 = x.reshape(-1, N)  # (..., N) -> (M, N)
    dy2 = dy.reshape(-1, N)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    dy2 = dy2 if dy2.stride(-1) == 1 else dy2.contiguous()
    M = x2.shape[0]
    cd = accum_dtype(x.dtype)
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    n_tiles = triton.cdiv(M, rows)
    BLOCK_N = _block_n(x2)
    warps = row_tile_warps(rows, BLOCK_N)
    P, per_program = (n_tiles, 1) if dw_partials == "tile" else persistent_grid(x.device, n_tiles, programs, warps)
    dw_partial = torch.empty((P, N), dtype=cd, device=x.device)  # one row per program
    if M > 0:
        args = (dy2, x2, weight, rstd, dx, dw_partial, dy2.stride(0), x2.stride(0), dx.stride(0), M, N)
        meta = dict(ROWS=rows, BLOCK_N=BLOCK_N, CD=compute_dtype(x.dtype), num_warps=warps, **pdl_args(x2))
        if dw_partials == "tile":
            _rms_norm_bwd_kernel[(P,)](*args, **meta)
        else:
            _rms_norm_bwd_persistent_kernel[(P,)](*args, per_program, **meta)
        dw = dw_partial.sum(0).to(weight.dtype)  # (P, N) -> (N,)
    else:
        dw = torch.zeros_like(weight)
    return dx.view(x.shape), dw  # (M, N) -> x's (..., N)


class RMSNormFunction(torch.autograd.Function):
    """Autograd glue: saves x, weight and rstd (M floats) instead of the normalized x.
    ``dw_partials``, ``programs``: how the backward forms its dweight partials (:func:`rms_norm_bwd`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, dw_partials: str = "tile",
                programs: int | None = None) -> torch.Tensor:
        check_dw_partials(dw_partials, programs)
        y, rstd = rms_norm_fwd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.dw_partials, ctx.programs = dw_partials, programs
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_bwd(dy, x, weight, rstd, dw_partials=ctx.dw_partials, programs=ctx.programs)
        return dx, dw, None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, dw_partials: str = "tile",
             programs: int | None = None) -> torch.Tensor:
    """Functional RMSNorm through the Triton kernels (differentiable in x and weight)."""
    return RMSNormFunction.apply(x, weight, eps, dw_partials, programs)


class TritonRMSNorm(nn.Module):
    """Drop-in for :class:`ftlib.model.norm.RMSNorm` (same parameter name and init); ``dw_partials``
    selects the backward's dweight partials (:func:`rms_norm_bwd`)."""

    def __init__(self, dim: int, eps: float = 1e-5, dw_partials: str = "tile") -> None:
        super().__init__()
        check_dw_partials(dw_partials)
        self.eps, self.dw_partials = eps, dw_partials
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.dw_partials)
