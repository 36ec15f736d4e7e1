"""LayerNorm forward and backward in Triton (Ba et al. 2016), Liger-Kernel layering.

kernel (``_layer_norm_fwd_kernel``, ``_layer_norm_bwd_kernel``) -> launcher
(``layer_norm_fwd``, ``layer_norm_bwd``) -> ``LayerNormFunction`` -> ``TritonLayerNorm``.
Reference: :func:`ftlib.model.reference.layer_norm_ref`. Same structure as :mod:`kernels.rmsnorm`
(and Liger-Kernel's ``layer_norm.py``): one row per program forward with mean and rstd
saved; persistent backward grid with per-program partial dweight/dbias sums. The bias is
optional (GPT-2 has one; ``ModelConfig(bias=False)`` does not).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import accum_dtype, check_tensor, compute_dtype, num_programs, same_device
from kernels.pdl import _grid_dependency, pdl_args
from kernels.rmsnorm import MAX_FUSED_BYTES


@triton.jit
def _layer_norm_fwd_kernel(
    X, W, B, Y, MEAN, RSTD,  # X, Y: (M, N); W, B: (N,); MEAN, RSTD: (M,)
    stride_x, stride_y, N, eps,
    BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, CD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One row per program:  mu = mean_j x_j,  var = mean_j (x_j - mu)^2,
    rstd = 1 / sqrt(var + eps),  y_j = (x_j - mu) rstd w_j + b_j.

    The row is in registers, so the "two passes" (mean, then variance of the centred
    values, the numerically safe order) cost no second read of x. Accumulation in CD.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(CD)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(CD)
    y = xc * rstd * w
    if HAS_BIAS:
        y += tl.load(B + cols, mask=mask, other=0.0).to(CD)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_bwd_kernel(
    DY, X, W, MEAN, RSTD, DX, DW_PARTIAL, DB_PARTIAL,  # DW_PARTIAL, DB_PARTIAL: (P, N)
    stride_dy, stride_x, stride_dx, M, N, rows_per_program,
    BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, CD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Backward for a block of rows, with xhat = (x - mu) rstd and g = dy w:

        dx_j = rstd (g_j - mean_k(g_k) - xhat_j mean_k(g_k xhat_k))
        dw_j = sum_rows dy_j xhat_j,   db_j = sum_rows dy_j     (per-program partial sums)
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(CD)
    dw_acc = tl.zeros((BLOCK_N,), dtype=CD)
    db_acc = tl.zeros((BLOCK_N,), dtype=CD)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for r in range(row_start, row_end):
        x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(CD)
        dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(CD)
        mean = tl.load(MEAN + r)
        rstd = tl.load(RSTD + r)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * w
        c1 = tl.sum(g * xhat, axis=0) / N
        c2 = tl.sum(g, axis=0) / N
        dx = rstd * (g - c2 - xhat * c1)
        tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        if HAS_BIAS:
            db_acc += dy
    tl.store(DW_PARTIAL + pid * N + cols, dw_acc, mask=mask)
    if HAS_BIAS:
        tl.store(DB_PARTIAL + pid * N + cols, db_acc, mask=mask)


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_tensor("x", x, contiguous=False)
    check_tensor("weight", weight, ndim=1)
    same_device(("x", x), ("weight", weight))
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        same_device(("x", x), ("bias", bias))
        if bias.shape != weight.shape:
            raise ValueError(f"bias shape {tuple(bias.shape)} != weight shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"x's last dim must equal weight's length: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if x.stride(-1) != 1:
        raise ValueError(f"x's last dim must be contiguous (stride 1), got strides {x.stride()}")
    block = triton.next_power_of_2(x.shape[-1])
    if block * x.element_size() > MAX_FUSED_BYTES:
        raise ValueError(f"rows of {x.shape[-1]} {x.dtype} elements do not fit one block ({MAX_FUSED_BYTES} bytes)")


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])  # (..., N) -> (M, N)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def layer_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd) for LayerNorm over the last dim; x (..., N), weight/bias (N,)."""
    _check_inputs(x, weight, bias)
    x2 = _rows(x)  # (M, N)
    M, N = x2.shape
    cd = accum_dtype(x.dtype)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    mean = torch.empty(M, dtype=cd, device=x.device)
    rstd = torch.empty(M, dtype=cd, device=x.device)
    BLOCK_N = triton.next_power_of_2(N)
    if M > 0:
        _layer_norm_fwd_kernel[(M,)](
            x2, weight, bias if bias is not None else weight, y, mean, rstd, x2.stride(0), y.stride(0), N, eps,
            BLOCK_N=BLOCK_N, HAS_BIAS=bias is not None, CD=compute_dtype(x.dtype),
            num_warps=min(max(BLOCK_N // 256, 1), 8), **pdl_args(x2),
        )
    return y.view(x.shape), mean, rstd  # (M, N) -> x's (..., N)


def layer_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dx, dweight, dbias or None) for y = layer_norm_fwd(x, weight, bias)[0]."""
    _check_inputs(x, weight, None)
    check_tensor("dy", dy, contiguous=False)
    if dy.shape != x.shape:
        raise ValueError(f"dy shape {tuple(dy.shape)} != x shape {tuple(x.shape)}")
    x2, dy2 = _rows(x), _rows(dy)
    M, N = x2.shape
    cd = accum_dtype(x.dtype)
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    P = num_programs(x.device, M)
    dw_partial = torch.zeros((P, N), dtype=cd, device=x.device)
    db_partial = torch.zeros((P, N), dtype=cd, device=x.device) if has_bias else dw_partial
    BLOCK_N = triton.next_power_of_2(N)
    if M > 0:
        _layer_norm_bwd_kernel[(P,)](
            dy2, x2, weight, mean, rstd, dx, dw_partial, db_partial, dy2.stride(0), x2.stride(0), dx.stride(0),
            M, N, triton.cdiv(M, P), BLOCK_N=BLOCK_N, HAS_BIAS=has_bias, CD=compute_dtype(x.dtype),
            num_warps=min(max(BLOCK_N // 256, 1), 8), **pdl_args(x2),
        )
    dw = dw_partial.sum(0).to(weight.dtype)
    db = db_partial.sum(0).to(weight.dtype) if has_bias else None
    return dx.view(x.shape), dw, db  # (M, N) -> x's (..., N)


class LayerNormFunction(torch.autograd.Function):
    """Autograd glue: saves x, weight, mean and rstd (2 M floats)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        y, mean, rstd = layer_norm_fwd(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_bwd(dy, x, weight, ctx.has_bias, mean, rstd)
        return dx, dw, db, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Functional LayerNorm through the Triton kernels (differentiable in x, weight, bias)."""
    return LayerNormFunction.apply(x, weight, bias, eps)


class TritonLayerNorm(nn.Module):
    """Drop-in for :class:`ftlib.model.norm.LayerNorm` (optional bias, same parameter names)."""

    def __init__(self, dim: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)
