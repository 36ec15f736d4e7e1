"""Where the FLOPs and bytes of one training step go, component by component.

From a :class:`~ftlib.model.config.ModelConfig`, a batch ``B`` and a sequence length ``T``,
:func:`rows` lists, per layer and per component, for the forward pass, the backward pass
and the optimizer step: FLOPs, bytes of DRAM traffic, parameters, activation memory
saved for backward, and arithmetic intensity (FLOP per byte).

Conventions (read these before quoting a number)
------------------------------------------------
* **Matmul FLOPs** are ``2 m n k`` for an (m, k) @ (k, n) product: one multiply and one
  add per term, the convention of Kaplan et al. 2020 (sec. 2.1), Narayanan et al. 2021
  and PaLM (Chowdhery et al. 2022, app. B). Backward matmuls cost 2x forward: each
  ``Y = X W`` needs ``dX = dY Wᵀ`` and ``dW = Xᵀ dY`` (Kaplan et al. 2020 sec. 2.1,
  "the backwards pass is approximately twice the compute of the forwards pass", whence
  the "6N" rule).
* **Elementwise FLOPs** count one per add, multiply, divide, exp, tanh, sqrt...; the
  per-element constants are in :data:`EW_FLOPS` and are approximate (they differ by
  kernel); they are a few percent of the step, so the approximation does not move any
  conclusion. Comparisons with the literature use the matmul part only (``gemm_flops``).
* **Attention** is reported three ways per row:

  - ``flops``: as the expected kernel executes it. The explicit softmax and SDPA's math
    backend compute the full T x T scores; fused kernels (flash, memory-efficient,
    cuDNN) skip the masked upper triangle (counted as exactly half here; tile
    granularity makes it slightly more) and *recompute* the scores in backward, so
    their backward costs 5 causal matmuls, not 4 (Dao et al. 2022, FlashAttention,
    sec. 3.1 and app. B.2).
  - ``flops_causal``: the useful work, half the T x T, backward = 2x forward.
  - ``flops_full``: full T x T, backward = 2x forward: the convention of Megatron-LM's
    formula (Narayanan et al. 2021, app.) and of ``torch.utils.flop_counter`` on the
    explicit implementation.

* **Bytes** are the DRAM traffic of the ATen ops an eager implementation runs for a
  component, each op reading each input once and writing each output once (perfect
  reuse inside an op, none across ops), as in the per-operator accounting of Ivanov et
  al. 2021 ("Data Movement Is All You Need", MLSys). Activations are ``precision``
  bytes (fp32/tf32 = 4, bf16/fp16 = 2); parameters, their gradients and AdamW states
  are fp32 (4 bytes), as under ``torch.autocast`` (the casts autocast inserts are not
  counted). Weights are read at the activation precision.
* **Saved for backward** is what autograd keeps alive from the forward pass, counted on
  the forward row of the component that saves it (cf. Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", sec. 4.1, for the
  same bookkeeping on GPT-3-style blocks).

What ``torch.utils.flop_counter.FlopCounterMode`` counts (torch 2.13, read from
``torch/utils/flop_counter.py`` and checked in ``tests/test_accounting.py``): only
matmuls (``mm``, ``addmm``, ``bmm``...) and the fused SDPA ops. The explicit softmax and
the math backend decompose into ``bmm``, so they count as full T x T, backward 2x. The
fused CUDA SDPA ops are counted by ``sdpa_flop_count``, which ignores ``is_causal``
(full T x T) and counts the backward as 5 matmuls (recomputation included), i.e. 2.5x
forward. The CPU fused kernel ``_scaled_dot_product_flash_attention_for_cpu`` has no
formula registered and counts **zero**. :func:`flop_counter_flops` predicts the total.
"""

from __future__ import annotations

import math
from typing import Any

from ftlib.model.config import ModelConfig

PRECISION_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
PARAM_BYTES = 4  # fp32 master weights, gradients and AdamW states (also under autocast)
INDEX_BYTES = 8  # int64 token ids and targets
STAT_BYTES = 4  # per-row norm statistics and softmax log-sum-exp are kept in fp32

# Approximate elementwise FLOPs per element (1 per add/mul/div/exp/tanh/erf/sqrt).
EW_FLOPS: dict[str, int] = {
    # LayerNorm (Ba et al. 2016): mean (1), centre (1), square+sum (2), normalize (1), gain (1)
    "layernorm_fwd": 6,
    # backward: x-hat recomputed (2), d-gain (2), dx-hat (1), two row means (4), combine (3)
    "layernorm_bwd": 12,
    # RMSNorm (Zhang & Sennrich 2019, eq. 4): square+sum (2), normalize (1), gain (1)
    "rmsnorm_fwd": 4,
    # backward: x-hat (1), d-gain (2), dx-hat (1), one row mean (2), combine (3)
    "rmsnorm_bwd": 9,
    "bias": 1,  # one add per output element (forward) / per gradient element summed (backward)
    # tanh GELU (Hendrycks & Gimpel 2016): x^3 (2), *c (1), +x (1), *sqrt(2/pi) (1), tanh (1), +1, *x, *0.5
    "gelu_tanh_fwd": 9,
    "gelu_tanh_bwd": 16,  # recompute inner + tanh (6), derivative (9), * grad (1)
    "gelu_fwd": 5,  # exact: /sqrt2, erf, +1, *x, *0.5
    "gelu_bwd": 11,  # erf part (3), exp(-x^2/2) (3), combine (4), * grad (1)
    "scale": 1,  # scores * 1/sqrt(hs)
    "mask": 1,  # math backend adds a float -inf mask; masked_fill is counted as 1 as well
    "softmax_fwd": 5,  # max, subtract, exp, sum, divide
    "softmax_bwd": 4,  # dS = P * (dP - rowsum(dP * P)): mul, sum, sub, mul
    "log_softmax_fwd": 5,  # max, subtract, exp, sum, log-subtract
    "log_softmax_bwd": 4,  # exp(logp), * rowsum, subtract, sum
    "dropout_fwd": 2,  # compare random number, scale
    "dropout_bwd": 1,
    # AdamW (Loshchilov & Hutter 2019, alg. 2, as in torch.optim.AdamW): decay (2), m (3), v (4),
    # bias corrections (2), sqrt (1), +eps (1), divide (1), *lr (1), subtract (1)
    "adamw": 16,
    "grad_clip": 3,  # square+sum for the norm (2), rescale (1)
}

