"""Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).

Pre-norm placement as in GPT-2 (Radford et al. 2019, sec. 2.3) and Llama.
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


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm1 = make_norm(config.norm, config.n_embd, config.bias, config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.norm2 = make_norm(config.norm, config.n_embd, config.bias, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x
