"""Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).

Pre-norm placement as in GPT-2 (Radford et al. 2019, sec. 2.3) and Llama. The model runs its
blocks regrouped, with the same operations in the same order: every residual add meets the norm
after it in one call, ``x, h = add_norm(x, branch, norm)``, h = norm(x + branch) being the next
branch's input. After a block's attention that norm is the block's own norm2; after its MLP it
is the next block's norm1 (the model's final norm after the last block). :class:`AddNorm` is
that call, a module the model owns: the seam where the engine puts its fused residual-add + norm
kernel (``ftlib.training.engine.swaps``), so that no second copy of the forward exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ftlib.model.attention import CausalSelfAttention
from ftlib.model.mlp import MLP
from ftlib.model.norm import make_norm

if TYPE_CHECKING:
    from ftlib.model.config import ModelConfig


class AddNorm(nn.Module):
    """A residual add and the norm after it: (x + branch, norm(x + branch)). No parameters."""

    def forward(self, x: torch.Tensor, branch: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + branch
        return x, norm(x)


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm1 = make_norm(config.norm, config.n_embd, config.bias, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.norm2 = make_norm(config.norm, config.n_embd, config.bias, config.norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor, next_norm: nn.Module, add_norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the residual stream (B, T, C) before the block; h = norm1(x), its attention's input.
        Returns the stream after the block and ``next_norm`` of it (the next block's input)."""
        x, h = add_norm(x, self.attn(h), self.norm2)
        return add_norm(x, self.mlp(h), next_norm)
