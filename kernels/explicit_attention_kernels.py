"""GPT-2's explicit attention with its probabilities written, fused with the two products around them.

GPT-2 as written (Radford et al. 2019; nanoGPT's ``CausalSelfAttention`` without flash) computes

    S = q k^T,  P = softmax(scale * S + causal mask)  (written: (B, nh, T, T)),  O = P v

and its backward from the stored P (the softmax Jacobian, Bridle 1990):

    dV = P^T dO,  dP = dO v^T,  dS = P * (dP - rowsum(P * dP)),  dq = scale * dS k,  dk = scale * dS^T q

On PyTorch ops that is a batched GEMM writing S, a softmax kernel reading S and writing P, a batched
GEMM reading P (and the layout copies the batched GEMMs need around strided q, k, v), and five more
kernels backward, each moving a (T, T) tensor per head. Here the same function runs as three kernels,
written after the FlashAttention-2 kernels (``kernels.attention_kernels``: the same tiling, grids and
the same two-kernel backward without atomics) but with P stored as GPT-2 stores it and read back:

* forward, one program per (query block, batch * head): pass 1 takes each row's max m and sum l over
  the keys up to the diagonal (online, Milakov & Gimelshein 2018); pass 2 recomputes the scores,
  writes P = exp(s - m) / l for every key (zeros above the diagonal, as GPT-2's masked softmax
  writes them) and accumulates O = P v from P as stored (GPT-2 multiplies the stored P by v).
* backward, dQ kernel, one program per (query block, batch * head), two passes over the key blocks:
  D = rowsum(P * dP) from the stored P, as the softmax backward computes it (FlashAttention-2's
  rowsum(dO * O), Dao 2023 sec. 3.1.2, is equal in exact arithmetic, but with P rounded to bf16 and O
  stored in bf16 it is not the D of that P, and dS = P * (dP - D) cancels), then
  dS = P * (dO v^T - D), dq += dS k.
* backward, dK/dV kernel, one program per (key block, batch * kv head), over the group's query heads
  and the query blocks at or after the key block: dV += P^T dO, dK += (P^T * (v dO^T - D)) q.

``HEAVY_FIRST`` swaps each grid's axes so every row's causal block with the most work is launched first, as
in the flash kernels (``kernels.attention_kernels``): the two-pass forward's and dQ's last query block, the
dK/dV kernel's first key block.

The scores S, the gradients dP and dS never reach memory; P is written once and read back three times
(its lower triangle: the upper one is known to be zero).

One pass, where a key tile spans the whole row (T up to a few hundred): the forward and the dQ kernel
above pass over the keys twice because a row's max and sum (forward) or D (backward) must be known
before P or dS can be formed from a key block. With every key of the row in one tile the two passes
are one: the forward forms s = q k^T for the whole row, takes its max and sum, writes the row of P (its
zeros above the diagonal in the same store) and multiplies it by v; the dQ kernel loads the row of P
once, forms dP = dO v^T, D = rowsum(P * dP) from it, dS and dq. Each q k^T (forward) and dO v^T and P
load (backward) happens once instead of twice; the price is a row-long tile in registers and products
over the keys past the diagonal block, which are masked to zero (never loaded).

Bias gradient (``HAS_DB``): GPT-2's qkv projection adds a bias b, so db = the column sums of d(qkv) =
[dq | dk | dv] over the batch and the sequence. The backward kernels hold every value of dq, dk and dv once,
so each can add its tile's column sums (of the values as stored, as a column-sum kernel would read them)
into db with atomic adds instead of a column-sum kernel reading d(qkv) back: dq's into db[h hs : (h+1) hs],
dk's and dv's into the K and V heads' slices. The sums' order is not fixed (atomics). The K heads' sums are
zero in exact arithmetic (each row of dS sums to zero: a key bias shifts a whole row of scores, which the
softmax ignores); they are added as computed, as the column-sum kernel would add them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_kernels import _dot, _key_program, _query_program
from kernels.pdl import _grid_dependency


@triton.jit
def _add_col_sums(db_ptrs, tile, rows_ok):
    """db_ptrs[d] += sum over the tile's valid rows of tile[:, d], in fp32 (atomic: other programs add to the
    same columns)."""
    tl.atomic_add(db_ptrs, tl.sum(tl.where(rows_ok[:, None], tile.to(tl.float32), 0.0), axis=0))


@triton.jit
def _explicit_attn_fwd_kernel(
    Q, K, V, Out, P,  # Q, Out: (B, nh, T, HS) strided; K, V: (B, nkv, T, HS) strided; P: (B, nh, T, T) contiguous
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    nh, T, qk_scale, group,  # qk_scale = softmax scale * log2(e); group = nh // nkv
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, HEAVY_FIRST: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """P and O for one (query block, batch * head). In base-2 units s2 = s * log2 e:

        pass 1 (keys <= diagonal):  m = max_j s2_j,  l = sum_j exp2(s2_j - m)   (online)
        pass 2 (every key):         P_j = exp2(s2_j - m) / l  (0 above the diagonal), stored;
                                    O = sum_j P_j v_j  with P_j as stored (rounded to P's dtype)
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_m, b, h, kvh, offs_m, offs_n, offs_d, row_ok = _query_program(nh, group, T, BLOCK_M, BLOCK_N, HS, 1,
                                                                        HEAVY_FIRST)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    p_rows = P + (b * nh + h) * T * T + offs_m[:, None].to(tl.int64) * T  # (BLOCK_M, 1) row starts

    m_i = tl.full((BLOCK_M,), float("-inf"), CD)
    l_i = tl.zeros((BLOCK_M,), CD)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)  # causal: keys <= the block's last query
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)  # (HS, BN)
        s = _dot(q, kt, PREC, UPCAST).to(CD) * qk_scale  # (BLOCK_M, BLOCK_N)
        s = tl.where((offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is in the first block for every row
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), axis=1)
        m_i = m_new
    inv_l = 1.0 / l_i

    acc = tl.zeros((BLOCK_M, HS), CD)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)
        s = _dot(q, kt, PREC, UPCAST).to(CD) * qk_scale
        keep = (offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T)
        p = tl.where(keep, tl.exp2(s - m_i[:, None]) * inv_l[:, None], 0.0).to(P.dtype.element_ty)
        tl.store(p_rows + cols[None, :], p, mask=row_ok[:, None] & (cols[None, :] < T))
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=cols[:, None] < T, other=0.0)  # (BN, HS)
        acc += _dot(p.to(v.dtype), v, PREC, UPCAST).to(CD)
    zeros = tl.zeros((BLOCK_M, BLOCK_N), P.dtype.element_ty)
    for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, T, BLOCK_N):  # key blocks above the diagonal
        cols = start_n + offs_n
        tl.store(p_rows + cols[None, :], zeros, mask=row_ok[:, None] & (cols[None, :] < T))
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _explicit_attn_bwd_dq_kernel(
    K, V, DO, P, DELTA, DQ, DB,  # DELTA: (B, nh, T) written here, read by the dK/dV kernel; DB: (C + 2 nkv HS,) fp32
    skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot, sdqb, sdqh, sdqt,
    nh, T, sm_scale, group,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, HAS_DB: tl.constexpr,
    HEAVY_FIRST: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """dq for one (query block, batch * head) from the stored P, in two passes over the key blocks:

        pass 1:  D = rowsum(P * dP) with dP = dO v^T   (stored for the dK/dV kernel)
        pass 2:  dS = P * (dP - D),  dq = scale * dS k;   HAS_DB: db[h hs + d] += sum_rows dq[:, d]
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_m, b, h, kvh, offs_m, offs_n, offs_d, row_ok = _query_program(nh, group, T, BLOCK_M, BLOCK_N, HS, 1,
                                                                        HEAVY_FIRST)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdot + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    p_rows = P + (b * nh + h) * T * T + offs_m[:, None].to(tl.int64) * T
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)

    delta = tl.zeros((BLOCK_M,), CD)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        keep = (offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T) & row_ok[:, None]
        p = tl.load(p_rows + cols[None, :], mask=keep, other=0.0).to(CD)  # (BLOCK_M, BLOCK_N), as stored
        vt = tl.load(v_base + cols[None, :] * svt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)  # (HS, BN)
        delta += tl.sum(p * _dot(do, vt, PREC, UPCAST).to(CD), axis=1)
    tl.store(DELTA + (b * nh + h) * T + offs_m, delta, mask=row_ok)

    dq = tl.zeros((BLOCK_M, HS), CD)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        keep = (offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T) & row_ok[:, None]
        p = tl.load(p_rows + cols[None, :], mask=keep, other=0.0).to(CD)
        vt = tl.load(v_base + cols[None, :] * svt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)
        ds = p * (_dot(do, vt, PREC, UPCAST).to(CD) - delta[:, None])
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)
        dq += _dot(ds.to(kt.dtype), tl.trans(kt), PREC, UPCAST).to(CD)
    dq = dq * sm_scale
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None])
    if HAS_DB:
        _add_col_sums(DB + h * HS + offs_d, dq.to(DQ.dtype.element_ty), row_ok)


@triton.jit
def _explicit_attn_bwd_dkdv_kernel(
    Q, V, DO, P, DELTA, DK, DV, DB,  # DK, DV: (B, nkv, T, HS) strided; DB: (C + 2 nkv HS,) fp32
    sqb, sqh, sqt, svb, svh, svt, sdob, sdoh, sdot, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
    nh, nkv, T, sm_scale, group,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, HAS_DB: tl.constexpr,
    HEAVY_FIRST: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """dk, dv for one (key block, batch * kv head), over the group's query heads and the query blocks
    at or after the key block (causal), from the stored P read transposed:

        dV += P^T dO,  dS^T = P^T * (v dO^T - D),  dK += scale * dS^T q
        HAS_DB: db[(nh + kvh) hs + d] += sum_rows dk[:, d],  db[(nh + nkv + kvh) hs + d] += sum_rows dv[:, d]
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_n, bk = _key_program(HEAVY_FIRST)  # bk: (batch, kv head)
    b = (bk // nkv).to(tl.int64)
    kvh = (bk % nkv).to(tl.int64)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HS)
    col_ok = offs_n < T
    v = tl.load(V + b * svb + kvh * svh + offs_n[:, None] * svt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, HS), CD)
    dv = tl.zeros((BLOCK_N, HS), CD)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M  # first query block that sees these keys
    for g in range(0, group):
        h = kvh * group + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
        row_base = (b * nh + h) * T
        p_base = P + row_base * T
        for start_m in range(lo, T, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < T
            keep = (offs_m[None, :] >= offs_n[:, None]) & row_ok[None, :] & col_ok[:, None]
            pt = tl.load(p_base + offs_m[None, :].to(tl.int64) * T + offs_n[:, None], mask=keep, other=0.0)  # (BN, BM)
            do = tl.load(do_base + offs_m[:, None] * sdot + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            q = tl.load(q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
            dv += _dot(pt.to(do.dtype), do, PREC, UPCAST).to(CD)
            dst = pt.to(CD) * (_dot(v, tl.trans(do), PREC, UPCAST).to(CD) - delta[None, :])
            dk += _dot(dst.to(q.dtype), q, PREC, UPCAST).to(CD)
    dk = dk * sm_scale
    tl.store(DK + b * sdkb + kvh * sdkh + offs_n[:, None] * sdkt + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=col_ok[:, None])
    tl.store(DV + b * sdvb + kvh * sdvh + offs_n[:, None] * sdvt + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=col_ok[:, None])
    if HAS_DB:
        _add_col_sums(DB + (nh + kvh) * HS + offs_d, dk.to(DK.dtype.element_ty), col_ok)
        _add_col_sums(DB + (nh + nkv + kvh) * HS + offs_d, dv.to(DV.dtype.element_ty), col_ok)


@triton.jit
def _explicit_attn_fwd_one_pass_kernel(
    Q, K, V, Out, P,  # as _explicit_attn_fwd_kernel
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    nh, T, qk_scale, group,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  # BLOCK_N >= T: the whole row
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, HEAVY_FIRST: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """P and O for one (query block, batch * head), every key of the rows in one tile, in one pass:

        s2 = q k^T * scale * log2 e   (-inf above the diagonal and past T),   m = rowmax(s2)
        P = exp2(s2 - m) / rowsum(exp2(s2 - m))   stored for the whole row (zeros above the diagonal)
        O = P v  with P as stored
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_m, b, h, kvh, offs_m, offs_t, offs_d, row_ok = _query_program(nh, group, T, BLOCK_M, BLOCK_N, HS, 1,
                                                                        HEAVY_FIRST)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)  # causal: keys <= the block's last query are loaded
    kt = tl.load(K + b * skb + kvh * skh + offs_t[None, :] * skt + offs_d[:, None], mask=offs_t[None, :] < hi,
                 other=0.0)  # (HS, BLOCK_N)
    s = _dot(q, kt, PREC, UPCAST).to(CD) * qk_scale  # (BLOCK_M, BLOCK_N)
    keep = (offs_m[:, None] >= offs_t[None, :]) & (offs_t[None, :] < T)
    s = tl.where(keep, s, float("-inf"))
    m = tl.max(s, axis=1)  # finite: key 0 is kept for every row
    e = tl.exp2(s - m[:, None])  # 0 where masked
    p = (e * (1.0 / tl.sum(e, axis=1))[:, None]).to(P.dtype.element_ty)
    p_rows = P + (b * nh + h) * T * T + offs_m[:, None].to(tl.int64) * T  # (BLOCK_M, 1) row starts
    tl.store(p_rows + offs_t[None, :], p, mask=row_ok[:, None] & (offs_t[None, :] < T))
    v = tl.load(V + b * svb + kvh * svh + offs_t[:, None] * svt + offs_d[None, :], mask=offs_t[:, None] < hi,
                other=0.0)  # (BLOCK_N, HS)
    o = _dot(p.to(v.dtype), v, PREC, UPCAST).to(CD)
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], o.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _explicit_attn_bwd_dq_one_pass_kernel(
    K, V, DO, P, DELTA, DQ, DB,  # as _explicit_attn_bwd_dq_kernel
    skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot, sdqb, sdqh, sdqt,
    nh, T, sm_scale, group,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  # BLOCK_N >= T: the whole row
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, HAS_DB: tl.constexpr,
    HEAVY_FIRST: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """dq for one (query block, batch * head) from the stored P, every key of the rows in one tile:

        dP = dO v^T,  D = rowsum(P * dP)  (stored for the dK/dV kernel),  dS = P * (dP - D),  dq = scale * dS k
        HAS_DB: db[h hs + d] += sum_rows dq[:, d]
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_m, b, h, kvh, offs_m, offs_t, offs_d, row_ok = _query_program(nh, group, T, BLOCK_M, BLOCK_N, HS, 1,
                                                                        HEAVY_FIRST)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdot + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)
    keep = (offs_m[:, None] >= offs_t[None, :]) & (offs_t[None, :] < T) & row_ok[:, None]
    p_rows = P + (b * nh + h) * T * T + offs_m[:, None].to(tl.int64) * T
    p = tl.load(p_rows + offs_t[None, :], mask=keep, other=0.0).to(CD)  # (BLOCK_M, BLOCK_N), as stored
    vt = tl.load(V + b * svb + kvh * svh + offs_t[None, :] * svt + offs_d[:, None], mask=offs_t[None, :] < hi,
                 other=0.0)  # (HS, BLOCK_N)
    dp = _dot(do, vt, PREC, UPCAST).to(CD)
    delta = tl.sum(p * dp, axis=1)
    tl.store(DELTA + (b * nh + h) * T + offs_m, delta, mask=row_ok)
    ds = p * (dp - delta[:, None])
    k = tl.load(K + b * skb + kvh * skh + offs_t[:, None] * skt + offs_d[None, :], mask=offs_t[:, None] < hi,
                other=0.0)  # (BLOCK_N, HS)
    dq = _dot(ds.to(k.dtype), k, PREC, UPCAST).to(CD) * sm_scale
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None])
    if HAS_DB:
        _add_col_sums(DB + h * HS + offs_d, dq.to(DQ.dtype.element_ty), row_ok)
