"""Where a kernel applies, the model's module is swapped for one that runs it, in place.

Every new module takes over the old one's Parameter objects under the same names and in the same
place of its parent's ordered ``_modules``, so ``model.parameters()`` keeps its order and identity
(the reference's optimizer groups line up) and the model's own forward runs unchanged: the norms,
attention, Linear layers and embeddings are modules, and every residual add with the norm after it
goes through the model's ``add_norm`` (``ftlib.model.block.AddNorm``), the embeddings' sum through its
``embedding_sum`` (``ftlib.model.gpt.EmbeddingSum``; :mod:`ftlib.training.engine.embedding`).
:func:`swap_kernels` returns which ops a kernel took over and, for every op or fusion that stayed on PyTorch, why.

Triton matmuls (attention, the Linear GEMM) go in only where ``tl.dot`` gets tensor cores for their
precision on the device: below sm_80 Triton lowers every ``tl.dot`` to FMA arithmetic
(``ftlib.core.device``), where SDPA's kernels and cuBLAS use the tensor cores.

The swaps of the Linear layers that need the flat buffers (a bf16 copy of the weights, gradients written
into the flat gradient) run after them: :mod:`ftlib.training.engine.linears`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ftlib.core.device import DeviceInfo
from ftlib.model.config import ModelConfig
from ftlib.model.gpt import GPT
from ftlib.model.norm import LayerNorm, RMSNorm
from ftlib.training.engine.attention import (
    FusedExplicitSelfAttention,
    FusedSoftmaxSelfAttention,
    KernelCausalSelfAttention,
)
from ftlib.training.engine.embedding import swap_embeddings
from ftlib.training.engine.options import KERNEL_OPS, EngineOptions, StepPrecision

if TYPE_CHECKING:
    from kernels.tiles import Tiles

# Head sizes the attention kernel takes (tl.dot needs a power of two in [16, 128]).
ATTN_HEAD_SIZES = (16, 32, 64, 128)
OFF = "switched off: PyTorch reference op"


def kernels_runnable(device: torch.device) -> str | None:
    """None when Triton kernels run here (CUDA tensors, or CPU tensors in the interpreter); else why not."""
    import kernels

    if not kernels.HAS_TRITON:
        return "Triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    return f"no Triton on {device.type} (set TRITON_INTERPRET=1 before importing triton for the CPU)"


def triton_dot_blocked(info: DeviceInfo | None, dot: str) -> str | None:
    """Why a Triton matmul with ``tl.dot`` input ``dot`` stays off on this GPU (None: it may run).
    'ieee' is FMA by definition and only ever runs when asked for explicitly."""
    if info is None or info.kind != "cuda" or dot == "ieee" or info.triton_dot_uses_tensor_cores(dot):
        return None
    return (f"not applied: Triton's tl.dot has no tensor cores for {dot} on {info.label()} "
            "(FMA arithmetic below sm_80)")


def replace_modules(model: nn.Module, match: type | tuple[type, ...], make: Callable[[nn.Module], nn.Module],
                    exact: bool = False, when: Callable[[nn.Module], bool] | None = None) -> int:
    """Every child module of type ``match`` (exactly, with ``exact``; and ``when(child)``) replaced by
    ``make(child)`` in place; returns how many."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if ((type(child) is match) if exact else isinstance(child, match)) and (when is None or when(child)):
                setattr(parent, name, make(child))  # replaces the entry in place: order kept
                n += 1
    return n


@dataclass
class Swaps:
    """What :func:`swap_kernels` did: op -> a kernel took it over, and why not where not."""

    applied: dict[str, bool] = field(default_factory=lambda: {op: False for op in KERNEL_OPS})
    notes: dict[str, str] = field(default_factory=dict)


