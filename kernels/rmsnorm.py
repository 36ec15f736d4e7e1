"""RMSNorm forward and backward in Triton (Zhang & Sennrich 2019), Liger-Kernel layering.

kernel (``_rms_norm_fwd_kernel``, ``_rms_norm_bwd_kernel``) -> launcher (``rms_norm_fwd``,
``rms_norm_bwd``) -> ``RMSNormFunction`` -> ``TritonRMSNorm``. Reference:
:func:`ftlib.model.reference.rms_norm_ref`. Layering after Liger-Kernel's ``rms_norm.py``
(linkedin/Liger-Kernel, src/liger_kernel/ops/rms_norm.py): rstd saved in the forward,
per-program partial dweight sums in the backward. Unlike Liger, each program takes a tile of
ROWS rows both ways: the measured winner of benchmarks/kernels/rmsnorm_dev.py (v5; the first
version, one row per program forward and a persistent backward grid, was v3).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import check_tensor, compute_dtype, row_tile_warps, same_device

MAX_FUSED_BYTES = 65536  # one row must fit in one block (as in Liger); C=256 is far below this


ROWS = 4  # rows per program (kernels.jsonl, H200, 8192 x 256 fwd+bwd in a graph: 4 rows 25.7 us, 16 rows 28.4,
#            one row per program 54; torch.compile 25)


@triton.jit
def _rms_norm_fwd_kernel(
    X, W, Y, RSTD,  # X, Y: (M, N) row-major; W: (N,); RSTD: (M,) fp32/fp64
    stride_x, stride_y, M, N, eps,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr,
):
    """Rows [pid ROWS, (pid + 1) ROWS):  rstd = 1 / sqrt(mean_j x_j^2 + eps),  y_j = x_j * rstd * w_j.

    A (ROWS, N) tile per program so the loads of several rows are in flight together (one
    1 KB row per program was latency-bound: benchmarks/kernels/rmsnorm_rows.py). Accumulation is in
    CD (fp32, or fp64 for fp64 inputs) whatever the storage dtype; the product x * rstd * w
    is formed in CD and rounded once to Y's dtype. rstd is stored for the backward pass so it
    needs no second reduction over x.
    """
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
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL,  # DY, X, DX: (M, N); W: (N,); RSTD: (M,); DW_PARTIAL: (cdiv(M, ROWS), N)
    stride_dy, stride_x, stride_dx, M, N,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr,
):
    """The backward pass for the tile's rows, with xhat = x * rstd:

        dx_j = rstd * (dy_j w_j - xhat_j * mean_k(dy_k w_k xhat_k))
        dw_j = sum_rows dy_j xhat_j      (this tile's partial sum, row pid of DW_PARTIAL)

    Derivation: y = xhat * w, d rstd / d x_k = -rstd^3 x_k / N. The launcher sums the
    partials (cdiv(M, ROWS) x N values).
    """
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(CD)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0).to(CD)
    xhat = x * rstd[:, None]
    dyw = dy * w[None, :]
    c = tl.sum(dyw * xhat, axis=1) / N  # (ROWS,)
    dx = rstd[:, None] * (dyw - xhat * c[:, None])
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dy * xhat, axis=0), mask=cols < N)


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
    rstd = torch.empty(M, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    BLOCK_N = _block_n(x2)
    if M > 0:
        _rms_norm_fwd_kernel[(triton.cdiv(M, rows),)](
            x2, weight, y, rstd, x2.stride(0), y.stride(0), M, N, eps,
            ROWS=rows, BLOCK_N=BLOCK_N, CD=compute_dtype(x.dtype), num_warps=row_tile_warps(rows, BLOCK_N),
        )
    return y.view(x.shape), rstd  # (M, N) -> x's (..., N)


def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, rows: int = ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) for y = rms_norm_fwd(x, weight)[0]; dy like x, dweight like weight."""
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
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    P = triton.cdiv(M, rows)
    dw_partial = torch.empty((P, N), dtype=cd, device=x.device)
    BLOCK_N = _block_n(x2)
    if M > 0:
        _rms_norm_bwd_kernel[(P,)](
            dy2, x2, weight, rstd, dx, dw_partial, dy2.stride(0), x2.stride(0), dx.stride(0),
            M, N, ROWS=rows, BLOCK_N=BLOCK_N, CD=compute_dtype(x.dtype), num_warps=row_tile_warps(rows, BLOCK_N),
        )
        dw = dw_partial.sum(0).to(weight.dtype)
    else:
        dw = torch.zeros_like(weight)
    return dx.view(x.shape), dw  # (M, N) -> x's (..., N)


class RMSNormFunction(torch.autograd.Function):
    """Autograd glue: saves x, weight and rstd (M floats) instead of the normalized x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, rstd = rms_norm_fwd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_bwd(dy, x, weight, rstd)
        return dx, dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Functional RMSNorm through the Triton kernels (differentiable in x and weight)."""
    return RMSNormFunction.apply(x, weight, eps)


class TritonRMSNorm(nn.Module):
    """Drop-in for :class:`ftlib.model.norm.RMSNorm` (same parameter name and init)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