# The post's claims (shared/seed/fasttransformer-post.txt), typed here so that the book
# can check them against the computed numbers; none of them is a result of this module.
POST_CLAIMS: dict[str, float] = {
    # sec. 3: "QK^T and AV accounts for only 4.0% of total block compute"
    "attention_share": 0.040,
    # sec. 3 and 7.1: "The GPU was spending 64% of its life multiplying FFN weights"
    "mlp_share": 0.64,
    # sec. 3 and 5.3: "8.59 GFLOPs per layer" for the 4x MLP, "-> 4.30 GFLOPs" for 2x
    "mlp_gflop_gpt2": 8.59,
    "mlp_gflop_fasttransformer": 4.30,
    # sec. 3: "(B, H, T, T) ... 805 MB of memory traffic per step across 6 layers"
    "attention_matrix_mb_per_step": 805.0,
    # sec. 5.1 and 7.1: "slashed KV projection weights ... by 58.3%"
    "qkv_weight_cut": 0.583,
    # sec. 7.1: "MQA cuts parameter gradients for keys and values by 87.5%"
    "kv_grad_cut": 0.875,
}

COMPONENTS_PRE = ("embeddings",)
COMPONENTS_LAYER = (
    "norm1", "qkv", "scores", "softmax", "attn_v", "out_proj", "residual",
    "norm2", "mlp_up", "gelu", "mlp_down", "dropout",
)
COMPONENTS_POST = ("final_norm", "head", "loss")
ATTENTION_COMPONENTS = ("scores", "softmax", "attn_v")
ATTENTION_GEMMS = ("scores", "attn_v")  # QKᵀ and A·V
MLP_GEMMS = ("mlp_up", "mlp_down")
FUSED_BACKENDS = ("flash", "efficient", "cudnn", "cpu_flash")
BACKENDS = ("explicit", "math", *FUSED_BACKENDS)


def act_bytes(precision: str) -> int:
    """Bytes per activation element for a precision name ('fp32', 'tf32', 'bf16', 'fp16')."""
    if precision not in PRECISION_BYTES:
        raise ValueError(f"unknown precision {precision!r}; expected one of {sorted(PRECISION_BYTES)}")
    return PRECISION_BYTES[precision]


# ----------------------------------------------------------------------------------------
# Which attention kernel runs
# ----------------------------------------------------------------------------------------


def expected_backend(
    cfg: ModelConfig,
    precision: str = "fp32",
    capability: tuple[int, int] | None = (9, 0),
    training: bool = True,
) -> str:
    """The attention kernel PyTorch (2.5-2.13) is expected to pick for this config.

    Returns 'explicit' (attn_impl='explicit'), or the SDPA backend: 'flash',
    'efficient', 'math' on CUDA (``capability`` = (major, minor)), 'cpu_flash' or 'math'
    on CPU (``capability=None``). The rules are the filters of ``select_sdp_backend`` in
    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (and sdp_utils_cpp.cpp):

    * every fused kernel needs q, k and v with the same number of heads
      (``check_batch_size_and_num_heads_dense``) unless ``enable_gqa`` is passed and
      the kernel supports GQA (flash and, in torch 2.13, the CPU kernel do; the
      memory-efficient kernel does not). So the original's (B, 1, T, hs) K/V
      (kv_layout='broadcast', n_kv_head < n_head) falls back to **math** in every
      precision; in fp32 this is what facts.md saw on an H200 (softmax_warp + sgemm).
    * flash: fp16/bf16 only, sm80..sm121, head size <= 256 and a multiple of 8. On sm90 and
      sm100 with cuDNN >= 9.15.1, recent torch tries cuDNN first; it is fused too and is
      accounted like flash.
    * memory-efficient: sm50..sm121, fp32 or fp16 (bf16 from sm80), head size a multiple
      of the GEMM alignment (8 for 16-bit, 4 for fp32 from sm80). T4 (sm75) has no flash.
    * CPU flash: no dropout in training (``check_for_dropout``).
    * 'tf32' is fp32 tensors with TF32 matmuls: same kernel choice as fp32.
    """
    act_bytes(precision)
    if cfg.attn_impl == "explicit":
        return "explicit"
    nh, nkv, hs = cfg.n_head, cfg.n_kv_head, cfg.head_size
    same_heads = nkv == nh or cfg.kv_layout in ("expand", "repeat")
    gqa = nkv != nh and cfg.kv_layout == "gqa"
    dropout = training and cfg.attn_dropout_p > 0  # on the probabilities
    low = precision in ("bf16", "fp16")
    if capability is None:
        if dropout or not (same_heads or gqa):
            return "math"
        return "cpu_flash"
    cap = tuple(capability)
    if low and (8, 0) <= cap <= (12, 1) and hs <= 256 and hs % 8 == 0 and (same_heads or gqa):
        return "flash"
    align = 8 if low else (4 if cap >= (8, 0) else 1)
    dtype_ok = precision != "bf16" or cap >= (8, 0)
    if (5, 0) <= cap <= (12, 1) and same_heads and hs % align == 0 and dtype_ok:
        return "efficient"
    return "math"


