"""Which attention kernel PyTorch runs for a config, and what it moves over (B, nh, T, T) tensors.

The backend decides the attention's FLOPs and bytes (:mod:`ftlib.analysis.accounting` counts
both per backend): the explicit softmax and SDPA's math backend materialize the scores and
probabilities, the fused kernels (flash, memory-efficient, cuDNN, the CPU's flash) keep them in
registers and shared memory.
"""

from __future__ import annotations

from typing import Any

from ftlib.core.precision import Precision
from ftlib.model.config import ModelConfig

FUSED_BACKENDS = ("flash", "efficient", "cudnn", "cpu_flash")
# GPT-2's explicit attention on the book's kernels (kernels/explicit_attention.py, the engine's
# fuse_softmax_matmuls): tiled like the fused kernels (causal tiles only, q, k, v read by index from the
# packed qkv, the output written in place), but P written, as GPT-2 writes it, and read back by the
# backward instead of recomputed. PyTorch never picks it: expected_backend does not return it.
EXPLICIT_FUSED = "explicit_fused"
TILED_BACKENDS = (*FUSED_BACKENDS, EXPLICIT_FUSED)
BACKENDS = ("explicit", "math", *FUSED_BACKENDS, EXPLICIT_FUSED)


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
      precision; in fp32 chapter 1's profiles show it on an H200 (softmax_warp + sgemm kernels).
    * flash: fp16/bf16 only, sm80..sm121, head size <= 256 and a multiple of 8. On sm90 and
      sm100 with cuDNN >= 9.15.1, recent torch tries cuDNN first; it is fused too and is
      accounted like flash.
    * memory-efficient: sm50..sm121, fp32 or fp16 (bf16 from sm80), head size a multiple
      of the GEMM alignment (8 for 16-bit, 4 for fp32 from sm80). T4 (sm75) has no flash.
    * CPU flash: no dropout in training (``check_for_dropout``).
    * 'tf32' is fp32 tensors with TF32 matmuls: same kernel choice as fp32.
    """
    Precision.of(precision)  # a ValueError for an unknown name
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
    # The least any implementation that stores P moves (the post's "write once, read once"): P written
    # once forward (q kᵀ, scale, mask and softmax in registers, P v from registers) and read once
    # backward. kernels/explicit_attention.py reads it three times (twice in its dq kernel, once in its
    # dK/dV kernel), recomputing dP = dO vᵀ instead of storing it; the ledger's floor is the least.
    EXPLICIT_FUSED: (
        ("fwd", "softmax", "fused forward: P written (saved)", 0, 1),
        ("bwd", "softmax", "backward: P read (dV = Pᵀ dO, dS = P (dP - rowsum(P dP)))", 1, 0),
    ),
}
# dropout on the probabilities (training, dropout > 0): one more pass each way, plus a
# 1-byte mask written, saved and read again
TT_DROPOUT_PASSES = (
    ("fwd", "dropout", "dropout(P)", 1, 1),
    ("bwd", "dropout", "dropout backward", 1, 1),
)


def tt_passes(backend: str, dropout: bool) -> tuple[tuple[str, str, str, int, int], ...]:
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
    s = Precision.of(precision).activation_bytes
    one = B * cfg.n_head * T * T * s  # bytes of one (B, nh, T, T) tensor
    passes = tt_passes(backend, training and cfg.attn_dropout_p > 0)
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


