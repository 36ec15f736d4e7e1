"""A Linear's weight gradient added into an fp32 buffer by one split-K Triton GEMM with atomic adds.

    C[n, k] += sum_m A[m, n] B[m, k]        A = dY (M, N), B = X (M, K), C = dW (N, K), fp32

Why: a Linear's weight gradient reduces over all M = batch x time rows, and its output is small
(N x K, a few hundred rows and columns in these models). cuBLAS fills the GPU by splitting that
reduction (split-K, Golub & Van Loan's blocked GEMM with the k loop cut into slices): each slice's
fp32 partial goes to a workspace and a second kernel (``splitKreduce``) sums them into the output.
Here program (t, s) reduces slice s of the rows for output tile t and adds its partial into C with
``tl.atomic_add``: one kernel, no workspace, no reduce kernel. C must hold what the sum adds to:
the engine's flat gradient is zeroed at the start of every step, so adding into it is writing it.
fp32 atomic adds land in whatever order the programs finish, so the rounding of C varies between
runs (as the fused residual-norm's atomic weight gradients do). Their memory order (``sem``,
:data:`kernels._common.ATOMIC_SEMS`): Triton's default, 'acq_rel', fences every add of a program's tile;
'relaxed' does not.

Products: bf16 / fp16 operands on the tensor cores; fp32 operands as TF32 (``input_precision='tf32'``,
what cuBLAS runs in a tf32 step) or exact FMA (``'ieee'``). Accumulation in fp32 always.
Layering (Liger-Kernel's): the kernel, a launcher that checks its tensors (:func:`wgrad_add_`), used
inside the engine's Linear backward (``ftlib.training.engine.grad_into``); the plain-PyTorch
reference is ``ftlib.model.reference.wgrad_ref``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    check_atomic_sem,
    check_tensor,
    dot_precision,
    interpret_mode,
    num_programs,
    same_device,
    upcast_dots,
)
from kernels.attention_kernels import _dot

PRECISIONS = ("ieee", "tf32")  # tl.dot's products for fp32 operands: exact FMA, or TF32 tensor cores
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Output tiles (BN x BK), rows per step of the reduction (BM) and slices per SM (SPLIT_PER_SM, the
# grid's second axis: enough programs for a few per SM however small the output). Tuned per (M, N, K)
# at the first call of a shape (the engine's warm-up, never inside a graph capture); C is restored
# after each timed try, so tuning adds nothing to it.
_GPU_CONFIGS = [
    triton.Config({"BN": bn, "BK": bk, "BM": 64, "SPLIT_PER_SM": s}, num_warps=w, num_stages=3)
    for bn, bk, w in ((64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8)) for s in (1, 2)
]
_CPU_CONFIGS = [triton.Config({"BN": 16, "BK": 16, "BM": 16, "SPLIT_PER_SM": 1}, num_warps=1, num_stages=1)]


@triton.jit
def _wgrad_splitk_tile_kernel(
    A, B, C,  # A (M, N), B (M, K) any strides; C (N, K) fp32 row-major
    M, N, K, sam, san, sbm, sbk,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, SPLIT_PER_SM: tl.constexpr, SEM: tl.constexpr,
):
    """Program (t, s): output tile t of (BN, BK), rows of slice s; C[tile] += A[slice]^T B[slice].

    The rows are cut into tl.num_programs(1) slices of whole BM-row steps, so no two slices share
    a row: every product is added exactly once. SPLIT_PER_SM only sizes the grid (the launcher's); SEM is
    the adds' memory order."""
    pid_t, pid_s = tl.program_id(0), tl.program_id(1)
    num_k = tl.cdiv(K, BK)
    rn = (pid_t // num_k) * BN + tl.arange(0, BN)
    rk = (pid_t % num_k) * BK + tl.arange(0, BK)
    chunk = tl.cdiv(tl.cdiv(M, tl.num_programs(1)), BM) * BM  # rows per slice, whole steps of BM
    acc = tl.zeros((BN, BK), tl.float32)
    for m in range(0, chunk, BM):
        rm = pid_s * chunk + m + tl.arange(0, BM)
        # a: the (BN, BM) tile of A^T, read through A's strides (no transposed copy)
        a = tl.load(A + rm[None, :] * sam + rn[:, None] * san, mask=(rm[None, :] < M) & (rn[:, None] < N), other=0.0)
        b = tl.load(B + rm[:, None] * sbm + rk[None, :] * sbk, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        acc += _dot(a, b, PREC, UPCAST)  # (the interpreter's bf16 tl.dot is wrong: UPCAST there)
    tl.atomic_add(C + rn[:, None] * K + rk[None, :], acc, mask=(rn[:, None] < N) & (rk[None, :] < K), sem=SEM)


_wgrad_splitk_kernel = triton.autotune(configs=_CPU_CONFIGS if interpret_mode() else _GPU_CONFIGS,
                                       key=["M", "N", "K"], restore_value=["C"])(_wgrad_splitk_tile_kernel)


def wgrad_add_(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, input_precision: str = "ieee",
               sem: str = "acq_rel") -> torch.Tensor:
    """c (N, K) fp32 += a^T @ b for a (M, N), b (M, K) of one dtype (fp32, bf16 or fp16), in place;
    returns c. ``input_precision``: the products of fp32 operands ('ieee' or 'tf32'; bf16 and fp16
    always multiply on the tensor cores); ``sem``: the atomic adds' memory order (module docstring). A
    ValueError/TypeError names a wrong argument."""
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision={input_precision!r}; expected one of {PRECISIONS}")
    check_atomic_sem(sem)
    check_tensor("c", c, dtypes=(torch.float32,), ndim=2)
    check_tensor("a", a, dtypes=_DTYPES, ndim=2, contiguous=False)
    check_tensor("b", b, dtypes=_DTYPES, ndim=2, contiguous=False)
    same_device(("c", c), ("a", a), ("b", b))
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share a dtype; got {a.dtype} and {b.dtype}")
    (M, N), K = a.shape, b.shape[1]
    if b.shape[0] != M or tuple(c.shape) != (N, K):
        raise ValueError(f"need a (M, N), b (M, K), c (N, K); got {tuple(a.shape)}, {tuple(b.shape)}, "
                         f"{tuple(c.shape)}")
    if M * N * K == 0:
        return c
    sms = num_programs(a.device, 1 << 30)

    def grid(meta):
        tiles = triton.cdiv(N, meta["BN"]) * triton.cdiv(K, meta["BK"])
        # enough slices for SPLIT_PER_SM programs per SM, never more than there are BM-row steps
        return tiles, max(1, min(triton.cdiv(M, meta["BM"]), triton.cdiv(meta["SPLIT_PER_SM"] * sms, tiles)))

    _wgrad_splitk_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                               PREC=dot_precision(a.dtype, input_precision), UPCAST=upcast_dots(a.dtype), SEM=sem)
    return c
