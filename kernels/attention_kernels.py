"""The fused causal attention kernels, FlashAttention-2 style, with MQA/GQA K/V by indexing.

Algorithm: Dao 2023, "FlashAttention-2" (arXiv:2307.08691). Forward = Algorithm 1 with the
online softmax (sec. 3.1.1: running max m and sum l, one rescale of the output at the end),
logsumexp saved per row. Backward = Algorithm 2 (P recomputed from Q, K and the logsumexp;
D = rowsum(dO * O)), split into two kernels as in the Triton fused-attention tutorial: one
program per (batch, kv head, key block) accumulates dK and dV over every query block and every
query head of its group, one program per (batch, query head, query block) accumulates dQ.
Neither needs atomics, so the result is deterministic; the cost is computing Q K^T twice in the
backward. The forward and dQ kernels can pack the query heads that share a K/V head into one tile
(``PACK``, :func:`_query_program`): each K/V block they load then serves PACK heads, where one
program per head loads it PACK times (the layout of the ``PackGQA`` option of the FlashAttention repository's
Hopper kernels, FlashAttention-3). Causal programs are unequal: the forward's and dQ's query block m visits m + 1
key blocks, the dK/dV kernel's key block n visits every query block from n on. With ``HEAVY_FIRST`` the grid's
axes swap so the heaviest block of every row is launched first (CUDA starts blocks about in order of their
linear index, x fastest) and the short ones fill the tail: longest processing time first, the order of the
``SingleTileLPTScheduler`` of the FlashAttention repository's tile schedulers. With ``PAIRED`` the dK/dV kernel's
program j takes key blocks j and n - 1 - j instead, so that every program has the same causal work: the pairing
of chunks i and 2N - 1 - i that balances causal attention over N ranks in context parallelism (Llama 3 paper,
arXiv:2407.21783, sec. 3.3.2). Launchers, autograd functions and modules: :mod:`kernels.attention`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.pdl import _grid_dependency


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with fp32 (or fp64) accumulation. UPCAST multiplies in fp32 instead: the Triton
    3.9 CPU interpreter mis-computes bf16 tl.dot, and bf16 x bf16 products are exact in fp32,
    so the result is the same as a tensor core's bf16 MMA with fp32 accumulation."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _query_program(nh, group, T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HS: tl.constexpr,
                   PACK: tl.constexpr = 1, HEAVY_FIRST: tl.constexpr = False):
    """Where a program of a (query blocks, B * nh / PACK) grid works: its query block's index, batch, query
    head(s) and the K/V head it reads (h // group: MQA/GQA by indexing, no copy), the batch and heads as
    int64 since they scale the pointer offsets; its rows' positions, a key block's columns, the head dims,
    and which rows are inside T. HEAVY_FIRST: the grid is (B * nh / PACK, query blocks), and its first
    programs on the blocks axis take the last query block, which visits the most key blocks.

    PACK = 1: the block's BLOCK_M rows are BLOCK_M positions of one head (h a scalar). PACK > 1 (a
    power of two dividing ``group``): they are BLOCK_M / PACK positions times PACK heads of one K/V
    group, row r at position r // PACK of head h0 + r % PACK (h a vector), so the heads of a position
    are adjacent rows; causal masks and row offsets read the positions."""
    if HEAVY_FIRST:
        start_m = tl.num_programs(1) - 1 - tl.program_id(1)
        bh = tl.program_id(0)  # (batch, block of PACK query heads)
    else:
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // (nh // PACK)
    h0 = (bh % (nh // PACK)) * PACK
    rows = tl.arange(0, BLOCK_M)
    if PACK == 1:
        h = h0
        offs_m = start_m * BLOCK_M + rows
    else:
        h = h0 + rows % PACK  # (BLOCK_M,)
        offs_m = start_m * (BLOCK_M // PACK) + rows // PACK  # (BLOCK_M,) positions
    return (start_m, b.to(tl.int64), h.to(tl.int64), (h0 // group).to(tl.int64), offs_m,
            tl.arange(0, BLOCK_N), tl.arange(0, HS), offs_m < T)


@triton.jit
def _key_program(HEAVY_FIRST: tl.constexpr):
    """A dK/dV program's key block and its row of the grid (the batch, K/V head and whatever else the kernel
    lays out there): the grid is (key blocks, rows), or with HEAVY_FIRST (rows, key blocks), so that the
    programs of key block 0, which sees every query block, launch first."""
    if HEAVY_FIRST:
        start_n = tl.program_id(1)
        row = tl.program_id(0)
    else:
        start_n = tl.program_id(0)
        row = tl.program_id(1)
    return start_n, row


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, Out, LSE,  # Q, Out: (B, nh, T, HS); K, V: (B, nkv, T, HS); LSE: (B, nh, T) in CD
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    nh, T, qk_scale, group,  # qk_scale = softmax scale * log2(e); group = nh // nkv
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, PACK: tl.constexpr, HEAVY_FIRST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program per (query block of BLOCK_M rows, batch * query head; PACK heads per block where PACK
    > 1, :func:`_query_program`). With s = q k^T * scale
    in base-2 units (s2 = s * log2 e), for each key block j up to the diagonal:

        m_new = max(m, rowmax(s2_j));  p = exp2(s2_j - m_new);  alpha = exp2(m - m_new)
        l = alpha l + rowsum(p);  acc = alpha acc + p v_j;  m = m_new

    then o = acc / l and lse2 = m + log2(l) (FlashAttention-2 Alg. 1; the division by l is
    deferred to the end, sec. 3.1.1). Keys beyond the diagonal block are never loaded
    (causal block skipping); the causal and T masks are applied as -inf before the max.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_m, b, h, kvh, offs_m, offs_n, offs_d, row_ok = _query_program(nh, group, T, BLOCK_M, BLOCK_N, HS, PACK,
                                                                        HEAVY_FIRST)
    q_ptrs = Q + b * sqb + (h * sqh + offs_m * sqt)[:, None] + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, HS)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh

    m_i = tl.full((BLOCK_M,), float("-inf"), CD)
    l_i = tl.zeros((BLOCK_M,), CD)
    acc = tl.zeros((BLOCK_M, HS), CD)
    hi = tl.minimum((start_m + 1) * (BLOCK_M // PACK), T)  # causal: keys <= the block's last query
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)  # (HS, BN)
        s = _dot(q, kt, PREC, UPCAST).to(CD) * qk_scale  # (BLOCK_M, BLOCK_N), base-2 units
        keep = (offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is in the first block for every row
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=cols[:, None] < T, other=0.0)  # (BN, HS)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC, UPCAST).to(CD)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + b * sob + (h * soh + offs_m * sot)[:, None] + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(LSE + (b * nh + h) * T + offs_m, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, Out, DO, LSE, DELTA, DQ,  # DELTA: (B, nh, T) written here, read by the dK/dV kernel
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sdob, sdoh, sdot, sdqb, sdqh, sdqt,
    nh, T, qk_scale, sm_scale, group,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, PACK: tl.constexpr, HEAVY_FIRST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """dQ for one (query block, batch * head; PACK heads per block as in the forward), FlashAttention-2
    Alg. 2 restricted to dQ:

        D = rowsum(dO * O)  (stored for the dK/dV kernel: this kernel is its preprocessing)
        P = exp2(s2 - lse2),  dP = dO V^T,  dS = P * (dP - D),  dQ = scale * dS K
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_m, b, h, kvh, offs_m, offs_n, offs_d, row_ok = _query_program(nh, group, T, BLOCK_M, BLOCK_N, HS, PACK,
                                                                        HEAVY_FIRST)
    q = tl.load(Q + b * sqb + (h * sqh + offs_m * sqt)[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * sdob + (h * sdoh + offs_m * sdot)[:, None] + offs_d[None, :], mask=row_ok[:, None],
                 other=0.0)
    o = tl.load(Out + b * sob + (h * soh + offs_m * sot)[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    delta = tl.sum(do.to(CD) * o.to(CD), axis=1)  # (BLOCK_M,)
    tl.store(DELTA + (b * nh + h) * T + offs_m, delta, mask=row_ok)
    lse = tl.load(LSE + (b * nh + h) * T + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh

    dq = tl.zeros((BLOCK_M, HS), CD)
    hi = tl.minimum((start_m + 1) * (BLOCK_M // PACK), T)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)  # (HS, BN)
        vt = tl.load(v_base + cols[None, :] * svt + offs_d[:, None], mask=cols[None, :] < T, other=0.0)  # (HS, BN)
        s = _dot(q, kt, PREC, UPCAST).to(CD) * qk_scale
        keep = (offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T) & row_ok[:, None]
        p = tl.where(keep, tl.exp2(s - lse[:, None]), 0.0)
        dp = _dot(do, vt, PREC, UPCAST).to(CD)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kt.dtype), tl.trans(kt), PREC, UPCAST).to(CD)
    dq = dq * sm_scale
    tl.store(DQ + b * sdqb + (h * sdqh + offs_m * sdqt)[:, None] + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _dkdv_block(
    start_n, Q, K, V, Out, DO, LSE, DELTA, DK, DV,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sdob, sdoh, sdot,
    nh, nkv, T, qk_scale, sm_scale, group, n_split, b, kvh, sp,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, DELTA_HERE: tl.constexpr,
):
    """One key block of the dK/dV kernel below (``start_n``, for batch b, K/V head kvh and split sp): its sums
    over the split's query heads and the query blocks at or after it, written to its slice of DK and DV."""
    heads = group // n_split
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HS)
    col_ok = offs_n < T
    k = tl.load(K + b * skb + kvh * skh + offs_n[:, None] * skt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b * svb + kvh * svh + offs_n[:, None] * svt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, HS), CD)
    dv = tl.zeros((BLOCK_N, HS), CD)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M  # first query block that sees these keys
    for g in range(0, heads):
        h = kvh * group + sp * heads + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
        row_base = (b * nh + h) * T
        for start_m in range(lo, T, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < T
            q = tl.load(q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(do_base + offs_m[:, None] * sdot + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            lse = tl.load(LSE + row_base + offs_m, mask=row_ok, other=0.0)
            if DELTA_HERE:
                o = tl.load(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], mask=row_ok[:, None],
                            other=0.0)
                delta = tl.sum(do.to(CD) * o.to(CD), axis=1)  # (BLOCK_M,), as the dQ kernel forms it
            else:
                delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
            st = _dot(k, tl.trans(q), PREC, UPCAST).to(CD) * qk_scale  # (BLOCK_N, BLOCK_M)
            keep = (offs_m[None, :] >= offs_n[:, None]) & row_ok[None, :] & col_ok[:, None]
            pt = tl.where(keep, tl.exp2(st - lse[None, :]), 0.0)
            dv += _dot(pt.to(do.dtype), do, PREC, UPCAST).to(CD)
            dpt = _dot(v, tl.trans(do), PREC, UPCAST).to(CD)
            dst = pt * (dpt - delta[None, :])
            dk += _dot(dst.to(q.dtype), q, PREC, UPCAST).to(CD)
    dk = dk * sm_scale
    out = ((b * nkv + kvh) * n_split + sp) * T * HS + offs_n[:, None] * HS + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, Out, DO, LSE, DELTA, DK, DV,  # DK, DV: (B, nkv * n_split, T, HS) contiguous
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sdob, sdoh, sdot,
    nh, nkv, T, qk_scale, sm_scale, group, n_split,
    HS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, CD: tl.constexpr, DELTA_HERE: tl.constexpr,
    HEAVY_FIRST: tl.constexpr = False, PAIRED: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """dK, dV for one (key block, batch * kv head), summed over the group's query heads:

        for h in group, for query blocks i at or after the key block (causal):
            P^T = exp2(s2^T - lse2),  dV += P^T dO,  dP^T = V dO^T,
            dS^T = P^T * (dP^T - D),  dK += scale * dS^T Q

    FlashAttention-2 Alg. 2's outer loop over key blocks (sec. 3.1.2 parallelizes the
    backward over the sequence this way); the extra loop over the group's heads replaces
    the atomics (or the expanded K/V and a reduction) that MQA/GQA would otherwise need.
    With ``n_split`` > 1 the group's heads are dealt to n_split programs (group / n_split
    heads each), each writing its partial dK, dV to its own slice, summed by the launcher:
    for MQA at B=32, T=256 one program per (key block, batch) is only 128 programs, under
    one per SM, each looping over 8 heads; splitting restores the parallelism.
    With ``DELTA_HERE`` it forms D = rowsum(dO * O) of each query block itself from ``Out``, as the
    dQ kernel does, instead of reading the D that kernel stored: the two kernels then share no
    data and may run at the same time (on two streams; the launcher's ``concurrent``).
    With ``PAIRED`` (a grid of ceil(n / 2) key-block slots for n key blocks) program j takes key blocks j and
    n - 1 - j, one after the other: with square tiles they visit n - j and j + 1 query blocks, n + 1 together,
    so every program has the same causal work where one per key block ranges from 1 to n visits and the
    kernel waits for its longest program. The sums of each key block are the same as without pairing.
    """
    _grid_dependency(PDL)  # first, before any load or store (kernels/pdl.py)
    start_n, bks = _key_program(HEAVY_FIRST)  # bks: (batch, kv head, split)
    sp = bks % n_split
    bk = bks // n_split
    b = (bk // nkv).to(tl.int64)
    kvh = (bk % nkv).to(tl.int64)
    _dkdv_block(start_n, Q, K, V, Out, DO, LSE, DELTA, DK, DV, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                sob, soh, sot, sdob, sdoh, sdot, nh, nkv, T, qk_scale, sm_scale, group, n_split, b, kvh, sp,
                HS, BLOCK_M, BLOCK_N, PREC, UPCAST, CD, DELTA_HERE)
    if PAIRED:
        partner = tl.cdiv(T, BLOCK_N) - 1 - start_n
        if partner != start_n:  # an odd count's middle block has no partner
            _dkdv_block(partner, Q, K, V, Out, DO, LSE, DELTA, DK, DV, sqb, sqh, sqt, skb, skh, skt, svb, svh,
                        svt, sob, soh, sot, sdob, sdoh, sdot, nh, nkv, T, qk_scale, sm_scale, group, n_split, b,
                        kvh, sp, HS, BLOCK_M, BLOCK_N, PREC, UPCAST, CD, DELTA_HERE)