# ----------------------------------------------------------------------------------------
# Passes over the (B, nh, T, T) tensor
# ----------------------------------------------------------------------------------------

# (phase, component, op, reads, writes), in units of one (B, nh, T, T) tensor, as the ATen
# ops of each implementation run them (ftlib.attention.causal_attention_ref and
# at::_scaled_dot_product_attention_math; checked op by op in tests/test_accounting.py).
TT_PASSES: dict[str, tuple[tuple[str, str, str, int, int], ...]] = {
    "explicit": (
        ("fwd", "scores", "bmm q@kᵀ -> S", 0, 1),
        ("fwd", "softmax", "mul S/sqrt(hs)", 1, 1),
        ("fwd", "softmax", "masked_fill -inf", 1, 1),
        ("fwd", "softmax", "softmax -> P (saved)", 1, 1),
        ("fwd", "attn_v", "bmm P@v", 1, 0),
        ("bwd", "attn_v", "bmm Pᵀ@dO -> dV", 1, 0),
        ("bwd", "attn_v", "bmm dO@vᵀ -> dP", 0, 1),
        ("bwd", "softmax", "softmax_backward(dP, P)", 2, 1),
        ("bwd", "softmax", "masked_fill backward", 1, 1),
        ("bwd", "softmax", "mul backward", 1, 1),
        ("bwd", "scores", "bmm dS@k -> dQ", 1, 0),
        ("bwd", "scores", "bmm dSᵀ@q -> dK", 1, 0),
    ),
    "math": (
        ("fwd", "scores", "bmm q@kᵀ -> S", 0, 1),
        ("fwd", "softmax", "add float causal mask", 1, 1),
        ("fwd", "softmax", "_safe_softmax -> P (saved)", 1, 1),
        ("fwd", "attn_v", "bmm P@v", 1, 0),
        ("bwd", "attn_v", "bmm Pᵀ@dO -> dV", 1, 0),
        ("bwd", "attn_v", "bmm dO@vᵀ -> dP", 0, 1),
        ("bwd", "softmax", "softmax_backward(dP, P)", 2, 1),
        ("bwd", "scores", "bmm dS@k -> dQ", 1, 0),
        ("bwd", "scores", "bmm dSᵀ@q -> dK", 1, 0),
    ),
}
# dropout on the probabilities (training, dropout > 0): one more pass each way, plus a
# 1-byte mask written, saved and read again
TT_DROPOUT_PASSES = (
    ("fwd", "dropout", "dropout(P)", 1, 1),
    ("bwd", "dropout", "dropout backward", 1, 1),
)


def _tt_passes(backend: str, dropout: bool) -> tuple[tuple[str, str, str, int, int], ...]:
    if backend in FUSED_BACKENDS:
        return ()  # scores and probabilities stay in registers / shared memory
    return TT_PASSES[backend] + (TT_DROPOUT_PASSES if dropout else ())


def attention_matrix_traffic(
    cfg: ModelConfig,
    B: int,
    T: int,
    precision: str = "fp32",
    backend: str | None = None,
    capability: tuple[int, int] | None = (9, 0),
    training: bool = True,
) -> dict[str, Any]:
    """DRAM bytes spent on (B, nh, T, T) tensors in one training step.

    The post (sec. 3) claims 805 MB per step over 6 layers for GPT-2: that is one
    (B, H, T, T) fp32 tensor written once in forward and read once in backward,
    ``2 * B*H*T*T*4 * L``. This function returns that "write once, read once" model
    next to what the implementation really moves (``TT_PASSES``), per layer and per step.
    """
    backend = backend or expected_backend(cfg, precision, capability, training)
    s = act_bytes(precision)
    one = B * cfg.n_head * T * T * s  # bytes of one (B, nh, T, T) tensor
    passes = _tt_passes(backend, training and cfg.attn_dropout_p > 0)
    reads = sum(p[3] for p in passes)
    writes = sum(p[4] for p in passes)
    per_layer = (reads + writes) * one
    return {
        "backend": backend,
        "tensor_bytes": one,
        "passes": [dict(phase=p[0], component=p[1], op=p[2], reads=p[3], writes=p[4]) for p in passes],
        "reads_per_layer": reads,
        "writes_per_layer": writes,
        "bytes_per_layer": per_layer,
        "bytes_per_step": per_layer * cfg.n_layer,
        "fwd_bytes_per_step": sum(p[3] + p[4] for p in passes if p[0] == "fwd") * one * cfg.n_layer,
        "bwd_bytes_per_step": sum(p[3] + p[4] for p in passes if p[0] == "bwd") * one * cfg.n_layer,
        # the post's model: P written in forward, read in backward (0 for fused kernels)
        "write_once_read_once_per_step": (2 * one * cfg.n_layer) if passes else 0,
        "saved_bytes_per_step": (one * cfg.n_layer) if passes else 0,
    }


