"""The training engine (issue 6): the whole step on flat buffers, captured in one CUDA graph.

``Engine(config, B, T, precision, device)`` owns a model of ``config`` and trains it with
``engine.step(x, y) -> loss``. Against ``ftlib.training.step.train_step`` with ``torch.optim.AdamW``
(same math, same initial weights) it changes how the step is *executed*, not what it computes:

1. **Kernels.** Where a kernel in ``kernels/`` applies, the model's op is swapped for it:
   RMSNorm -> ``TritonRMSNorm``, LayerNorm -> ``TritonLayerNorm``, SDPA attention ->
   ``TritonCausalAttention`` (MQA/GQA K/V shared by indexing, never expanded), the loss ->
   the fused cross-entropy, the embeddings -> a scatter-add backward, AdamW -> the flat
   AdamW kernel. Each can be switched off (``use_kernels={'attention': False}``), falling
   back to the PyTorch op the model uses, so the book can show what each kernel buys.
   Options that are off by default until a GPU run shows they win (benchmarks/kernels/NOTES.md):
   3xTF32 attention and Linear layers in fp32, attention from the packed qkv, residual adds
   fused into the RMSNorm after them.
2. **Flat buffers.** Every parameter is a view into one fp32 buffer and every gradient a
   view into one fp32 grad buffer, decayed matrices first (the two groups of
   ``ftlib.training.step.param_groups``). Then the optimizer is one elementwise kernel over the
   whole model (no per-tensor launches; ``kernels/adamw.py`` explains the segment
   boundary), and zero_grad is one memset; the gradients keep fixed addresses, where
   set_to_none would make every backward allocate ~50 new grad tensors that a flat
   optimizer could not read through one pointer. Cost: autograd *adds* each new gradient
   into its view (AccumulateGrad's in-place branch, since a grad already exists), one add
   per parameter that set_to_none would avoid; at 2.5M parameters that is ~30 MB of
   traffic, ~6 us at 4.8 TB/s.
3. **Static shapes, one graph.** Inputs live in static (B, T) buffers. On CUDA the whole
   step (memset, forward, loss, backward, AdamW) is captured once in a
   ``torch.cuda.CUDAGraph`` and replayed: one launch per step from the host, so no gaps
   between the hundreds of kernels of a step while Python and the dispatcher queue the next one
   (facts.md: at B=32, T=256 the eager step is launch-bound). The capture follows
   PyTorch's "whole-network capture" recipe (CUDA semantics notes): warm up on a side
   stream first (Triton JIT compiles and loads its kernels, cuBLAS creates workspaces,
   the optimizer creates its state: none of that may happen during capture), then capture.
   Unlike the recipe, the warm-up steps are undone (weights and optimizer state restored
   from a snapshot: one copy each, thanks to the flat buffers), so step k of the engine
   is step k of reference training. On CPU the same step runs uncaptured, which is how CI
   tests it (kernels under ``TRITON_INTERPRET=1``).

Precision: ``precision`` is one of ``ftlib.core.precision.PRECISIONS``; TF32 flags and autocast are
set only while the step is warmed up, captured or (uncaptured) run, and restored after,
so the engine changes no global setting. A replay needs no flags: cuBLAS's math mode and
the autocast casts were fixed when the graph was captured. fp16 scales the loss dynamically
inside the captured step (``ftlib.training.loss_scale.DeviceLossScale``: scale, found-inf flag and
clean-step count are device tensors; the flat AdamW kernel unscales, and skips the update on
inf/nan; no host sync), or with the adamw kernel off through ``torch.amp.GradScaler`` and
torch's fused AdamW.

Device: ``ftlib.core.device.DeviceInfo`` (detected, or ``device_info=``, or rehearsed through
``FTLIB_CAPABILITY``). A precision the GPU cannot run as labelled is refused (bf16 and tf32
on a T4), and the Triton matmuls (attention, the Linear GEMM) replace PyTorch's only where
``tl.dot`` gets tensor cores for their precision: below sm_80 Triton has none, so on a T4
attention stays on SDPA and the Linears on cuBLAS. The attention kernels choose their tiles
from the device's shared memory (``kernels.tiles.choose_tiles``).

``check_against_reference`` trains an engine and ``train_step`` + ``torch.optim.AdamW``
side by side from the same weights on the same batches and compares the losses step by
step and the weights at the end (the issue's 100-step check; ``ci/gpu_bench.py``'s
``engine_check`` suite runs it on the GPU).

Import of this module imports neither Triton nor ``kernels``' op modules: they are
imported when an engine that uses them is built.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ftlib.core.device import DeviceInfo, pick_device
from ftlib.core.precision import PRECISIONS, precision_region
from ftlib.model.attention import CausalSelfAttention
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import GPT, build_model
from ftlib.model.norm import LayerNorm, RMSNorm
from ftlib.training.loss_scale import DeviceLossScale, LossScaleConfig, make_grad_scaler, needs_loss_scaling
from ftlib.training.step import grad_scaler, make_optimizer, train_step

# The ops a kernel can take over, each switchable on its own.
OPS = ("rmsnorm", "layernorm", "attention", "embedding", "cross_entropy", "adamw")
# Head sizes the attention kernel supports (tl.dot needs a power of two in [16, 128]).
ATTN_HEAD_SIZES = (16, 32, 64, 128)
# Side-stream steps before capture; PyTorch's whole-network example uses 3.
WARMUP_STEPS = 3
# Engine options a benchmark case may carry in its ``extra`` (ftlib.harness.bench's 'engine' mode).
BENCH_OPTIONS = ("use_kernels", "attention_for_explicit", "capture", "linear_precision", "attention_precision",
                 "attention_layout", "fuse_residual_norm", "bias_kernel", "bf16_norm_out", "bf16_weights",
                 "fuse_dropout", "dropout_rng4", "fused_softmax")
# 'heads': q/k/v as (B, h, T, hs) views, o transposed back with a copy;
# 'packed' (the default): kernels.attention.packed_attention reads the qkv output and writes
# (B, T, C) directly, d(qkv) into one buffer (no layout copies). H200, FT, engine round 3:
# 2.95 -> 2.83 ms per step in tf32, 2.45 -> 2.36 in bf16 (data/results/h200/engine.jsonl).
ATTENTION_LAYOUTS = ("heads", "packed")
# Engine precisions the Triton GEMM (kernels/linear.py) may take the Linear layers in: fp32
# storage only (bf16 autocast stays on cuBLAS's bf16 tensor-core GEMMs).
LINEAR_PRECISIONS = ("ieee", "tf32", "tf32x3")


def resolve_kernels(use_kernels: bool | Mapping[str, bool]) -> dict[str, bool]:
    """``True``/``False`` for all ops, or a dict overriding some ops (the others stay on)."""
    if isinstance(use_kernels, bool):
        return {op: use_kernels for op in OPS}
    unknown = sorted(set(use_kernels) - set(OPS))
    if unknown:
        raise ValueError(f"unknown kernel op(s) {unknown} in use_kernels; known ops: {list(OPS)}")
    return {op: bool(use_kernels.get(op, True)) for op in OPS}


def _kernels_runnable(device: torch.device) -> tuple[bool, str]:
    """Triton kernels run on CUDA tensors, or on CPU tensors in the interpreter."""
    import kernels

    if not kernels.HAS_TRITON:
        return False, "Triton is not installed"
    if device.type == "cuda":
        return True, ""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True, ""
    return False, f"no Triton on {device.type} (set TRITON_INTERPRET=1 before importing triton for the CPU)"


class KernelCausalSelfAttention(nn.Module):
    """``ftlib.attention.CausalSelfAttention`` with its attention core on the Triton kernel.

    It takes over the original's ``qkv`` and ``proj`` Linears (the same Parameter objects,
    registered under the same names and in the same order, so parameter lists and
    optimizer groups are unchanged). K and V stay (B, nkv, T, hs) strided views of the
    qkv output: the kernel maps query head h to K/V head h // (nh // nkv) by pointer
    arithmetic, so MQA/GQA needs no expand and no copy (the SDPA path needs an expanded
    (B, nh, T, hs) K/V in fp32 to avoid the math backend; facts.md).
    """

    def __init__(self, attn: CausalSelfAttention, input_precision: str, layout: str = "heads") -> None:
        super().__init__()
        from kernels.attention import TritonCausalAttention

        self.n_head, self.n_kv_head, self.head_size = attn.n_head, attn.n_kv_head, attn.head_size
        self.qkv, self.proj, self.resid_dropout = attn.qkv, attn.proj, attn.resid_dropout
        # Tiles chosen per kernel by the launchers: 64 x 64 at the book's T where the device's
        # shared memory allows, smaller for short sequences (kernels.tiles.choose_tiles).
        self.core = TritonCausalAttention(input_precision)
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "packed":
            from kernels.attention import packed_attention

            y = packed_attention(self.qkv(x), self.n_head, self.n_kv_head, self.head_size,
                                 self.core.input_precision, self.core.block_m, self.core.block_n)  # (B, T, C)
            return self.resid_dropout(self.proj(y))
        B, T, C = x.shape
        kv_dim = self.n_kv_head * self.head_size
        q, k, v = self.qkv(x).split([C, kv_dim, kv_dim], dim=-1)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs), a view
        k = k.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs), a view
        v = v.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs), a view
        y = self.core(q, k, v)  # (B, nh, T, hs), contiguous
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C), heads side by side
        return self.resid_dropout(self.proj(y))


class FusedSoftmaxSelfAttention(nn.Module):
    """GPT-2's explicit attention as written (the (B, nh, T, T) probabilities materialized for
    ``att @ v``) with scale, causal mask and softmax in one Triton kernel each way
    (``kernels/causal_softmax.py``), the fusion torch.compile makes of the same three ops.

    Takes over the original's ``qkv``, ``proj``, dropouts (same Parameters, same order).
    ``out_dtype``: the dtype the probabilities are written in (bf16 under bf16 autocast, what
    the ``att @ v`` matmul would cast them to; None keeps the scores' dtype).
    """

    def __init__(self, attn: CausalSelfAttention, out_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        from kernels.causal_softmax import CausalSoftmax

        self.n_head, self.n_kv_head, self.head_size = attn.n_head, attn.n_kv_head, attn.head_size
        self.qkv, self.proj, self.resid_dropout = attn.qkv, attn.proj, attn.resid_dropout
        self.attn_dropout_p = attn.dropout
        self.softmax = CausalSoftmax(1.0 / math.sqrt(self.head_size))
        self.out_dtype = out_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_size
        q, k, v = self.qkv(x).split([C, nkv * hs, nkv * hs], dim=-1)
        q = q.view(B, T, nkv, nh // nkv, hs).permute(0, 2, 3, 1, 4)  # (B, nkv, r, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2).unsqueeze(2)  # (B, nkv, 1, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2).unsqueeze(2)  # (B, nkv, 1, T, hs)
        att = self.softmax(q @ k.transpose(-2, -1), self.out_dtype)  # (B, nkv, r, T, T)
        if self.training and self.attn_dropout_p > 0:
            att = F.dropout(att, p=self.attn_dropout_p)
        y = (att @ v).reshape(B, nh, T, hs)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C), heads side by side
        return self.resid_dropout(self.proj(y))


def _attention_dot(precision: str, attention_precision: str | None) -> str:
    """The tl.dot input of the attention kernel: the autocast dtype under bf16/fp16, else the
    fp32 input precision (strict 'ieee' unless tf32 or an explicit attention_precision)."""
    if precision in ("bf16", "fp16"):
        return precision
    return attention_precision or ("tf32" if precision == "tf32" else "ieee")


def _triton_dot_blocked(info: DeviceInfo | None, dot: str) -> str | None:
    """Why a Triton matmul with ``tl.dot`` input ``dot`` stays off on this GPU (None: it may run).

    Below sm_80 Triton lowers every tl.dot to FMA arithmetic (ftlib.core.device), where SDPA's
    kernels and cuBLAS use the tensor cores; 'ieee' is FMA by definition and only ever runs
    when asked for explicitly, so it is left to the caller.
    """
    if info is None or info.kind != "cuda" or dot == "ieee" or info.triton_dot_uses_tensor_cores(dot):
        return None
    return (f"not applied: Triton's tl.dot has no tensor cores for {dot} on {info.label()} "
            "(FMA arithmetic below sm_80)")


def _swap_modules(
    model: GPT, want: dict[str, bool], T: int, precision: str, attention_for_explicit: bool,
    runnable: tuple[bool, str], linear_precision: str | None = None, attention_precision: str | None = None,
    attention_layout: str = "packed", bias_kernel: bool = False, fused_softmax: bool = True,
    info: DeviceInfo | None = None,
) -> tuple[dict[str, bool], dict[str, str]]:
    """Replace norms and attention cores by kernel modules in place; returns (applied, notes).

    The new modules share the old ones' Parameter objects and take their place in the
    parent's ordered ``_modules``, so ``model.parameters()`` keeps its order and identity.
    ``info`` (a GPU's description): Triton matmuls (attention, the Linear GEMM) only where
    ``tl.dot`` gets tensor cores for their precision there (:func:`_triton_dot_blocked`).
    """
    cfg = model.config
    ok, why_not = runnable
    applied = {op: False for op in OPS}
    notes: dict[str, str] = {}

    def blocked(op: str, reason: str | None) -> bool:
        if not want[op]:
            notes[op] = "switched off: PyTorch reference op"
            return True
        if not ok:
            notes[op] = why_not
            return True
        if reason:
            notes[op] = reason
            return True
        return False

    norm_op = cfg.norm  # 'rmsnorm' or 'layernorm'
    other_norm = "layernorm" if norm_op == "rmsnorm" else "rmsnorm"
    notes[other_norm] = f"not applicable: the config uses {norm_op}"
    if not blocked(norm_op, None):
        from kernels.layernorm import TritonLayerNorm
        from kernels.rmsnorm import TritonRMSNorm

        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, RMSNorm):
                    new = TritonRMSNorm(child.weight.shape[0], eps=child.eps)
                elif isinstance(child, LayerNorm):
                    new = TritonLayerNorm(child.weight.shape[0], bias=child.bias is not None, eps=child.eps)
                    new.bias = child.bias
                else:
                    continue
                new.weight = child.weight
                setattr(parent, name, new)  # replaces the entry in place: order kept
        applied[norm_op] = True

    reason = None
    if cfg.attn_impl == "explicit" and not attention_for_explicit:
        reason = ("not applied: attn_impl='explicit' materializes the softmax by design "
                  "(attention_for_explicit=True swaps it too)")
    elif cfg.head_size not in ATTN_HEAD_SIZES:
        reason = f"not applicable: head size {cfg.head_size} not in {ATTN_HEAD_SIZES}"
    elif cfg.attn_dropout_p > 0:
        reason = f"not applicable: the kernel has no attention dropout (attention dropout {cfg.attn_dropout_p})"
    elif _triton_dot_blocked(info, _attention_dot(precision, attention_precision)):
        reason = _triton_dot_blocked(info, _attention_dot(precision, attention_precision)) + "; SDPA kept"
    elif precision == "fp32" and cfg.attn_impl == "sdpa" and attention_precision is None:
        # Only a measured winner enters the step: in a CUDA graph on the H200 the kernel's
        # strict-fp32 ('ieee', FMA) dots took 743 us fwd+bwd per FastTransformer layer against
        # SDPA's memory-efficient kernel's 357 (kernels.jsonl, 2026-12-02). attention_precision
        # ='tf32x3' (fp32-accurate, 211 us) or 'ieee' selects the kernel explicitly.
        reason = ("not applied in strict fp32: SDPA's kernel is faster than the 'ieee' one "
                  "(attention_precision='tf32x3' or 'ieee' selects it)")
    if not blocked("attention", reason):
        # fp32 storage: strict IEEE dots, or TF32 tensor cores when the precision is tf32;
        # bf16/fp16 operands (autocast) always go to the MMA directly.
        input_precision = attention_precision or ("tf32" if precision == "tf32" else "ieee")
        for blk in model.blocks:
            blk.attn = KernelCausalSelfAttention(blk.attn, input_precision, attention_layout)
        applied["attention"] = True
    elif fused_softmax and cfg.attn_impl == "explicit":
        # The explicit softmax kept, as written, with its three elementwise passes fused.
        if not ok:
            notes["softmax"] = why_not
        elif not any(want.values()):
            notes["softmax"] = "off: every kernel is switched off (use_kernels=False)"
        else:
            out = torch.bfloat16 if precision == "bf16" else None
            for blk in model.blocks:
                blk.attn = FusedSoftmaxSelfAttention(blk.attn, out)
            notes["softmax"] = "scale + causal mask + softmax fused (kernels/causal_softmax.py)"

    if linear_precision is not None:
        # Every nn.Linear (attention, MLP, head) onto the Triton GEMM, sharing its Parameters.
        reason = None if precision in ("fp32", "tf32") else f"not applicable: {precision} stays on cuBLAS"
        if reason is None and _triton_dot_blocked(info, linear_precision):
            reason = _triton_dot_blocked(info, linear_precision) + "; cuBLAS kept"
        if ok and reason is None:
            from kernels.linear import TritonLinear

            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.Linear):
                        setattr(parent, name, TritonLinear(child, linear_precision))
            notes["linear"] = f"Triton GEMM, input_precision={linear_precision!r}"
        else:
            notes["linear"] = reason or why_not

    if bias_kernel:
        # Linears with a bias keep their GEMMs on cuBLAS; only the bias gradient moves to a
        # Triton column sum (kernels/bias_linear.py: PyTorch's dy.sum(0) was ~5x off bandwidth).
        if linear_precision is not None:
            notes["bias"] = "not applied: the Linear layers run on the Triton GEMM (linear_precision)"
        elif not ok:
            notes["bias"] = why_not
        elif not any(want.values()):  # use_kernels=False: no Triton kernel at all
            notes["bias"] = "off: every kernel is switched off (use_kernels=False)"
        elif not cfg.bias:
            notes["bias"] = "not applicable: the config has no biases"
        else:
            from kernels.bias_linear import BiasLinear

            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if isinstance(child, nn.Linear) and child.bias is not None:
                        setattr(parent, name, BiasLinear(child))
            notes["bias"] = "bias gradients on the Triton column sum (kernels/bias_linear.py)"

    if not blocked("embedding", None):
        from kernels.embedding import ScatterEmbedding

        # Token and position tables: the same Parameters, a scatter-add backward.
        model.wte = ScatterEmbedding(model.wte)
        model.wpe = ScatterEmbedding(model.wpe)
        applied["embedding"] = True

    applied["cross_entropy"] = not blocked("cross_entropy", None)
    applied["adamw"] = not blocked("adamw", None)
    return applied, notes


def forward_fused_residual_norm(
    model: GPT, idx: torch.Tensor, norm_out_dtype: torch.dtype | None = None,
    dropout: tuple[float, torch.Tensor, bool] | None = None,
) -> torch.Tensor:
    """``GPT.forward`` (logits only) with each residual add fused into the norm that follows it.

    The same function as the model's pre-norm blocks (x + attn(norm1(x)), x + mlp(norm2(x)),
    then norm_f and the head), regrouped so that every ``x = x + branch`` meets the next
    norm in one kernel (:mod:`kernels.residual_norm`, RMSNorm or LayerNorm with its bias):
    after attention that is the block's norm2, after the MLP the next block's norm1 (the
    final norm_f after the last block). ``norm_out_dtype``: the fused norms write their output
    in this dtype (bf16 under bf16 autocast: what the next Linear would cast it to).
    ``dropout``: (p, seed tensor, rng4): the branches' residual dropout runs inside the fused kernels
    (call site k of the step draws with salt k), for a model whose branch dropout modules were
    replaced by identities (:func:`fuse_residual_dropout_`); in eval mode p is ignored.
    """
    from kernels.residual_norm import add_layer_norm, add_rms_norm

    p, seed, rng4 = dropout if (dropout is not None and model.training) else (0.0, None, False)
    salt = 0

    def add_norm(x: torch.Tensor, r: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal salt
        salt += 1
        if model.config.norm == "layernorm":
            return add_layer_norm(x, r, norm.weight, norm.bias, norm.eps, norm_out_dtype, p=p, seed=seed, salt=salt,
                                  rng4=rng4)
        return add_rms_norm(x, r, norm.weight, norm.eps, norm_out_dtype, p=p, seed=seed, salt=salt, rng4=rng4)

    B, T = idx.shape
    model.config.check_sequence(T)
    pos = torch.arange(T, device=idx.device)
    x = model.drop(model.wte(idx) + model.wpe(pos))  # (B, T, C)
    blocks = list(model.blocks)
    h = blocks[0].norm1(x)
    for i, blk in enumerate(blocks):
        x, h = add_norm(x, blk.attn(h), blk.norm2)
        after = blocks[i + 1].norm1 if i + 1 < len(blocks) else model.norm_f
        x, h = add_norm(x, blk.mlp(h), after)
    return model.head(h)


def fuse_residual_dropout_(model: GPT) -> float:
    """Replace every block's branch dropout (attention's ``resid_dropout``, the MLP's ``dropout``)
    by an identity, in place; returns their p, which :func:`forward_fused_residual_norm` then
    applies inside the fused residual-norm kernels. The embedding dropout stays a module."""
    p = model.config.dropout
    for blk in model.blocks:
        blk.attn.resid_dropout = nn.Identity()
        blk.mlp.dropout = nn.Identity()
    return p


def flatten_parameters_(
    params: list[nn.Parameter],
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Move every parameter into one flat fp32 buffer and bind its ``.grad`` to one flat grad buffer.

    After the call ``p.data`` is a view ``flat_param[off : off + n].view_as(p)`` and ``p.grad``
    the same slice of ``flat_grad`` (zeros), in the order given. Returns
    (flat_param (N,), flat_grad (N,), [(offset, numel)] per parameter). The grads must then
    never be set to None (``model.zero_grad()`` would detach them from the buffer).
    """
    device = params[0].device
    for i, p in enumerate(params):
        if p.dtype != torch.float32 or p.device != device:
            raise TypeError(f"parameter {i} is {p.dtype} on {p.device}; flat buffers need fp32 on {device}")
    total = sum(p.numel() for p in params)
    flat_param = torch.empty(total, dtype=torch.float32, device=device)
    flat_grad = torch.zeros(total, dtype=torch.float32, device=device)
    spans, off = [], 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat_param[off : off + n].copy_(p.reshape(-1))
            p.data = flat_param[off : off + n].view_as(p)
            p.grad = flat_grad[off : off + n].view_as(p)
            spans.append((off, n))
            off += n
    return flat_param, flat_grad, spans


class Engine:
    """One model, its flat buffers and optimizer state, and (on CUDA) its captured step.

    ``use_kernels``: True (every kernel that applies), False (none: the plain PyTorch
    step, still flat and captured) or ``{op: bool}`` over ``OPS`` (unnamed ops stay on).
    ``attention_for_explicit``: also replace the explicit materialized-softmax attention
    (attn_impl='explicit', GPT-2) by the kernel: the same function, but that is the post's
    "fused attention" change, so it is off by default. ``capture``: None = on CUDA only.
    ``linear_precision``: None keeps the Linear layers on cuBLAS; 'tf32x3', 'ieee' or 'tf32'
    runs them on the Triton GEMM of ``kernels/linear.py`` (fp32 storage only). 'tf32x3' is
    fp32-accurate on tensor cores (3xTF32): the engine's answer to a strict-fp32 step that
    is bound by SIMT SGEMM. ``attention_precision``: overrides the attention kernel's
    ``input_precision`` (default 'ieee' in fp32, 'tf32' in tf32). ``attention_layout``: one of
    ``ATTENTION_LAYOUTS`` (default 'packed'). ``fuse_residual_norm`` (default on): every residual
    add and the norm after it (RMSNorm or LayerNorm) in one kernel each way
    (:func:`forward_fused_residual_norm`; round 3 on the H200, FT tf32: 2.83 -> 2.44 ms).
    ``bias_kernel`` (default on): Linear layers with a bias compute its gradient with the Triton
    column sum of ``kernels/bias_linear.py`` (GEMMs stay on cuBLAS). ``bf16_norm_out`` (default
    on): under bf16, the fused norms write their output in bf16 (the values the next Linear's
    autocast cast would give, without that cast kernel and its backward). ``bf16_weights``
    (default on): under bf16, the plain Linear layers read their weights from one bf16 copy of
    the flat buffer made at the start of each step, instead of one autocast cast per weight
    (``ftlib/bf16_weights.py``; the bias-kernel Linears keep autocast's casts). All three compute
    the same values as without them; measured as variants of round 4 on the H200 (GPT-2 +flash
    tf32 3.79 -> 3.71 ms and bf16 3.00 -> 2.64 ms; FT bf16 1.90 -> 1.81 ms) and default from round 5.
    ``fuse_dropout`` (default on; with dropout > 0 and the fused residual-norm): each branch's
    residual dropout runs inside the fused residual-norm kernels, its mask drawn from Philox
    keyed by a seed tensor that the step increments (so every graph replay draws new masks) and
    redrawn in the backward (kernels/residual_norm.py): no dropout kernels. Same distribution as
    ``nn.Dropout``, another random stream, so training with it is not bit-comparable to the
    reference (its test applies the kernels' masks to the reference instead). ``dropout_rng4``
    (default on): one Philox call per 4 columns. H200, the speedrun step (B=64, dropout 0.2,
    bf16; engine_probe.jsonl): 2.82 ms with ``nn.Dropout``, 2.90 ms fused with one Philox call
    per element (the norm kernels grew by more than the dropout kernels removed), 2.68 ms fused
    with one call per 4 columns. ``fused_softmax`` (default on from round 6): for explicit
    attention left as written (GPT-2 without ``attention_for_explicit``), scale, causal mask
    and softmax run as one Triton kernel each way (``kernels/causal_softmax.py``), the
    probabilities still materialized: the fusion torch.compile applies to the same ops. H200,
    GPT-2 as a round-5 variant (engine.jsonl): tf32 6.68 -> 5.02 ms, bf16 5.79 -> 3.49, fp32
    11.20 -> 9.54.
    Optimizer: AdamW with ``lr, betas, eps, weight_decay`` on the 'matrices' groups of
    ``ftlib.training.step.param_groups`` (decay parameters with >= 2 dims only), like
    ``ftlib.training.step.make_optimizer``. ``grad_clip``: clip the global gradient norm to this
    value before the optimizer step, like ``torch.nn.utils.clip_grad_norm_`` (None: no clipping).
    ``loss_scale`` (fp16 only): the dynamic loss scaling's knobs (``ftlib.training.loss_scale.LossScaleConfig``,
    default ``torch.amp.GradScaler``'s). ``device_info``: the device description the precision
    check and the Triton-vs-PyTorch choices read (default ``DeviceInfo.detect(device)``).

    Attributes: ``model``, ``flat_param`` / ``flat_grad`` (N,), ``n_decay`` (elements
    [0, n_decay) are decayed), ``spans`` (name -> (offset, numel)), ``kernels`` (op ->
    applied?), ``notes`` (op -> why not), ``captured``, ``static_x`` / ``static_y`` (B, T).
    """

    def __init__(
        self,
        config: ModelConfig | str,
        B: int,
        T: int,
        precision: str = "fp32",
        device: torch.device | str = "auto",
        use_kernels: bool | Mapping[str, bool] = True,
        *,
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        seed: int | None = 0,
        capture: bool | None = None,
        attention_for_explicit: bool = False,
        warmup_steps: int = WARMUP_STEPS,
        grad_clip: float | None = None,
        linear_precision: str | None = None,
        attention_precision: str | None = None,
        attention_layout: str = "packed",
        fuse_residual_norm: bool = True,
        bias_kernel: bool = True,
        bf16_norm_out: bool = True,
        bf16_weights: bool = True,
        fuse_dropout: bool = True,
        dropout_rng4: bool = True,
        fused_softmax: bool = True,
        loss_scale: LossScaleConfig | None = None,
        device_info: DeviceInfo | None = None,
    ) -> None:
        cfg = preset(config) if isinstance(config, str) else config
        cfg.check_sequence(T)
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
        dev = pick_device(device) if isinstance(device, str) else torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        # What the GPU can do (FTLIB_CAPABILITY rehearses another's): no row under a precision
        # label the device cannot run as labelled, and no Triton matmul without tensor cores.
        self.device_info = device_info or DeviceInfo.detect(dev)
        if self.device_info.kind == "cuda":
            reason = self.device_info.why_not(precision)
            if reason is not None:
                raise ValueError(f"precision={precision!r} on {self.device_info.label()}: {reason}")
        if loss_scale is not None and not needs_loss_scaling(precision):
            raise ValueError(f"loss_scale is for precision='fp16' (dynamic loss scaling), got precision={precision!r}")
        self.loss_scale_config = loss_scale or LossScaleConfig()
        self.capture = dev.type == "cuda" if capture is None else bool(capture)
        if self.capture and dev.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA device, got {dev}")
        self.config, self.B, self.T, self.precision, self.device = cfg, int(B), int(T), precision, dev
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip={grad_clip} must be positive (or None for no clipping)")
        self.grad_clip = grad_clip
        self.requested = resolve_kernels(use_kernels)
        for name, val in (("linear_precision", linear_precision), ("attention_precision", attention_precision)):
            if val is not None and val not in LINEAR_PRECISIONS:
                raise ValueError(f"{name}={val!r}; expected None or one of {LINEAR_PRECISIONS}")
        self.linear_precision, self.attention_precision = linear_precision, attention_precision
        if attention_layout not in ATTENTION_LAYOUTS:
            raise ValueError(f"attention_layout={attention_layout!r}; expected one of {ATTENTION_LAYOUTS}")
        self.attention_layout = attention_layout
        self.fuse_residual_norm = False  # set below once the model and its kernels are known

        # Same initial weights as build_model(cfg, seed) - the reference's - then kernels in.
        self.model = build_model(cfg, seed=seed).to(dev)
        self.model.train()
        self.kernels, self.notes = _swap_modules(
            self.model, self.requested, self.T, precision, attention_for_explicit, _kernels_runnable(dev),
            linear_precision, attention_precision, attention_layout, bias_kernel, fused_softmax, self.device_info,
        )
        if fuse_residual_norm:
            ok, why_not = _kernels_runnable(dev)
            if not ok:
                self.notes["residual_norm"] = why_not
            elif not self.kernels[cfg.norm]:
                self.notes["residual_norm"] = f"off: the {cfg.norm} kernel is switched off"
            else:
                self.fuse_residual_norm = True
                self.notes["residual_norm"] = f"residual add fused into the next {cfg.norm} (kernels/residual_norm.py)"
        # bf16 only, with the fused norms: their outputs feed Linears that autocast casts to bf16.
        self.norm_out_dtype = torch.bfloat16 if (bf16_norm_out and precision == "bf16"
                                                 and self.fuse_residual_norm) else None
        # Residual dropout inside the fused residual-norm kernels: the mask drawn from a seed
        # tensor the step increments (kernels/residual_norm.py), no dropout kernels.
        self.resid_dropout: tuple[float, torch.Tensor, bool] | None = None
        if fuse_dropout and cfg.dropout > 0:
            if not self.fuse_residual_norm:
                self.notes["fuse_dropout"] = "not applied: needs the fused residual-norm"
            else:
                gen = torch.Generator().manual_seed(0 if seed is None else seed)
                start = torch.randint(0, 2**40, (1,), generator=gen, dtype=torch.int64)
                self.resid_dropout = (fuse_residual_dropout_(self.model), start.to(dev), bool(dropout_rng4))
                self.notes["fuse_dropout"] = (f"residual dropout p={cfg.dropout} inside the fused residual-norm "
                                              "(mask from Philox, redrawn in the backward)")
        if bf16_norm_out and self.norm_out_dtype is None:
            self.notes["bf16_norm_out"] = "not applied: needs precision='bf16' and the fused residual-norm"
        if self.kernels["cross_entropy"]:
            from functools import partial

            from kernels.cross_entropy import cross_entropy

            # The kernel's target check is a host sync per call, which an uncaptured CUDA step
            # must not have (step() queues ahead of the device). The targets are the engine's
            # own static buffer, filled from the data loader's tokens, so they are in range.
            self._loss_fn = partial(cross_entropy, check_targets=dev.type != "cuda")
        else:
            self._loss_fn = F.cross_entropy  # exactly what GPT.forward computes

        # Flat buffers, decayed parameters first (ftlib.training.step.param_groups 'matrices').
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        decay = [(n, p) for n, p in named if p.dim() >= 2]
        no_decay = [(n, p) for n, p in named if p.dim() < 2]
        ordered = decay + no_decay
        self.flat_param, self.flat_grad, spans = flatten_parameters_([p for _, p in ordered])
        self.spans = {n: s for (n, _), s in zip(ordered, spans)}
        self.n_decay = sum(p.numel() for _, p in decay)
        self._make_optimizer(lr, [p for _, p in decay], [p for _, p in no_decay])

        self.flat_param16: torch.Tensor | None = None
        if bf16_weights:
            self._shadow_linears(precision, linear_precision)

        self.static_x = torch.zeros(self.B, self.T, dtype=torch.long, device=dev)  # (B, T) tokens
        self.static_y = torch.zeros(self.B, self.T, dtype=torch.long, device=dev)  # (B, T) targets
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_loss: torch.Tensor | None = None
        self.captured = False
        if self.capture:
            self._warm_up_and_capture(warmup_steps)

    def _shadow_linears(self, precision: str, linear_precision: str | None) -> None:
        """bf16 only: every plain nn.Linear reads its weight from one bf16 shadow of the decayed
        (matrix) part of the flat buffer, refreshed by one copy per step (ftlib/bf16_weights.py)."""
        if precision != "bf16":
            self.notes["bf16_weights"] = "not applied: needs precision='bf16'"
            return
        if linear_precision is not None:
            self.notes["bf16_weights"] = "not applied: the Linear layers run on the Triton GEMM"
            return
        from ftlib.training.bf16_weights import ShadowLinear

        span_of = {id(p): self.spans[n] for n, p in self.model.named_parameters()}
        self.flat_param16 = torch.empty(self.n_decay, dtype=torch.bfloat16, device=self.device)
        n = 0
        for parent in list(self.model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:  # not the Triton GEMM or bias-kernel Linears
                    off, size = span_of[id(child.weight)]
                    w16 = self.flat_param16[off : off + size].view_as(child.weight)
                    setattr(parent, name, ShadowLinear(child, w16))
                    n += 1
        self.notes["bf16_weights"] = f"{n} Linear layers on one bf16 shadow of the flat weights"

    # -- optimizer ---------------------------------------------------------------------

    def _make_optimizer(self, lr: float, decay: list[nn.Parameter], no_decay: list[nn.Parameter]) -> None:
        # fp16: dynamic loss scaling, on the device with the flat AdamW kernel (it unscales and
        # skips), else torch's GradScaler (sync-free with the fused AdamW used on CUDA).
        self.loss_scale: DeviceLossScale | None = None
        self.scaler: torch.amp.GradScaler | None = None
        if needs_loss_scaling(self.precision):
            if self.kernels["adamw"]:
                self.loss_scale = DeviceLossScale(self.device, self.loss_scale_config)
            else:
                self.scaler = make_grad_scaler(self.precision, self.device, self.loss_scale_config)
                self._scaler_state0 = self.scaler.state_dict()
        if self.kernels["adamw"]:
            # State as flat as the parameters; step and lr are device scalars, read by the
            # kernel on every replay (torch's capturable=True keeps them on the device too).
            self.exp_avg = torch.zeros_like(self.flat_param)
            self.exp_avg_sq = torch.zeros_like(self.flat_param)
            self.step_t = torch.zeros((), dtype=torch.float32, device=self.device)
            self.lr_t = torch.tensor(lr, dtype=torch.float32, device=self.device)
            self.optimizer = None
            self.optimizer_name = "flat-adamw-triton"
            return
        groups = [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.device.type == "cuda":
            # The best capturable PyTorch AdamW: one fused kernel per group, step on the device
            # (what ftlib.harness.bench's cudagraph mode uses).
            self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=self.betas, eps=self.eps,
                                               fused=True, capturable=True)
            self.optimizer_name = "adamw-fused-capturable"
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=self.betas, eps=self.eps)
            self.optimizer_name = "adamw-default"

    @torch.no_grad()
    def _optimizer_step(self) -> None:
        if self.optimizer is not None:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # skips on inf/nan (fused: on the device)
                self.scaler.update()
            else:
                self.optimizer.step()
            return
        from kernels.adamw import adamw_step_

        ls = self.loss_scale
        # Its own launch: incrementing inside the kernel would race with its readers. A step the
        # loss scaler skips leaves the count where it was, as torch's GradScaler does.
        self.step_t += 1 if ls is None else ls.step_increment()
        adamw_step_(self.flat_param, self.flat_grad, self.exp_avg, self.exp_avg_sq, self.step_t, self.lr_t,
                    betas=self.betas, eps=self.eps, weight_decay=self.weight_decay, n_decay=self.n_decay,
                    grad_scaling=None if ls is None else (ls.grad_mul, ls.found_inf))
        if ls is not None:
            ls.update_()

    @torch.no_grad()
    def _reset_optimizer(self) -> None:
        """Back to a fresh optimizer (zero moments, step 0) and loss scale, in place so captured
        pointers stay valid."""
        if self.loss_scale is not None:
            self.loss_scale.reset_()
        if self.scaler is not None:
            self.scaler.load_state_dict(self._scaler_state0)  # fills its scale and tracker in place
        if self.optimizer is None:
            self.exp_avg.zero_()
            self.exp_avg_sq.zero_()
            self.step_t.zero_()
            return
        for state in self.optimizer.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    v.zero_()  # step, exp_avg, exp_avg_sq

    def set_lr(self, lr: float) -> None:
        """Change the learning rate; a captured graph reads the new value on its next replay."""
        if self.optimizer is None:
            self.lr_t.fill_(lr)
            return
        if self.captured:  # torch's AdamW takes a float lr: the capture baked it into the graph
            raise RuntimeError("set_lr after capture needs the adamw kernel (its lr is a device tensor)")
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    # -- the step ----------------------------------------------------------------------

    def _step_body(self) -> torch.Tensor:
        """zero grad (one memset) + forward + loss + backward + AdamW, on the static buffers."""
        self.flat_grad.zero_()
        if self.flat_param16 is not None:  # the step's bf16 weights, one copy (ftlib/bf16_weights.py)
            self.flat_param16.copy_(self.flat_param[: self.n_decay])
        if self.resid_dropout is not None:  # a new mask every step, also on graph replay
            self.resid_dropout[1].add_(1)
        if self.fuse_residual_norm:
            logits = forward_fused_residual_norm(self.model, self.static_x, self.norm_out_dtype,
                                                 self.resid_dropout)  # (B, T, V)
        else:
            logits, _ = self.model(self.static_x)  # (B, T, V)
        loss = self._loss_fn(logits.view(self.B * self.T, -1), self.static_y.view(self.B * self.T))
        if self.loss_scale is not None:
            # Scaled backward; unscale and clip become one multiplier inside the AdamW kernel.
            self.loss_scale.scale_loss(loss).backward()
            self.loss_scale.unscale_factor_(self.flat_grad, self.grad_clip)
        else:
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.optimizer)  # the grads are views of flat_grad: unscaled in place
            else:
                loss.backward()
            if self.grad_clip is not None:  # clip_grad_norm_'s formula on the flat buffer; no host sync
                norm = torch.linalg.vector_norm(self.flat_grad)
                self.flat_grad.mul_(torch.clamp(self.grad_clip / (norm + 1e-6), max=1.0))
        self._optimizer_step()
        return loss.detach()

    def _warm_up(self, steps: int) -> None:
        """Run ``steps`` real steps (kernels compile and load, the optimizer creates its state),
        then undo them, so that engine step 0 starts from the initial weights like the reference."""
        saved = self.flat_param.clone()  # one copy: the flat buffer holds every weight
        for _ in range(steps):
            self._step_body()
        with torch.no_grad():
            self.flat_param.copy_(saved)
        self._reset_optimizer()

    def _warm_up_and_capture(self, warmup_steps: int) -> None:
        """PyTorch's whole-network capture: side-stream warm-up, then one graph of the step."""
        with precision_region(self.precision, self.device):
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._warm_up(max(1, warmup_steps))
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # Nothing runs during capture, it is only recorded; activations come from the
            # graph's private memory pool and are reused by every replay. The grads exist
            # (views into flat_grad), so backward accumulates into them in place.
            with torch.cuda.graph(self.graph):
                self.static_loss = self._step_body()
        self.captured = True

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step on tokens x and targets y (B, T); returns the loss (0-dim, detached).

        On CUDA the returned tensor is the graph's static output: the next step overwrites
        it, so take ``.item()`` or ``.clone()`` before then. No host sync happens here.
        Passing ``static_x`` / ``static_y`` themselves (after filling them) skips the copies.
        """
        if tuple(x.shape) != (self.B, self.T) or tuple(y.shape) != (self.B, self.T):
            raise ValueError(f"x and y must be ({self.B}, {self.T}); got {tuple(x.shape)}, {tuple(y.shape)}")
        if x is not self.static_x:
            self.static_x.copy_(x)
        if y is not self.static_y:
            self.static_y.copy_(y)
        if self.captured:
            self.graph.replay()
            return self.static_loss
        with precision_region(self.precision, self.device):
            return self._step_body()

    def num_params(self) -> int:
        return self.flat_param.numel()

    def loss_scale_state(self) -> dict[str, Any] | None:
        """fp16: the loss scaler's scale and clean-step count now (host values: syncs); else None."""
        if self.loss_scale is not None:
            return {"scaler": "device (flat AdamW skips)", **self.loss_scale.state()}
        if self.scaler is not None:
            st = self.scaler.state_dict()
            return {"scaler": "torch.amp.GradScaler", "scale": st["scale"], "growth_tracker": st["_growth_tracker"]}
        return None

    def describe(self) -> dict[str, Any]:
        """What this engine runs, for result rows and the book."""
        return {
            "kernels": [op for op in OPS if self.kernels[op]],
            "requested_off": [op for op in OPS if not self.requested[op]],
            "notes": dict(self.notes),
            "captured": self.captured,
            "optimizer": self.optimizer_name,
            "n_params": self.num_params(),
            "n_decay": self.n_decay,
            "grad_clip": self.grad_clip,
            "linear_precision": self.linear_precision if "linear" in self.notes and
            self.notes["linear"].startswith("Triton") else None,
            "attention_precision": self.attention_precision,
            "attention_layout": self.attention_layout if self.kernels["attention"] else None,
            "fuse_residual_norm": self.fuse_residual_norm,
            "fuse_dropout": self.resid_dropout is not None,
            "bias_kernel": self.notes.get("bias", "").startswith("bias gradients"),
            "bf16_norm_out": self.norm_out_dtype is not None,
            "bf16_weights": self.flat_param16 is not None,
            "fused_softmax": self.notes.get("softmax", "").startswith("scale"),
            "loss_scale": ("device" if self.loss_scale is not None else
                           "torch.amp.GradScaler" if self.scaler is not None else None),
            "device_info": self.device_info.label() + (" (rehearsal)" if self.device_info.rehearsal else ""),
        }


