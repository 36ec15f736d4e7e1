"""One training step on paper, summed: FLOPs and bytes per step and per component, and
the shares of one block's forward matmuls (the post's sec. 2 table)."""

from __future__ import annotations

from typing import Any

from ftlib.analysis.accounting import ATTENTION_GEMMS, MLP_GEMMS, PARAM_BYTES, num_params, rows
from ftlib.model.config import ModelConfig


def total_flops(
    cfg: ModelConfig,
    B: int,
    T: int,
    which: str = "flops",
    phases: tuple[str, ...] = ("fwd", "bwd", "opt"),
    gemm_only: bool = False,
    **kw: Any,
) -> float:
    """Sum of one FLOP column (``which`` = 'flops', 'flops_causal', 'flops_full') over a
    step; ``gemm_only`` sums the matmul part (``gemm_flops``, full T x T) instead."""
    key = "gemm_flops" if gemm_only else which
    return sum(r[key] for r in rows(cfg, B, T, **kw) if r["phase"] in phases)


def total_bytes(cfg: ModelConfig, B: int, T: int, phases: tuple[str, ...] = ("fwd", "bwd", "opt"), **kw: Any) -> float:
    """DRAM bytes of one step (sum of the rows' ``bytes``)."""
    return sum(r["bytes"] for r in rows(cfg, B, T, **kw) if r["phase"] in phases)


def layer_forward_breakdown(
    cfg: ModelConfig, B: int, T: int, causal: bool = False, gemm_only: bool = True
) -> dict[str, float]:
    """Forward FLOPs of one block by component (layer 0), the post's sec. 2 table.

    With ``gemm_only`` (the default, the convention of the post) only the
    matmuls: qkv, scores (QKᵀ), attn_v (A·V), out_proj, mlp_up, mlp_down; full T x T
    unless ``causal``. Otherwise every component's ``flops_full`` / ``flops_causal``.
    """
    out: dict[str, float] = {}
    for r in rows(cfg, B, T, backend="math"):
        if r["layer"] != 0 or r["phase"] != "fwd":
            continue
        if gemm_only:
            if r["kind"] not in ("gemm", "attention"):
                continue
            v = r["gemm_flops"] / (2 if causal and r["component"] in ATTENTION_GEMMS else 1)
        else:
            v = r["flops_causal" if causal else "flops_full"]
        out[r["component"]] = out.get(r["component"], 0.0) + v
    return out


def attention_mlp_fractions(cfg: ModelConfig, B: int, T: int, causal: bool = False) -> dict[str, float]:
    """Shares of one block's forward matmul FLOPs: 'attention' (QKᵀ + A·V), 'mlp'
    (up + down), 'projections' (qkv + out_proj); plus the GFLOP values."""
    bd = layer_forward_breakdown(cfg, B, T, causal=causal)
    total = sum(bd.values())
    att = sum(bd[c] for c in ATTENTION_GEMMS)
    mlp = sum(bd[c] for c in MLP_GEMMS)
    return {
        "attention": att / total,
        "mlp": mlp / total,
        "projections": (bd["qkv"] + bd["out_proj"]) / total,
        "attention_gflop": att / 1e9,
        "mlp_gflop": mlp / 1e9,
        "block_gflop": total / 1e9,
    }


def step_summary(cfg: ModelConfig, B: int, T: int, **kw: Any) -> dict[str, float]:
    """Per-step totals: FLOPs (executed, causal, full, matmul-only), bytes, memory."""
    rs = rows(cfg, B, T, **kw)
    P = num_params(cfg)
    tot = {k: sum(r[k] for r in rs) for k in ("flops", "flops_causal", "flops_full", "gemm_flops", "bytes")}
    return {
        **tot,
        "fwd_flops": sum(r["flops"] for r in rs if r["phase"] == "fwd"),
        "bwd_flops": sum(r["flops"] for r in rs if r["phase"] == "bwd"),
        "opt_flops": sum(r["flops"] for r in rs if r["phase"] == "opt"),
        "fwd_bytes": sum(r["bytes"] for r in rs if r["phase"] == "fwd"),
        "bwd_bytes": sum(r["bytes"] for r in rs if r["phase"] == "bwd"),
        "opt_bytes": sum(r["bytes"] for r in rs if r["phase"] == "opt"),
        "intensity": tot["flops"] / tot["bytes"],
        "params": P,
        "param_bytes": P * PARAM_BYTES,
        "grad_bytes": P * PARAM_BYTES,
        "adamw_state_bytes": 2 * P * PARAM_BYTES,
        "saved_activation_bytes": sum(r["saved_bytes"] for r in rs if r["phase"] == "fwd"),
    }


def by_component(
    cfg: ModelConfig, B: int, T: int, key: str = "flops", phases: tuple[str, ...] = ("fwd", "bwd", "opt"), **kw: Any
) -> dict[str, float]:
    """``key`` summed over layers and the given phases, per component, in step order."""
    out: dict[str, float] = {}
    for r in rows(cfg, B, T, **kw):
        if r["phase"] in phases:
            out[r["component"]] = out.get(r["component"], 0.0) + r[key]
    return out


