"""Launch-parameter sweeps read back for chapter 6: which tile or grid is fastest, against the default.

Three benchmarks in ``benchmarks/kernels`` time one kernel at many launch parameters and store their rows in
kernels.jsonl (with ``--record``): ``attention_tiles_dev`` (op ``attention_tiles``: the attention kernels'
tiles, forward and backward apart), ``explicit_tiles_dev`` (op ``explicit_tiles``: GPT-2's explicit-attention
kernels' tiles, forward and backward apart, in bf16 and tf32) and ``norm_bwd_grid_dev`` (op ``norm_bwd_grid``:
the fused residual-norm backward's grid). Each row is one variant's in-graph time with its p20 and p80 over
replays. A variant beats the default *beyond the spread* when its p80 is below the default's p20: only
such a win is worth a trial in the engine (``engine_candidates``), where the step decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from ftlib.views.bench import gpu_label
from ftlib.views.tables import table_view

# The launchers' defaults, by op and pass, as the sweeps name their variants (tests/test_sweepview.py
# checks these against kernels.tiles and kernels._common).
DEFAULTS: dict[str, dict[str, str]] = {
    "attention_tiles": {"fwd": "fwd 64x64 w4 s2", "bwd": "bwd 64x64 w4 s2"},
    "explicit_tiles": {f"{p} {prec}": f"{p} 64x64 w4 s2" for p in ("fwd", "bwd") for prec in ("bf16", "tf32")},
    "norm_bwd_grid": {"": "atomic 4 rows 4/SM"},
}
SWEEP_NAMES = {"attention_tiles": "attention tiles", "explicit_tiles": "GPT-2's explicit-attention tiles",
               "norm_bwd_grid": "residual-norm backward grid"}
DRIVERS = {op: f"benchmarks.kernels.{op}_dev" for op in DEFAULTS}  # the module that sweeps each (``--record``)
RATIO = "launcher's default / variant"  # the table's ratio column: above 1, the variant is faster


def sweep_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The sweeps' in-graph rows that passed their check, newest run per (device, op, pass, variant)."""
    keep = [{"device": r.get("device_slug") or r.get("device"), "op": r["op"],
             "pass": (r.get("shape") or {}).get("pass", ""), "variant": r["variant"], "graph µs": r["median_us"],
             "p20 µs": r.get("p20_us"), "p80 µs": r.get("p80_us"), "date": r.get("date", "")}
            for r in rows if r.get("op") in DEFAULTS and r.get("timing") == "graph" and r.get("status") == "ok"
            and r.get("check_ok", True) and r.get("median_us")]
    if not keep:
        return pd.DataFrame(columns=["device", "op", "pass", "variant", "graph µs", "p20 µs", "p80 µs", "date"])
    df = pd.DataFrame(keep).sort_values("date")
    return df.drop_duplicates(["device", "op", "pass", "variant"], keep="last").reset_index(drop=True)


def _with_default(df: pd.DataFrame) -> pd.DataFrame:
    """Each row beside its group's launcher default: :data:`RATIO` and 'beyond spread'."""
    out = []
    for (_dev, op, p), g in df.groupby(["device", "op", "pass"], sort=True):
        base = g[g["variant"] == DEFAULTS[op].get(p)]
        if base.empty:
            continue
        b = base.iloc[0]
        g = g.assign(**{RATIO: b["graph µs"] / g["graph µs"],
                        "beyond spread": (g["p80 µs"] < b["p20 µs"]) | (g["p20 µs"] > b["p80 µs"])})
        out.append(g.sort_values("graph µs"))
    return pd.concat(out, ignore_index=True) if out else df.iloc[0:0]


@table_view
def sweep_table(rows: Iterable[dict[str, Any]], top: int = 4) -> list[dict[str, Any]]:
    """Per device, sweep and pass: the ``top`` fastest variants, and the launcher's default and the variant the
    engine runs (``the engine's``) wherever they rank."""
    df = _with_default(sweep_frame(rows))
    out = []
    for (dev, op, p), g in df.groupby(["device", "op", "pass"], sort=True):
        ran = engine_choice(op, p) or DEFAULTS[op][p]  # the variant the engine runs: its own, else the launcher's
        shown = g[(g["graph µs"].rank(method="first") <= top) | g["variant"].isin([DEFAULTS[op][p], ran])]
        for r in shown.to_dict("records"):
            out.append({"device": dev, "sweep": SWEEP_NAMES[op] + (f" ({p})" if p else ""), "variant": r["variant"],
                        "rank": int((g["graph µs"] < r["graph µs"]).sum()) + 1, "of": len(g),
                        **{k: r[k] for k in ("graph µs", "p20 µs", "p80 µs", RATIO)},
                        "differs beyond spread": bool(r["beyond spread"]) if r["variant"] != DEFAULTS[op][p] else None,
                        "the engine's": r["variant"] == ran})
    return out


