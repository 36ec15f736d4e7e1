"""The output head and the mean cross-entropy in two kernels: the logits never reach memory.

    z = x W^T                (N, V) logits of the rows x (N, K) under the head W (V, K)
    loss = sum_i [lse_i - z_{i, t_i}] / n_valid,   lse_i = log sum_j e^(z_ij)
    g_ij = (e^(z_ij - lse_i) - [j == t_i]) * grad_out / n_valid     d loss / d z, ignored rows 0
    dx = g W    (N, K);    dW = g^T x    (V, K), added into an fp32 buffer

kernels (``_lce_fwd_kernel``, ``_lce_bwd_kernel``) -> launchers (``linear_cross_entropy_fwd``,
``linear_cross_entropy_bwd``) -> ``LinearCrossEntropyFunction`` -> ``LinearCrossEntropyLoss``. Reference:
:func:`ftlib.model.reference.linear_cross_entropy_ref` (F.linear then the cross-entropy).

Why: with a character vocabulary (V = 65) the head is a skinny GEMM whose row of outputs is not 16-byte
aligned, so cuBLAS runs slow unaligned kernels for it; the step then runs the head GEMM, the cross-entropy
kernel and two more GEMMs for dx and dW, each a kernel boundary and a trip of the (N, V) logits or their
gradient through memory. A block of rows' logits fits in registers (V padded to a power of two), so one
kernel computes them, the row's log-sum-exp and its loss, and another recomputes them in the backward and
forms both gradients from the same tile, as Liger-Kernel's fused linear cross-entropy avoids materializing
the logits (Hsu et al. 2024, "Liger Kernel", sec. 3.3; linkedin/Liger-Kernel ``fused_linear_cross_entropy``).
Unlike Liger, the backward recomputes the logits (one more pass over x and W, small at these sizes) instead
of computing the gradients in the forward, so that grad_out is applied where it is known: fp16 loss scaling
passes its scale there. dW is added with atomic adds (each program's (V, K) partial), so it can go straight
into a gradient buffer the caller zeroed; the order of those adds, and so dW's rounding, varies between runs.
Their memory order (``sem``, :data:`kernels._common.ATOMIC_SEMS`): Triton's default, 'acq_rel', makes the
next slice's loads wait for each slice's add; 'relaxed' does not.

The products multiply in the operands' dtype on the tensor cores (bf16/fp16) or, for fp32 operands, as TF32
or exact FMA (``input_precision``); the logits and everything after them are fp32. g is rounded to the
operands' dtype before the two backward products, as the unfused bf16 step rounds dlogits.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import check_atomic_sem, check_tensor, dot_precision, same_device, upcast_dots
from kernels.attention_kernels import _dot
from kernels.limits import device_limits
from kernels.pdl import _grid_dependency, pdl_args

PRECISIONS = ("ieee", "tf32")  # tl.dot's products for fp32 operands: exact FMA, or TF32 tensor cores
MAX_V = 256  # a row of logits must fit one register tile; larger vocabularies take the unfused head
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _logits(X, W, rm, rv, N, V, K, sxm, sxk, swv, swk,
            BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
            PREC: tl.constexpr, UPCAST: tl.constexpr):
    """z = x[rm] W[rv]^T, (BLOCK_M, BLOCK_V) in fp32; rows past N and columns past V are 0."""
    acc = tl.zeros((BLOCK_M, BLOCK_V), tl.float32)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        x = tl.load(X + rm[:, None] * sxm + rk[None, :] * sxk, mask=(rm[:, None] < N) & (rk[None, :] < K), other=0.0)
        w = tl.load(W + rv[:, None] * swv + rk[None, :] * swk, mask=(rv[:, None] < V) & (rk[None, :] < K), other=0.0)
        acc += _dot(x, tl.trans(w), PREC, UPCAST)
    return acc


@triton.jit
def _lce_fwd_kernel(
    X, W, T, LOSS, LSE,  # X (N, K), W (V, K) any strides; T (N,) int; LOSS, LSE (N,) fp32
    N, V, K, sxm, sxk, swv, swk, ignore_index,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """BLOCK_M rows per program: z = x W^T in registers, then per row

        lse_i = m_i + log sum_j e^(z_ij - m_i)   (m_i = max_j z_ij; columns past V count as -inf)
        loss_i = lse_i - z_{i, t_i}              (0 where t_i == ignore_index)

    The whole padded row is one tile, so one pass (no online normalizer) gives the sum."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rv = tl.arange(0, BLOCK_V)
    z = _logits(X, W, rm, rv, N, V, K, sxm, sxk, swv, swk, BLOCK_M, BLOCK_V, BLOCK_K, PREC, UPCAST)
    z = tl.where(rv[None, :] < V, z, float("-inf"))
    m = tl.max(z, axis=1)
    lse = m + tl.log(tl.sum(tl.exp(z - m[:, None]), axis=1))
    t = tl.load(T + rm, mask=rm < N, other=ignore_index).to(tl.int32)
    z_t = tl.sum(tl.where(rv[None, :] == t[:, None], z, 0.0), axis=1)
    loss = tl.where(t != ignore_index, lse - z_t, 0.0)
    tl.store(LOSS + rm, loss, mask=rm < N)
    tl.store(LSE + rm, lse, mask=rm < N)


