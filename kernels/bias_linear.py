"""Linear layer with its GEMMs on cuBLAS and its bias gradient on a Triton column-sum kernel.

kernel (``_col_sum_kernel``) -> launcher (``bias_grad``) -> ``BiasLinearFunction`` ->
:func:`bias_linear` -> ``BiasLinear``. Reference: ``torch.nn.functional.linear``
(:func:`ftlib.model.reference.linear_ref`).

Why: in GPT-2 every ``nn.Linear`` has a bias. With x (M, K) = (B*T, K) = (8192, 256) and N in
{768, 256, 1024, 256}, the engine's profile shows PyTorch computing each bias gradient
``dy.sum(0)`` with a generic column reduction several times off the memory floor, 24 times a
step (chapter 6 gives the measured times). Here the three GEMMs stay on
``F.linear`` / ``torch.mm`` (cuBLAS: speed and numerics of the matmuls unchanged) and only the
bias gradient moves to Triton.

With x (M, K), W (N, K), b (N,), dy (M, N):
    forward   y  = x W^T + b                       F.linear
    backward  dx = dy W                            torch.mm, (M, N) @ (N, K)
              dW = dy^T x                          torch.mm, (N, M) @ (M, K)
              db = sum_rows dy                     two stages:
                   P[s, n] = sum_{m in split s} dy[m, n]      (Triton, S row splits x N/BLOCK_N
                                                               column blocks, fp32 accumulation)
                   db[n]   = sum_s P[s, n]                    (torch, a small (S, N) tensor)

A column sum over a tall (M, N) matrix has only N/BLOCK_N independent column blocks (2-16 for
GPT-2 at BLOCK_N = 64), far fewer than the SMs; splitting the rows into S parts gives ~2
programs per SM, each streaming BLOCK_M x BLOCK_N tiles, and the second stage reads only S x N
partials. The partials are summed in a fixed order, so db is deterministic (no atomics).

:func:`bias_grad_add_` is the one-stage form for a destination that already exists: each program
adds its partial row into an (N,) fp32 buffer with atomic adds (db_out[n] += P[s, n]), so the second
stage, the cast and autograd's add into the parameter's gradient all go. It is meant for a gradient
buffer zeroed before the backward (the engine's flat gradient), where adding is writing; the order of
the S adds per column is not fixed, so db is then reproducible only to fp32 rounding.

:func:`gelu_bwd_bias_add_` puts a GELU's backward in front of that sum, for the Linear a GELU follows (the
MLP's up-projection): the kernel reads z and da, writes dz = da * gelu'(z) and sums dz as stored, so the
column sum does not read dz back (GELU and its derivative as in :mod:`kernels.gelu_mlp`);
:class:`GeluBiasGradFunction` is F.gelu with that backward.

Autocast: F.linear is on autocast's lower-precision list. ``BiasLinearFunction.forward`` mirrors
that itself (casts x, W, b to the autocast dtype, fp64 excepted, and runs F.linear with autocast
off), saves the cast tensors so the backward GEMMs run in that dtype as autocast's would, and
returns each gradient in its input's original dtype. db is accumulated in fp32 from the bf16
dy and written straight in the bias dtype (no intermediate bf16 rounding).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernels._common import FLOAT_DTYPES, accum_dtype, check_tensor, compute_dtype, interpret_mode, same_device
from kernels.gelu_mlp import _gelu_parts
from kernels.pdl import _grid_dependency, pdl_args

# (BLOCK_M, BLOCK_N, num_warps). GPU: 64 columns are 128 B (bf16) / 256 B (fp32) per row,
# whole cache lines, and 64 columns keep enough column blocks that the row splits stay a few
# tiles deep at GPT-2's N = 256. Interpreter: small blocks so odd test shapes span several
# tiles and column blocks, and the numpy emulation stays fast.
_GPU_BLOCKS = (32, 64, 4)
_CPU_BLOCKS = (8, 32, 1)
MIN_TILES_PER_SPLIT = 4  # fewer BLOCK_M tiles per split and the partials cost more than they save
# The row splits aim at this many programs per SM (benchmarks/kernels/bias_grad_dev.py times others).
PROGRAMS_PER_SM = 2
# Wide outputs (N >= WIDE_N) take 128-column tiles and ~4 programs per SM: faster at GPT-2's N = 768
# and 1024 (M = 8192, fp32 and bf16, in a graph; benchmarks/kernels/bias_grad_dev.py, kernels.jsonl);
# at N = 256 the 64-column default stays ahead, since it gives twice the programs.
WIDE_N, _GPU_WIDE = 512, ((32, 128, 4), 4)
GELU_KINDS = {"none": 1, "tanh": 2}  # F.gelu's approximate= -> the kernel's GELU constexpr


@triton.jit
def _col_sum_kernel(DY, P, Z, DZ, M, N, stride_m, stride_n, rows_per_split,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr, ATOMIC: tl.constexpr,
                    GELU: tl.constexpr = 0, PDL: tl.constexpr = False):
    """P[ps, c] = sum_{m in [ps rows_per_split, min((ps+1) rows_per_split, M))} DY[m, c] for the
    BLOCK_N columns c of program (pn, ps), accumulated in CD (fp32; fp64 for fp64 DY).
    GELU (1: exact, 2: tanh-approximated; 0: none): DY is the gradient of a GELU's output and Z its
    input, both (M, N) with DY's strides; the kernel first forms DZ = DY * gelu'(Z) (in CD, rounded to
    DZ's dtype and stored into DZ, (M, N) contiguous) and sums DZ as stored: the GELU's backward and the
    preceding Linear's bias gradient in one pass (``gelu_bwd_bias_add_``).

    DY is (M, N) with any strides (coalesced when stride_n == 1); P is (S, N) contiguous in CD.
    ATOMIC: P is instead one (N,) row in CD, and each program adds its sum into it,
    P[c] += sum_{m in split ps} DY[m, c], so that after all S programs P[c] += sum_m DY[m, c].
    Tiles of BLOCK_M rows are added elementwise into a (BLOCK_M, BLOCK_N) register
    accumulator and reduced over rows once at the end: one cross-thread reduction per
    program instead of one per tile.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    cols = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    r0 = ps * rows_per_split
    r1 = tl.minimum(r0 + rows_per_split, M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), CD)
    for m in range(r0, r1, BLOCK_M):
        rows = (m + tl.arange(0, BLOCK_M)).to(tl.int64)  # int64: M * stride_m may pass 2^31
        mask = (rows[:, None] < r1) & cmask[None, :]
        offs = rows[:, None] * stride_m + cols[None, :] * stride_n
        dy = tl.load(DY + offs, mask=mask, other=0.0)
        if GELU:
            z = tl.load(Z + offs, mask=mask, other=0.0).to(CD)
            dy = (dy.to(CD) * _gelu_parts(z, GELU == 2)[1]).to(DZ.dtype.element_ty)
            tl.store(DZ + rows[:, None] * N + cols[None, :], dy, mask=mask)
        acc += dy.to(CD)
    part = tl.sum(acc, axis=0)  # (BLOCK_M, BLOCK_N) -> (BLOCK_N,)
    if ATOMIC:
        tl.atomic_add(P + cols, part, mask=cmask)
    else:
        tl.store(P + ps * N + cols, part, mask=cmask)


