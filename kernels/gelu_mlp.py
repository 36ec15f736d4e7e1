"""The MLP's GELU inside its matrix products: a GEMM with a GELU epilogue forward, one with a GELU' epilogue backward.

kernel (``_gemm_gelu_tile_kernel``) -> launchers (``gemm_gelu``, ``gemm_dgelu``) -> ``GeluMLPFunction`` ->
``gelu_mlp``. Reference: :func:`ftlib.model.reference.gelu_mlp_ref` (the model's ``MLP`` without dropout).

The MLP of a block (Vaswani et al. 2017, sec. 3.3) with x (M, C), W1 (F, C), W2 (C, F), z the
pre-activation and a the activation (M, F):

    forward   z  = x W1^T + b1                 GEMM, epilogue: store z and a = gelu(z)
              a  = gelu(z)
              y  = a W2^T + b2                 cuBLAS
    backward  dW2 = dy^T a,  db2 = sum_rows dy  cuBLAS, column sum
              dz = (dy W2) * gelu'(z)           GEMM, epilogue: load z, multiply by gelu'(z)
              dW1 = dz^T x,  db1 = sum_rows dz  cuBLAS, column sum
              dx = dz W1                        cuBLAS

Unfused, GELU is an elementwise kernel each way: forward it reads z and writes a, backward it reads
z and da and writes dz, where da is a GEMM output written only to be read back. Here both epilogues
work on the fp32 accumulator still in registers: the two elementwise kernels and the da round trip go.
This is the GEMM-epilogue fusion of CUTLASS's ``LinearCombinationGELU`` and cuBLASLt's
``CUBLASLT_EPILOGUE_GELU_AUX`` / ``CUBLASLT_EPILOGUE_DGELU``, written as a Triton tile GEMM (Triton's
matmul tutorial, with its grouped tile order).

GELU (Hendrycks & Gimpel 2016, sec. 2), exact and tanh-approximated, with their derivatives:

    erf    gelu(z)  = z Phi(z) = 0.5 z (1 + erf(z / sqrt 2))
           gelu'(z) = Phi(z) + z phi(z),  phi(z) = exp(-z^2 / 2) / sqrt(2 pi)
    tanh   gelu(z)  = 0.5 z (1 + t),  t = tanh(u),  u = sqrt(2/pi) (z + 0.044715 z^3)
           gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 z^2)

computed in fp32 (fp64 for fp64 operands, for gradcheck) whatever the storage dtype; tanh(u) as
2 / (1 + exp(-2u)) - 1, which saturates to +-1 without overflow trouble. z and a are stored in the
operands' dtype (bf16 under bf16 autocast, what ``F.linear`` and ``F.gelu`` would store). bf16 and
fp16 operands go to the tensor cores' MMA; fp32 operands take exact products
(``input_precision='ieee'``) or TF32 ones (``'tf32'``, what a TF32 step's cuBLAS GEMMs compute).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kernels._common import check_device, compute_dtype, dot_precision, interpret_mode, same_device, upcast_dots
from kernels.attention_kernels import _dot
from kernels.mm_into import weight_grad_into_

APPROXIMATIONS = ("none", "tanh")  # F.gelu's names: the exact erf form, the tanh approximation
PRECISIONS = ("ieee", "tf32")  # tl.dot's products for fp32 operands: exact FMA, or TF32 tensor cores
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# tl.constexpr: a @triton.jit function may read a module global only when it is a constexpr (the
# interpreter reads any global, so only a compile for a GPU catches a plain float here).
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)

# Tile configurations the autotuner tries per (M, N, K) on the GPU: at the first call of each shape,
# i.e. in the engine's warm-up, never inside a graph capture.
_GPU_CONFIGS = [
    triton.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=3),
    triton.Config({"BM": 128, "BN": 64, "BK": 64}, num_warps=4, num_stages=3),
    triton.Config({"BM": 64, "BN": 128, "BK": 64}, num_warps=4, num_stages=3),
    triton.Config({"BM": 128, "BN": 256, "BK": 64}, num_warps=8, num_stages=3),
]
_CPU_CONFIGS = [triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1, num_stages=1)]


@triton.jit
def _gelu_parts(z, TANH: tl.constexpr):
    """(gelu(z), gelu'(z)) in fp32, by the formulas of the module docstring."""
    if TANH:
        u = _SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)
        t = 2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0
        return 0.5 * z * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (
            1.0 + 3.0 * 0.044715 * z * z)
    cdf = 0.5 * (1.0 + tl.math.erf(z * _INV_SQRT_2))
    return z * cdf, cdf + z * tl.exp(-0.5 * z * z) * _INV_SQRT_2PI


