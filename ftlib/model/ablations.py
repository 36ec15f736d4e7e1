"""The co-design changes one at a time and together: named configs for chapter 4.

Starting from the GPT-2 preset, each of the four changes of the post is one switch:

* ``MQA``    n_kv_head 8 -> 1           (Shazeer 2019)
* ``SDPA``   explicit softmax -> fused F.scaled_dot_product_attention
* ``MLP2x``  mlp_ratio 4 -> 2
* ``RMS``    LayerNorm -> RMSNorm        (Zhang & Sennrich 2019)

The 2^4 grid keeps GPT-2's biases and init so that each cell differs from its neighbours by
exactly the switches it names; the ladder ends by dropping the biases, which gives the
FastTransformer preset itself.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from ftlib.model.config import ModelConfig, preset

SWITCHES: dict[str, dict] = {
    "MQA": {"n_kv_head": 1},
    "SDPA": {"attn_impl": "sdpa"},
    "MLP2x": {"mlp_ratio": 2.0},
    "RMS": {"norm": "rmsnorm"},
}


def with_switches(names: tuple[str, ...], base: str = "gpt2", **overrides: Any) -> ModelConfig:
    fields: dict = {}
    for n in names:
        fields.update(SWITCHES[n])
    return preset(base, **fields, **overrides)


def grid_label(names: tuple[str, ...]) -> str:
    return "+".join(names) if names else "gpt2"


def grid(**overrides: Any) -> dict[str, ModelConfig]:
    """All 16 combinations of the four switches on GPT-2, labelled like 'MQA+SDPA'."""
    out = {}
    for bits in product((False, True), repeat=len(SWITCHES)):
        names = tuple(n for n, on in zip(SWITCHES, bits) if on)
        out[grid_label(names)] = with_switches(names, **overrides)
    return out


def ladder(**overrides: Any) -> dict[str, ModelConfig]:
    """GPT-2 -> FastTransformer one change at a time, in the post's order, then no biases."""
    steps, names = {}, ()
    steps["gpt2"] = with_switches((), **overrides)
    for n in SWITCHES:
        names = names + (n,)
        steps["+" + n] = with_switches(names, **overrides)
    steps["+no bias = fasttransformer"] = with_switches(names, bias=False, **overrides)
    return steps


def kv_head_sweep(base: str = "fasttransformer", **overrides: Any) -> dict[str, ModelConfig]:
    """Grouped-query attention from multi-query (1 K/V head) to multi-head (8)."""
    return {f"n_kv_head={k}": preset(base, n_kv_head=k, **overrides) for k in (1, 2, 4, 8)}


def mlp_ratio_sweep(base: str = "fasttransformer", **overrides: Any) -> dict[str, ModelConfig]:
    return {f"mlp_ratio={r:g}": preset(base, mlp_ratio=r, **overrides) for r in (1.0, 1.5, 2.0, 3.0, 4.0)}
