"""The model's embeddings on their kernels.

Each table's lookup keeps PyTorch's gather with its backward as one scatter-add (:mod:`kernels.embedding`); with
``fuse_embedding``, the model's ``embedding_sum`` seam (:class:`ftlib.model.gpt.EmbeddingSum`, ``wte(idx) +
wpe(positions)``) goes onto one kernel that gathers and sums both tables, whose backward adds both gradients
straight into the tables' ``.grad`` (:mod:`kernels.embedding_sum`): the engine's flat-gradient views, which the
step zeroes with one memset. Where the head is tied to ``wte`` (``tie_weights``), the head's backward has put its
gradient into that view before the embedding's backward runs (the embedding's output feeds every later layer), and
the kernel adds to it. With ``relaxed_atomics``, that kernel's atomic adds take relaxed memory order instead of
Triton's acquire-release (:mod:`kernels.embedding_sum`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ftlib.model.gpt import GPT
from ftlib.training.engine.grad_into import grad_views

FUSED_NOTE = ("the token and position embeddings gathered and summed by one kernel, their gradients added into "
              "the flat gradient by another (kernels/embedding_sum.py)")


class FusedEmbeddingSum(nn.Module):
    """Takes the place of the model's ``embedding_sum``: in training with gradients on,
    :func:`kernels.embedding_sum.embedding_sum` with both tables' gradients added into their ``.grad``; elsewhere
    the same forward kernel, any gradient returned to autograd. No parameters: it reads the tables from the
    embedding modules the model passes, as the seam it replaces does. ``sem``: the backward's atomic adds' memory
    order (:data:`kernels._common.ATOMIC_SEMS`)."""

    def __init__(self, sem: str = "acq_rel") -> None:
        super().__init__()
        self.sem = sem

    def forward(self, idx: torch.Tensor, wte: nn.Module, wpe: nn.Module) -> torch.Tensor:
        from kernels.embedding_sum import embedding_sum

        if self.training and torch.is_grad_enabled():
            dwte, dwpe = grad_views("FusedEmbeddingSum", wte.weight, wpe.weight)
            return embedding_sum(idx, wte.weight, wpe.weight, dwte, dwpe, sem=self.sem)  # (B, T, C)
        return embedding_sum(idx, wte.weight, wpe.weight, sem=self.sem)  # (B, T, C)

    def extra_repr(self) -> str:
        return f"sem={self.sem!r}"


def swap_embeddings(model: GPT, fuse: bool, blocked: bool, notes: dict[str, str], sem: str = "acq_rel") -> bool:
    """Put the embeddings on their kernels unless ``blocked`` (the embedding op switched off or no kernel
    runnable), and, with ``fuse``, their sum on the fused kernel, whose atomic adds take memory order ``sem``; a
    note says what ``fuse`` did. Returns whether a kernel took the embeddings over."""
    if blocked:
        if fuse:
            notes["fuse_embedding"] = "not applied: needs the embedding kernel"
        return False
    from kernels.embedding import ScatterEmbedding

    model.wte, model.wpe = ScatterEmbedding(model.wte), ScatterEmbedding(model.wpe)  # same Parameters
    if fuse:
        model.embedding_sum = FusedEmbeddingSum(sem)
        notes["fuse_embedding"] = FUSED_NOTE
    return True
