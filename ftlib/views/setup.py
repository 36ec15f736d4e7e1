"""Chapter 0's tables and sentences: the claim under test, the machine, the data, the models and how
their K/V reach the attention kernel."""

from __future__ import annotations

from typing import Any

import torch

from ftlib.analysis.claims import POST_CLAIMED, POST_GPU
from ftlib.analysis.params import param_rows
from ftlib.harness.provenance import provenance
from ftlib.model.gpt import GPT
from ftlib.training.data import SHA256, CharDataset
from ftlib.views.bench import model_title
from ftlib.views.tables import table_view


@table_view
def machine_table(device: torch.device) -> list[dict[str, Any]]:
    """What this machine is: the provenance fields every result row carries."""
    return [{"field": k, "value": v} for k, v in provenance(device).items()]


@table_view
def data_table(ds: CharDataset) -> list[dict[str, Any]]:
    """TinyShakespeare's size, vocabulary and split, and the checksum it was verified against."""
    return [{"what": "characters", "value": len(ds.text)},
            {"what": "vocabulary (sorted set of characters)", "value": ds.vocab_size},
            {"what": "train tokens (first 90%)", "value": len(ds.train)},
            {"what": "validation tokens (last 10%)", "value": len(ds.val)},
            {"what": "SHA-256", "value": SHA256}]


@table_view
def model_table(models: dict[str, GPT]) -> list[dict[str, Any]]:
    """One line per named model: its switches and parameter counts."""
    return param_rows(models)


@table_view
def kv_table(models: dict[str, GPT]) -> list[dict[str, Any]]:
    """What K/V tensor each model's attention kernel receives."""
    return [{"model": n, "attention kernel input": m.blocks[0].attn.kv_description()} for n, m in models.items()]


def claim_text() -> str:
    """The post's headline claims as ``ftlib.analysis.claims`` records them (the post's numbers, on its GPU)."""
    c = POST_CLAIMED
    s, p = c["speedup_compiled"], c["perplexity"]
    return (f"The post's claim (on a {POST_GPU}, fp32, B = 32, T = 256): FastTransformer trains "
            f"{s:.3f}× as fast as `torch.compile`d GPT-2 (\"+{100 * (s - 1):.1f}% speedup over compiled standard "
            f"GPT-2\"), with {c['params']['fasttransformer'] / 1e6:.2f}M parameters against "
            f"{c['params']['gpt2'] / 1e6:.2f}M, and reaches a perplexity of {p['fasttransformer']:.2f} against "
            f"GPT-2's {p['gpt2']:.2f}. These are the post's figures; the book measures its own.")


def summary_text(models: dict[str, GPT], ds: CharDataset) -> str:
    """What chapter 0 set up, in words, with the counts computed from the models and the data built here."""
    n = {name: sum(t.numel() for t in m.parameters()) for name, m in models.items()}
    names = ", ".join(f"{model_title(name)} ({count:,} parameters)" for name, count in n.items())
    return "\n".join([
        "- **The parameters** `DEVICE`, `SMOKE` and `MEASURE` that every chapter takes: stored results by "
        "default, or a measurement on this machine at small or full size.",
        f"- **The data**: TinyShakespeare, checked against its SHA-256, {len(ds.train):,} training and "
        f"{len(ds.val):,} validation characters over a vocabulary of {ds.vocab_size}.",
        f"- **The models**: {names}, built from `ftlib.preset`; each co-design change is one field of "
        "`ftlib.ModelConfig`, which is how chapter 4 switches them one at a time.",
        "- **The K/V layout**: the original FastTransformer hands SDPA a (B, 1, T, hs) K/V, `ftlib` a "
        "stride-0 expanded view by default; chapter 4 measures what the difference costs.",
        "- **One training step** of the shared training function ran on this device, its loss finite.",
    ])