def _num_splits(M: int, N: int, block_m: int, block_n: int, device: torch.device,
                per_sm: int = PROGRAMS_PER_SM) -> int:
    """Row splits S: S * cdiv(N, block_n) ~ per_sm programs per SM, each split >= MIN_TILES_PER_SPLIT tiles."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        target = triton.cdiv(per_sm * sms, triton.cdiv(N, block_n))
    else:
        target = 2  # interpreter: still exercises the partials and the second stage
    return max(1, min(target, triton.cdiv(M, block_m) // MIN_TILES_PER_SPLIT))


def _launch(dy2d: torch.Tensor, out: torch.Tensor | None, atomic: bool, splits: int | None,
            blocks: tuple[int, int, int] | None, per_sm: int,
            gelu: tuple[torch.Tensor, torch.Tensor, str] | None = None) -> torch.Tensor:
    """Run ``_col_sum_kernel`` over dy2d (M, N), M, N > 0: into a new (S, N) partials tensor, or
    (``atomic``) adding into ``out`` (N,); returns what the kernel wrote. ``gelu`` = (z, dz, approximate):
    the sums are of dz = dy2d * gelu'(z), which the kernel writes into dz."""
    if splits is not None and int(splits) < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    if int(per_sm) < 1:
        raise ValueError(f"per_sm must be >= 1, got {per_sm}")
    M, N = dy2d.shape
    if blocks is None and not interpret_mode() and N >= WIDE_N:
        blocks, per_sm = _GPU_WIDE
    block_m, block_n, num_warps = blocks or (_CPU_BLOCKS if interpret_mode() else _GPU_BLOCKS)
    S = _num_splits(M, N, block_m, block_n, dy2d.device, int(per_sm)) if splits is None else int(splits)
    # Whole tiles per split, then drop the splits that would start past M.
    rows_per_split = triton.cdiv(triton.cdiv(M, S), block_m) * block_m
    S = triton.cdiv(M, rows_per_split)
    if not atomic:
        out = torch.empty((S, N), dtype=accum_dtype(dy2d.dtype), device=dy2d.device)  # (S, N) partials
    kind = 0 if gelu is None else GELU_KINDS[gelu[2]]
    gelu = (dy2d, dy2d) if gelu is None else gelu[:2]  # Z, DZ: never touched without GELU
    _col_sum_kernel[(triton.cdiv(N, block_n), S)](
        dy2d, out, *gelu, M, N, dy2d.stride(0), dy2d.stride(1), rows_per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, CD=compute_dtype(dy2d.dtype), ATOMIC=atomic, GELU=kind,
        num_warps=num_warps, **pdl_args(dy2d))
    return out


