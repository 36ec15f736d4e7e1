"""Stored data-parallel rows read back (chapter 9): scaling over one rank, the accounting beside them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ftlib.analysis.allreduce import NVLINK_GBS, allreduce_volume, ring_floor_s
from ftlib.model.config import preset
from ftlib.views.baselines import config_name, placement_table
from ftlib.views.bench import MODEL_NAMES, gpu_label, model_title
from ftlib.views.plots import MODEL_COLORS, log_ticks
from ftlib.views.tables import table_view


@table_view
def scaling_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
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




# ---------------------------------------------------------------------------------------
# Chapter 9: the all-reduce on paper, beside the stored single-GPU step, and the stored DDP rows.

MODELS = {"gpt2": preset("gpt2"), "fasttransformer": preset("fasttransformer")}
WORLD_SIZES = (1, 2, 4, 8)
H200_LINK_GBS = NVLINK_GBS["NVIDIA H200"] / 2  # GB/s per direction


@table_view
def allreduce_table() -> list[dict[str, Any]]:
    """Per model and GPU count: the gradient bytes, the ring factor, what each GPU sends, and the floor
    of that at the H200's NVLink bandwidth (a lead, not a reading)."""
    out = []
    for name, cfg in MODELS.items():
        for n in WORLD_SIZES:
            v = allreduce_volume(cfg, n)
            out.append({"model": name, "GPUs": n, "parameters": v["n_params"], "gradient MB": v["grad_bytes"] / 1e6,
                        "ring factor 2(n-1)/n": v["ring_factor"], "sent per GPU MB": v["ring_bytes_per_rank"] / 1e6,
                        "NVLink floor µs (H200)": ring_floor_s(cfg, n, H200_LINK_GBS) * 1e6})
    return out


def allreduce_figure() -> go.Figure:
    """Gradient bytes each GPU sends per step against the GPU count, per model."""
    fig = go.Figure()
    for name, cfg in MODELS.items():
        fig.add_trace(go.Scatter(name=model_title(name), x=list(WORLD_SIZES), mode="lines+markers",
                                 line_color=MODEL_COLORS[name],
                                 y=[allreduce_volume(cfg, n)["ring_bytes_per_rank"] / 1e6 for n in WORLD_SIZES]))
    fig.update_layout(title="Gradient bytes each GPU sends per step (ring all-reduce, fp32 gradients)",
                      xaxis=dict(title="GPUs", **log_ticks(WORLD_SIZES)), yaxis_title="MB per GPU per step",
                      height=400)
    return fig


def fewer_bytes_text(n: int = 8) -> str:
    """How many fewer bytes FastTransformer all-reduces than GPT-2."""
    g2, ft = (allreduce_volume(MODELS[m], n) for m in ("gpt2", "fasttransformer"))
    return (f"FastTransformer all-reduces {1 - ft['grad_bytes'] / g2['grad_bytes']:.1%} fewer bytes per step than "
            f"GPT-2 ({ft['grad_bytes'] / 1e6:.2f} MB vs {g2['grad_bytes'] / 1e6:.2f} MB), at every GPU count.")


def _steps(runs: pd.DataFrame, device: str, label: str) -> pd.DataFrame:
    """One model's configurations on ``device``, each one's step over the stored runs (median, min, max,
    runs): :func:`ftlib.views.baselines.placement_table` of the complete clean runs, where the engine's
    rows stand apart by the engine they ran (never pooled across versions)."""
    tab = placement_table(runs)
    return tab[(tab["device_slug"] == device) & (tab["label"] == label)]


def _eager_step_ms(steps: pd.DataFrame) -> tuple[float | None, int]:
    """The eager fp32 step of :func:`_steps` (median over its runs), and how many runs."""
    eager = steps[(steps["config"] == config_name("eager", "default")) & (steps["precision"] == "fp32")]
    return (None, 0) if eager.empty else (float(eager["median_ms"].iloc[0]), int(eager["runs"].iloc[0]))


def _fastest_step_ms(steps: pd.DataFrame) -> tuple[float | None, str | None]:
    """The fastest configuration of :func:`_steps`, any precision (its median over its runs), and which: the
    step that leaves the least time to hide an all-reduce behind."""
    if steps.empty:
        return None, None
    best = steps.loc[steps["median_ms"].idxmin()]
    engine = config_name("engine", "default")
    name = ("the engine" if best["config"] == engine else "an earlier engine"
            if best["config"].startswith(engine + ", ") else best["config"])
    return float(best["median_ms"]), f"{name} in {best['precision']}"


@table_view
def floor_vs_step(runs: pd.DataFrame, device: str = "h200", n: int = 8) -> list[dict[str, Any]]:
    """The ``n``-GPU all-reduce floor beside the single-GPU eager fp32 step of ``device`` (its median over the
    stored runs), and beside the fastest single-GPU step stored for it (:func:`_fastest_step_ms`). ``runs``:
    the baselines suite's complete runs (:func:`ftlib.views.baselines.load`)."""
    out = []
    for name, cfg in MODELS.items():
        steps = _steps(runs, device, name)
        step, n_runs = _eager_step_ms(steps)
        fast, which = _fastest_step_ms(steps)
        floor_ms = ring_floor_s(cfg, n, H200_LINK_GBS) * 1e3
        out.append({"model": name, "H200 1-GPU eager step ms (median of stored runs)": step, "runs": n_runs,
                    f"{n}-GPU all-reduce floor ms": floor_ms,
                    "floor, share of the step": (floor_ms / step) if step else None,
                    "fastest 1-GPU step stored": which, "its ms": fast,
                    "floor, share of the fastest step": (floor_ms / fast) if fast else None})
    return out


