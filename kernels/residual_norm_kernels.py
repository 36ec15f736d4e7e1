"""The fused residual-add + norm kernels: forward, and backward on row tiles or on a persistent grid.

The math, the launchers and the autograd glue are in :mod:`kernels.residual_norm`; these are its Triton kernels
(kept apart so that each module stays short). Every kernel works on (ROWS, BLOCK_N) row tiles with the row
statistics in CD (fp32; fp64 for fp64 storage) and draws the residual dropout's keep mask from Philox
(:func:`kernels.dropout_mask._keep`), so any tiling of the backward regenerates the forward's mask.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.dropout_mask import _keep
from kernels.pdl import _grid_dependency


@triton.jit
def _add_norm_fwd_kernel(X, R, W, B, S, H, RSTD, SEED, M, N, eps, salt, p, scale,
                         IS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROP: tl.constexpr, RNG4: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr, PDL: tl.constexpr = False):
    """Per row of the (ROWS, N) tile:  s = x + r  (stored; with dropout s = x + r keep scale);
    RMSNorm:    rstd = 1 / sqrt(mean(s^2) + eps),          shat = s rstd
    LayerNorm:  rstd = 1 / sqrt(mean((s - mu)^2) + eps),   shat = (s - mu) rstd,  mu = mean(s)
    h = shat w (+ b) (stored);  rstd (stored for the backward)."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    off = rows[:, None] * N + cols[None, :]
    r = tl.load(R + off, mask=mask, other=0.0).to(CD)
    if HAS_DROP:
        r = tl.where(_keep(SEED, salt, rows, N, p, ROWS, BLOCK_N, RNG4), r * scale, 0.0)
    s = tl.load(X + off, mask=mask, other=0.0).to(CD) + r
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
def _add_norm_bwd_rows(DS, DH, S, RSTD, G, GR, SEED, w, rows, cols, M, N, salt, p, scale,
                       IS_LN: tl.constexpr, HAS_DS: tl.constexpr, HAS_GR: tl.constexpr, HAS_DROP: tl.constexpr,
                       RNG4: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr):
    """g (and dr) for the rows ``rows`` of a (ROWS, BLOCK_N) tile, stored; returns (dh shat, dh, dr),
    the tile's dweight and dbias terms and dr (the branch's gradient, g with the keep mask and scale under
    dropout) in CD before it is stored, zero outside the mask."""
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    off = rows[:, None] * N + cols[None, :]
    s = tl.load(S + off, mask=mask, other=0.0).to(CD)
    dh = tl.load(DH + off, mask=mask, other=0.0).to(CD)
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
    if HAS_GR:
        if HAS_DROP:  # the mask is a function of (seed, salt, row, column) only: any tiling redraws it
            g = tl.where(_keep(SEED, salt, rows, N, p, ROWS, BLOCK_N, RNG4), g * scale, 0.0)
        tl.store(GR + off, g.to(GR.dtype.element_ty), mask=mask)
    return dh * shat, dh, g