def swap_kernels(model: GPT, options: EngineOptions, prec: StepPrecision, info: DeviceInfo | None,
                 device: torch.device) -> Swaps:
    """Swap the norms, attention, Linear layers (GEMM or bias gradient) and embeddings for their
    kernels where requested and applicable; the loss and AdamW are the step's (``Swaps.applied``
    says whether their kernels run)."""
    cfg, want, why_not = model.config, options.kernels(), kernels_runnable(device)
    out = Swaps()
    any_kernel = any(want.values())

    def blocked(op: str, reason: str | None = None) -> bool:
        if not want[op]:
            out.notes[op] = OFF
        elif why_not:
            out.notes[op] = why_not
        elif reason:
            out.notes[op] = reason
        else:
            return False
        return True

    other = "layernorm" if cfg.norm == "rmsnorm" else "rmsnorm"
    out.notes[other] = f"not applicable: the config uses {cfg.norm}"
    if not blocked(cfg.norm):
        from kernels.layernorm import TritonLayerNorm
        from kernels.rmsnorm import TritonRMSNorm

        def norm_kernel(old: nn.Module) -> nn.Module:
            if isinstance(old, RMSNorm):
                new = TritonRMSNorm(old.weight.shape[0], eps=old.eps, dw_partials=options.norm_dw_partials)
            else:
                new = TritonLayerNorm(old.weight.shape[0], bias=old.bias is not None, eps=old.eps)
                new.bias = old.bias
            new.weight = old.weight
            return new

        replace_modules(model, (RMSNorm, LayerNorm), norm_kernel)
        out.applied[cfg.norm] = True

    _swap_attention(model, options, prec, info, blocked, out, why_not, any_kernel)
    _swap_linears(model, options, prec, info, out, why_not, any_kernel)

    out.applied["embedding"] = swap_embeddings(model, options.fuse_embedding, blocked("embedding"), out.notes,
                                               options.atomic_sem)
    out.applied["cross_entropy"] = not blocked("cross_entropy")
    out.applied["adamw"] = not blocked("adamw")
    return out


def _pack_heads(cfg: ModelConfig, options: EngineOptions, out: Swaps) -> int:
    """The query heads per tile of the attention kernel's forward and dQ (``attention_pack_heads``): all of one
    K/V head's where they are a power of two, at most 16, on the packed layout; else 1, with a note saying why."""
    if not options.attention_pack_heads:
        return 1
    group = cfg.n_head // cfg.n_kv_head
    if options.attention_layout != "packed" or group == 1 or group & (group - 1) or group > 16:
        out.notes["attention_pack_heads"] = (
            "not applicable: " + ("the heads layout" if options.attention_layout != "packed" else
                                  f"{group} query heads per K/V head (packing needs 2, 4, 8 or 16)"))
        return 1
    return group


