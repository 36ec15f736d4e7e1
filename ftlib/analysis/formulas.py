"""Training FLOPs per step by the literature's closed forms, beside the accounting's own sum, and
what ``torch.utils.flop_counter`` reports.

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

from ftlib.analysis.accounting import matmul_params, num_params, rows
from ftlib.analysis.backends import FUSED_BACKENDS, expected_backend
from ftlib.model.config import ModelConfig


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
