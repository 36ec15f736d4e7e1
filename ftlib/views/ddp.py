"""Stored data-parallel rows read back (chapter 9): scaling over one rank, the accounting beside them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def scaling(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored DDP rows with their scaling over the same case at one rank (weak scaling: fixed
    ``B_per_rank``): ``speedup = tok/s(n) / tok/s(1)``, ``efficiency = speedup / n``."""
    def case(r: dict[str, Any]) -> tuple:
        return (r.get("device_slug"), r.get("label"), r.get("config_hash"), r.get("precision"), r.get("mode"),
                r.get("B_per_rank"), r.get("T"))

    ok = [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s")]
    base = {case(r): r for r in ok if r.get("world_size") == 1}
    out = []
    for r in sorted(ok, key=lambda r: (*map(str, case(r)), r["world_size"])):
        one = base.get(case(r))
        speedup = r["tokens_per_s"] / one["tokens_per_s"] if one else None
        out.append({**r, "speedup": speedup, "efficiency": speedup / r["world_size"] if speedup else None,
                    "step_overhead_ms": r["median_ms"] - one["median_ms"] if one else None})
    return out


