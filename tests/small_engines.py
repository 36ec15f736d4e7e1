"""Small models and a few engine steps on them, shared by the tests of engine options that change how a step runs
(not what it computes): each trains the same model with and without its option and compares."""

from __future__ import annotations

import torch

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine

# One sequence: the interpreter emulates every program a kernel launches, and a row-tiled kernel's programs grow
# with B * T (16 rows still make two of the interpreter's 8-row tiles).
B, T = 1, 16
# The FastTransformer with one K/V head (MQA), and GPT-2 as written: biases, the exact erf GELU, multi-head
# attention and its head tied to the token embedding.
FT = preset("fasttransformer", n_layer=2, n_embd=64, n_head=4, n_kv_head=1, block_size=T)
GPT2 = preset("gpt2", n_layer=1, n_embd=64, n_head=4, n_kv_head=4, block_size=T)


def engine(cfg, precision: str, device: torch.device, **options) -> Engine:
    """An engine at (B, T), seed 3, uncaptured, with ``options``: the same initial weights for every option."""
    return Engine(cfg, B, T, precision, device, seed=3, capture=False, **options)


def train(cfg, precision: str, device: torch.device, steps: int = 3, **options) -> tuple[Engine, torch.Tensor]:
    """:func:`engine` with ``options`` and its losses over ``steps`` learnable batches (seed 2)."""
    eng = engine(cfg, precision, device, **options)
    batches = pattern_batches(cfg.vocab_size, B, T, steps, seed=2, device=device)
    return eng, torch.stack([eng.step(x, y).detach().float().clone() for x, y in batches])
