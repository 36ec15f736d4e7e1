"""Experiment: RMSNorm forward and backward on tiles of ROWS rows (the winner, 4 rows, is now the model's).

Why: in a CUDA graph on the H200 the model's Triton RMSNorm (kernels/rmsnorm.py) takes 54 us
fwd+bwd at (8192, 256) fp32 against torch.compile's 25 us (kernels.jsonl, 2026-12-02). Its
forward runs one 1 KB row per program (8,192 tiny programs) and its backward one program per
SM looping over ~62 rows one after another, each iteration waiting on its two row loads:
latency-bound, not bandwidth-bound. Here every program takes a (ROWS, N) tile, so the loads
of ROWS rows are in flight together, and the backward's dweight partial is one (N,) row per
program, summed by the launcher (cdiv(M, ROWS) x N floats: 0.5 MB at ROWS=16).

Prediction (to be measured by ``python -m benchmarks.kernels.rmsnorm_dev``, variants v4/v5): 42 MB
of traffic fwd+bwd at ~3 TB/s is ~14 us; with launch and the partial sum ~18-25 us, i.e. at
torch.compile's time, saving ~30 us per norm, 13 norms per FastTransformer step: ~0.4 ms.

Math (Zhang & Sennrich 2019), per row, xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps):
    forward   y = xhat * w
    backward  dx = rstd * (dy w - xhat * mean(dy w xhat)),   dw = sum_rows dy xhat
"""

from __future__ import annotations

import torch

from kernels.rmsnorm import rms_norm_bwd, rms_norm_fwd

# The row-tile kernels written here won (v5, 4 rows: 25.7 us against 54 for one row per program)
# and moved into kernels/rmsnorm.py with the number of rows as a launcher argument; this module
# keeps the experiment's entry point so rmsnorm_dev's v4 (16 rows) and v5 (4 rows) still run.


class RMSRowsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps, rows, dw_partials="tile", programs=None):
        y, rstd = rms_norm_fwd(x, w, eps, rows)
        ctx.save_for_backward(x, w, rstd)
        ctx.rows, ctx.dw_partials, ctx.programs = rows, dw_partials, programs
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rms_norm_bwd(dy, x, w, rstd, ctx.rows, ctx.dw_partials, ctx.programs)
        return dx, dw, None, None, None, None


def rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5, rows: int = 16, dw_partials: str = "tile",
                  programs: int | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of a contiguous x on (rows, N) tiles (fwd and bwd); ``dw_partials`` and
    ``programs`` as in :func:`kernels.rmsnorm.rms_norm_bwd`."""
    return RMSRowsFunction.apply(x.contiguous(), w, eps, rows, dw_partials, programs)
