"""The token and position embeddings gathered and summed by one kernel; their gradients added into given
buffers by one kernel.

kernels (``_embedding_sum_fwd_kernel``, ``_embedding_sum_bwd_kernel``) -> launchers
(:func:`embedding_sum_fwd`, :func:`embedding_sum_bwd`) -> ``EmbeddingSumFunction`` -> :func:`embedding_sum`.
Reference: :func:`ftlib.model.reference.embedding_sum_ref`, ``F.embedding(idx, wte) + F.embedding(pos, wpe)``
with pos = 0 .. T-1 (GPT-2's learned embeddings, Radford et al. 2019, sec. 2.3; the input of its first block).

Why: PyTorch runs that input as a position index (``arange``), two gathers and an add forward, and backward
as two zero-filled tables, two scatter-adds (``index_add_``) and autograd's two adds into the gradients: about
ten launches around a few MB of traffic, each a kernel boundary of the captured step. Here one kernel writes x
and one adds both tables' gradients straight into the buffers the caller gives (the engine's flat gradient,
zeroed every step). With rows r = b T + t of x (B T, C):

    forward    x[r]     = wte[idx[r]] + wpe[t]                         in the tables' dtype, as PyTorch adds
    backward   dwte[v] += sum_{r: idx[r] = v} dx[r]                    atomic adds, one per row and column
               dwpe[t] += sum_b dx[b T + t]                            a program's run of b summed in registers,
                                                                       then one atomic add per position

The atomic adds make the order of both sums vary from run to run (the values, up to fp32 rounding, do not),
as ``index_add_`` on CUDA does. Their memory order (``sem``, :data:`kernels._common.ATOMIC_SEMS`): Triton's
default, 'acq_rel', makes each add of the backward's loop wait for the loads before it; 'relaxed' does not.
Token ids are not checked on a GPU (a check would synchronize the host with the device); :func:`embedding_sum`
checks them on the CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    accum_dtype,
    check_atomic_sem,
    check_tensor,
    compute_dtype,
    interpret_mode,
    num_programs,
    same_device,
)
from kernels.pdl import _grid_dependency, pdl_args

# Tiles: up to 256 columns of a row per tile (C = 256 in one; GPT-2's 768 in three), 16 rows forward (a 16 KB
# fp32 tile on 4 warps) and 16 positions backward. The interpreter takes 4 rows and 16 columns, so the tests'
# small shapes span several tiles, partial ones among them.
_GPU_BLOCK_C, _GPU_ROWS, _GPU_WARPS = 256, 16, 4
_CPU_BLOCK_C, _CPU_ROWS = 16, 4
# Backward programs per SM: the batch is split into runs so that the grid holds about this many.
_BWD_PROGRAMS_PER_SM = 2


@triton.jit
def _embedding_sum_fwd_kernel(IDX, WTE, WPE, X, M, T, C,
                              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, CD: tl.constexpr,
                              PDL: tl.constexpr = False):
    """x[r, c] = wte[idx[r], c] + wpe[r mod T, c] over this program's (BLOCK_R, BLOCK_C) tile of rows r and
    columns c; the sum formed in CD (fp32; fp64 for fp64 tables) and stored in x's dtype (the tables')."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < M
    mask = rmask[:, None] & (cols[None, :] < C)
    tok = tl.load(IDX + rows, mask=rmask, other=0).to(tl.int64)
    pos = (rows % T).to(tl.int64)
    a = tl.load(WTE + tok[:, None] * C + cols[None, :], mask=mask, other=0.0).to(CD)
    p = tl.load(WPE + pos[:, None] * C + cols[None, :], mask=mask, other=0.0).to(CD)
    tl.store(X + rows.to(tl.int64)[:, None] * C + cols[None, :], (a + p).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _embedding_sum_bwd_kernel(IDX, DX, DWTE, DWPE, B, T, C, B_RUN,
                              BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, CD: tl.constexpr, SEM: tl.constexpr,
                              PDL: tl.constexpr = False):
    """For the positions t of this program's BLOCK_T tile, the columns c of its BLOCK_C tile and the batch rows b
    of its run [pb B_RUN, (pb + 1) B_RUN) (program (pt, pb, pc)), with r = b T + t:

        dwte[idx[r], c] += dx[r, c]                  one atomic add per row and column
        dwpe[t, c]      += sum_b dx[r, c]            summed over the run in CD (fp32; fp64 for fp64), then one
                                                     atomic add per position and column

    dx is contiguous (B T, C); dwte and dwpe are contiguous in the accumulation dtype. SEM: the adds' memory
    order, one of kernels._common.ATOMIC_SEMS."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    tmask = t < T
    mask = tmask[:, None] & (cols[None, :] < C)
    acc = tl.zeros((BLOCK_T, BLOCK_C), CD)
    b0 = tl.program_id(1) * B_RUN
    for i in range(0, B_RUN):
        b = b0 + i + tl.zeros_like(t)  # this row of the run, one per position of the tile
        rmask = tmask & (b < B)
        ok = rmask[:, None] & (cols[None, :] < C)
        r = (b * T + t).to(tl.int64)  # int64: offsets r C may pass 2^31
        g = tl.load(DX + r[:, None] * C + cols[None, :], mask=ok, other=0.0).to(CD)
        acc += g
        tok = tl.load(IDX + r, mask=rmask, other=0).to(tl.int64)
        tl.atomic_add(DWTE + tok[:, None] * C + cols[None, :], g.to(DWTE.dtype.element_ty), mask=ok, sem=SEM)
    tl.atomic_add(DWPE + t.to(tl.int64)[:, None] * C + cols[None, :], acc.to(DWPE.dtype.element_ty), mask=mask,
                  sem=SEM)


def _blocks(C: int) -> tuple[int, int, int]:
    """(BLOCK_C, rows per tile, num_warps)."""
    if interpret_mode():
        return _CPU_BLOCK_C, _CPU_ROWS, 1
    return min(_GPU_BLOCK_C, triton.next_power_of_2(C)), _GPU_ROWS, _GPU_WARPS


def _check_tables(idx: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor) -> tuple[int, int, int]:
    """(B, T, C) of token ids ``idx`` (B, T) and tables ``wte`` (V, C), ``wpe`` (>= T, C); errors name the argument."""
    check_tensor("idx", idx, dtypes=(torch.int64, torch.int32), ndim=2)
    check_tensor("wte", wte, ndim=2)
    check_tensor("wpe", wpe, ndim=2)
    same_device(("idx", idx), ("wte", wte), ("wpe", wpe))
    B, T = idx.shape
    if wte.dtype != wpe.dtype or wte.shape[1] != wpe.shape[1]:
        raise ValueError(f"wte {tuple(wte.shape)} {wte.dtype} and wpe {tuple(wpe.shape)} {wpe.dtype} must share "
                         "their dtype and width")
    if T > wpe.shape[0]:
        raise ValueError(f"idx has {T} positions; wpe has {wpe.shape[0]} rows")
    return B, T, wte.shape[1]


def embedding_sum_fwd(idx: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor) -> torch.Tensor:
    """x (B, T, C) = wte[idx] + wpe[0 .. T-1], in the tables' dtype (module docstring)."""
    B, T, C = _check_tables(idx, wte, wpe)
    x = torch.empty((B, T, C), dtype=wte.dtype, device=wte.device)
    if x.numel() == 0:
        return x
    block_c, rows, num_warps = _blocks(C)
    M = B * T
    _embedding_sum_fwd_kernel[(triton.cdiv(M, rows), triton.cdiv(C, block_c))](
        idx, wte, wpe, x, M, T, C, BLOCK_R=rows, BLOCK_C=block_c, CD=compute_dtype(wte.dtype), num_warps=num_warps,
        **pdl_args(wte))
    return x


def backward_runs(device: torch.device, B: int, tiles: int) -> int:
    """Batch rows per backward program: the batch split so that ``tiles`` (position x column) tiles times the runs
    make about ``_BWD_PROGRAMS_PER_SM`` programs per SM (fewer rows per program: more positions' sums in flight;
    more: fewer atomic adds of the position sums)."""
    target = _BWD_PROGRAMS_PER_SM * num_programs(device, 1 << 30)
    return max(1, min(B, -(-B * tiles // target)))


def embedding_sum_bwd(idx: torch.Tensor, dx: torch.Tensor, dwte: torch.Tensor, dwpe: torch.Tensor,
                      b_run: int | None = None, sem: str = "acq_rel") -> None:
    """Add the gradients of wte and wpe for the gradient ``dx`` (B, T, C) of x into ``dwte`` (V, C) and ``dwpe``
    (>= T, C), contiguous buffers in the accumulation dtype of dx (fp32; fp64 for fp64); the caller zeroes them
    where the gradient is to be written. ``b_run``: batch rows per program (None: :func:`backward_runs`);
    ``sem``: the atomic adds' memory order, one of kernels._common.ATOMIC_SEMS."""
    check_tensor("idx", idx, dtypes=(torch.int64, torch.int32), ndim=2)
    check_tensor("dx", dx, ndim=3)
    acc = accum_dtype(dx.dtype)
    for name, t in (("dwte", dwte), ("dwpe", dwpe)):
        check_tensor(name, t, dtypes=(acc,), ndim=2)
    same_device(("idx", idx), ("dx", dx), ("dwte", dwte), ("dwpe", dwpe))
    B, T, C = dx.shape
    if tuple(idx.shape) != (B, T) or dwte.shape[1] != C or dwpe.shape[1] != C or dwpe.shape[0] < T:
        raise ValueError(f"shapes do not agree: idx {tuple(idx.shape)}, dx {tuple(dx.shape)}, dwte "
                         f"{tuple(dwte.shape)}, dwpe {tuple(dwpe.shape)}")
    if dx.numel() == 0:
        return
    if b_run is not None and (isinstance(b_run, bool) or not isinstance(b_run, int) or b_run < 1):
        raise ValueError(f"b_run={b_run!r} must be None or a positive int")
    check_atomic_sem(sem)
    block_c, rows, num_warps = _blocks(C)
    n_t, n_c = triton.cdiv(T, rows), triton.cdiv(C, block_c)
    run = b_run or backward_runs(dx.device, B, n_t * n_c)
    _embedding_sum_bwd_kernel[(n_t, triton.cdiv(B, run), n_c)](
        idx, dx, dwte, dwpe, B, T, C, run, BLOCK_T=rows, BLOCK_C=block_c, CD=compute_dtype(dx.dtype), SEM=sem,
        num_warps=num_warps, **pdl_args(dx))


class EmbeddingSumFunction(torch.autograd.Function):
    """Saves the token ids; the backward adds the tables' gradients into ``dwte_out`` and ``dwpe_out`` and returns
    none for them, or, without those buffers, returns them as new tensors (in the tables' dtype)."""

    @staticmethod
    def forward(ctx, idx: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, dwte_out: torch.Tensor | None,
                dwpe_out: torch.Tensor | None, sem: str) -> torch.Tensor:
        ctx.save_for_backward(idx)
        ctx.outs, ctx.shapes, ctx.dtype, ctx.sem = (dwte_out, dwpe_out), (wte.shape, wpe.shape), wte.dtype, sem
        return embedding_sum_fwd(idx, wte, wpe)

    @staticmethod
    def backward(ctx, dx: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (idx,) = ctx.saved_tensors
        dx = dx.contiguous()
        dwte, dwpe = ctx.outs
        into = dwte is not None
        if not into:
            dwte, dwpe = (torch.zeros(s, dtype=accum_dtype(dx.dtype), device=dx.device) for s in ctx.shapes)
        embedding_sum_bwd(idx, dx, dwte, dwpe, sem=ctx.sem)
        if into:
            return None, None, None, None, None, None
        return None, dwte.to(ctx.dtype), dwpe.to(ctx.dtype), None, None, None


def embedding_sum(idx: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, dwte_out: torch.Tensor | None = None,
                  dwpe_out: torch.Tensor | None = None, check_ids: bool | None = None,
                  sem: str = "acq_rel") -> torch.Tensor:
    """x (B, T, C) = wte[idx] + wpe[0 .. T-1], differentiable in both tables (module docstring). With
    ``dwte_out`` and ``dwpe_out`` (both or neither: buffers shaped like the tables, in the accumulation dtype), the
    backward adds the gradients into them and autograd receives none. ``check_ids``: raise a ValueError for a token
    id outside [0, V) (None: on the CPU only; on a GPU the check would wait for the device). ``sem``: the
    backward's atomic adds' memory order, one of kernels._common.ATOMIC_SEMS."""
    _check_tables(idx, wte, wpe)  # before the ids are read
    check_atomic_sem(sem)
    if (dwte_out is None) != (dwpe_out is None):
        raise ValueError("give both dwte_out and dwpe_out, or neither")
    if dwte_out is not None:
        for name, out, table in (("dwte_out", dwte_out, wte), ("dwpe_out", dwpe_out, wpe)):
            if out.shape != table.shape or out.dtype != accum_dtype(table.dtype) or not out.is_contiguous():
                raise ValueError(f"{name} must be contiguous {tuple(table.shape)} {accum_dtype(table.dtype)}; got "
                                 f"{tuple(out.shape)} {out.dtype}")
    if check_ids if check_ids is not None else not idx.is_cuda:
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= wte.shape[0]):
            raise ValueError(f"token ids must lie in [0, {wte.shape[0]}); got {int(idx.min())} .. {int(idx.max())}")
    return EmbeddingSumFunction.apply(idx.contiguous(), wte.contiguous(), wpe.contiguous(), dwte_out, dwpe_out,
                                      sem)
