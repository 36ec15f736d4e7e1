"""Synthetic result rows for the views' tests (chapters 4, 5 and 7), shaped like the harness's rows with only
the fields the views read; written into the temporary results directory (FTLIB_RESULTS_DIR), never data/results.
"""

from __future__ import annotations

from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import ModelConfig
from ftlib.views import codesign as codesignview

SLUG = "h200"
DATE = "2026-12-03T10:00:00Z"


def step_row(bench: str, label: str, cfg: ModelConfig, B: int, T: int, mode: str, prec: str, ms: float,
             **extra) -> dict:
    """A row shaped like ftlib.harness.bench's, with only the fields the views read."""
    ident = {"label": label, **{k: extra[k] for k in ("run_id", "optimizer_kind") if k in extra}}
    return {"key": row_key(bench, cfg.config_hash(), B, T, mode, prec, ident), "bench": bench,
            "label": label, "config": cfg.to_dict(), "config_hash": cfg.config_hash(), "B": B, "T": T,
            "tokens": B * T, "mode": mode, "precision": prec, "status": "ok", "median_ms": ms,
            "tokens_per_s": B * T / (ms / 1e3), "device": "NVIDIA H200", "torch": "2.11.0", "date": DATE,
            "commit": "synthetic", **extra}


def write(*rows: dict, slug: str = SLUG) -> None:
    for r in rows:
        ResultStore(r["bench"], slug).append(r)


def profile_row(name: str, prec: str, backend: str, step_ms: float = 10.0, mode: str = "eager") -> dict:
    cfg = codesignview.VARIANTS[name]
    return {"key": row_key("profile", cfg.config_hash(), 32, 256, mode, prec, {"preset": "x"}), "bench": "profile",
            "status": "ok", "preset": "fasttransformer" if name.startswith("fast") else name,
            "config": cfg.to_dict(), "config_hash": cfg.config_hash(), "B": 32, "T": 256, "precision": prec,
            "mode": mode, "sdpa_backend": backend, "step_ms": step_ms,
            "provenance": {"capability": "9.0", "device": "NVIDIA H200", "date": DATE}}
