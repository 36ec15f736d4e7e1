"""Parameter counts by component, and what each preset switches, in words."""

from __future__ import annotations

from typing import Any

from ftlib.model.config import ModelConfig
from ftlib.model.gpt import GPT


def param_breakdown(model: GPT) -> dict[str, int]:
    """Parameters per component, summed over layers; a tied head counts as 0 (shared)."""
    groups = {"embeddings": 0, "norms": 0, "attention qkv": 0, "attention out": 0, "mlp": 0, "head": 0}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if name.startswith(("wte", "wpe")):
            groups["embeddings"] += p.numel()
        elif "norm" in name:
            groups["norms"] += p.numel()
        elif ".attn.qkv" in name:
            groups["attention qkv"] += p.numel()
        elif ".attn.proj" in name:
            groups["attention out"] += p.numel()
        elif ".mlp." in name:
            groups["mlp"] += p.numel()
        elif name.startswith("head"):
            groups["head"] += p.numel()
        else:
            raise KeyError(f"parameter {name} has no component")
    groups["total"] = sum(groups.values())
    return groups


def describe(config: ModelConfig) -> dict[str, Any]:
    """The switches of a config in words, as the book's tables show them."""
    c = config
    if c.n_kv_head == c.n_head:
        heads = f"multi-head ({c.n_head} K/V)"
    elif c.n_kv_head == 1:
        heads = f"multi-query (1 K/V for {c.n_head} Q)"
    else:
        heads = f"grouped-query ({c.n_kv_head} K/V for {c.n_head} Q)"
    return {
        "width x depth": f"{c.n_embd} x {c.n_layer}",
        "heads": heads,
        "attention": "explicit softmax" if c.attn_impl == "explicit" else f"SDPA ({c.kv_layout} K/V)",
        "mlp widths": f"{c.n_embd}->{c.d_ff}->{c.n_embd}",
        "norm": c.norm,
        "bias": c.bias,
        "init": c.init,
        "tied": c.tie_weights,
    }


def param_rows(models: dict[str, GPT]) -> list[dict[str, Any]]:
    """One row per named model: its switches and parameter counts."""
    rows = []
    for name, m in models.items():
        rows.append({"model": name, **describe(m.config), **param_breakdown(m)})
    return rows
