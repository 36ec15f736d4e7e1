"""The engine's attention modules: each takes over a ``CausalSelfAttention``'s projections and dropout
and runs its core on kernels (``ftlib.training.engine.swaps`` decides which one applies, and why not).

* :class:`KernelCausalSelfAttention`: the flash-attention kernels (SDPA's function; the FastTransformer).
* :class:`FusedSoftmaxSelfAttention`: GPT-2's explicit attention as written, its scale, mask and softmax
  fused into one kernel each way, the products on cuBLAS (engine option ``fused_softmax``).
* :class:`FusedExplicitSelfAttention`: GPT-2's explicit attention as written, the products with K and V
  fused with the softmax, the probabilities still written (engine option ``fuse_softmax_matmuls``); with
  :func:`qkv_biases_into_attention`, its kernels also add the qkv bias's gradient (``qkv_bias_into_attention``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from ftlib.model.attention import CausalSelfAttention
from ftlib.training.engine.grad_into import bias_sum_why_not, grad_views

if TYPE_CHECKING:  # the kernels (and Triton) load only where a kernel module is built
    from ftlib.training.engine.options import EngineOptions
    from kernels.tiles import Tiles


class KernelCausalSelfAttention(nn.Module):
    """``CausalSelfAttention`` with its attention core on the Triton kernel, taking over its ``qkv``
    and ``proj`` Linears and dropout. K and V stay (B, nkv, T, hs) strided views of the qkv output:
    the kernel maps query head h to K/V head h // (nh // nkv) by pointer arithmetic, so MQA/GQA needs
    no expand and no copy."""

    def __init__(self, attn: CausalSelfAttention, input_precision: str, layout: str = "heads",
                 fuse_kv_split_sum: bool = False, tiles: str | None = None, kv_split: int | None = None,
                 concurrent_bwd: bool = False, pack_heads: int = 1, heavy_first: bool = False) -> None:
        super().__init__()
        from kernels.attention import TritonCausalAttention
        from kernels.tiles import parse_tiles

        self.n_head, self.n_kv_head, self.head_size = attn.n_head, attn.n_kv_head, attn.head_size
        self.qkv, self.proj, self.resid_dropout = attn.qkv, attn.proj, attn.resid_dropout
        # Tiles chosen per kernel by the launchers from the device's shared memory (kernels.tiles),
        # unless ``tiles`` names them per pass (the packed layout only).
        self.core = TritonCausalAttention(input_precision, fuse_kv_split_sum=fuse_kv_split_sum)
        self.layout = layout
        named = parse_tiles(tiles) if tiles else {}
        self.fwd_tiles, self.bwd_tiles = named.get("fwd"), named.get("bwd")
        self.kv_split = kv_split  # MQA/GQA's query heads per dK/dV program (packed layout); None: the launcher's
        self.concurrent_bwd = concurrent_bwd  # the backward's dQ and dK/dV kernels on two streams (packed layout)
        self.pack_heads = pack_heads  # query heads per forward and dQ tile (packed layout); 1: one head a tile
        self.heavy_first = heavy_first  # each grid's causal block with the most work launched first (packed layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "packed":
            from kernels.attention_packed import packed_attention

            y = packed_attention(self.qkv(x), self.n_head, self.n_kv_head, self.head_size,
                                 self.core.input_precision, self.fwd_tiles, self.bwd_tiles,
                                 self.core.fuse_kv_split_sum, self.kv_split, self.concurrent_bwd,
                                 self.pack_heads, self.heavy_first)  # (B, T, C)
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
    ``out_dtype``: the dtype the probabilities are written in (bf16 under bf16 autocast, what the
    ``att @ v`` matmul would cast them to; None keeps the scores' dtype)."""

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


class FusedExplicitSelfAttention(nn.Module):
    """GPT-2's explicit attention as written, on three kernels (``kernels/explicit_attention.py``): forward,
    q k^T, the scale, causal mask and softmax, and P v in one, the (B, nh, T, T) probabilities written as
    GPT-2 writes them; backward, two kernels reading them back. q, k, v are read from the qkv projection's
    output and the result written (B, T, C), so the batched GEMMs' layout copies and the ``cat`` of the
    three gradients go too. ``p_dtype``: the dtype P is written in (bf16 under bf16 autocast, what the
    ``att @ v`` matmul would cast it to; None keeps the scores' dtype); ``input_precision``: the products'
    tl.dot precision for fp32 operands; ``tiles``: the kernels' tiles per pass, as the option ``attention_tiles``
    names them (None: chosen from the device); ``fwd_one_pass``, ``dq_one_pass``: the forward, the dQ kernel
    over whole rows, True or at row-spanning tiles (options ``explicit_one_pass``, ``explicit_dq_one_pass``);
    ``heavy_first``: every grid's heaviest causal block launched first (the kernels' ``heavy_first``).
    ``bias_into`` (set by :func:`qkv_biases_into_attention`): the backward kernels add the qkv bias's gradient
    into its ``.grad``, the flat gradient's view. No attention dropout (the swap checks)."""

    def __init__(self, attn: CausalSelfAttention, p_dtype: torch.dtype | None, input_precision: str,
                 tiles: str | None = None, fwd_one_pass: bool | Tiles = False,
                 dq_one_pass: bool | Tiles = False, heavy_first: bool = False) -> None:
        super().__init__()
        from kernels.explicit_attention import TritonExplicitAttention
        from kernels.tiles import parse_tiles

        self.qkv, self.proj, self.resid_dropout = attn.qkv, attn.proj, attn.resid_dropout
        named = parse_tiles(tiles) if tiles else {}
        self.core = TritonExplicitAttention(attn.n_head, attn.n_kv_head, attn.head_size, p_dtype, input_precision,
                                            named.get("fwd"), named.get("bwd"), fwd_one_pass,
                                            dq_one_pass, heavy_first)
        self.bias_into = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        db = grad_views("qkv_bias_into_attention", self.qkv.bias)[0] if self.bias_into else None
        return self.resid_dropout(self.proj(self.core(self.qkv(x), db)))  # core: (B, T, C + 2 nkv hs) -> (B, T, C)


def qkv_biases_into_attention(model: nn.Module, options: EngineOptions, notes: dict[str, str]) -> frozenset[int]:
    """With ``qkv_bias_into_attention`` where it applies: each :class:`FusedExplicitSelfAttention` hands its
    qkv projection's bias to its kernels, whose backward adds that bias's gradient into its ``.grad`` (the flat
    gradient's view); returns the ids of those biases, whose Linears then sum none (``setup_linears``'
    ``bias_elsewhere``). Else an empty set, with a note in ``notes`` saying why."""
    if not options.qkv_bias_into_attention:
        return frozenset()
    attns = [m for m in model.modules() if isinstance(m, FusedExplicitSelfAttention)]
    why = ("not applicable: the explicit attention kernels (fuse_softmax_matmuls) do not take this attention"
           if not attns else "not applicable: the qkv projection has no bias" if attns[0].qkv.bias is None
           else bias_sum_why_not(options, notes))
    if why:
        notes["qkv_bias_into_attention"] = why
        return frozenset()
    for m in attns:
        m.bias_into = True
    notes["qkv_bias_into_attention"] = (f"{len(attns)} qkv projection biases' gradients added by the explicit "
                                        "attention's backward kernels (kernels/explicit_attention.py)")
    return frozenset(id(m.qkv.bias) for m in attns)
