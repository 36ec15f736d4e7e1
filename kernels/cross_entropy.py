"""Fused softmax cross-entropy (mean reduction) whose forward pass also writes dlogits.

kernel (``_cross_entropy_kernel``) -> launcher (``cross_entropy_fwd``) ->
``CrossEntropyFunction`` -> ``TritonCrossEntropyLoss``. Reference:
:func:`ftlib.model.reference.cross_entropy_ref`. After Liger-Kernel's ``cross_entropy.py``
(linkedin/Liger-Kernel, src/liger_kernel/ops/cross_entropy.py): the row's softmax is
already in registers when the loss is computed, so the gradient
d loss / d z_ij = (softmax(z_i)_j - [j == t_i]) / n_valid is written in the same pass and
the backward only scales it by the incoming grad_output. Unlike Liger the gradient goes to
a separate buffer, not over the logits, because GPT.forward returns the logits to the caller.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import accum_dtype, check_tensor, compute_dtype, same_device
from kernels.pdl import _grid_dependency, pdl_args

MAX_BLOCK_V = 4096  # vocabularies above this loop over blocks (V=65 fits in one block of 128)


@triton.jit
def _cross_entropy_kernel(
    Z, T, DZ, LOSS, N_VALID,  # Z, DZ: (N, V); T: (N,) int; LOSS: (N,) fp32/fp64; N_VALID: (1,) int64
    stride_z, stride_dz, V, ignore_index,
    BLOCK_V: tl.constexpr, CD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One row per program (so any N, odd or not). With m = max_j z_j and d = sum_j e^(z_j - m):

        loss_i = m + log d - z_{t_i}                                (0 when t_i == ignore_index)
        dz_ij  = (e^(z_ij - m) / d - [j == t_i]) / n_valid          (0 rows when ignored)

    Pass 1 is the online softmax normalizer (Milakov & Gimelshein 2018, "Online normalizer
    calculation for softmax", alg. 3): running max and rescaled running sum over blocks of V.
    Pass 2 re-reads the row (from L1/L2 for V=65) and writes the gradient. n_valid is read
    from device memory, so the mean needs no host sync.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(T + row).to(tl.int64)
    z_row = Z + row * stride_z
    dz_row = DZ + row * stride_dz
    cols = tl.arange(0, BLOCK_V)
    if target == ignore_index:
        for start in range(0, V, BLOCK_V):
            tl.store(dz_row + start + cols, tl.zeros((BLOCK_V,), CD).to(DZ.dtype.element_ty), mask=start + cols < V)
        tl.store(LOSS + row, tl.zeros((), CD))
    else:
        n_valid = tl.load(N_VALID).to(CD)
        m = tl.full((), float("-inf"), CD)
        d = tl.zeros((), CD)
        for start in range(0, V, BLOCK_V):
            z = tl.load(z_row + start + cols, mask=start + cols < V, other=float("-inf")).to(CD)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
        z_t = tl.load(z_row + target).to(CD)
        tl.store(LOSS + row, m + tl.log(d) - z_t)
        for start in range(0, V, BLOCK_V):
            c = start + cols
            z = tl.load(z_row + c, mask=c < V, other=float("-inf")).to(CD)
            p = tl.exp(z - m) / d
            g = (p - tl.where(c == target, 1.0, 0.0).to(CD)) / n_valid
            tl.store(dz_row + c, g.to(DZ.dtype.element_ty), mask=c < V)


def check_targets_in_range(targets: torch.Tensor, V: int, ignore_index: int) -> None:
    """ValueError unless every target is a class index in [0, V) or ``ignore_index``.

    F.cross_entropy raises for such a target ("Target ... is out of bounds"); the kernel would
    read z_t outside the row (another row's logits, or past the tensor) and return a finite,
    wrong loss. Cost: one elementwise compare and reduction over N targets and one
    device-to-host sync (``bool(...)``) per call, tens of microseconds on a GPU, which also
    stops the host from queueing ahead of the device. It cannot run inside CUDA graph capture
    (a sync is not allowed there), so the launcher skips it while capturing: a captured step
    is checked by the eager warm-up steps before the capture, not on its replays.
    """
    bad = ((targets < 0) | (targets >= V)) & (targets != ignore_index)
    if bool(bad.any()):
        rows = bad.nonzero().flatten()[:3].tolist()
        raise ValueError(
            f"targets must be class indices in [0, {V}) or ignore_index={ignore_index}; "
            f"{int(bad.sum())} of {targets.numel()} are not, e.g. {targets[bad][:3].tolist()} at rows {rows}. "
            f"Check the targets against the model's vocab_size ({V} logits per row)."
        )


def cross_entropy_fwd(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, check_targets: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, dlogits) for logits (N, V) and integer targets (N,).

    The loss is an fp32 (fp64 for fp64 logits) 0-dim tensor; dlogits has the logits' dtype
    and is d loss / d logits for grad_output = 1. Targets outside [0, V) other than
    ignore_index raise a ValueError, as F.cross_entropy raises (:func:`check_targets_in_range`:
    a host sync, skipped inside CUDA graph capture and with ``check_targets=False``).
    """
    check_tensor("logits", logits, ndim=2, contiguous=False)
    check_tensor("targets", targets, dtypes=(torch.int64, torch.int32), ndim=1, contiguous=False)
    same_device(("logits", logits), ("targets", targets))
    if logits.stride(-1) != 1:
        raise ValueError(f"logits' last dim must be contiguous (stride 1), got strides {logits.stride()}")
    N, V = logits.shape
    if targets.shape[0] != N:
        raise ValueError(f"targets has {targets.shape[0]} entries for {N} rows of logits")
    cd = accum_dtype(logits.dtype)
    dlogits = torch.empty((N, V), dtype=logits.dtype, device=logits.device)
    loss_rows = torch.empty(N, dtype=cd, device=logits.device)
    if check_targets and N > 0 and not (logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_targets_in_range(targets, V, ignore_index)
    n_valid = (targets != ignore_index).sum().reshape(1)  # device int64; stays on the device
    if N > 0:
        BLOCK_V = min(triton.next_power_of_2(V), MAX_BLOCK_V)
        _cross_entropy_kernel[(N,)](
            logits, targets, dlogits, loss_rows, n_valid, logits.stride(0), dlogits.stride(0), V, ignore_index,
            BLOCK_V=BLOCK_V, CD=compute_dtype(logits.dtype), num_warps=4 if BLOCK_V >= 1024 else 1, **pdl_args(logits),
        )
    # Deterministic mean (no atomics): one small sum over N fp32 row losses.
    loss = loss_rows.sum() / n_valid.squeeze(0).to(cd)
    return loss, dlogits


class CrossEntropyFunction(torch.autograd.Function):
    """Saves the gradient computed in the forward; backward multiplies by grad_output."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                check_targets: bool = True) -> torch.Tensor:
        loss, dlogits = cross_entropy_fwd(logits, targets, ignore_index, check_targets)
        ctx.save_for_backward(dlogits)
        return loss

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (dlogits,) = ctx.saved_tensors
        # Liger skips this when grad_output == 1, but testing that needs a host sync; at
        # N x V = 8192 x 65 the multiply is one small elementwise kernel.
        if dlogits.dtype == grad_output.dtype:
            return dlogits * grad_output, None, None, None
        # fp16/bf16 logits: the product in grad_output's dtype, rounded once. Casting
        # grad_output down first would turn fp16 loss scaling's 2^16 into inf (fp16's largest
        # value is 65504) and every step would be skipped.
        return (dlogits.to(grad_output.dtype) * grad_output).to(dlogits.dtype), None, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  check_targets: bool = True) -> torch.Tensor:
    """Mean cross-entropy through the fused kernel (differentiable in logits). ``check_targets``:
    raise for targets outside [0, V) (a host sync per call; see :func:`check_targets_in_range`)."""
    return CrossEntropyFunction.apply(logits, targets, ignore_index, check_targets)


class TritonCrossEntropyLoss(nn.Module):
    """Drop-in for ``nn.CrossEntropyLoss()`` with mean reduction and no label smoothing."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets, self.ignore_index)