@triton.jit
def _lce_bwd_kernel(
    X, W, T, LSE, GOUT, N_VALID, DX, DW,  # DX (N, K) like X; DW (V, K) fp32, added into; GOUT, N_VALID (1,)
    N, V, K, sxm, sxk, swv, swk, sdxm, sdwv, ignore_index,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, SEM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """BLOCK_M rows per program: z again, g = (e^(z - lse) - onehot(t)) * grad_out / n_valid, rounded to
    x's dtype, then per slice of BLOCK_K columns of K (SEM: the adds' memory order):

        dx[rm, k] = g W[:, k]           stored
        dW[:, k] += g^T x[rm, k]        atomic adds of this program's partial

    Rows past N and ignored rows have g = 0, so they add nothing to dW."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rv = tl.arange(0, BLOCK_V)
    z = _logits(X, W, rm, rv, N, V, K, sxm, sxk, swv, swk, BLOCK_M, BLOCK_V, BLOCK_K, PREC, UPCAST)
    lse = tl.load(LSE + rm, mask=rm < N, other=0.0)
    t = tl.load(T + rm, mask=rm < N, other=ignore_index).to(tl.int32)
    scale = tl.load(GOUT).to(tl.float32) / tl.load(N_VALID).to(tl.float32)
    p = tl.exp(z - lse[:, None])
    g = (p - tl.where(rv[None, :] == t[:, None], 1.0, 0.0)) * scale
    keep = (rm[:, None] < N) & (t[:, None] != ignore_index) & (rv[None, :] < V)
    g = tl.where(keep, g, 0.0).to(X.dtype.element_ty)  # (BLOCK_M, BLOCK_V) in the operands' dtype
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        kmask = rk[None, :] < K
        w = tl.load(W + rv[:, None] * swv + rk[None, :] * swk, mask=(rv[:, None] < V) & kmask, other=0.0)
        dx = _dot(g, w, PREC, UPCAST)  # (BLOCK_M, BLOCK_V) @ (BLOCK_V, BLOCK_K)
        tl.store(DX + rm[:, None] * sdxm + rk[None, :], dx.to(DX.dtype.element_ty), mask=(rm[:, None] < N) & kmask)
        x = tl.load(X + rm[:, None] * sxm + rk[None, :] * sxk, mask=(rm[:, None] < N) & kmask, other=0.0)
        dw = _dot(tl.trans(g), x, PREC, UPCAST)  # (BLOCK_V, BLOCK_M) @ (BLOCK_M, BLOCK_K)
        tl.atomic_add(DW + rv[:, None] * sdwv + rk[None, :], dw, mask=(rv[:, None] < V) & kmask, sem=SEM)


def _stages(device: torch.device) -> int:
    """Software-pipelining stages of the loops over K: 2, or 1 below sm_80, whose 64 KB of shared memory per
    block does not hold the backward's staged tiles of x and W beside g (``kernels.limits``)."""
    lim = device_limits(device)
    return 1 if lim is not None and lim.sm < 80 else 2


def _blocks(V: int, device: torch.device, block_m: int | None = None) -> dict[str, int]:
    """Tile sizes: the whole padded vocabulary per tile, ``block_m`` rows and a step of K. On a GPU from sm_80,
    64 rows (128 programs at N = 8192, about one per SM of an H100 or H200; fewer, larger programs make fewer
    atomic adds into dW) and 64 columns; below sm_80, 32 of each, so that the backward's tiles fit 64 KB of
    shared memory per block; 16 of each in the interpreter (fast CPU tests)."""
    if block_m is not None and (block_m < 16 or block_m & (block_m - 1)):
        raise ValueError(f"block_m={block_m} must be a power of two, at least 16 (a tl.dot dimension)")
    side = 16 if device.type != "cuda" else 32 if _stages(device) == 1 else 64
    return {"BLOCK_M": block_m or side, "BLOCK_V": max(16, triton.next_power_of_2(V)), "BLOCK_K": side}


def _check(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, input_precision: str) -> tuple[int, int, int]:
    """(N, K, V) after checking the operands: ValueError/TypeError naming what is wrong."""
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision={input_precision!r}; expected one of {PRECISIONS}")
    check_tensor("x", x, dtypes=_DTYPES, ndim=2, contiguous=False)
    check_tensor("weight", w, dtypes=_DTYPES, ndim=2, contiguous=False)
    check_tensor("targets", targets, dtypes=(torch.int64, torch.int32), ndim=1)
    same_device(("x", x), ("weight", w), ("targets", targets))
    if x.dtype != w.dtype:
        raise TypeError(f"x and weight must share a dtype; got {x.dtype} and {w.dtype}")
    (N, K), (V, Kw) = x.shape, w.shape
    if Kw != K:
        raise ValueError(f"weight (V, K) must have x's K={K} columns; got {tuple(w.shape)}")
    if targets.shape[0] != N:
        raise ValueError(f"targets has {targets.shape[0]} entries for {N} rows of x")
    if not 1 <= V <= MAX_V:
        raise ValueError(f"vocabulary V={V} must be 1..{MAX_V}: a row of logits is one register tile")
    return N, K, V


def _consts(x: torch.Tensor, input_precision: str) -> dict[str, object]:
    return {"PREC": dot_precision(x.dtype, input_precision), "UPCAST": upcast_dots(x.dtype)}


def linear_cross_entropy_fwd(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                             input_precision: str = "ieee", block_m: int | None = None,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss (0-dim fp32), lse (N,) fp32, n_valid (1,) int64 on the device) for rows x (N, K), the head
    w (V, K) of x's dtype and targets (N,). Targets must be in [0, V) or ``ignore_index`` (not checked: the
    check is a host sync; ``kernels.cross_entropy.check_targets_in_range`` makes it). ``block_m``: rows per
    program (:func:`_blocks`)."""
    N, K, V = _check(x, w, targets, input_precision)
    loss_rows = torch.empty(N, dtype=torch.float32, device=x.device)
    lse = torch.empty(N, dtype=torch.float32, device=x.device)
    n_valid = (targets != ignore_index).sum().reshape(1)  # stays on the device: the mean needs no sync
    if N > 0:
        b = _blocks(V, x.device, block_m)
        _lce_fwd_kernel[(triton.cdiv(N, b["BLOCK_M"]),)](
            x, w, targets, loss_rows, lse, N, V, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
            ignore_index, **b, **_consts(x, input_precision), num_warps=4, num_stages=_stages(x.device), **pdl_args(x))
    # Deterministic mean (no atomics): one small sum over N fp32 row losses.
    return loss_rows.sum() / n_valid.squeeze(0).to(torch.float32), lse, n_valid


def linear_cross_entropy_bwd(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                             n_valid: torch.Tensor, grad_out: torch.Tensor, dw_out: torch.Tensor,
                             ignore_index: int = -100, input_precision: str = "ieee",
                             block_m: int | None = None, sem: str = "acq_rel") -> torch.Tensor:
    """dx (N, K) in x's dtype; adds dW = g^T x into ``dw_out`` (V, K) fp32 with a unit last stride (a zeroed
    buffer, or the head's view of a gradient buffer zeroed before the backward). ``grad_out``: the loss's
    incoming gradient, a 1-element tensor read on the device. ``block_m``: rows per program, the forward's.
    ``sem``: the atomic adds' memory order (module docstring)."""
    N, K, V = _check(x, w, targets, input_precision)
    check_atomic_sem(sem)
    same_device(("x", x), ("lse", lse), ("n_valid", n_valid), ("grad_out", grad_out), ("dw_out", dw_out))
    if tuple(lse.shape) != (N,) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be the forward's ({N},) fp32 row log-sum-exps; got {tuple(lse.shape)} {lse.dtype}")
    if tuple(dw_out.shape) != (V, K) or dw_out.dtype != torch.float32 or dw_out.stride(-1) != 1:
        raise ValueError(f"dw_out must be ({V}, {K}) fp32 with a unit last stride; got {tuple(dw_out.shape)} "
                         f"{dw_out.dtype} strides {dw_out.stride()}")
    if grad_out.numel() != 1:
        raise ValueError(f"grad_out must hold one value (the loss's gradient); got shape {tuple(grad_out.shape)}")
    dx = torch.empty((N, K), dtype=x.dtype, device=x.device)
    if N > 0:
        b = _blocks(V, x.device, block_m)
        gout = grad_out.reshape(1).to(torch.float32)
        _lce_bwd_kernel[(triton.cdiv(N, b["BLOCK_M"]),)](
            x, w, targets, lse, gout, n_valid, dx, dw_out, N, V, K, x.stride(0), x.stride(1), w.stride(0),
            w.stride(1), dx.stride(0), dw_out.stride(0), ignore_index, **b, **_consts(x, input_precision),
            SEM=sem, num_warps=4, num_stages=_stages(x.device), **pdl_args(x))
    return dx


