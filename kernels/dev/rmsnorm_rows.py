"""Experiment (not in the model yet): RMSNorm forward and backward on tiles of ROWS rows.

Why: in a CUDA graph on the H200 the model's Triton RMSNorm (kernels/rmsnorm.py) takes 54 us
fwd+bwd at (8192, 256) fp32 against torch.compile's 25 us (kernels.jsonl, 2026-12-02). Its
forward runs one 1 KB row per program (8,192 tiny programs) and its backward one program per
SM looping over ~62 rows one after another, each iteration waiting on its two row loads:
latency-bound, not bandwidth-bound. Here every program takes a (ROWS, N) tile, so the loads
of ROWS rows are in flight together, and the backward's dweight partial is one (N,) row per
program, summed by the launcher (cdiv(M, ROWS) x N floats: 0.5 MB at ROWS=16).

Prediction (to be measured by ``python -m kernels.dev.rmsnorm_dev``, variants v4/v5): 42 MB
of traffic fwd+bwd at ~3 TB/s is ~14 us; with launch and the partial sum ~18-25 us, i.e. at
torch.compile's time, saving ~30 us per norm, 13 norms per FastTransformer step: ~0.4 ms.

Math (Zhang & Sennrich 2019), per row, xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps):
    forward   y = xhat * w
    backward  dx = rstd * (dy w - xhat * mean(dy w xhat)),   dw = sum_rows dy xhat
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import compute_dtype


@triton.jit
def _rms_rows_fwd_kernel(X, W, Y, RSTD, M, N, sx, sy, eps,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """Rows [pid ROWS, (pid + 1) ROWS): rstd = 1 / sqrt(mean_j x_j^2 + eps), y = x rstd w."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)  # (ROWS,)
    tl.store(RSTD + rows, rstd, mask=rmask)
    tl.store(Y + rows[:, None] * sy + cols[None, :], (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty),
             mask=mask)


@triton.jit
def _rms_rows_bwd_kernel(DY, X, W, RSTD, DX, DWP, M, N, sdy, sx, sdx,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """dx for the tile's rows; this program's dweight partial sum_rows dy xhat into DWP[pid]."""
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0).to(CD)
    dy = tl.load(DY + rows[:, None] * sdy + cols[None, :], mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(CD)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    xhat = x * rstd[:, None]
    dyw = dy * w[None, :]
    c = tl.sum(dyw * xhat, axis=1) / N  # (ROWS,)
    dx = rstd[:, None] * (dyw - xhat * c[:, None])
    tl.store(DX + rows[:, None] * sdx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DWP + pid * N + cols, tl.sum(dy * xhat, axis=0), mask=cols < N)


def _warps(rows: int, block_n: int) -> int:
    return min(8, max(1, rows * block_n // 1024))


def rms_rows_fwd(x: torch.Tensor, w: torch.Tensor, eps: float, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])  # (M, N)
    M, N = x2.shape
    y = torch.empty_like(x2)
    rstd = torch.empty(M, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    block_n = triton.next_power_of_2(N)
    _rms_rows_fwd_kernel[(triton.cdiv(M, rows),)](x2, w, y, rstd, M, N, x2.stride(0), y.stride(0), eps,
                                                  ROWS=rows, BLOCK_N=block_n, CD=compute_dtype(x.dtype),
                                                  num_warps=_warps(rows, block_n))
    return y.view(x.shape), rstd


def rms_rows_bwd(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
                 rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    N = x.shape[-1]
    x2, dy2 = x.reshape(-1, N), dy.reshape(-1, N).contiguous()
    M = x2.shape[0]
    dx = torch.empty_like(x2)
    grid = triton.cdiv(M, rows)
    dwp = torch.empty((grid, N), dtype=rstd.dtype, device=x.device)
    block_n = triton.next_power_of_2(N)
    _rms_rows_bwd_kernel[(grid,)](dy2, x2, w, rstd, dx, dwp, M, N, dy2.stride(0), x2.stride(0), dx.stride(0),
                                  ROWS=rows, BLOCK_N=block_n, CD=compute_dtype(x.dtype),
                                  num_warps=_warps(rows, block_n))
    return dx.view(x.shape), dwp.sum(0).to(w.dtype)


class RMSRowsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps, rows):
        y, rstd = rms_rows_fwd(x, w, eps, rows)
        ctx.save_for_backward(x, w, rstd)
        ctx.rows = rows
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rms_rows_bwd(dy, x, w, rstd, ctx.rows)
        return dx, dw, None, None


def rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5, rows: int = 16) -> torch.Tensor:
    """RMSNorm over the last dim of a contiguous x on (rows, N) tiles (fwd and bwd)."""
    return RMSRowsFunction.apply(x.contiguous(), w, eps, rows)
