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

Which attention kernel runs and what it moves over (B, nh, T, T) tensors: :mod:`ftlib.analysis.backends`;
per-step sums and shares: :mod:`ftlib.analysis.totals`; the literature's closed forms:
:mod:`ftlib.analysis.formulas`.
"""

from __future__ import annotations

import math
from typing import Any

from ftlib.analysis.backends import BACKENDS, FUSED_BACKENDS, TILED_BACKENDS, expected_backend, tt_passes
from ftlib.core.precision import PRECISIONS, Precision
from ftlib.model.config import ModelConfig

PRECISION_BYTES: dict[str, int] = {p: Precision.of(p).activation_bytes for p in PRECISIONS}
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

COMPONENTS_PRE = ("embeddings",)
COMPONENTS_LAYER = (
    "norm1", "qkv", "scores", "softmax", "attn_v", "out_proj", "residual",
    "norm2", "mlp_up", "gelu", "mlp_down", "dropout",
)
COMPONENTS_POST = ("final_norm", "head", "loss")
ATTENTION_COMPONENTS = ("scores", "softmax", "attn_v")
ATTENTION_GEMMS = ("scores", "attn_v")  # QKᵀ and A·V
MLP_GEMMS = ("mlp_up", "mlp_down")


def act_bytes(precision: str) -> int:
    """Bytes per activation element for a precision name ('fp32', 'tf32', 'bf16', 'fp16')."""
    if precision not in PRECISION_BYTES:
        raise ValueError(f"unknown precision {precision!r}; expected one of {sorted(PRECISION_BYTES)}")
    return PRECISION_BYTES[precision]


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
    fused = backend in FUSED_BACKENDS  # P never stored: recomputed in the backward from the log-sum-exp
    tiled = backend in TILED_BACKENDS  # causal tiles only, q, k, v by index, the output written in place
    tt = B * nh * T * T  # elements of one (B, nh, T, T) tensor
    mm_full = 2 * B * nh * T * T * hs  # one of QKᵀ or A·V, full T x T
    mm_causal = mm_full / 2
    dropout = training and cfg.attn_dropout_p > 0  # on the probabilities
    passes = tt_passes(backend, dropout)

    def tt_bytes(phase: str, comp: str) -> float:
        return sum(p[3] + p[4] for p in passes if p[0] == phase and p[1] == comp) * tt * s

    # K/V with fewer heads: the explicit matmul broadcast and the math backend copy K and V
    # to n_head heads (expand + clone before bmm); 'repeat' copies before any backend.
    kv_copy = nkv < nh and (not tiled or cfg.kv_layout == "repeat")
    k_read = (N * kv + 2 * N * C) * s if kv_copy else N * kv * s  # read K, [write + read copy]
    # gradients of a copied / expanded K (or V) come out at n_head heads and are summed
    k_grad = (N * C + N * C + N * kv) * s if (kv_copy or (tiled and nkv < nh)) else N * kv * s
    # head merge y.transpose(1, 2).contiguous(): a copy for bmm outputs, free for fused ones
    merge = 0 if tiled else 2 * N * C * s

    ew_elems = tt / 2 if tiled else tt  # elementwise softmax work done on executed elements
    soft_per = EW_FLOPS["scale"] + EW_FLOPS["softmax_fwd"] + (EW_FLOPS["mask"] if not tiled else 0)
    lse = B * nh * T * STAT_BYTES
    rows: list[dict[str, Any]] = []

    # ---- QKᵀ
    f_fwd = mm_causal if tiled else mm_full
    # fused: recompute S, then dQ, dK; explicit_fused: dQ, dK from the stored P, causal tiles only
    f_bwd = 3 * mm_causal if fused else 2 * mm_causal if tiled else 2 * mm_full
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
                     tt_bytes("fwd", "softmax") + (lse if fused else 0 if tiled else T * T),
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
    f_fwd = mm_causal if tiled else mm_full
    f_bwd = 2 * mm_causal if tiled else 2 * mm_full  # dP = dO Vᵀ, dV = Pᵀ dO
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
