"""Residual add fused with the norm that follows it (RMSNorm or LayerNorm), forward and backward.

kernels (in :mod:`kernels.residual_norm_kernels`: ``_add_norm_fwd_kernel``, ``_add_norm_bwd_kernel`` or
``_add_norm_bwd_persistent_kernel``) -> launchers (``add_norm_fwd``, ``add_norm_bwd``) -> ``AddNormFunction`` ->
:func:`add_rms_norm`, :func:`add_layer_norm`.
References: :func:`ftlib.model.reference.add_rms_norm_ref`, :func:`ftlib.model.reference.add_layer_norm_ref`.
Used by ``ftlib.training.engine`` (option ``fuse_residual_norm``, through the model's
``AddNorm`` seam); its effect on the step is in data/results/h200/engine.jsonl.

In a pre-norm block every residual add is followed by a norm: ``s = x + r; h = norm(s)``,
and ``s`` feeds both the norm and the next residual add. Unfused that is an add kernel and
a norm kernel forward, and backward autograd adds the two gradients reaching ``s`` (one
more kernel) before the norm's backward. Fused, per (ROWS, N) tile, with ``shat`` the
normalized row:

    RMSNorm (Zhang & Sennrich 2019)   shat = s rstd,          rstd = 1 / sqrt(mean(s^2) + eps)
    LayerNorm (Ba et al. 2016)        shat = (s - mu) rstd,   rstd = 1 / sqrt(mean((s - mu)^2) + eps)
    forward    h = shat w (+ b)
    backward   g = ds + rstd (dh w - [mean(dh w)] - shat mean(dh w shat))   ([.] LayerNorm only)
               dx = dr = g;   dw = sum_rows dh shat;   db = sum_rows dh   (per-program partials)

where ``ds`` is the gradient reaching ``s`` from the next residual add and ``dh`` the one
reaching the norm's output. One kernel each way instead of two forward and three backward;
rows are processed in tiles of ROWS so the loads of a tile are in flight together (the
row-per-program norm kernels were latency-bound in a graph: benchmarks/kernels/NOTES.md).

The dw and db partials: by default one row per tile (cdiv(M, ROWS) rows, summed by the launcher
with a torch reduction). With ``dw_partials="persistent"`` the backward runs on a few programs per SM
(``kernels._common.persistent_grid``), each looping over a contiguous run of tiles and
accumulating its dw (and db) in registers, so the launcher sums one row per program
(Liger-Kernel's rms_norm backward; the partial-sum-then-reduce scheme of Triton's layer-norm
tutorial, python/tutorials/05-layer-norm.py). With ``dw_partials="atomic"`` the same programs add
their rows into one (N,) output with atomic adds instead (``DW += sum over the program's rows``):
given the weight's own gradient buffer (``dw_out``, zeroed by the caller), the backward leaves
nothing for a reduction or for autograd's gradient accumulation.

Residual dropout (``p`` > 0): the branch's dropout is fused too, ``s = x + r m / (1 - p)`` with
``m`` a keep mask (keep probability 1 - p; inverted dropout, Srivastava et al. 2014, as
``nn.Dropout``), and ``dr = g m / (1 - p)``. The mask is never stored: both kernels draw it
from Philox (Salmon et al. 2011; ``tl.rand``; :mod:`kernels.dropout_mask`) keyed by a seed read
from a device tensor (``seed``, one int64) and the element's (row, column), so the backward
regenerates it on either grid. Reading the seed from memory, not from a kernel argument, is
what lets a captured CUDA graph draw new masks on every replay: the engine increments the
tensor at the start of each step. ``salt`` separates the call sites of one step (each draws
from its own stream). The seed tensor must not change between a forward and its backward.
This removes the two dropout kernels of each branch (forward with its mask write, backward
with its mask read).

``dr`` is written by the backward kernel in r's dtype when that differs from s's (a bf16 branch
under autocast into the fp32 residual stream) or when dropout scales it: no separate cast kernel.
"""

from __future__ import annotations

import torch
import triton