# ----------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------


def _row(
    layer: int | None,
    component: str,
    phase: str,
    kind: str,
    flops: float,
    nbytes: float,
    *,
    gemm: float = 0.0,
    causal: float | None = None,
    full: float | None = None,
    params: int = 0,
    saved: float = 0.0,
    note: str = "",
) -> dict[str, Any]:
    return {
        "layer": layer,
        "component": component,
        "phase": phase,
        "kind": kind,
        "flops": float(flops),
        "flops_causal": float(flops if causal is None else causal),
        "flops_full": float(flops if full is None else full),
        "gemm_flops": float(gemm),  # matmul part of flops_full
        "bytes": float(nbytes),
        "intensity": float(flops) / nbytes if nbytes else math.inf,
        "params": int(params),
        "param_bytes": int(params) * PARAM_BYTES,
        "saved_bytes": float(saved),
        "note": note,
    }


def _linear(
    layer: int | None, name: str, N: int, k: int, n: int, bias: bool, s: int, params: bool = True
) -> list[dict[str, Any]]:
    """Y (N, n) = X (N, k) @ W (k, n) [+ b]: forward and backward rows."""
    g = 2 * N * k * n
    b = N * n * EW_FLOPS["bias"] if bias else 0
    fwd_bytes = (N * k + k * n + (n if bias else 0) + N * n) * s
    # backward, two mm ops: dX = dY Wᵀ (reads dY, W; writes dX), dW = Xᵀ dY (reads X, dY;
    # writes dW), plus a sum over tokens of dY for the bias gradient
    bwd_bytes = (2 * N * n + k * n + N * k + N * k) * s + k * n * PARAM_BYTES
    if bias:
        bwd_bytes += N * n * s + n * PARAM_BYTES
    nparams = (k * n + (n if bias else 0)) if params else 0
    return [
        _row(layer, name, "fwd", "gemm", g + b, fwd_bytes, gemm=g, params=nparams, saved=N * k * s,
             note=f"({N},{k})@({k},{n})" + (" + bias" if bias else "")),
        _row(layer, name, "bwd", "gemm", 2 * g + b, bwd_bytes, gemm=2 * g, note="dX = dY Wᵀ, dW = Xᵀ dY"),
    ]


def _norm(layer: int | None, name: str, cfg: ModelConfig, N: int, s: int) -> list[dict[str, Any]]:
    C = cfg.n_embd
    ln = cfg.norm == "layernorm"
    has_bias = ln and cfg.bias  # ftlib's RMSNorm has a gain only, whatever cfg.bias says
    per_fwd = EW_FLOPS[f"{cfg.norm}_fwd"] + (EW_FLOPS["bias"] if has_bias else 0)
    per_bwd = EW_FLOPS[f"{cfg.norm}_bwd"] + (EW_FLOPS["bias"] if has_bias else 0)
    stats = (2 if ln else 1) * N * STAT_BYTES  # LayerNorm: mean and rstd; RMSNorm: rstd
    nparams = C * (2 if has_bias else 1)
    fwd_bytes = 2 * N * C * s + nparams * s + stats
    bwd_bytes = 3 * N * C * s + nparams * s + stats + nparams * PARAM_BYTES
    note = "saves x and per-row stats"
    if cfg.norm == "rmsnorm":
        note += " (ftlib's unfused rms_norm_ref keeps more: the normalized x too)"
    return [
        _row(layer, name, "fwd", "elementwise", per_fwd * N * C, fwd_bytes, params=nparams,
             saved=N * C * s + stats, note=note),
        _row(layer, name, "bwd", "elementwise", per_bwd * N * C, bwd_bytes),
    ]