class LinearCrossEntropyFunction(torch.autograd.Function):
    """loss = cross_entropy(x weight^T, targets), mean over the rows not ignored.

    ``w_compute``: what the products read, ``weight`` itself or a copy in x's dtype (the engine's bf16
    shadow). ``dw_out``: the weight's fp32 gradient buffer, zeroed before the backward, into which dW is
    added; None returns dW to autograd instead. The backward needs ``weight`` only for autograd's bookkeeping.
    ``sem``: the backward's atomic adds' memory order (module docstring).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                w_compute: torch.Tensor | None = None, dw_out: torch.Tensor | None = None,
                ignore_index: int = -100, input_precision: str = "ieee", sem: str = "acq_rel") -> torch.Tensor:
        wc = weight if w_compute is None else w_compute
        loss, lse, n_valid = linear_cross_entropy_fwd(x, wc, targets, ignore_index, input_precision)
        ctx.save_for_backward(x, wc, targets, lse, n_valid)
        ctx.dw_out, ctx.ignore_index, ctx.input_precision = dw_out, ignore_index, input_precision
        ctx.weight_dtype, ctx.sem = weight.dtype, sem
        return loss

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, wc, targets, lse, n_valid = ctx.saved_tensors
        into = ctx.dw_out if ctx.dw_out is not None else torch.zeros(wc.shape, dtype=torch.float32,
                                                                      device=wc.device)
        dx = linear_cross_entropy_bwd(x, wc, targets, lse, n_valid, grad_out, into, ctx.ignore_index,
                                      ctx.input_precision, sem=ctx.sem)
        dw = None if ctx.dw_out is not None or not ctx.needs_input_grad[1] else into.to(ctx.weight_dtype)
        return dx, dw, None, None, None, None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         w_compute: torch.Tensor | None = None, dw_out: torch.Tensor | None = None,
                         ignore_index: int = -100, input_precision: str = "ieee", sem: str = "acq_rel") -> torch.Tensor:
    """Mean cross-entropy of the logits x weight^T (never stored), differentiable in x and weight
    (:class:`LinearCrossEntropyFunction` says what ``w_compute``, ``dw_out`` and ``sem`` do)."""
    check_atomic_sem(sem)
    return LinearCrossEntropyFunction.apply(x, weight, targets, w_compute, dw_out, ignore_index, input_precision,
                                            sem)


class LinearCrossEntropyLoss(nn.Module):
    """``F.cross_entropy(F.linear(x, weight), targets)`` with mean reduction, through the fused kernels."""

    def __init__(self, ignore_index: int = -100, input_precision: str = "ieee") -> None:
        super().__init__()
        self.ignore_index, self.input_precision = ignore_index, input_precision

    def forward(self, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(x, weight, targets, ignore_index=self.ignore_index,
                                    input_precision=self.input_precision)
