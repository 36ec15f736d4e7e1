"""The decoder-only language model: embeddings -> blocks -> final norm -> head."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ftlib.model.block import AddNorm, Block
from ftlib.model.config import ModelConfig
from ftlib.model.norm import make_norm


def embedding_sum_ref(idx: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor) -> torch.Tensor:
    """x (B, T, C) = wte[idx] + wpe[0 .. T-1]: the token and position embeddings of ``idx`` (B, T) summed, the first
    block's input (GPT-2, Radford et al. 2019, sec. 2.3), from the tables' weights."""
    pos = torch.arange(idx.shape[1], device=idx.device)
    return F.embedding(idx, wte) + F.embedding(pos, wpe)


class EmbeddingSum(nn.Module):
    """The token and position embeddings summed, ``wte(idx) + wpe(0 .. T-1)``, from the model's two embedding
    modules. No parameters: like :class:`ftlib.model.block.AddNorm`, the seam where the engine puts one kernel
    (``ftlib.training.engine.embedding``), so that no second copy of the forward exists."""

    def forward(self, idx: torch.Tensor, wte: nn.Module, wpe: nn.Module) -> torch.Tensor:
        # The modules, not embedding_sum_ref on their weights: the engine's lookup kernels take their place.
        pos = torch.arange(idx.shape[1], device=idx.device)
        return wte(idx) + wpe(pos)  # (B, T, C)


class GPT(nn.Module):
    """Learned token + position embeddings, ``n_layer`` pre-norm blocks, untied or tied head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"GPT needs a ModelConfig (e.g. ftlib.preset('gpt2')), got {config!r}")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.embedding_sum = EmbeddingSum()  # wte(idx) + wpe(positions), a seam for the engine's kernel
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = make_norm(config.norm, config.n_embd, config.bias, config.norm_eps)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.add_norm = AddNorm()  # every residual add with the norm after it (ftlib.model.block)
        if config.tie_weights:
            # Press & Wolf 2017: the output layer shares the input embedding matrix.
            self.head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        scheme = self.config.init
        if scheme == "torch":
            return  # PyTorch's defaults, as the original GPT-2 baseline left them
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        if scheme == "gpt2":
            # GPT-2 paper sec. 2.3: scale residual-path weights by 1/sqrt(N), N = 2 per block.
            std = 0.02 / math.sqrt(2 * self.config.n_layer)
            for blk in self.blocks:
                nn.init.normal_(blk.attn.proj.weight, mean=0.0, std=std)
                nn.init.normal_(blk.mlp.proj.weight, mean=0.0, std=std)

    def num_params(self) -> int:
        """Trainable parameters, a tied matrix counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        self.config.check_sequence(T)
        x = self.drop(self.embedding_sum(idx, self.wte, self.wpe))  # (B, T, C)
        h = self.blocks[0].norm1(x)  # (B, T, C), the first attention's input
        for i, blk in enumerate(self.blocks):
            after = self.blocks[i + 1].norm1 if i + 1 < len(self.blocks) else self.norm_f
            x, h = blk(x, h, after, self.add_norm)
        logits = self.head(h)  # (B, T, V); h = norm_f(x)
        cap = self.config.logit_softcap
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))  # (B*T, V), (B*T,)
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``idx`` (B, T0), cropping to the context."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size :]
            logits, _ = self(ctx)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def build_model(config: ModelConfig | str, seed: int | None = None, **overrides: Any) -> GPT:
    """A model from a config or preset name; ``seed`` makes the initialization reproducible."""
    from ftlib.model.config import PRESETS, preset

    if not isinstance(config, (ModelConfig, str)):
        raise ValueError(f"build_model needs a ModelConfig or a preset name (one of {sorted(PRESETS)}), "
                         f"got {config!r}")
    cfg = preset(config, **overrides) if isinstance(config, str) else config.replace(**overrides)
    if seed is None:
        return GPT(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(cfg)