def _attention(
    layer: int, cfg: ModelConfig, B: int, T: int, s: int, backend: str, training: bool
) -> list[dict[str, Any]]:
    """Rows for QKᵀ, softmax and A·V under one backend."""
    nh, hs, nkv = cfg.n_head, cfg.head_size, cfg.n_kv_head
    N, C, kv = B * T, cfg.n_embd, cfg.n_kv_head * cfg.head_size
    fused = backend in FUSED_BACKENDS
    tt = B * nh * T * T  # elements of one (B, nh, T, T) tensor
    mm_full = 2 * B * nh * T * T * hs  # one of QKᵀ or A·V, full T x T
    mm_causal = mm_full / 2
    dropout = training and cfg.attn_dropout_p > 0  # on the probabilities
    passes = _tt_passes(backend, dropout)

    def tt_bytes(phase: str, comp: str) -> float:
        return sum(p[3] + p[4] for p in passes if p[0] == phase and p[1] == comp) * tt * s

    # K/V with fewer heads: the explicit matmul broadcast and the math backend copy K and V
    # to n_head heads (expand + clone before bmm); 'repeat' copies before any backend.
    kv_copy = nkv < nh and (not fused or cfg.kv_layout == "repeat")
    k_read = (N * kv + 2 * N * C) * s if kv_copy else N * kv * s  # read K, [write + read copy]
    # gradients of a copied / expanded K (or V) come out at n_head heads and are summed
    k_grad = (N * C + N * C + N * kv) * s if (kv_copy or (fused and nkv < nh)) else N * kv * s
    # head merge y.transpose(1, 2).contiguous(): a copy for bmm outputs, free for fused ones
    merge = 0 if fused else 2 * N * C * s

    ew_elems = tt / 2 if fused else tt  # elementwise softmax work done on executed elements
    soft_per = EW_FLOPS["scale"] + EW_FLOPS["softmax_fwd"] + (EW_FLOPS["mask"] if not fused else 0)
    lse = B * nh * T * STAT_BYTES
    rows: list[dict[str, Any]] = []

    # ---- QKᵀ
    f_fwd = mm_causal if fused else mm_full
    f_bwd = (3 * mm_causal) if fused else 2 * mm_full  # fused: recompute S, then dQ, dK
    rows.append(_row(layer, "scores", "fwd", "attention", f_fwd, N * C * s + k_read + tt_bytes("fwd", "scores"),
                     gemm=mm_full, causal=mm_causal, full=mm_full,
                     saved=N * C * s + (N * C if kv_copy else N * kv) * s,
                     note=f"{backend}: q ({B},{nh},{T},{hs}) @ kᵀ, K from {nkv} head(s)"))
    rows.append(_row(layer, "scores", "bwd", "attention", f_bwd,
                     (N * C + N * kv + N * C) * s + k_grad + tt_bytes("bwd", "scores")
                     + (lse + 2 * N * C * s if fused else 0),
                     gemm=2 * mm_full, causal=2 * mm_causal, full=2 * mm_full,
                     note="fused: recomputes QKᵀ (2.5x forward overall)" if fused else "dQ = dS K, dK = dSᵀ Q"))
    # ---- softmax (with scale and mask)
    rows.append(_row(layer, "softmax", "fwd", "elementwise", ew_elems * soft_per,
                     tt_bytes("fwd", "softmax") + (lse if fused else T * T),
                     causal=tt / 2 * soft_per, full=tt * soft_per,
                     saved=(lse if fused else tt * s),
                     note="in registers (online softmax)" if fused else "scale, mask, softmax: P saved"))
    rows.append(_row(layer, "softmax", "bwd", "elementwise",
                     ew_elems * (EW_FLOPS["softmax_bwd"] + (2 if fused else EW_FLOPS["scale"])),
                     tt_bytes("bwd", "softmax") + ((2 * N * C * s + lse) if fused else 0),
                     causal=tt / 2 * (EW_FLOPS["softmax_bwd"] + EW_FLOPS["scale"]),
                     full=tt * (EW_FLOPS["softmax_bwd"] + EW_FLOPS["scale"]),
                     note="fused: D = rowsum(dO * O), exp recomputed" if fused else ""))
    # ---- A·V
    f_fwd = mm_causal if fused else mm_full
    f_bwd = 2 * mm_causal if fused else 2 * mm_full  # dP = dO Vᵀ, dV = Pᵀ dO
    rows.append(_row(layer, "attn_v", "fwd", "attention", f_fwd,
                     k_read + N * C * s + merge + tt_bytes("fwd", "attn_v"),
                     gemm=mm_full, causal=mm_causal, full=mm_full,
                     saved=(N * C if kv_copy else N * kv) * s + (N * C * s if fused else 0),
                     note="fused kernel also saves O and the log-sum-exp" if fused else "P @ v, heads merged"))
    rows.append(_row(layer, "attn_v", "bwd", "attention", f_bwd,
                     N * C * s + N * kv * s + k_grad + merge + tt_bytes("bwd", "attn_v"),
                     gemm=2 * mm_full, causal=2 * mm_causal, full=2 * mm_full))
    return rows


def _dropout_rows(layer: int | None, n_elems: float, s: int, tt_extra: float = 0.0) -> list[dict[str, Any]]:
    """Dropout on n_elems activations: read, write, 1-byte mask written (saved) and read back."""
    return [
        _row(layer, "dropout", "fwd", "elementwise", EW_FLOPS["dropout_fwd"] * n_elems,
             n_elems * (2 * s + 1) + tt_extra, saved=n_elems * 1),
        _row(layer, "dropout", "bwd", "elementwise", EW_FLOPS["dropout_bwd"] * n_elems,
             n_elems * (2 * s + 1) + tt_extra),
    ]