def bias_grad(
    dy2d: torch.Tensor, out_dtype: torch.dtype, splits: int | None = None,
    blocks: tuple[int, int, int] | None = None, per_sm: int = PROGRAMS_PER_SM,
) -> torch.Tensor:
    """Column sums of dy2d (M, N) -> (N,) in ``out_dtype``, accumulated in fp32 (fp64 for fp64).

    dy2d may be a strided view (its last dim should be unit-stride for coalesced loads).
    ``splits``: row splits S (None: ~``per_sm`` programs per SM, see :func:`_num_splits`); the
    (S, N) partials are summed by torch. ``blocks``: (BLOCK_M, BLOCK_N, num_warps), powers of
    two (None: the measured default, 128-column tiles at ~4 programs per SM for N >= WIDE_N;
    the dev driver times others).
    """
    check_tensor("dy2d", dy2d, ndim=2, contiguous=False)
    if out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype is {out_dtype}; expected one of {[str(d) for d in FLOAT_DTYPES]}")
    M, N = dy2d.shape
    if M == 0 or N == 0:
        return torch.zeros(N, dtype=out_dtype, device=dy2d.device)
    partials = _launch(dy2d, None, False, splits, blocks, per_sm)  # (S, N)
    db = partials[0] if partials.shape[0] == 1 else partials.sum(0)  # (N,)
    return db.to(out_dtype)


def bias_grad_add_(
    dy2d: torch.Tensor, db_out: torch.Tensor, splits: int | None = None,
    blocks: tuple[int, int, int] | None = None, per_sm: int = PROGRAMS_PER_SM,
) -> torch.Tensor:
    """db_out += column sums of dy2d (M, N), in one kernel with atomic adds; returns ``db_out``.

    ``db_out``: (N,), contiguous, in the accumulation dtype of dy2d (fp32; fp64 for fp64), on dy2d's
    device: a bias's gradient buffer, zeroed before the backward when the sum is to be written. The
    grid and ``splits``/``blocks``/``per_sm`` are :func:`bias_grad`'s.
    """
    check_tensor("dy2d", dy2d, ndim=2, contiguous=False)
    _check_db_out(db_out, "dy2d", dy2d)
    M, N = dy2d.shape
    if M == 0 or N == 0:
        return db_out
    return _launch(dy2d, db_out, True, splits, blocks, per_sm)


def _check_db_out(db_out: torch.Tensor, name: str, dy: torch.Tensor) -> None:
    """db_out must be (N,), contiguous, in the accumulation dtype of ``dy`` (..., N) and on its device."""
    check_tensor("db_out", db_out, ndim=1)
    same_device((name, dy), ("db_out", db_out))
    N, want = dy.shape[-1], accum_dtype(dy.dtype)
    if db_out.shape[0] != N or db_out.dtype != want:
        raise ValueError(f"db_out must be ({N},) {want} for {name} {tuple(dy.shape)} {dy.dtype}; got "
                         f"{tuple(db_out.shape)} {db_out.dtype}")


def _check_approximate(approximate: str) -> None:
    if approximate not in GELU_KINDS:
        raise ValueError(f"approximate must be one of {list(GELU_KINDS)} (F.gelu's), got {approximate!r}")


def gelu_bwd_bias_add_(
    z: torch.Tensor, da: torch.Tensor, db_out: torch.Tensor, approximate: str = "tanh",
    blocks: tuple[int, int, int] | None = None, per_sm: int = PROGRAMS_PER_SM,
) -> torch.Tensor:
    """GELU's backward fused with the bias gradient of the Linear before it: returns dz = da * gelu'(z), in z's
    dtype (the values F.gelu's backward gives, computed in fp32), and adds the column sums of dz as stored
    into ``db_out`` with atomic adds (:func:`bias_grad_add_`'s grid and contract, ``blocks`` and ``per_sm``
    included). z, da: (..., N) contiguous, the same shape and dtype; ``approximate``: F.gelu's ('none' or
    'tanh')."""
    _check_approximate(approximate)
    check_tensor("z", z)
    check_tensor("da", da, dtypes=(z.dtype,))
    if da.shape != z.shape or z.dim() < 1:
        raise ValueError(f"da must have z's shape {tuple(z.shape)}, got {tuple(da.shape)}")
    same_device(("z", z), ("da", da))
    _check_db_out(db_out, "z", z)
    N = z.shape[-1]
    z2, da2 = z.reshape(-1, N), da.reshape(-1, N)  # (..., N) -> (M, N) views (contiguous)
    dz = torch.empty_like(z)
    if z2.shape[0] > 0 and N > 0:
        _launch(da2, db_out, True, None, blocks, per_sm, (z2, dz.view(-1, N), approximate))
    return dz


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # Devices first, so that a mix is reported as a mix rather than as one unsupported device.
    same_device(("x", x), ("weight", weight), ("bias", bias))
    check_tensor("x", x, contiguous=False)
    check_tensor("weight", weight, ndim=2, contiguous=False)
    check_tensor("bias", bias, ndim=1, contiguous=False)
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x's last dim must equal weight's in_features {weight.shape[1]}; x is {tuple(x.shape)}")
    if bias.shape[0] != weight.shape[0]:
        raise ValueError(f"bias must be ({weight.shape[0]},) to match weight {tuple(weight.shape)}, "
                         f"got {tuple(bias.shape)}")