# ---------------------------------------------------------------------------------------
# The correctness check: engine vs reference training, step by step.


def pattern_batches(
    vocab_size: int, B: int, T: int, n: int, seed: int = 0, device: torch.device | str = "cpu"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of learnable sequences: row r is a_r + b_r * t (mod V), targets shifted by one.

    Unlike uniform random tokens the loss falls (the next token follows from the previous
    two, which needs attention), so a wrong gradient anywhere shows in the losses.
    """
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(T + 1)
    out = []
    for _ in range(n):
        a = torch.randint(vocab_size, (B, 1), generator=g)
        b = torch.randint(1, max(2, min(8, vocab_size)), (B, 1), generator=g)
        seq = (a + b * t) % vocab_size  # (B, T + 1)
        out.append((seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)))
    return out


def check_against_reference(
    config: ModelConfig | str,
    steps: int = 100,
    device: torch.device | str = "auto",
    precision: str = "fp32",
    B: int = 32,
    T: int = 256,
    use_kernels: bool | Mapping[str, bool] = True,
    seed: int = 0,
    rtol: float | None = None,
    **engine_kwargs: Any,
) -> dict[str, Any]:
    """Train an Engine and the reference (``train_step`` + ``torch.optim.AdamW``, same groups)
    ``steps`` steps from the same initial weights on the same batches; compare.

    Returns a dict: both loss curves, ``max_rel_err`` (largest |engine - ref| / |ref| over
    the steps), ``param_rel_err`` (||w_engine - w_ref|| / ||w_ref|| over all weights at the
    end), ``ok`` (max_rel_err <= rtol and all losses finite; rtol defaults to
    ``ftlib.harness.bench.CHECK_RTOL[precision]``), and the engine's ``describe()``.
    """
    from ftlib.harness.bench import CHECK_RTOL

    cfg = preset(config) if isinstance(config, str) else config
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    lr = engine_kwargs.get("lr", 3e-4)
    betas = engine_kwargs.get("betas", (0.9, 0.999))
    wd = engine_kwargs.get("weight_decay", 0.01)
    batches = pattern_batches(cfg.vocab_size, B, T, steps, seed=seed + 1, device=dev)

    ref = build_model(cfg, seed=seed).to(dev)
    opt = make_optimizer(ref, lr=lr, betas=betas, weight_decay=wd)  # param_groups 'matrices'
    scaler = grad_scaler(precision, dev, engine_kwargs.get("loss_scale"))  # fp16: torch's GradScaler
    clip = engine_kwargs.get("grad_clip")
    ref_losses = []
    with precision_region(precision, dev):
        for x, y in batches:
            ref_losses.append(train_step(ref, opt, x, y, grad_clip=clip, scaler=scaler).clone())  # no sync per step

    engine = Engine(cfg, B, T, precision, dev, use_kernels, seed=seed, **engine_kwargs)
    eng_losses = [engine.step(x, y).clone() for x, y in batches]  # clone: the graph reuses its output

    ref_l = torch.stack(ref_losses).double().cpu().tolist()
    eng_l = torch.stack(eng_losses).double().cpu().tolist()
    rel = [abs(e - r) / max(abs(r), 1e-12) for e, r in zip(eng_l, ref_l)]
    ref_params = dict(ref.named_parameters())
    num = den = 0.0
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            r = ref_params[name].double()
            num += float((p.double() - r).pow(2).sum())
            den += float(r.pow(2).sum())
    tol = CHECK_RTOL[precision] if rtol is None else rtol
    finite = all(math.isfinite(v) for v in eng_l + ref_l)
    return {
        "steps": steps, "B": B, "T": T, "precision": precision,
        "losses_engine": eng_l, "losses_ref": ref_l,
        "max_rel_err": max(rel), "rel_err_last": rel[-1],
        "param_rel_err": math.sqrt(num / max(den, 1e-300)),
        "rtol": tol, "ok": bool(finite and max(rel) <= tol),
        "loss_drop_ref": ref_l[0] - ref_l[-1],
        "loss_scale_ref": scaler.get_scale() if scaler is not None else None,
        "loss_scale_engine": (engine.loss_scale_state() or {}).get("scale"),
        **engine.describe(),
    }
