"""Causal self-attention with any number of K/V heads and two kernels.

* ``n_kv_head == n_head``: multi-head attention (Vaswani et al. 2017, sec. 3.2.2).
* ``n_kv_head == 1``: multi-query attention (Shazeer 2019, "Fast Transformer Decoding").
* anything dividing ``n_head``: grouped-query attention (Ainslie et al. 2023).

``attn_impl='explicit'`` materializes the (B, nh, T, T) probabilities like the
original GPT-2 baseline; ``attn_impl='sdpa'`` calls
``F.scaled_dot_product_attention``. How K/V with fewer heads reach SDPA matters:
in float32 a (B, 1, T, hs) K/V makes PyTorch fall back to its math backend
(which materializes the scores after all), while a stride-0 ``expand`` view of
shape (B, nh, T, hs) is accepted by the memory-efficient kernel. ``kv_layout``
names the choice and :meth:`CausalSelfAttention.kv_description` reports it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from ftlib.model.config import KV_LAYOUTS

if TYPE_CHECKING:
    from ftlib.model.config import ModelConfig


def causal_softmax_ref(att: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(att * scale + causal mask) over the last dim of (..., T, T) scores: GPT-2's
    materialized softmax (Radford et al. 2019; the mask of Vaswani et al. 2017, sec. 3.2.3)."""
    T = att.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=att.device).tril()
    return F.softmax((att * scale).masked_fill(~mask, float("-inf")), dim=-1)


def causal_attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0, training: bool = False
) -> torch.Tensor:
    """Explicit causal attention softmax(q kᵀ / sqrt(hs) + mask) v.

    q: (B, nh, T, hs); k, v: (B, nkv, T, hs) with nkv dividing nh. Query head h
    uses K/V head h // (nh // nkv), the grouping of Ainslie et al. 2023. The
    (B, nh, T, T) probability tensor is materialized, as in the GPT-2 baseline.
    """
    B, nh, T, hs = q.shape
    nkv = k.shape[1]
    r = nh // nkv
    qg = q.view(B, nkv, r, T, hs)  # (B, nkv, r, T, hs)
    kg = k.unsqueeze(2)  # (B, nkv, 1, T, hs), broadcast over the r query heads
    vg = v.unsqueeze(2)
    att = causal_softmax_ref(qg @ kg.transpose(-2, -1), 1.0 / math.sqrt(hs))  # (B, nkv, r, T, T)
    if training and dropout_p > 0:
        att = F.dropout(att, p=dropout_p)
    y = att @ vg  # (B, nkv, r, T, hs)
    return y.reshape(B, nh, T, hs)  # (B, nkv, r, T, hs) -> (B, nh, T, hs): head h = g * r + i


def kv_for_sdpa(k: torch.Tensor, n_head: int, layout: str) -> tuple[torch.Tensor, bool]:
    """Shape K (or V) of (B, nkv, T, hs) for SDPA; returns (tensor, enable_gqa).

    'expand':    (B, nh, T, hs); a stride-0 view (no copy) when nkv == 1, a copy otherwise.
    'broadcast': as given, (B, nkv, T, hs), relying on SDPA broadcasting (nkv must be 1 or nh);
                 this is what the original FastTransformer passes.
    'repeat':    (B, nh, T, hs) by repeat_interleave, always a copy.
    'gqa':       as given, with SDPA's ``enable_gqa=True`` (PyTorch >= 2.5).
    """
    B, nkv, T, hs = k.shape
    if nkv == n_head or layout in ("broadcast", "gqa"):
        return k, layout == "gqa" and nkv != n_head
    if layout == "expand":
        r = n_head // nkv
        # (B, nkv, r, T, hs) view with stride 0 on r; reshape copies only when nkv > 1.
        return k.unsqueeze(2).expand(B, nkv, r, T, hs).reshape(B, n_head, T, hs), False
    if layout == "repeat":
        return k.repeat_interleave(n_head // nkv, dim=1), False
    raise ValueError(f"unknown kv_layout {layout!r}; expected one of {KV_LAYOUTS}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        self.attn_impl = config.attn_impl
        self.kv_layout = config.kv_layout
        self.qk_norm = config.qk_norm
        self.norm_eps = config.norm_eps
        self.dropout = config.attn_dropout_p  # on the attention probabilities
        # One fused projection to [q | k | v]: C + 2 * nkv * hs outputs
        # (256 -> 768 for GPT-2, 256 -> 320 for FastTransformer).
        kv_dim = self.n_kv_head * self.head_size
        self.qkv = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def kv_description(self) -> str:
        """What K/V tensor the attention kernel receives, for summaries and the book."""
        if self.attn_impl == "explicit":
            kv = f"explicit softmax, K/V (B,{self.n_kv_head},T,{self.head_size})"
            if self.n_kv_head == self.n_head:
                return f"{kv}, one K/V head per query head"
            return f"{kv}, each K/V head broadcast over {self.n_head // self.n_kv_head} query heads in the matmul"
        if self.n_kv_head == self.n_head:
            return f"SDPA, K/V (B,{self.n_head},T,{self.head_size})"
        if self.kv_layout == "expand":
            how = "stride-0 expand view" if self.n_kv_head == 1 else "expanded copy"
            return f"SDPA, K/V (B,{self.n_head},T,{self.head_size}) as {how}"
        if self.kv_layout == "repeat":
            return f"SDPA, K/V (B,{self.n_head},T,{self.head_size}) by repeat_interleave (copy)"
        if self.kv_layout == "gqa":
            return f"SDPA enable_gqa, K/V (B,{self.n_kv_head},T,{self.head_size})"
        return f"SDPA, K/V (B,{self.n_kv_head},T,{self.head_size}) broadcast (math backend in fp32)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        kv_dim = self.n_kv_head * self.head_size
        q, k, v = self.qkv(x).split([C, kv_dim, kv_dim], dim=-1)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, nkv, T, hs)
        if self.qk_norm:  # each head's query and key vectors to unit RMS (no gain)
            q = F.rms_norm(q, (self.head_size,), eps=self.norm_eps)
            k = F.rms_norm(k, (self.head_size,), eps=self.norm_eps)
        p = self.dropout if self.training else 0.0
        if self.attn_impl == "explicit":
            y = causal_attention_ref(q, k, v, dropout_p=p, training=self.training)
        else:
            k, gqa = kv_for_sdpa(k, self.n_head, self.kv_layout)
            v, _ = kv_for_sdpa(v, self.n_head, self.kv_layout)
            extra = {"enable_gqa": True} if gqa else {}
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, **extra)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C), heads side by side
        return self.resid_dropout(self.proj(y))
