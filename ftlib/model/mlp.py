"""Position-wise feed-forward network C -> ratio*C -> C (Vaswani et al. 2017, sec. 3.3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from ftlib.model.config import ModelConfig


class MLP(nn.Module):
    """Linear -> activation -> Linear. GPT-2 uses the tanh approximation of GELU
    (Hendrycks & Gimpel 2016, sec. 2); nanoGPT uses the exact erf form; 'relu2' is ReLU(x)^2
    (So et al. 2021, "Primer")."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)
        self.proj = nn.Linear(config.d_ff, config.n_embd, bias=config.bias)
        self.activation = config.activation
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = F.relu(h).square() if self.activation == "relu2" else F.gelu(h, approximate=self.approximate)
        return self.dropout(self.proj(h))
