"""RMSNorm forward and backward in Triton (Zhang & Sennrich 2019), Liger-Kernel layering.

kernel (``_rms_norm_fwd_kernel``, ``_rms_norm_bwd_kernel``) -> launcher (``rms_norm_fwd``,
``rms_norm_bwd``) -> ``RMSNormFunction`` -> ``TritonRMSNorm``. Reference:
:func:`ftlib.reference.rms_norm_ref`. Structure after Liger-Kernel's ``rms_norm.py``
(linkedin/Liger-Kernel, src/liger_kernel/ops/rms_norm.py): one row per program forward,
rstd saved, backward in a persistent grid with per-program partial dweight sums.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import check_tensor, compute_dtype, num_programs, same_device

MAX_FUSED_BYTES = 65536  # one row must fit in one block (as in Liger); C=256 is far below this


@triton.jit
def _rms_norm_fwd_kernel(
    X, W, Y, RSTD,  # X, Y: (M, N) row-major; W: (N,); RSTD: (M,) fp32/fp64
    stride_x, stride_y, N, eps,
    BLOCK_N: tl.constexpr, CD: tl.constexpr,
):
    """One row per program:  rstd = 1 / sqrt(mean_j x_j^2 + eps),  y_j = x_j * rstd * w_j.

    Accumulation is in CD (fp32, or fp64 for fp64 inputs) whatever the storage dtype; the
    product x * rstd * w is formed in CD and rounded once to Y's dtype. rstd is stored for
    the backward pass so it needs no second reduction over x.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=mask, other=0.0).to(CD)
    mean_sq = tl.sum(x * x, axis=0) / N
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DW_PARTIAL,  # DY, X, DX: (M, N); W: (N,); RSTD: (M,); DW_PARTIAL: (P, N)
    stride_dy, stride_x, stride_dx, M, N, rows_per_program,
    BLOCK_N: tl.constexpr, CD: tl.constexpr,
):
    """Rows [pid * rows_per_program, ...) of the backward pass, with xhat = x * rstd:

        dx_j = rstd * (dy_j w_j - xhat_j * mean_k(dy_k w_k xhat_k))
        dw_j = sum_rows dy_j xhat_j      (this program's partial sum, row pid of DW_PARTIAL)

    Derivation: y = xhat * w, d rstd / d x_k = -rstd^3 x_k / N. The dweight partial sums
    stay in registers across the program's rows (Liger's persistent-grid trick), so the
    final reduction reads only P x N values instead of M x N.
    """
    pid = tl.program_id(0).to(tl.int64)  # int64 row offsets: M * N may exceed 2^31
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(CD)
    dw_acc = tl.zeros((BLOCK_N,), dtype=CD)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for r in range(row_start, row_end):
        x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(CD)
        dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(CD)
        rstd = tl.load(RSTD + r)
        xhat = x * rstd
        dyw = dy * w
        c = tl.sum(dyw * xhat, axis=0) / N
        dx = rstd * (dyw - xhat * c)
        tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
    tl.store(DW_PARTIAL + pid * N + cols, dw_acc, mask=mask)


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


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = rms_norm(x) * weight over the last dim; returns (y, rstd) with rstd (M,) fp32 (fp64 for fp64 x).

    x: (..., N) with unit last-dim stride; weight: (N,). y has x's dtype and shape.
    """
    _check_inputs(x, weight)
    x2 = x.reshape(-1, x.shape[-1])  # (M, N); a view for contiguous x
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    BLOCK_N = _block_n(x2)
    num_warps = min(max(BLOCK_N // 256, 1), 8)
    if M > 0:
        _rms_norm_fwd_kernel[(M,)](
            x2, weight, y, rstd, x2.stride(0), y.stride(0), N, eps,
            BLOCK_N=BLOCK_N, CD=compute_dtype(x.dtype), num_warps=num_warps,
        )
    return y.view(x.shape), rstd


def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) for y = rms_norm_fwd(x, weight)[0]; dy like x, dweight like weight."""
    _check_inputs(x, weight)
    check_tensor("dy", dy, contiguous=False)
    if dy.shape != x.shape:
        raise ValueError(f"dy shape {tuple(dy.shape)} != x shape {tuple(x.shape)}")
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    dy2 = dy.reshape(-1, N)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    dy2 = dy2 if dy2.stride(-1) == 1 else dy2.contiguous()
    M = x2.shape[0]
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    P = num_programs(x.device, M)
    dw_partial = torch.empty((P, N), dtype=cd, device=x.device)
    BLOCK_N = _block_n(x2)
    num_warps = min(max(BLOCK_N // 256, 1), 8)
    if M > 0:
        _rms_norm_bwd_kernel[(P,)](
            dy2, x2, weight, rstd, dx, dw_partial, dy2.stride(0), x2.stride(0), dx.stride(0),
            M, N, triton.cdiv(M, P), BLOCK_N=BLOCK_N, CD=compute_dtype(x.dtype), num_warps=num_warps,
        )
        dw = dw_partial.sum(0).to(weight.dtype)
    else:
        dw = torch.zeros_like(weight)
    return dx.view(x.shape), dw


class RMSNormFunction(torch.autograd.Function):
    """Autograd glue: saves x, weight and rstd (M floats) instead of the normalized x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, rstd = rms_norm_fwd(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_bwd(dy, x, weight, rstd)
        return dx, dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Functional RMSNorm through the Triton kernels (differentiable in x and weight)."""
    return RMSNormFunction.apply(x, weight, eps)


class TritonRMSNorm(nn.Module):
    """Drop-in for :class:`ftlib.norm.RMSNorm` (same parameter name and init)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