from kernels._common import (
    ADD_NORM_DW_PARTIALS,
    accum_dtype,
    check_atomic_sem,
    check_dw_partials,
    check_tensor,
    compute_dtype,
    persistent_grid,
    row_tile_warps,
    same_device,
)
from kernels.dropout_mask import RNG4, SALTS, _block_n, _check_dropout, keep_mask
from kernels.pdl import pdl_args
from kernels.residual_norm_kernels import _add_norm_bwd_kernel, _add_norm_bwd_persistent_kernel, _add_norm_fwd_kernel

__all__ = ["ROWS", "RNG4", "SALTS", "AddNormFunction", "add_layer_norm", "add_norm_bwd", "add_norm_fwd", "add_rms_norm",
           "keep_mask"]

# Rows per program, with one warp per 1,024 elements: the fastest of 4, 8 and 16 rows for the fused
# residual + RMSNorm and + LayerNorm, fp32 and bf16, forward + backward at 8192 x 256 on the H200
# (benchmarks/kernels/residual_norm_dev.py; data/results/h200/kernels.jsonl).
ROWS = 4


def _check(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    check_tensor("x", x)
    check_tensor("r", r)
    check_tensor("weight", w, ndim=1)
    same_device(("x", x), ("r", r), ("weight", w))
    if b is not None:
        check_tensor("bias", b, ndim=1)
        same_device(("x", x), ("bias", b))
        if b.shape != w.shape:
            raise ValueError(f"bias {tuple(b.shape)} and weight {tuple(w.shape)} must have one shape")
    if x.shape != r.shape:
        raise ValueError(f"x and r must have one shape: {tuple(x.shape)} vs {tuple(r.shape)}")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"x's last dim {x.shape[-1]} != weight's length {w.shape[0]}")


