"""Linear layers on a Triton GEMM whose fp32 products can run on tensor cores (3xTF32).

kernel (``_matmul_kernel``) -> launcher (``matmul``) -> ``LinearFunction`` -> ``TritonLinear``.
Reference: ``torch.nn.functional.linear`` (:func:`ftlib.model.reference.linear_ref`).

Why: in strict fp32 a FastTransformer step is bound by its matmuls, which cuBLAS runs on
the FMA units (SIMT SGEMM, ~39 TFLOP/s here against a 67 TFLOP/s datasheet peak; chapter
01's profile). Tensor cores take TF32 operands (10 explicit mantissa bits), which is why
``allow_tf32`` changes results. The 3xTF32 split (NVIDIA/cutlass discussion 385; Triton's
``input_precision='tf32x3'``) writes each fp32 operand as ``a = a_hi + a_lo`` with
``a_hi = tf32(a)`` and ``a_lo = tf32(a - a_hi)`` and computes

    a b ~= a_hi b_hi + a_hi b_lo + a_lo b_hi        (the a_lo b_lo term, ~2^-22 relative, dropped)

with three tensor-core products and fp32 accumulation: close to fp32 accuracy (the tests
check it against fp64 at the fp32 tolerance) at up to a third of the TF32 rate, still
several times the FMA rate. ``input_precision='ieee'`` (FMA, strict) and ``'tf32'`` are
available for comparison.

The three GEMMs of a linear layer y = x W^T + b, with x (M, K), W (N, K), dy (M, N):
    forward   y  = x @ W^T (+ b)        M x N output, reduction over K
    backward  dx = dy @ W               M x K output, reduction over N
              dW = dy^T @ x             N x K output, reduction over M = B*T (split-K)
              db = sum_rows dy
Transposes are strides, never copies.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels._common import check_device, compute_dtype, dot_precision, interpret_mode, same_device

PRECISIONS = ("ieee", "tf32", "tf32x3")

# Tile configurations the autotuner tries per (M, N, K, split) on the GPU (the first call
# of each shape, i.e. during the engine's warm-up, never inside a graph capture).
_GPU_CONFIGS = [
    triton.Config({"BM": 128, "BN": 128, "BK": 32}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 64, "BK": 32}, num_warps=4, num_stages=4),
    triton.Config({"BM": 64, "BN": 128, "BK": 32}, num_warps=4, num_stages=4),
    triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=4),
]
_CPU_CONFIGS = [triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1, num_stages=1)]


@triton.jit
def _matmul_tile_kernel(
    A, B, C, BIAS,  # A: (M, K), B: (K, N) any strides; C: (S, M, N) fp32 partials; BIAS: (N,)
    M, N, K, sam, sak, sbk, sbn, scs, scm, scn, k_per_split,
    HAS_BIAS: tl.constexpr, PREC: tl.constexpr, CD: tl.constexpr, GROUP_M: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """C[s] = A[:, K_s] @ B[K_s, :] (+ bias on slice 0), K_s = [s k_per_split, (s+1) k_per_split).

    One program per (BM x BN output tile, K slice s), fp32 accumulator, ``tl.dot`` with
    ``input_precision=PREC``. Tiles are walked in groups of GROUP_M tile rows so programs
    running together share B tiles in L2 (Triton's matmul tutorial, "L2 cache
    optimizations"). With more than one slice the caller sums C over s: split-K gives a
    weight gradient (N x K output, reduction over M = B*T) enough programs to fill the SMs.
    """
    pid = tl.program_id(0)
    s = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % size_m
    pn = (pid % per_group) // size_m
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k0 = s * k_per_split
    k1 = tl.minimum(k0 + k_per_split, K)
    acc = tl.zeros((BM, BN), CD)  # fp32 (fp64 for the fp64 gradcheck)
    for k in range(k0, k1, BK):
        kk = k + rk
        a = tl.load(A + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < k1), other=0.0)
        b = tl.load(B + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < k1) & (rn[None, :] < N), other=0.0)
        # out_dtype named: where Triton's default is fp32 whatever acc is, an fp64 acc fails to compile.
        acc = tl.dot(a, b, acc, input_precision=PREC, out_dtype=CD)
    if HAS_BIAS:
        if s == 0:
            acc += tl.load(BIAS + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(C + s * scs + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


# The launchers call the autotuned kernel; benchmarks/kernels/matmul_dev.py times the bare one per config.
_matmul_kernel = triton.autotune(configs=_CPU_CONFIGS if interpret_mode() else _GPU_CONFIGS,
                                 key=["M", "N", "K", "k_per_split"])(_matmul_tile_kernel)


def _split_k(M: int, N: int, K: int, device: torch.device) -> int:
    """K slices so that a small output still gets ~2 programs per SM (only for long K)."""
    if device.type != "cuda":
        return 2 if K >= 64 else 1  # the interpreter still exercises the split path
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = triton.cdiv(M, 128) * triton.cdiv(N, 128)
    if tiles >= sms or K < 1024:
        return 1
    return int(max(1, min(triton.cdiv(2 * sms, tiles), K // 512, 16)))


def matmul(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
    input_precision: str = "tf32x3", split_k: int | None = None,
) -> torch.Tensor:
    """a (M, K) @ b (K, N) (+ bias (N,)) -> (M, N) in a's dtype; a and b may be transposed views.

    ``split_k``: K slices (None: :func:`_split_k` picks); the partials are summed by torch.
    """
    for name, t in (("a", a), ("b", b)) + ((("bias", bias),) if bias is not None else ()):
        check_device(name, t)
        if t.dtype not in (torch.float32, torch.float64) or t.dtype != a.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; the Triton GEMM takes float32 (float64 for "
                            f"gradcheck), all operands alike (a is {a.dtype}); bf16 stays on cuBLAS")
    same_device(("a", a), ("b", b))
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs a (M, K) and b (K, N); got {tuple(a.shape)} and {tuple(b.shape)}")
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision {input_precision!r}; expected one of {PRECISIONS}")
    M, K = a.shape
    N = b.shape[1]
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias must be ({N},), got {tuple(bias.shape)}")
    split = _split_k(M, N, K, a.device) if split_k is None else int(split_k)
    if split < 1:
        raise ValueError(f"split_k must be >= 1, got {split}")
    k_per = triton.cdiv(triton.cdiv(max(K, 1), split), 32) * 32
    split = triton.cdiv(max(K, 1), k_per)
    out = torch.empty((split, M, N), device=a.device, dtype=a.dtype)
    if M * N == 0:
        return out.sum(0)

    def grid(meta):
        return (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]), split)

    _matmul_kernel[grid](
        a, b, out, bias if bias is not None else out,
        M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        out.stride(0), out.stride(1), out.stride(2), k_per,
        HAS_BIAS=bias is not None, PREC=dot_precision(a.dtype, input_precision),
        CD=compute_dtype(a.dtype), GROUP_M=8,
    )
    return out[0] if split == 1 else out.sum(0)


class LinearFunction(torch.autograd.Function):
    """y = x W^T + b with all three GEMMs on :func:`matmul`; saves x and W (as F.linear does)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                input_precision: str) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (M, K), a view for contiguous activations
        y = matmul(x2, weight.t(), bias, input_precision)  # (M, N)
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        ctx.prec = input_precision
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], weight.shape[0])  # (M, N) -> (..., N)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])  # (M, N)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = matmul(dy2, weight, None, ctx.prec).view(ctx.x_shape)  # (M, N) @ (N, K)
        if ctx.needs_input_grad[1]:
            dw = matmul(dy2.t(), x2, None, ctx.prec)  # (N, M) @ (M, K), split over M
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           input_precision: str = "tf32x3") -> torch.Tensor:
    """``F.linear`` through the Triton GEMM (fp32 only)."""
    return LinearFunction.apply(x, weight, bias, input_precision)


class TritonLinear(nn.Module):
    """Thin module: takes over an ``nn.Linear``'s Parameters (same objects) and runs them on
    :func:`linear`."""

    def __init__(self, lin: nn.Linear, input_precision: str = "tf32x3") -> None:
        super().__init__()
        if input_precision not in PRECISIONS:
            raise ValueError(f"input_precision {input_precision!r}; expected one of {PRECISIONS}")
        self.weight = lin.weight
        self.bias = lin.bias
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.input_precision = input_precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.input_precision)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, input_precision={self.input_precision!r}")
