"""Embedding lookup whose backward is one scatter-add instead of PyTorch's sort-based kernel.

``EmbeddingFunction`` -> ``ScatterEmbedding``. Reference: ``torch.nn.functional.embedding``.
No Triton here: the forward is the same gather ``F.embedding`` runs; the backward is

    dW = 0;  dW[idx[i]] += dy[i]  for every row i           (``index_add_``, atomic adds)

where ``embedding_dense_backward`` on CUDA sorts the indices first (radix sort, segment
offsets, partial sums, then the rows: about eight kernels per table per step in chapter
01's profile) so that its sum is deterministic. With a 65-symbol vocabulary and 8,192
rows per step the atomics are cheap; the price is a summation order that can vary
between runs in the last bits of fp32, well inside the engine's 100-step check.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class EmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(idx)
        ctx.num_embeddings = weight.shape[0]
        return F.embedding(idx, weight)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (idx,) = ctx.saved_tensors
        C = dy.shape[-1]
        # Accumulate in fp32 whatever dy's dtype: a bf16 sum of ~100 rows per symbol would round
        # at every add. In the engine dy is fp32 (the residual stream), so both casts are no-ops.
        dw = torch.zeros((ctx.num_embeddings, C), dtype=torch.float32, device=dy.device)
        dw.index_add_(0, idx.reshape(-1), dy.reshape(-1, C).float())  # (N, C) rows into (V, C)
        return None, dw.to(dy.dtype)


class ScatterEmbedding(nn.Module):
    """Thin module: takes over an ``nn.Embedding``'s weight (the same Parameter object)."""

    def __init__(self, emb: nn.Embedding) -> None:
        super().__init__()
        if emb.padding_idx is not None or emb.max_norm is not None or emb.scale_grad_by_freq or emb.sparse:
            raise ValueError("ScatterEmbedding supports plain embeddings only (no padding_idx, max_norm, "
                             "scale_grad_by_freq or sparse)")
        self.weight = emb.weight
        self.num_embeddings, self.embedding_dim = emb.num_embeddings, emb.embedding_dim

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return EmbeddingFunction.apply(idx, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