@triton.jit
def _gemm_gelu_tile_kernel(
    A, B, BIAS, Z, OUT,  # A (M, K), B (K, N) any strides; BIAS (N,); Z, OUT (M, N) row-major
    M, N, K, sam, sak, sbk, sbn,
    BACKWARD: tl.constexpr, TANH: tl.constexpr, HAS_BIAS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    CD: tl.constexpr, GROUP_M: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """acc = A @ B (+ bias) on one (BM, BN) tile, fp32 accumulator, then the epilogue:
    forward (BACKWARD False) stores Z = acc and OUT = gelu(acc); backward loads Z and stores
    OUT = acc * gelu'(Z). Tiles are walked in groups of GROUP_M tile rows so that programs running
    together share B tiles in L2 (Triton's matmul tutorial)."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % size_m
    pn = (pid % per_group) // size_m
    rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), CD)  # fp32 (fp64 for fp64 operands, gradcheck)
    for k in range(0, K, BK):
        kk = k + rk
        a = tl.load(A + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(B + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += _dot(a, b, PREC, UPCAST)  # (the interpreter's bf16 tl.dot is wrong: UPCAST there)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N, other=0.0)[None, :].to(acc.dtype)
    offs, mask = rm[:, None] * N + rn[None, :], (rm[:, None] < M) & (rn[None, :] < N)
    if BACKWARD:
        z = tl.load(Z + offs, mask=mask, other=0.0).to(acc.dtype)
        _, d = _gelu_parts(z, TANH)
        tl.store(OUT + offs, (acc * d).to(OUT.dtype.element_ty), mask=mask)
    else:
        z = acc.to(Z.dtype.element_ty)
        tl.store(Z + offs, z, mask=mask)
        # gelu of z as stored (rounded to its dtype), so that the backward's gelu'(z) is of the same z.
        g, _ = _gelu_parts(z.to(acc.dtype), TANH)
        tl.store(OUT + offs, g.to(OUT.dtype.element_ty), mask=mask)


_gemm_gelu_kernel = triton.autotune(configs=_CPU_CONFIGS if interpret_mode() else _GPU_CONFIGS,
                                    key=["M", "N", "K", "BACKWARD"])(_gemm_gelu_tile_kernel)


def _check(a: torch.Tensor, b: torch.Tensor, approximate: str, input_precision: str,
           **more: torch.Tensor | None) -> tuple[int, int, int]:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate={approximate!r}; expected one of {APPROXIMATIONS}")
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision={input_precision!r}; expected one of {PRECISIONS}")
    named = [("a", a), ("b", b)] + [(n, t) for n, t in more.items() if t is not None]
    for name, t in named:
        check_device(name, t)
        if t.dtype not in _DTYPES or t.dtype != a.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; expected a's dtype {a.dtype}, one of {_DTYPES}")
    same_device(*named)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"the GEMM needs a (M, K) and b (K, N); got {tuple(a.shape)} and {tuple(b.shape)}")
    M, K = a.shape
    return M, b.shape[1], K


def _launch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor, out: torch.Tensor,
            backward: bool, approximate: str, input_precision: str) -> None:
    M, K = a.shape
    N = b.shape[1]
    if M * N == 0:
        return

    def grid(meta):
        return (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)

    _gemm_gelu_kernel[grid](a, b, bias if bias is not None else out, z, out, M, N, K, a.stride(0), a.stride(1),
                            b.stride(0), b.stride(1), BACKWARD=backward, TANH=approximate == "tanh",
                            HAS_BIAS=bias is not None, CD=compute_dtype(a.dtype), GROUP_M=8,
                            PREC=dot_precision(a.dtype, input_precision), UPCAST=upcast_dots(a.dtype))


def gemm_gelu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "tanh",
              input_precision: str = "ieee") -> tuple[torch.Tensor, torch.Tensor]:
    """(z, gelu(z)) for z = a (M, K) @ b (K, N) + bias (N,), both (M, N) in a's dtype; a, b may be views.
    ``input_precision``: the products of fp32 operands (:data:`PRECISIONS`)."""
    M, N, _ = _check(a, b, approximate, input_precision, bias=bias)
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias must be ({N},), got {tuple(bias.shape)}")
    z = torch.empty((M, N), device=a.device, dtype=a.dtype)
    out = torch.empty_like(z)
    _launch(a, b, bias, z, out, False, approximate, input_precision)
    return z, out


def gemm_dgelu(a: torch.Tensor, b: torch.Tensor, z: torch.Tensor, approximate: str = "tanh",
               input_precision: str = "ieee") -> torch.Tensor:
    """(a (M, K) @ b (K, N)) * gelu'(z), z (M, N) contiguous: the gradient at z, in a's dtype."""
    M, N, _ = _check(a, b, approximate, input_precision, z=z)
    if z.shape != (M, N) or not z.is_contiguous():
        raise ValueError(f"z must be a contiguous ({M}, {N}); got {tuple(z.shape)}")
    out = torch.empty((M, N), device=a.device, dtype=a.dtype)
    _launch(a, b, None, z, out, True, approximate, input_precision)
    return out


def _weight_grad(dy2: torch.Tensor, x2: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype,
                 fp32_out: bool) -> torch.Tensor | None:
    """dy2^T @ x2: written into ``out`` (fp32, e.g. a view of an optimizer's flat gradient) and None
    returned (:func:`kernels.mm_into.weight_grad_into_`), or returned in ``dtype``."""
    if out is None:
        return (dy2.t() @ x2).to(dtype)
    weight_grad_into_(out, dy2, x2, fp32_out)
    return None


class GeluMLPFunction(torch.autograd.Function):
    """y = gelu(x W1^T + b1) W2^T + b2, the two GELU epilogues on the Triton GEMM (module docstring).

    ``w1c``, ``w2c``: the weights in the compute dtype (a bf16 copy kept by the caller), else cast
    here. ``dw1_out``, ``dw2_out``: fp32 buffers the weight gradients are written into (not added:
    the caller zeroes them once per step), None returned for those weights. ``bias_grad``: the
    column sum for the bias gradients (default ``dy.sum(0)``). ``fp32_out``: those writes are one GEMM
    with an fp32 output (:func:`kernels.mm_into.fp32_out_mm_available`), else a low-precision GEMM
    copied in. ``input_precision``: the fused GEMMs'
    products for fp32 operands ('tf32' where the step runs its matrix products in TF32)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                b2: torch.Tensor | None, approximate: str, w1c: torch.Tensor | None, w2c: torch.Tensor | None,
                dw1_out: torch.Tensor | None, dw2_out: torch.Tensor | None,
                bias_grad: Callable[[torch.Tensor], torch.Tensor] | None, fp32_out: bool,
                input_precision: str) -> torch.Tensor:
        dev = x.device.type
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        x2 = x.reshape(-1, x.shape[-1]).to(cdt)  # (..., C) -> (M, C); a no-op for a bf16 producer
        w1c = (w1c if w1c is not None else w1).to(cdt)
        w2c = (w2c if w2c is not None else w2).to(cdt)
        z, a = gemm_gelu(x2, w1c.t(), b1.to(cdt) if b1 is not None else None, approximate,
                         input_precision)  # (M, F) each
        with torch.autocast(dev, enabled=False):
            y = torch.nn.functional.linear(a, w2c, b2.to(cdt) if b2 is not None else None)  # (M, C)
        ctx.save_for_backward(x2, z, a, w1c, w2c)
        ctx.approximate, ctx.bias_grad, ctx.outs = approximate, bias_grad, (dw1_out, dw2_out)
        ctx.prec, ctx.fp32_out = input_precision, fp32_out
        ctx.x_dtype, ctx.w_dtypes = x.dtype, (w1.dtype, w2.dtype)
        ctx.b_dtypes = (b1.dtype if b1 is not None else None, b2.dtype if b2 is not None else None)
        return y.view(*x.shape[:-1], w2.shape[0])  # (M, C) -> (..., C)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, z, a, w1c, w2c = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).to(w2c.dtype)  # (..., C) -> (M, C)
        colsum = ctx.bias_grad or (lambda t: t.sum(0))
        g = ctx.needs_input_grad
        with torch.autocast(dy.device.type, enabled=False):
            dw2 = _weight_grad(dy2, a, ctx.outs[1], ctx.w_dtypes[1], ctx.fp32_out) if g[3] else None
            db2 = colsum(dy2).to(ctx.b_dtypes[1]) if g[4] else None
            dz = gemm_dgelu(dy2, w2c, z, ctx.approximate, ctx.prec)  # (M, C) @ (C, F), times gelu'(z)
            dw1 = _weight_grad(dz, x2, ctx.outs[0], ctx.w_dtypes[0], ctx.fp32_out) if g[1] else None
            db1 = colsum(dz).to(ctx.b_dtypes[0]) if g[2] else None
            dx = (dz @ w1c).to(ctx.x_dtype).view(*dy.shape[:-1], w1c.shape[1]) if g[0] else None  # (..., C)
        return dx, dw1, db1, dw2, db2, None, None, None, None, None, None, None, None


def gelu_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
             b2: torch.Tensor | None, approximate: str = "tanh", *, w1c: torch.Tensor | None = None,
             w2c: torch.Tensor | None = None, dw1_out: torch.Tensor | None = None,
             dw2_out: torch.Tensor | None = None,
             bias_grad: Callable[[torch.Tensor], torch.Tensor] | None = None, fp32_out: bool = False,
             input_precision: str = "ieee") -> torch.Tensor:
    """The MLP gelu(x W1^T + b1) W2^T + b2 on :class:`GeluMLPFunction` (keywords: its docstring)."""
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate={approximate!r}; expected one of {APPROXIMATIONS}")
    for name, out, w in (("dw1_out", dw1_out, w1), ("dw2_out", dw2_out, w2)):
        if out is not None and (out.shape != w.shape or out.dtype != torch.float32):
            raise ValueError(f"{name} must be fp32 of shape {tuple(w.shape)}; got {out.dtype} {tuple(out.shape)}")
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision={input_precision!r}; expected one of {PRECISIONS}")
    return GeluMLPFunction.apply(x, w1, b1, w2, b2, approximate, w1c, w2c, dw1_out, dw2_out, bias_grad,
                                 fp32_out, input_precision)