def findings(runs: pd.DataFrame, ddp_rows: list[dict[str, Any]], device: str = "h200",
             n: int = max(WORLD_SIZES)) -> str:
    """Chapter 9's closing paragraph: the accounting's answer, and what the stored DDP rows add. ``runs``: the
    baselines suite's complete runs (:func:`ftlib.views.baselines.load`)."""
    fl = floor_vs_step.rows(runs, device, n)
    shares = [f"{MODEL_NAMES[r['model']]} {r['floor, share of the step']:.2%}" for r in fl
              if r["floor, share of the step"]]
    text = fewer_bytes_text(n)
    # "Small" where the floor stays under a tenth of even the fastest step: hidden behind the backward, it is noise.
    small = all(r["floor, share of the fastest step"] < 0.1 for r in fl if r["floor, share of the fastest step"])
    fastest = [f"{MODEL_NAMES[r['model']]} {r['floor, share of the fastest step']:.1%} of {r['its ms']:.2f} ms, "
               f"{r['fastest 1-GPU step stored']}" for r in fl if r["floor, share of the fastest step"]]
    if shares:
        text += (f" At {n} GPUs the bandwidth floor of that all-reduce is a small share of one eager fp32 step "
                 f"on the {gpu_label(device)} ({'; '.join(shares)})"
                 + (f", and of the fastest single-GPU step stored ({'; '.join(fastest)})" if fastest else "")
                 + (": bandwidth does not limit data parallelism at this size" if small else
                    ": against the fastest step, bandwidth alone already costs a noticeable share")
                 + ". What else could is each all-reduce's fixed latency and how much backward is left to hide "
                 "it behind, which only a multi-GPU measurement shows.")
    mine = [r for r in scaling_table.rows(ddp_rows) if r.get("device_slug") == device and r.get("efficiency")]
    if mine:
        top = max(r["world_size"] for r in mine)
        eff = "; ".join(f"{MODEL_NAMES[r['label']]} {r['precision']} {r['efficiency']:.0%}" for r in mine
                        if r["world_size"] == top)
        text += f" Measured weak-scaling efficiency at {top} GPUs: {eff}."
    else:
        text += (f" No multi-GPU step is stored for the {gpu_label(device)}, so what DDP costs in practice (the "
                 "exposed part of the all-reduce) is not measured in this edition.")
    return text


@table_view
def ddp_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored DDP rows with their scaling (:func:`scaling_table`) and all-reduce, as chapter 9 shows them."""
    return [{"device": r["device_slug"], "model": r["label"], "precision": r["precision"], "mode": r["mode"],
             "ranks (GPUs)": r["world_size"], "backend": r["backend"], "B per rank": r["B_per_rank"],
             "step ms": r["median_ms"], "p20–p80 ms": f"{r['p20_ms']:.2f}–{r['p80_ms']:.2f}",
             "tokens/s": r["tokens_per_s"], "speed-up": r["speedup"], "efficiency": r["efficiency"],
             "overhead ms": r["step_overhead_ms"], "all-reduce ms (profiled)": r.get("comm_ms"),
             "all-reduces/step": r.get("comm_calls_per_step"),
             "MB reduced (measured)": (r.get("allreduce_bytes_measured") or 0) / 1e6 or None,
             "MB (accounting)": r["grad_bytes"] / 1e6, "grads ok": r.get("check_ok")}
            for r in scaling_table.rows(rows)]


def scaling_figures(rows: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """(name, figure) per device and measure (step time, throughput, weak-scaling efficiency) against ranks."""
    table = scaling_table.rows(rows)
    out = []
    for dev in sorted({r["device_slug"] for r in table}):
        for field, title, ytitle in (("median_ms", "step time", "ms per step"),
                                     ("tokens_per_s", "throughput (all GPUs)", "tokens/s"),
                                     ("efficiency", "weak-scaling efficiency", "tok/s(n) / (n · tok/s(1))")):
            fig = go.Figure()
            for r0 in [r for r in table if r["device_slug"] == dev and r["world_size"] == 1]:
                pts = [r for r in table if r["device_slug"] == dev and r["label"] == r0["label"]
                       and r["precision"] == r0["precision"] and r["mode"] == r0["mode"]]
                fig.add_trace(go.Scatter(name=f"{model_title(r0['label'])} {r0['precision']} {r0['mode']}",
                                         mode="lines+markers", x=[r["world_size"] for r in pts],
                                         y=[r[field] for r in pts]))
            fig.update_layout(title=f"DDP {title}, {gpu_label(dev)}", yaxis_title=ytitle, height=400,
                              xaxis=dict(title="ranks (one GPU each)", **log_ticks(r["world_size"] for r in table)))
            out.append((f"ddp-{field}-{dev}", fig))
    return out