def rows(
    cfg: ModelConfig,
    B: int,
    T: int,
    precision: str = "fp32",
    capability: tuple[int, int] | None = (9, 0),
    backend: str | None = None,
    training: bool = True,
    grad_clip: bool = False,
) -> list[dict[str, Any]]:
    """Every component of one training step as a dict (see the module docstring).

    Keys: layer (None outside the blocks), component, phase ('fwd', 'bwd', 'opt'), kind
    ('gemm', 'attention', 'elementwise', 'memory', 'optimizer'), flops, flops_causal,
    flops_full, gemm_flops, bytes, intensity, params, param_bytes, saved_bytes, note.
    ``backend`` overrides :func:`expected_backend` (which uses ``capability``;
    None = CPU). ``grad_clip`` adds a clip-by-global-norm row (the original training
    script clips at 1.0; its timing loop does not).
    """
    cfg.check_sequence(T)
    backend = backend or expected_backend(cfg, precision, capability, training)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    s = act_bytes(precision)
    N, C, F, V = B * T, cfg.n_embd, cfg.d_ff, cfg.vocab_size
    kv = cfg.n_kv_head * cfg.head_size
    dropout = training and cfg.dropout > 0  # embeddings and residual branches
    attn_drop = training and cfg.attn_dropout_p > 0  # attention probabilities
    out: list[dict[str, Any]] = []

    # ---- embeddings: x = wte[idx] + wpe[:T]
    emb_params = V * C + cfg.block_size * C
    out.append(_row(None, "embeddings", "fwd", "memory", N * C,
                    N * INDEX_BYTES + (4 * N * C + 3 * T * C) * s,
                    params=emb_params, saved=N * INDEX_BYTES, note="gather token rows + position rows, add"))
    # backward: dense scatter-add of dX into dwte (V, C) and a sum over the batch into dwpe
    bwd_flops = 2 * N * C + (V * C if cfg.tie_weights else 0)
    bwd_bytes = 2 * N * C * s + N * INDEX_BYTES + (V * C + T * C) * PARAM_BYTES
    if cfg.tie_weights:
        bwd_bytes += 3 * V * C * PARAM_BYTES  # head's dW accumulated into the shared matrix
    out.append(_row(None, "embeddings", "bwd", "memory", bwd_flops, bwd_bytes,
                    note="tied: head gradient added into wte" if cfg.tie_weights else ""))
    if dropout:
        for r in _dropout_rows(None, N * C, s):
            r["component"] = "embeddings"
            out.append(r)

    for layer in range(cfg.n_layer):
        out += _norm(layer, "norm1", cfg, N, s)
        qkv = _linear(layer, "qkv", N, C, C + 2 * kv, cfg.bias, s)
        qkv[1]["bytes"] += (N * (C + 2 * kv) * 2) * s  # backward of split: cat(dq, dk, dv)
        out += qkv
        out += _attention(layer, cfg, B, T, s, backend, training)
        out += _linear(layer, "out_proj", N, C, C, cfg.bias, s)
        out.append(_row(layer, "residual", "fwd", "elementwise", 2 * N * C, 2 * 3 * N * C * s,
                        note="x + attn(.), x + mlp(.)"))
        out.append(_row(layer, "residual", "bwd", "elementwise", 2 * N * C, 2 * 3 * N * C * s,
                        note="gradient of the residual stream accumulated twice"))
        out += _norm(layer, "norm2", cfg, N, s)
        out += _linear(layer, "mlp_up", N, C, F, cfg.bias, s)
        act = cfg.activation
        out.append(_row(layer, "gelu", "fwd", "elementwise", EW_FLOPS[f"{act}_fwd"] * N * F, 2 * N * F * s,
                        saved=N * F * s, note=act))
        out.append(_row(layer, "gelu", "bwd", "elementwise", EW_FLOPS[f"{act}_bwd"] * N * F, 3 * N * F * s))
        out += _linear(layer, "mlp_down", N, F, C, cfg.bias, s)
        if dropout or attn_drop:
            # residual dropouts after out_proj and mlp_down; probabilities' dropout in the
            # explicit / math paths (fused kernels drop in registers with a Philox RNG)
            fused = backend in FUSED_BACKENDS
            tt = B * cfg.n_head * T * T
            extra_elems = 0 if fused or not attn_drop else tt
            out += _dropout_rows(layer, (2 * N * C if dropout else 0) + extra_elems, s)

    out += _norm(None, "final_norm", cfg, N, s)
    out += _linear(None, "head", N, C, V, False, s, params=not cfg.tie_weights)
    # ---- loss: cross_entropy = log_softmax + nll_loss (mean)
    out.append(_row(None, "loss", "fwd", "elementwise", EW_FLOPS["log_softmax_fwd"] * N * V + 2 * N,
                    2 * N * V * s + N * INDEX_BYTES + N * s, saved=N * V * s + N * INDEX_BYTES,
                    note="log_softmax saved"))
    out.append(_row(None, "loss", "bwd", "elementwise", EW_FLOPS["log_softmax_bwd"] * N * V + N,
                    N * V * s + N * INDEX_BYTES + 3 * N * V * s, note="nll scatter, log_softmax backward"))

    # ---- optimizer: AdamW reads p, g, m, v and writes p, m, v (all fp32)
    P = num_params(cfg)
    if grad_clip:
        out.append(_row(None, "grad_clip", "opt", "optimizer", EW_FLOPS["grad_clip"] * P,
                        3 * P * PARAM_BYTES, note="global norm (read g), rescale (read+write g)"))
    out.append(_row(None, "optimizer", "opt", "optimizer", EW_FLOPS["adamw"] * P, 7 * P * PARAM_BYTES,
                    note=f"AdamW over {P:,} parameters; states m, v: {2 * P * PARAM_BYTES:,} bytes"))
    return out


# ----------------------------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------------------------