def _autocast_cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Autocast leaves fp64 tensors alone (they are not "eligible"); so does this.
    return t if t.dtype == torch.float64 else t.to(dtype)


class BiasLinearFunction(torch.autograd.Function):
    """y = x W^T + b; forward, dx and dW on F.linear / torch.mm, db on :func:`bias_grad`.

    Saves x and W (as F.linear does), in the dtype the GEMMs ran in (the autocast dtype
    under autocast).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        _check(x, weight, bias)
        dev = x.device.type
        ctx.dev = dev
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype)
        if torch.is_autocast_enabled(dev):
            dtype = torch.get_autocast_dtype(dev)
            x, weight, bias = (_autocast_cast(t, dtype) for t in (x, weight, bias))
        if not x.dtype == weight.dtype == bias.dtype:
            raise TypeError(f"x, weight and bias must share a dtype, got {x.dtype}, {weight.dtype}, {bias.dtype}")
        with torch.autocast(dev, enabled=False):  # already cast; F.linear must not cast again
            y = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    @once_differentiable  # db comes from a Triton kernel autograd cannot see through
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        N, K = weight.shape
        dy2 = dy.reshape(-1, N)  # (M, N)
        dx = dw = db = None
        # A CPU backward called inside an autocast region would otherwise recast the GEMMs.
        with torch.autocast(ctx.dev, enabled=False):
            if ctx.needs_input_grad[0]:
                dx = (dy2 @ weight).view(x.shape).to(x_dtype)  # (M, N) @ (N, K) -> (M, K) -> x's shape
            if ctx.needs_input_grad[1]:
                dw = (dy2.t() @ x.reshape(-1, K)).to(w_dtype)  # (N, M) @ (M, K) -> (N, K)
        if ctx.needs_input_grad[2]:
            db = bias_grad(dy2, b_dtype)  # (N,)
        return dx, dw, db


def bias_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose bias gradient is the Triton column sum (bias required)."""
    return BiasLinearFunction.apply(x, weight, bias)


class BiasLinear(nn.Module):
    """Thin module: takes over an ``nn.Linear``'s Parameters (same objects) and runs them on
    :func:`bias_linear`. A Linear without a bias is rejected: there is no bias gradient to speed up."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"BiasLinear wraps an nn.Linear, got {type(lin).__name__}")
        if lin.bias is None:
            raise ValueError("BiasLinear needs an nn.Linear with a bias (bias=False leaves nothing to "
                             "speed up; keep the plain nn.Linear)")
        self.weight = lin.weight
        self.bias = lin.bias
        self.in_features, self.out_features = lin.in_features, lin.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=True"


class GeluBiasGradFunction(torch.autograd.Function):
    """a = gelu(z) forward (F.gelu itself), and backward dz = da * gelu'(z) with the preceding Linear's bias
    gradient, the column sums of dz, added into ``db_out`` (:func:`gelu_bwd_bias_add_`). Saves z, as F.gelu's
    backward does."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, approximate: str, db_out: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z)
        ctx.approximate, ctx.db_out = approximate, db_out
        return F.gelu(z, approximate=approximate)

    @staticmethod
    @once_differentiable
    def backward(ctx, da: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (z,) = ctx.saved_tensors
        return gelu_bwd_bias_add_(z, da.contiguous(), ctx.db_out, ctx.approximate), None, None


def gelu_bias_grad(z: torch.Tensor, approximate: str, db_out: torch.Tensor) -> torch.Tensor:
    """``F.gelu(z, approximate=approximate)`` whose backward also adds the column sums of dz into ``db_out``
    (the bias gradient of the Linear that produced z; its own column sum must then be skipped)."""
    _check_approximate(approximate)  # here, not first in the backward
    return GeluBiasGradFunction.apply(z, approximate, db_out)
