"""Chapter 0's tables: the machine, the data, the models and how their K/V reach the attention kernel."""

from __future__ import annotations

from typing import Any

import torch

from ftlib.analysis.params import param_rows
from ftlib.harness.provenance import provenance
from ftlib.model.gpt import GPT
from ftlib.training.data import SHA256, CharDataset
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