def add_norm_fwd(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, layer_norm: bool,
    out_dtype: torch.dtype | None = None, rows: int = ROWS,
    p: float = 0.0, seed: torch.Tensor | None = None, salt: int = 0, rng4: bool = RNG4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s, h, rstd): s = x + r, h = norm(s) over the last dim; contiguous x and r.

    ``layer_norm``: LayerNorm (mean removed, optional bias ``b``) instead of RMSNorm (``b`` must be
    None). s takes x's dtype (the residual stream's; under bf16 autocast r may be bf16 and is
    added in fp32 inside the kernel, as ``x + r`` would promote it). h takes ``out_dtype`` (default
    x's): under bf16 autocast the next op is a Linear that casts h to bf16 anyway, so writing h
    in bf16 here gives the same values (h is computed in fp32 and rounded once either way) and
    saves the cast kernel forward and the cast of its gradient backward. ``rows``: rows per
    program, a power of two (benchmarks/kernels/residual_norm_dev.py times others). ``p`` > 0: dropout
    on r first, s = x + r keep / (1 - p), the mask drawn from ``seed`` (int64 device tensor, read
    by the kernel) and ``salt`` (module docstring).
    """
    _check(x, r, w, b)
    _check_dropout(p, seed, salt, x)
    if b is not None and not layer_norm:
        raise ValueError("a bias is only defined for LayerNorm (layer_norm=True)")
    N = x.shape[-1]
    M = x.numel() // max(N, 1)
    s, h = torch.empty_like(x), torch.empty_like(x, dtype=out_dtype or x.dtype)
    rstd = torch.empty(M, dtype=accum_dtype(x.dtype), device=x.device)
    if M > 0:
        block_n = _block_n(N)
        _add_norm_fwd_kernel[(triton.cdiv(M, rows),)](
            x, r, w, b if b is not None else w, s, h, rstd, seed if p > 0 else rstd, M, N, eps, salt, p,
            1.0 / (1.0 - p), IS_LN=layer_norm, HAS_BIAS=b is not None, HAS_DROP=p > 0, RNG4=rng4, ROWS=rows,
            BLOCK_N=block_n, CD=compute_dtype(x.dtype), num_warps=row_tile_warps(rows, block_n),
            **pdl_args(x))
    return s, h, rstd


def add_norm_bwd(
    ds: torch.Tensor | None, dh: torch.Tensor, s: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
    layer_norm: bool, has_bias: bool, rows: int = ROWS, r_dtype: torch.dtype | None = None,
    p: float = 0.0, seed: torch.Tensor | None = None, salt: int = 0, rng4: bool = RNG4,
    dw_partials: str = "tile", programs: int | None = None,
    dw_out: torch.Tensor | None = None, db_out: torch.Tensor | None = None, drb_out: torch.Tensor | None = None,
    loop_stages: int | None = None, sem: str = "acq_rel",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dr, dweight, dbias or None); ``ds`` None when s feeds only the norm.

    dx = g (module docstring); dr = g in ``r_dtype`` (default s's), times keep / (1 - p) with
    dropout (the forward's mask: same ``seed`` value and ``salt``). Without dropout and with one
    dtype, dr is dx itself (no second write). ``dw_partials``: "tile" (a partial row per tile of
    ``rows`` rows) or "persistent" (about ``programs`` programs, default a few per SM:
    ``kernels._common.persistent_grid``, a partial row each), the launcher summing the partial rows;
    or "atomic" (the persistent grid adding into (N,) outputs). ``dw_out`` (and ``db_out`` with a
    bias), "atomic" only: the weight's (and bias's) gradient buffers, in rstd's dtype, which the
    kernel adds into; dweight and dbias are then returned as None (already accumulated). ``drb_out``,
    "atomic" only: an (N,) buffer in rstd's dtype into which the kernel also adds the column sums of dr (the
    gradient of a bias the branch added last, e.g. the projection's before the residual add). ``loop_stages``
    (persistent grids; None: not pipelined): each program's loop over its tiles software-pipelined over that
    many tiles (:class:`kernels._common.RowGrid`). ``sem``: the memory order of the "atomic" adds
    (:data:`kernels._common.ATOMIC_SEMS`)."""
    check_dw_partials(dw_partials, programs, ADD_NORM_DW_PARTIALS)
    check_atomic_sem(sem)
    if loop_stages is not None and (dw_partials == "tile" or not 1 <= loop_stages <= 4):
        raise ValueError(f"loop_stages={loop_stages!r}: 1 to 4, for the persistent grids ('persistent', 'atomic')")
    into = dw_out is not None
    if into or db_out is not None:
        _check_outs(dw_partials, dw_out, db_out, w, rstd.dtype, has_bias)
    if drb_out is not None:
        if dw_partials != "atomic":
            raise ValueError(f"drb_out needs dw_partials='atomic', got {dw_partials!r}")
        _check_out_buffer("drb_out", drb_out, w, rstd.dtype)
    N = s.shape[-1]
    M = s.numel() // max(N, 1)
    r_dtype = r_dtype or s.dtype
    dh = dh.contiguous()
    ds = ds.contiguous() if ds is not None else None
    g = torch.empty_like(s)
    has_gr = p > 0 or r_dtype != s.dtype
    gr = torch.empty_like(s, dtype=r_dtype) if has_gr else g
    if M == 0:
        if into:
            return g, gr, None, None
        return g, gr, torch.zeros_like(w), torch.zeros_like(w) if has_bias else None
    n_tiles, block_n = triton.cdiv(M, rows), _block_n(N)
    warps = row_tile_warps(rows, block_n)
    grid, per_program = (n_tiles, 1) if dw_partials == "tile" else persistent_grid(s.device, n_tiles, programs, warps)
    atomic = dw_partials == "atomic"
    if atomic:  # (N,) outputs the programs add into: the caller's buffers, or zeroed here
        dwp = dw_out if into else torch.zeros(N, dtype=rstd.dtype, device=s.device)
        dbp = (db_out if into else torch.zeros(N, dtype=rstd.dtype, device=s.device)) if has_bias else dwp
    else:
        dwp = torch.empty((grid, N), dtype=rstd.dtype, device=s.device)  # one partial row per program
        dbp = torch.empty((grid, N), dtype=rstd.dtype, device=s.device) if has_bias else dwp
    head, tail = (ds if ds is not None else dh, dh, s, w, rstd, g, gr, dwp, dbp), (
        seed if p > 0 else rstd, M, N, salt, p, 1.0 / (1.0 - p))
    meta = dict(IS_LN=layer_norm, HAS_BIAS=has_bias, HAS_DS=ds is not None, HAS_GR=has_gr, HAS_DROP=p > 0, RNG4=rng4,
                ROWS=rows, BLOCK_N=block_n, CD=compute_dtype(s.dtype), num_warps=warps,
                **pdl_args(s))
    if dw_partials == "tile":
        _add_norm_bwd_kernel[(grid,)](*head, *tail, **meta)
    else:
        drb = drb_out if drb_out is not None else dwp  # not read without HAS_DRB
        _add_norm_bwd_persistent_kernel[(grid,)](*head, drb, *tail, per_program, **meta, ATOMIC=atomic,
                                                 HAS_DRB=drb_out is not None, LOOP_STAGES=loop_stages, SEM=sem)
    if into:
        return g, gr, None, None
    if atomic:
        return g, gr, dwp.to(w.dtype), dbp.to(w.dtype) if has_bias else None
    return g, gr, dwp.sum(0).to(w.dtype), dbp.sum(0).to(w.dtype) if has_bias else None  # (grid, N) -> (N,)


def _check_outs(dw_partials: str, dw_out: torch.Tensor | None, db_out: torch.Tensor | None, w: torch.Tensor,
                dtype: torch.dtype, has_bias: bool) -> None:
    """ValueError unless the gradient buffers fit :func:`add_norm_bwd`'s atomic adds."""
    if dw_partials != "atomic":
        raise ValueError(f"dw_out/db_out need dw_partials='atomic', got {dw_partials!r}")
    if dw_out is None or (db_out is None) == has_bias:
        raise ValueError("dw_out is required with db_out, and db_out exactly when the norm has a bias")
    for name, t in (("dw_out", dw_out), ("db_out", db_out)):
        if t is not None:
            _check_out_buffer(name, t, w, dtype)


def _check_out_buffer(name: str, t: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> None:
    """ValueError unless ``t`` is a contiguous buffer of the weight's shape and device in ``dtype``."""
    check_tensor(name, t, ndim=1)
    same_device(("weight", w), (name, t))
    if t.shape != w.shape or t.dtype != dtype:
        raise ValueError(f"{name} must be {tuple(w.shape)} in {dtype} (the kernel adds into it), "
                         f"got {tuple(t.shape)} in {t.dtype}")


class AddNormFunction(torch.autograd.Function):
    """Two outputs, (s, h); autograd hands the backward both gradients, so their sum is fused."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float,
                layer_norm: bool, out_dtype: torch.dtype | None = None, rows: int = ROWS, p: float = 0.0,
                seed: torch.Tensor | None = None, salt: int = 0, rng4: bool = RNG4, dw_partials: str = "tile",
                programs: int | None = None, dw_out: torch.Tensor | None = None,
                db_out: torch.Tensor | None = None, bwd_rows: int | None = None,
                drb_out: torch.Tensor | None = None,
                loop_stages: int | None = None, sem: str = "acq_rel") -> tuple[torch.Tensor, torch.Tensor]:
        check_dw_partials(dw_partials, programs, ADD_NORM_DW_PARTIALS)
        if dw_out is not None or db_out is not None:  # checked now, not first in the backward
            _check_outs(dw_partials, dw_out, db_out, w, accum_dtype(x.dtype), b is not None)
        s, h, rstd = add_norm_fwd(x.contiguous(), r.contiguous(), w, b, eps, layer_norm, out_dtype, rows,
                                  p, seed, salt, rng4)
        ctx.save_for_backward(s, w, rstd)
        ctx.r_dtype, ctx.layer_norm, ctx.has_bias, ctx.rows = r.dtype, layer_norm, b is not None, bwd_rows or rows
        ctx.p, ctx.seed, ctx.salt, ctx.rng4 = p, seed, salt, rng4  # the seed tensor: its value is read again
        ctx.dw_partials, ctx.programs, ctx.dw_out, ctx.db_out = dw_partials, programs, dw_out, db_out
        ctx.drb_out, ctx.loop_stages, ctx.sem = drb_out, loop_stages, sem
        ctx.set_materialize_grads(False)  # an unused s arrives as None, not as a tensor of zeros
        return s, h

    @staticmethod
    def backward(ctx, ds: torch.Tensor, dh: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        s, w, rstd = ctx.saved_tensors
        none = (None,) * 18
        if dh is None:  # h unused: s's gradient passes through to x, and to r through the mask
            if ds is None:
                return (None, None) + none
            dr = ds
            if ctx.p > 0:
                dr = ds * keep_mask(ctx.seed, ds.shape, ctx.p, ctx.salt, ctx.rng4) / (1.0 - ctx.p)
            if ctx.drb_out is not None:  # the branch bias's gradient, which the kernel would have added
                ctx.drb_out.add_(dr.reshape(-1, dr.shape[-1]).sum(0))  # (..., N) -> (N,)
            return (ds, dr.to(ctx.r_dtype)) + none
        # dh may be bf16: loaded as fp32
        # With dw_out the weight's gradient is added into its buffer by the kernel: None goes to autograd.
        g, gr, dw, db = add_norm_bwd(ds, dh, s, w, rstd, ctx.layer_norm, ctx.has_bias, ctx.rows, ctx.r_dtype,
                                     ctx.p, ctx.seed, ctx.salt, ctx.rng4, ctx.dw_partials, ctx.programs,
                                     ctx.dw_out, ctx.db_out, ctx.drb_out, loop_stages=ctx.loop_stages, sem=ctx.sem)
        return (g, gr, dw, db) + (None,) * 16


def add_rms_norm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-5, out_dtype: torch.dtype | None = None,
    rows: int = ROWS, p: float = 0.0, seed: torch.Tensor | None = None, salt: int = 0, rng4: bool = RNG4,
    dw_partials: str = "tile", programs: int | None = None, dw_out: torch.Tensor | None = None,
    bwd_rows: int | None = None, drb_out: torch.Tensor | None = None, loop_stages: int | None = None,
    sem: str = "acq_rel",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, rms_norm(x + r) * w), differentiable in x, r and w; h in ``out_dtype`` (default x's).
    ``p`` > 0: r through dropout first (mask from ``seed`` and ``salt``: module docstring).
    ``dw_partials``, ``programs``, ``dw_out``: the backward's dweight (:func:`add_norm_bwd`), on
    ``bwd_rows``-row tiles (default ``rows``: the backward recomputes from s and rstd, any tiling);
    ``drb_out``: also the column sums of r's gradient added there; ``loop_stages``: the backward's loop pipelined;
    ``sem``: the memory order of its atomic adds (:func:`add_norm_bwd`)."""
    return AddNormFunction.apply(x, r, w, None, eps, False, out_dtype, rows, p, seed, salt, rng4, dw_partials,
                                 programs, dw_out, None, bwd_rows, drb_out, loop_stages, sem)


def add_layer_norm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, eps: float = 1e-5,
    out_dtype: torch.dtype | None = None, rows: int = ROWS, p: float = 0.0, seed: torch.Tensor | None = None,
    salt: int = 0, rng4: bool = RNG4, dw_partials: str = "tile", programs: int | None = None,
    dw_out: torch.Tensor | None = None, db_out: torch.Tensor | None = None, bwd_rows: int | None = None,
    drb_out: torch.Tensor | None = None, loop_stages: int | None = None, sem: str = "acq_rel",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, layer_norm(x + r) * w + b), differentiable in x, r, w and b; h in ``out_dtype``; the other
    arguments as :func:`add_rms_norm`'s."""
    return AddNormFunction.apply(x, r, w, b, eps, True, out_dtype, rows, p, seed, salt, rng4, dw_partials,
                                 programs, dw_out, db_out, bwd_rows, drb_out, loop_stages, sem)