@triton.jit
def _add_norm_bwd_kernel(DS, DH, S, W, RSTD, G, GR, DWP, DBP, SEED, M, N, salt, p, scale,
                         IS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DS: tl.constexpr,
                         HAS_GR: tl.constexpr, HAS_DROP: tl.constexpr, RNG4: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr, PDL: tl.constexpr = False):
    """Per row:  g = ds + rstd (dh w - [mean(dh w)] - shat mean(dh w shat))   ([.] LayerNorm only),
    the gradient of x (and of r without dropout); with HAS_GR dr = g (keep scale) into GR in r's
    dtype (the keep mask redrawn as in the forward); the tile's partials dw = sum_rows dh shat into DWP[pid] and
    db = sum_rows dh into DBP[pid]. The LayerNorm mean is recomputed from s (none is saved)."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(CD)
    dwt, dbt, _ = _add_norm_bwd_rows(DS, DH, S, RSTD, G, GR, SEED, w, rows, cols, M, N, salt, p, scale,
                                     IS_LN, HAS_DS, HAS_GR, HAS_DROP, RNG4, ROWS, BLOCK_N, CD)
    tl.store(DWP + pid * N + cols, tl.sum(dwt, axis=0), mask=cmask)
    if HAS_BIAS:
        tl.store(DBP + pid * N + cols, tl.sum(dbt, axis=0), mask=cmask)


@triton.jit
def _add_norm_bwd_persistent_kernel(DS, DH, S, W, RSTD, G, GR, DWP, DBP, DRB, SEED, M, N, salt, p, scale,
                                    tiles_per_program,
                                    IS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DS: tl.constexpr,
                                    HAS_GR: tl.constexpr, HAS_DROP: tl.constexpr, RNG4: tl.constexpr,
                                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, CD: tl.constexpr,
                                    ATOMIC: tl.constexpr, HAS_DRB: tl.constexpr, LOOP_STAGES: tl.constexpr = None,
                                    SEM: tl.constexpr = "acq_rel", PDL: tl.constexpr = False):
    """The same g, dr, dw, db on a persistent grid (Liger-Kernel's rms_norm backward: a few programs
    per SM). Program pid takes the ``tiles_per_program`` consecutive (ROWS, N) tiles from
    tile pid * tiles_per_program on (the last run clipped at M); per row, as the tile kernel,

        g = ds + rstd (dh w - [mean(dh w)] - shat mean(dh w shat)),   dx = g,   dr = g (keep scale)

    and over all its rows it accumulates, in (ROWS, BLOCK_N) register tiles in CD,

        acc_w += dh shat,   acc_b += dh   (LayerNorm with a bias only)

    then writes DWP[pid] = sum over the ROWS axis of acc_w and DBP[pid] likewise: one partial row
    per program for the launcher to sum (dw = sum_programs DWP, db = sum_programs DBP), instead of
    one per tile. With ATOMIC, DWP and DBP are (N,) outputs instead, and each program adds its row
    into them (DWP += sum over the ROWS axis of acc_w): the sum over programs done by atomic adds, in memory order
    SEM (kernels._common.ATOMIC_SEMS).
    HAS_DRB (with ATOMIC): also acc_r += dr, and DRB += sum over the ROWS axis of acc_r, an (N,) output: the
    column sums of the branch's gradient, which are the gradient of a bias the branch added last (the
    projection before the residual add: y = x W^T + b, db = sum_rows dy = sum_rows dr).
    The keep mask depends on (seed, salt, row, column) only: the same as the forward's. LOOP_STAGES (None: not
    pipelined): the loop over the tiles software-pipelined over that many tiles (``tl.range``'s num_stages), so
    the next tiles' loads are in flight while one is computed; the same arithmetic in the same order."""
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(CD)
    acc_w = tl.zeros((ROWS, BLOCK_N), dtype=CD)
    acc_b = tl.zeros((ROWS, BLOCK_N), dtype=CD)
    acc_r = tl.zeros((ROWS, BLOCK_N), dtype=CD)
    for i in tl.range(tiles_per_program, num_stages=LOOP_STAGES):
        rows = ((pid * tiles_per_program + i) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        dwt, dbt, drt = _add_norm_bwd_rows(DS, DH, S, RSTD, G, GR, SEED, w, rows, cols, M, N, salt, p, scale,
                                           IS_LN, HAS_DS, HAS_GR, HAS_DROP, RNG4, ROWS, BLOCK_N, CD)
        acc_w += dwt
        if HAS_BIAS:
            acc_b += dbt
        if HAS_DRB:
            acc_r += drt
    if ATOMIC:
        tl.atomic_add(DWP + cols, tl.sum(acc_w, axis=0), mask=cmask, sem=SEM)
        if HAS_BIAS:
            tl.atomic_add(DBP + cols, tl.sum(acc_b, axis=0), mask=cmask, sem=SEM)
        if HAS_DRB:
            tl.atomic_add(DRB + cols, tl.sum(acc_r, axis=0), mask=cmask, sem=SEM)
    else:
        tl.store(DWP + pid * N + cols, tl.sum(acc_w, axis=0), mask=cmask)
        if HAS_BIAS:
            tl.store(DBP + pid * N + cols, tl.sum(acc_b, axis=0), mask=cmask)