def _swap_attention(model: GPT, options: EngineOptions, prec: StepPrecision, info: DeviceInfo | None,
                    blocked, out: Swaps, why_not: str | None, any_kernel: bool) -> None:
    cfg = model.config
    reason = None
    if cfg.attn_impl == "explicit" and not options.attention_for_explicit:
        reason = ("not applied: attn_impl='explicit' materializes the softmax by design "
                  "(attention_for_explicit=True swaps it too)")
    elif unfit := _attention_kernel_unfit(cfg, prec, info, "; SDPA kept"):
        reason = unfit
    elif prec.base.name == "fp32" and cfg.attn_impl == "sdpa" and options.attention_precision is None:
        # In a CUDA graph SDPA's memory-efficient kernel beat the kernel's strict-fp32 ('ieee', FMA)
        # dots (the attention rows of kernels.jsonl); 'tf32x3' or 'ieee' selects the kernel.
        reason = ("not applied in strict fp32: SDPA's kernel is faster than the 'ieee' one "
                  "(attention_precision='tf32x3' or 'ieee' selects it)")
    if not blocked("attention", reason):
        kv_split = options.attention_kv_split if options.attention_layout == "packed" else None  # packed only
        if kv_split is not None and (cfg.n_head // cfg.n_kv_head) % kv_split:
            out.notes["attention_kv_split"] = (f"not applicable: {kv_split} does not divide the "
                                               f"{cfg.n_head // cfg.n_kv_head} query heads per K/V head")
            kv_split = None
        pack = _pack_heads(cfg, options, out)
        heavy = options.attention_heavy_first and options.attention_layout == "packed"
        if options.attention_heavy_first and not heavy:
            out.notes["attention_heavy_first"] = "not applicable: the heads layout"
        for blk in model.blocks:
            blk.attn = KernelCausalSelfAttention(blk.attn, prec.fp32_dot, options.attention_layout,
                                                 options.fuse_kv_split_sum, options.attention_tiles, kv_split,
                                                 options.attention_bwd_streams, pack, heavy)
        out.applied["attention"] = True
    elif cfg.attn_impl == "explicit" and not cfg.qk_norm:
        # The explicit softmax kept, as written, with its three elementwise passes fused, and with
        # fuse_softmax_matmuls the products on either side of it too (an extension of the fused
        # softmax: fused_softmax=False leaves both off).
        if why_not:
            out.notes["softmax"] = why_not
        elif not any_kernel:
            out.notes["softmax"] = "off: every kernel is switched off (use_kernels=False)"
        elif not options.fused_softmax:
            out.notes["softmax"] = "not fused (fused_softmax=False)"
        else:
            unfit = _explicit_attention_unfit(cfg, options, prec, info) if options.fuse_softmax_matmuls else None
            if options.fuse_softmax_matmuls and unfit is None:
                fwd_one_pass, dq_one_pass, one_pass_note = _explicit_one_pass(cfg, options, info)
                # Heavy-first only under bf16/fp16 autocast: in tf32 its trial was mixed (chapter 6).
                heavy = options.explicit_heavy_first and prec.base.autocast is not None
                if options.explicit_heavy_first and not heavy:
                    out.notes["explicit_heavy_first"] = ("not applied: bf16 and fp16 only (in tf32 its trial was "
                                                         "mixed: chapter 6)")
                for blk in model.blocks:
                    blk.attn = FusedExplicitSelfAttention(blk.attn, prec.low_dtype, prec.fp32_dot,
                                                          options.attention_tiles, fwd_one_pass, dq_one_pass, heavy)
                out.notes["softmax"] = ("scale + causal mask + softmax fused with the products around it "
                                        "(q k^T, P v), the probabilities still written (kernels/explicit_attention.py)"
                                        + one_pass_note)
            else:
                for blk in model.blocks:
                    blk.attn = FusedSoftmaxSelfAttention(blk.attn, prec.low_dtype)
                out.notes["softmax"] = "scale + causal mask + softmax fused (kernels/causal_softmax.py)"
            if unfit:
                out.notes["softmax"] += f"; fuse_softmax_matmuls {unfit}"
    if options.explicit_heavy_first and not isinstance(model.blocks[0].attn, FusedExplicitSelfAttention):
        out.notes["explicit_heavy_first"] = ("not applicable: GPT-2's explicit-attention kernels "
                                             "(fuse_softmax_matmuls) do not take this step's attention")


# The dQ kernel's one-pass tile (option explicit_dq_one_pass): 64 query rows on one warpgroup, the shape
# that beat the two-pass kernel in benchmarks/kernels/explicit_tiles_dev.py's sweep.
DQ_ONE_PASS_ROWS, DQ_ONE_PASS_WARPS = 64, 4


def dq_one_pass_tiles(T: int) -> Tiles:
    """The engine's one-pass dQ tile for rows of T keys (imports the kernels: Triton)."""
    from kernels.explicit_attention import one_pass_tiles

    return one_pass_tiles(T, DQ_ONE_PASS_ROWS, DQ_ONE_PASS_WARPS)


def _explicit_one_pass(cfg: ModelConfig, options: EngineOptions,
                       info: DeviceInfo | None) -> tuple[bool, bool | Tiles, str]:
    """(forward, dQ kernel) one-pass arguments of the explicit attention (options ``explicit_one_pass``,
    ``explicit_dq_one_pass``; the latter's tile wins for dQ where both are on), and what the note adds:
    the kernels take rows of at most ``ONE_PASS_MAX_T`` keys, so the tile spans ``block_size``; the dQ
    option's 64-row tile of fp32 scores needs more shared memory than a block has below sm_80 (a T4's 64 KB)."""
    names = [n for n in ("explicit_one_pass", "explicit_dq_one_pass") if getattr(options, n)]
    if not names:
        return False, False, ""
    from kernels.explicit_attention import ONE_PASS_MAX_T

    if cfg.block_size > ONE_PASS_MAX_T:
        return False, False, (f"; {' and '.join(names)} not applied: the one-pass kernels take rows of up to "
                              f"{ONE_PASS_MAX_T} keys, block_size is {cfg.block_size}")
    fwd, dq, note = options.explicit_one_pass, options.explicit_one_pass, ""
    if options.explicit_dq_one_pass:
        cap = info.capability if info is not None else None
        if cap is not None and cap < (8, 0):
            note = ("; explicit_dq_one_pass not applied: its 64-row tile does not fit a block's shared memory "
                    "below sm_80")
            names.remove("explicit_dq_one_pass")
        else:
            dq = dq_one_pass_tiles(cfg.block_size)
    if not names:
        return False, False, note
    which = "the forward and dQ kernels" if fwd else "the dQ kernel"
    return fwd, dq, f"; {which} in one pass over each row ({', '.join(names)})" + note


def _explicit_attention_unfit(cfg: ModelConfig, options: EngineOptions, prec: StepPrecision,
                              info: DeviceInfo | None) -> str | None:
    """Why GPT-2's explicit attention kernel (kernels/explicit_attention.py) cannot take this step's attention,
    or None: the attention kernels' own limits, and strict fp32 unless a dot precision is set. There its
    products would be IEEE FMA, as cuBLAS's SGEMM is, and its trial measured bf16 and tf32 only (the flash
    kernel's rule in strict fp32 is the same)."""
    if unfit := _attention_kernel_unfit(cfg, prec, info):
        return unfit
    if prec.base.name == "fp32" and options.attention_precision is None:
        return ("not applied in strict fp32: its products would be IEEE FMA like cuBLAS's, not measured faster "
                "(attention_precision='tf32x3' or 'ieee' selects it)")
    return None


def _attention_kernel_unfit(cfg: ModelConfig, prec: StepPrecision, info: DeviceInfo | None,
                            kept: str = "") -> str | None:
    """Why neither attention kernel (the flash one, kernels/attention.py; GPT-2's explicit one,
    kernels/explicit_attention.py) can take this model's attention in this step, or None: a head size
    tl.dot does not take, qk_norm, attention dropout, or no tensor cores for tl.dot (then ``kept`` says
    what runs instead)."""
    if cfg.head_size not in ATTN_HEAD_SIZES:
        return f"not applicable: head size {cfg.head_size} not in {ATTN_HEAD_SIZES}"
    if cfg.qk_norm:
        return "not applicable: qk_norm normalizes q and k between the projection and the kernel"
    if cfg.attn_dropout_p > 0:
        return f"not applicable: the kernel has no attention dropout (attention dropout {cfg.attn_dropout_p})"
    blocked = triton_dot_blocked(info, prec.attention_dot)
    return blocked + kept if blocked else None


def _swap_linears(model: GPT, options: EngineOptions, prec: StepPrecision, info: DeviceInfo | None,
                  out: Swaps, why_not: str | None, any_kernel: bool) -> None:
    lp = options.linear_precision
    if lp is not None:  # every nn.Linear (attention, MLP, head) onto the Triton GEMM, sharing its Parameters
        reason = None if prec.fp32_storage else f"not applicable: {prec.base.name} stays on cuBLAS"
        if reason is None and triton_dot_blocked(info, lp):
            reason = triton_dot_blocked(info, lp) + "; cuBLAS kept"
        if why_not is None and reason is None:
            from kernels.linear import TritonLinear

            replace_modules(model, nn.Linear, lambda lin: TritonLinear(lin, lp))
            out.notes["linear"] = f"Triton GEMM, input_precision={lp!r}"
        else:
            out.notes["linear"] = reason or why_not
    if not options.bias_kernel:
        return
    # Linears with a bias keep their GEMMs on cuBLAS; only the bias gradient moves to a Triton column
    # sum (kernels/bias_linear.py: PyTorch's dy.sum(0) ran far under the copy bandwidth).
    if lp is not None:
        out.notes["bias"] = "not applied: the Linear layers run on the Triton GEMM (linear_precision)"
    elif why_not:
        out.notes["bias"] = why_not
    elif not any_kernel:
        out.notes["bias"] = "off: every kernel is switched off (use_kernels=False)"
    elif not model.config.bias:
        out.notes["bias"] = "not applicable: the config has no biases"
    else:
        from kernels.bias_linear import BiasLinear

        replace_modules(model, nn.Linear, BiasLinear, when=lambda lin: lin.bias is not None)
        out.notes["bias"] = "bias gradients on the Triton column sum (kernels/bias_linear.py)"