def sweep_findings(rows: Iterable[dict[str, Any]]) -> list[str]:
    """One sentence per device, sweep and pass: the fastest variant against the default, and whether the
    difference is beyond the spread of the replays."""
    df = _with_default(sweep_frame(rows))
    out = []
    for (dev, op, p), g in df.groupby(["device", "op", "pass"], sort=True):
        win, base = g.iloc[0], g[g["variant"] == DEFAULTS[op][p]].iloc[0]
        name = f"{gpu_label(dev)}, {SWEEP_NAMES[op]}" + (f" ({p})" if p else "") + f", {len(g)} variants"
        if win["variant"] == base["variant"]:
            out.append(f"{name}: the launcher's default, {base['variant']}, is the fastest "
                       f"({base['graph µs']:.1f} µs in a graph).")
            continue
        choice = engine_choice(op, p)
        ran = g[g["variant"] == choice]
        verdict = ("within the spread of the replays: no reason to change the default" if not win["beyond spread"]
                   else ("beyond the spread of the replays; the engine runs it by default (its trial is in the "
                         "table of options)")
                   if win["variant"] == choice
                   else "beyond the spread of the replays: worth a trial in the engine")
        if win["beyond spread"] and choice not in (None, win["variant"], base["variant"]) and len(ran):
            # The engine already runs another variant than the launcher's default: the winner is set against it.
            e = ran.iloc[0]
            apart = e["p20 µs"] > win["p80 µs"]
            verdict = (f"beyond the spread of the replays; the engine runs {choice} ({e['graph µs']:.1f} µs here, "
                       f"{e['graph µs'] / win['graph µs']:.2f}× the fastest" + (
                           "), beyond the spread too: worth a trial in the engine (the table of engine options says "
                           "whether one ran)" if apart else "), within the spread of the fastest"))
        out.append(f"{name}: fastest {win['variant']} at {win['graph µs']:.1f} µs against the launcher's default "
                   f"{base['variant']} at {base['graph µs']:.1f} µs ({win[RATIO]:.2f}×), "
                   f"{verdict}.")
    return out


def engine_choice(op: str, pass_: str = "") -> str | None:
    """The variant of sweep ``op`` (and pass) the engine runs by default, named as the sweep names it; None
    where the engine leaves the launcher's own default (an engine option set to None)."""
    from ftlib.training.engine import EngineOptions  # here: the views' other functions need no engine

    opts = EngineOptions()
    if op == "norm_bwd_grid" and opts.norm_bwd_grid is not None:
        return f"atomic {opts.norm_bwd_grid}"
    if op == "explicit_tiles" and pass_.startswith("bwd") and opts.explicit_dq_one_pass:
        # GPT-2's dQ kernel over whole rows at the engine's tile, the dK/dV kernel at its launcher's tiles
        # (the sweep's shape is the headline one; the engine's rule: ftlib.training.engine.swaps)
        from ftlib.harness.suites import HEADLINE_T
        from ftlib.training.engine.swaps import dq_one_pass_tiles

        if opts.attention_tiles is None or "bwd" not in opts.attention_tiles:
            return f"bwd one-pass {dq_one_pass_tiles(HEADLINE_T).name}"
    if op in ("attention_tiles", "explicit_tiles") and opts.attention_tiles is not None:
        from kernels.tiles import parse_tiles

        kernel_pass = pass_.split()[0]  # the explicit sweep's passes also name the precision: 'fwd bf16'
        tiles = parse_tiles(opts.attention_tiles).get(kernel_pass)
        return f"{kernel_pass} {tiles.name}" if tiles else None
    return None


def unswept_text(rows: Iterable[dict[str, Any]]) -> str:
    """A sentence naming each sweep with no stored row, and the command that runs it ('' when none)."""
    swept = set(sweep_frame(rows)["op"])
    missing = [f"{SWEEP_NAMES[op]} (`python -m {DRIVERS[op]} --record` on a GPU)" for op in DEFAULTS if op not in swept]
    return f"Not swept yet: {'; '.join(missing)}." if missing else ""
