"""Position-wise feed-forward network C -> ratio*C -> C (Vaswani et al. 2017, sec. 3.3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from ftlib.model.config import ModelConfig


class MLP(nn.Module):
    """Linear -> GELU -> Linear. GPT-2 uses the tanh approximation of GELU
    (Hendrycks & Gimpel 2016, sec. 2); nanoGPT uses the exact erf form."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)
        self.proj = nn.Linear(config.d_ff, config.n_embd, bias=config.bias)
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))