def num_params(cfg: ModelConfig) -> int:
    """Trainable parameters of ftlib.model.gpt.GPT for this config (a tied matrix once)."""
    C, F, V, kv = cfg.n_embd, cfg.d_ff, cfg.vocab_size, cfg.n_kv_head * cfg.head_size
    b = cfg.bias
    norm = C * (2 if (cfg.norm == "layernorm" and b) else 1)
    layer = (
        2 * norm
        + C * (C + 2 * kv) + (C + 2 * kv if b else 0)
        + C * C + (C if b else 0)
        + C * F + (F if b else 0)
        + F * C + (C if b else 0)
    )
    head = 0 if cfg.tie_weights else C * V
    return V * C + cfg.block_size * C + cfg.n_layer * layer + norm + head


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in a matmul: every Linear weight including the head
    (embedding lookups, norms and biases excluded)."""
    C, F, V, kv = cfg.n_embd, cfg.d_ff, cfg.vocab_size, cfg.n_kv_head * cfg.head_size
    return cfg.n_layer * (C * (C + 2 * kv) + C * C + 2 * C * F) + C * V


def total_flops(
    cfg: ModelConfig,
    B: int,
    T: int,
    which: str = "flops",
    phases: tuple[str, ...] = ("fwd", "bwd", "opt"),
    gemm_only: bool = False,
    **kw: Any,
) -> float:
    """Sum of one FLOP column (``which`` = 'flops', 'flops_causal', 'flops_full') over a
    step; ``gemm_only`` sums the matmul part (``gemm_flops``, full T x T) instead."""
    key = "gemm_flops" if gemm_only else which
    return sum(r[key] for r in rows(cfg, B, T, **kw) if r["phase"] in phases)


def total_bytes(cfg: ModelConfig, B: int, T: int, phases: tuple[str, ...] = ("fwd", "bwd", "opt"), **kw: Any) -> float:
    """DRAM bytes of one step (sum of the rows' ``bytes``)."""
    return sum(r["bytes"] for r in rows(cfg, B, T, **kw) if r["phase"] in phases)


def layer_forward_breakdown(
    cfg: ModelConfig, B: int, T: int, causal: bool = False, gemm_only: bool = True
) -> dict[str, float]:
    """Forward FLOPs of one block by component (layer 0), the post's sec. 2 table.

    With ``gemm_only`` (the default, the convention of the post and facts.md) only the
    matmuls: qkv, scores (QKᵀ), attn_v (A·V), out_proj, mlp_up, mlp_down; full T x T
    unless ``causal``. Otherwise every component's ``flops_full`` / ``flops_causal``.
    """
    out: dict[str, float] = {}
    for r in rows(cfg, B, T, backend="math"):
        if r["layer"] != 0 or r["phase"] != "fwd":
            continue
        if gemm_only:
            if r["kind"] not in ("gemm", "attention"):
                continue
            v = r["gemm_flops"] / (2 if causal and r["component"] in ATTENTION_GEMMS else 1)
        else:
            v = r["flops_causal" if causal else "flops_full"]
        out[r["component"]] = out.get(r["component"], 0.0) + v
    return out


def attention_mlp_fractions(cfg: ModelConfig, B: int, T: int, causal: bool = False) -> dict[str, float]:
    """Shares of one block's forward matmul FLOPs: 'attention' (QKᵀ + A·V), 'mlp'
    (up + down), 'projections' (qkv + out_proj); plus the GFLOP values."""
    bd = layer_forward_breakdown(cfg, B, T, causal=causal)
    total = sum(bd.values())
    att = sum(bd[c] for c in ATTENTION_GEMMS)
    mlp = sum(bd[c] for c in MLP_GEMMS)
    return {
        "attention": att / total,
        "mlp": mlp / total,
        "projections": (bd["qkv"] + bd["out_proj"]) / total,
        "attention_gflop": att / 1e9,
        "mlp_gflop": mlp / 1e9,
        "block_gflop": total / 1e9,
    }


def step_summary(cfg: ModelConfig, B: int, T: int, **kw: Any) -> dict[str, float]:
    """Per-step totals: FLOPs (executed, causal, full, matmul-only), bytes, memory."""
    rs = rows(cfg, B, T, **kw)
    P = num_params(cfg)
    tot = {k: sum(r[k] for r in rs) for k in ("flops", "flops_causal", "flops_full", "gemm_flops", "bytes")}
    return {
        **tot,
        "fwd_flops": sum(r["flops"] for r in rs if r["phase"] == "fwd"),
        "bwd_flops": sum(r["flops"] for r in rs if r["phase"] == "bwd"),
        "opt_flops": sum(r["flops"] for r in rs if r["phase"] == "opt"),
        "fwd_bytes": sum(r["bytes"] for r in rs if r["phase"] == "fwd"),
        "bwd_bytes": sum(r["bytes"] for r in rs if r["phase"] == "bwd"),
        "opt_bytes": sum(r["bytes"] for r in rs if r["phase"] == "opt"),
        "intensity": tot["flops"] / tot["bytes"],
        "params": P,
        "param_bytes": P * PARAM_BYTES,
        "grad_bytes": P * PARAM_BYTES,
        "adamw_state_bytes": 2 * P * PARAM_BYTES,
        "saved_activation_bytes": sum(r["saved_bytes"] for r in rs if r["phase"] == "fwd"),
    }


def by_component(
    cfg: ModelConfig, B: int, T: int, key: str = "flops", phases: tuple[str, ...] = ("fwd", "bwd", "opt"), **kw: Any
) -> dict[str, float]:
    """``key`` summed over layers and the given phases, per component, in step order."""
    out: dict[str, float] = {}
    for r in rows(cfg, B, T, **kw):
        if r["phase"] in phases:
            out[r["component"]] = out.get(r["component"], 0.0) + r[key]
    return out


# ----------------------------------------------------------------------------------------
# Closed forms from the literature
# ----------------------------------------------------------------------------------------


def kaplan_flops(cfg: ModelConfig, B: int, T: int, include_context: bool = True) -> float:
    """Training FLOPs per step by Kaplan et al. 2020, sec. 2.1 and Table 1.

    C_forward = 2N + 2 n_layer n_ctx d_attn per token, N the non-embedding parameters
    2 d_model n_layer (2 d_attn + d_ff) (biases, norms, embeddings and the de-embedding
    excluded); training = 3 C_forward per token ("6N"). N is generalized here to fewer K/V
    heads: n_layer (C (C + 2 kv) + C^2 + 2 C d_ff). The context term, 2 n_layer n_ctx
    d_attn with n_ctx = T, is half of the full QKᵀ + A·V count (4 n_layer T d_attn), i.e.
    the causal count. The head (de-embedding, 2 d_model n_vocab) is left out, as in the
    paper's C_forward.
    """
    C, F, kv, L = cfg.n_embd, cfg.d_ff, cfg.n_kv_head * cfg.head_size, cfg.n_layer
    N = L * (C * (C + 2 * kv) + C * C + 2 * C * F)
    per_token = 2 * N + (2 * L * T * C if include_context else 0)
    return 3 * per_token * B * T


def megatron_flops(cfg: ModelConfig, B: int, T: int) -> float:
    """Training FLOPs per step by Narayanan et al. 2021 (SC21, "Efficient Large-Scale
    Language Model Training on GPU Clusters Using Megatron-LM"), sec. 5.1 / app.:
    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` without activation recomputation (the paper
    quotes 96 B s l h^2 (1 + s/6h + V/16lh) with recomputation; 72 = 96 * 3/4).

    It assumes d_ff = 4h, n_kv_head = n_head, full s x s attention and counts only
    matmuls (logits included): exactly the matmul sum of GPT-2 here, an overestimate for
    FastTransformer (which it does not describe).
    """
    s, h, n_l, V = T, cfg.n_embd, cfg.n_layer, cfg.vocab_size  # the paper's s, h, l, V
    return 72 * B * s * n_l * h * h * (1 + s / (6 * h) + V / (12 * n_l * h))


def palm_flops(cfg: ModelConfig, B: int, T: int, params: str = "matmul") -> float:
    """Model FLOPs per step by PaLM (Chowdhery et al. 2022, app. B, the definition of MFU):
    ``(6 N + 12 L H Q T)`` per token: 6N for the dense matmuls (2N forward, 4N backward)
    and 6 L H (2 Q T) for QKᵀ and A·V, full T x T, H query heads of size Q.

    ``params``: which N. 'matmul' (default): weights of every matmul incl. the head
    (the dense-matmul rationale of the formula); 'non_embedding': all parameters but the
    token and position embeddings; 'all': every parameter.
    """
    if params == "matmul":
        N = matmul_params(cfg)
    elif params == "non_embedding":
        N = num_params(cfg) - cfg.vocab_size * cfg.n_embd - cfg.block_size * cfg.n_embd
        if cfg.tie_weights:
            N += cfg.vocab_size * cfg.n_embd  # the tied matrix still does the head's matmul
    elif params == "all":
        N = num_params(cfg)
    else:
        raise ValueError(f"params must be 'matmul', 'non_embedding' or 'all', got {params!r}")
    per_token = 6 * N + 12 * cfg.n_layer * cfg.n_head * cfg.head_size * T
    return per_token * B * T


def flop_counter_flops(
    cfg: ModelConfig,
    B: int,
    T: int,
    backend: str | None = None,
    capability: tuple[int, int] | None = None,
    precision: str = "fp32",
    backward: bool = True,
) -> float:
    """What ``torch.utils.flop_counter.FlopCounterMode`` reports for forward (+ backward).

    Linear layers: 2mnk forward, 2x in backward. Attention: full T x T in forward; in
    backward 2x forward for 'explicit' / 'math' (bmm) and 2.5x for fused CUDA kernels
    (``sdpa_backward_flop_count`` counts the recomputation); 'cpu_flash' has no
    registered formula and counts 0. Default ``capability=None`` (CPU), as in the tests.
    """
    backend = backend or expected_backend(cfg, precision, capability)
    rs = [r for r in rows(cfg, B, T, precision=precision, backend=backend) if r["phase"] == "fwd"]
    lin = sum(r["gemm_flops"] for r in rs if r["kind"] == "gemm")
    att = sum(r["gemm_flops"] for r in rs if r["kind"] == "attention")
    if backend == "cpu_flash":
        att_mult = 0.0
    elif backend in FUSED_BACKENDS:
        att_mult = 1.0 + (2.5 if backward else 0.0)
    else:
        att_mult = 1.0 + (2.0 if backward else 0.0)
    return lin * (3.0 if backward else 1.0) + att * att_mult
