"""Residual add fused with the norm that follows it (RMSNorm or LayerNorm), forward and backward.

kernels (``_add_norm_fwd_kernel``, ``_add_norm_bwd_kernel``) -> launchers (``add_norm_fwd``,
``add_norm_bwd``) -> ``AddNormFunction`` -> :func:`add_rms_norm`, :func:`add_layer_norm`.
References: :func:`ftlib.reference.add_rms_norm_ref`, :func:`ftlib.reference.add_layer_norm_ref`.
Used by ``ftlib.engine`` (``fuse_residual_norm``; measured on the H200 in engine round 3: FT tf32
2.83 -> 2.44 ms per step with the packed attention, data/results/h200/engine.jsonl).

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
row-per-program norm kernels were latency-bound in a graph: kernels/dev/NOTES.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_tensor, compute_dtype, row_tile_warps, same_device

# Rows per program, with one warp per 1,024 elements (kernels.jsonl, H200, 8192 x 256 fwd+bwd in a
# graph, residual + RMSNorm fp32 / bf16: 4 rows 31.9 / 26.3 us, 8 rows 36.6 / 27.1, 16 rows 34.5 /
# 32.3; + LayerNorm: 4 rows 41.5 / 37.3, 16 rows 47.6 / 48.5). 16 rows was the round-3/4 default.
ROWS = 4


@triton.jit
def _add_norm_fwd_kernel(X, R, W, B, S, H, RSTD, M, N, eps,
                         IS_LN: tl.constexpr, HAS_BIAS: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """Per row of the (ROWS, N) tile:  s = x + r  (stored);
    RMSNorm:    rstd = 1 / sqrt(mean(s^2) + eps),          shat = s rstd
    LayerNorm:  rstd = 1 / sqrt(mean((s - mu)^2) + eps),   shat = (s - mu) rstd,  mu = mean(s)
    h = shat w (+ b) (stored);  rstd (stored for the backward)."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    off = rows[:, None] * N + cols[None, :]
    s = tl.load(X + off, mask=mask, other=0.0).to(CD) + tl.load(R + off, mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(CD)
    if IS_LN:
        mu = tl.sum(s, axis=1) / N
        xc = tl.where(mask, s - mu[:, None], 0.0)  # padding columns must not enter the variance
    else:
        xc = s
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    h = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        h += tl.load(B + cols, mask=cmask, other=0.0).to(CD)[None, :]
    tl.store(S + off, s.to(S.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)
    tl.store(H + off, h.to(H.dtype.element_ty), mask=mask)


@triton.jit
def _add_norm_bwd_kernel(DS, DH, S, W, RSTD, G, DWP, DBP, M, N,
                         IS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DS: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """Per row:  g = ds + rstd (dh w - [mean(dh w)] - shat mean(dh w shat))   ([.] LayerNorm only),
    the gradient of both x and r; the tile's partials dw = sum_rows dh shat into DWP[pid] and
    db = sum_rows dh into DBP[pid]. The LayerNorm mean is recomputed from s (none is saved)."""
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    off = rows[:, None] * N + cols[None, :]
    s = tl.load(S + off, mask=mask, other=0.0).to(CD)
    dh = tl.load(DH + off, mask=mask, other=0.0).to(CD)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(CD)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0).to(CD)
    if IS_LN:
        mu = tl.sum(s, axis=1) / N
        shat = tl.where(mask, (s - mu[:, None]) * rstd[:, None], 0.0)
    else:
        shat = s * rstd[:, None]
    dhw = dh * w[None, :]
    c = tl.sum(dhw * shat, axis=1) / N
    if IS_LN:
        g = rstd[:, None] * (dhw - (tl.sum(dhw, axis=1) / N)[:, None] - shat * c[:, None])
    else:
        g = rstd[:, None] * (dhw - shat * c[:, None])
    if HAS_DS:
        g += tl.load(DS + off, mask=mask, other=0.0).to(CD)
    tl.store(G + off, g.to(G.dtype.element_ty), mask=mask)
    tl.store(DWP + pid * N + cols, tl.sum(dh * shat, axis=0), mask=cmask)
    if HAS_BIAS:
        tl.store(DBP + pid * N + cols, tl.sum(dh, axis=0), mask=cmask)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s, h, rstd): s = x + r, h = norm(s) over the last dim; contiguous x and r.

    ``layer_norm``: LayerNorm (mean removed, optional bias ``b``) instead of RMSNorm (``b`` must be
    None). s takes x's dtype (the residual stream's; under bf16 autocast r may be bf16 and is
    added in fp32 inside the kernel, as ``x + r`` would promote it). h takes ``out_dtype`` (default
    x's): under bf16 autocast the next op is a Linear that casts h to bf16 anyway, so writing h
    in bf16 here gives the same values (h is computed in fp32 and rounded once either way) and
    saves the cast kernel forward and the cast of its gradient backward. ``rows``: rows per
    program, a power of two (kernels/dev/residual_norm_dev.py times others).
    """
    _check(x, r, w, b)
    if b is not None and not layer_norm:
        raise ValueError("a bias is only defined for LayerNorm (layer_norm=True)")
    N = x.shape[-1]
    M = x.numel() // max(N, 1)
    s, h = torch.empty_like(x), torch.empty_like(x, dtype=out_dtype or x.dtype)
    rstd = torch.empty(M, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    if M > 0:
        block_n = triton.next_power_of_2(N)
        _add_norm_fwd_kernel[(triton.cdiv(M, rows),)](
            x, r, w, b if b is not None else w, s, h, rstd, M, N, eps,
            IS_LN=layer_norm, HAS_BIAS=b is not None, ROWS=rows, BLOCK_N=block_n,
            CD=compute_dtype(x.dtype), num_warps=row_tile_warps(rows, block_n))
    return s, h, rstd


def add_norm_bwd(
    ds: torch.Tensor | None, dh: torch.Tensor, s: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
    layer_norm: bool, has_bias: bool, rows: int = ROWS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(g, dweight, dbias or None): g is the gradient of both x and r; ``ds`` None when s feeds only the norm."""
    N = s.shape[-1]
    M = s.numel() // max(N, 1)
    dh = dh.contiguous()
    ds = ds.contiguous() if ds is not None else None
    g = torch.empty_like(s)
    if M == 0:
        return g, torch.zeros_like(w), torch.zeros_like(w) if has_bias else None
    grid = triton.cdiv(M, rows)
    block_n = triton.next_power_of_2(N)
    dwp = torch.empty((grid, N), dtype=rstd.dtype, device=s.device)
    dbp = torch.empty((grid, N), dtype=rstd.dtype, device=s.device) if has_bias else dwp
    _add_norm_bwd_kernel[(grid,)](ds if ds is not None else dh, dh, s, w, rstd, g, dwp, dbp, M, N,
                                  IS_LN=layer_norm, HAS_BIAS=has_bias, HAS_DS=ds is not None, ROWS=rows,
                                  BLOCK_N=block_n, CD=compute_dtype(s.dtype),
                                  num_warps=row_tile_warps(rows, block_n))
    return g, dwp.sum(0).to(w.dtype), dbp.sum(0).to(w.dtype) if has_bias else None


class AddNormFunction(torch.autograd.Function):
    """Two outputs, (s, h); autograd hands the backward both gradients, so their sum is fused."""

    @staticmethod
    def forward(ctx, x, r, w, b, eps, layer_norm, out_dtype=None, rows=ROWS):
        s, h, rstd = add_norm_fwd(x.contiguous(), r.contiguous(), w, b, eps, layer_norm, out_dtype, rows)
        ctx.save_for_backward(s, w, rstd)
        ctx.r_dtype, ctx.layer_norm, ctx.has_bias, ctx.rows = r.dtype, layer_norm, b is not None, rows
        ctx.set_materialize_grads(False)  # an unused s arrives as None, not as a tensor of zeros
        return s, h

    @staticmethod
    def backward(ctx, ds, dh):
        s, w, rstd = ctx.saved_tensors
        if dh is None:  # h unused: s's gradient passes through to x and r
            return ds, None if ds is None else ds.to(ctx.r_dtype), None, None, None, None, None, None
        # dh may be bf16: loaded as fp32
        g, dw, db = add_norm_bwd(ds, dh, s, w, rstd, ctx.layer_norm, ctx.has_bias, ctx.rows)
        return g, g.to(ctx.r_dtype), dw, db, None, None, None, None


def add_rms_norm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = 1e-5, out_dtype: torch.dtype | None = None,
    rows: int = ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, rms_norm(x + r) * w), differentiable in x, r and w; h in ``out_dtype`` (default x's)."""
    return AddNormFunction.apply(x, r, w, None, eps, False, out_dtype, rows)


def add_layer_norm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, eps: float = 1e-5,
    out_dtype: torch.dtype | None = None, rows: int = ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, layer_norm(x + r) * w + b), differentiable in x, r, w and b; h in ``out_dtype``."""
    return AddNormFunction.apply(x, r, w, b, eps, True, out_dtype, rows)
