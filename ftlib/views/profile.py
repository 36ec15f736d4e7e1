"""Stored profiles read back (chapter 1): phases per step, kernels by category, what ran."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ftlib.core.precision import PRECISIONS
from ftlib.harness.profiling import BENCH, PROFILE_MODES
from ftlib.harness.results import load_rows
from ftlib.harness.trace import CATEGORIES, OTHER_PHASE, PHASES, STEP_PHASE
from ftlib.model.config import preset
from ftlib.views.bench import gpu_of, model_title
from ftlib.views.per_run import span_text
from ftlib.views.tables import to_frame

_ID_FIELDS = ("key", "preset", "config_hash", "B", "T", "precision", "mode", "device_slug")


def to_rows(row: dict) -> list[dict[str, Any]]:
    """Tidy rows (one per phase, category and kernel name) of a stored profile row
    (``ftlib.harness.profiling.to_row``)."""
    ident = {k: row.get(k) for k in _ID_FIELDS}
    return [{**ident, **k} for k in row.get("kernels") or []]


def select_rows(rows: Iterable[dict], B: int, T: int, **overrides: Any) -> list[dict[str, Any]]:
    """Stored rows measured at ``B`` x ``T`` on a preset with exactly these ``overrides``.

    Keeps a figure of the full models from mixing with smoke runs of smaller ones.
    """
    out = []
    for r in rows:
        if r.get("status", "ok") != "ok" or r.get("B") != B or r.get("T") != T or r.get("preset") is None:
            continue
        with contextlib.suppress(ValueError):
            if r.get("config") == preset(r["preset"], **overrides).to_dict():
                out.append(r)
    return out


def phase_breakdown(rows: Iterable[dict]) -> list[dict[str, Any]]:
    """Per stored profile: ms per step in forward, backward, optimizer, other and launch gaps.

    Phases are device-busy times from the trace. A whole-step CUDA graph whose kernels were
    not split falls back to the three-graph differences (which then include the gaps inside
    each graph, so no separate gap bar is drawn for it).
    """
    out = []
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        ident = {k: r.get(k) for k in ("preset", "mode", "precision", "B", "T", "device_slug")}
        ident["step_ms"] = r.get("step_ms")
        ident["sdpa_backend"] = r.get("sdpa_backend")
        if r.get("phase_source") == "none" and r.get("graph_phases"):
            parts = {p["phase"]: p["total_us"] for p in r["graph_phases"]}
            source = "graph-difference"
        else:
            parts = {p["phase"]: p["total_us"] for p in r.get("phases") or []}
            parts["launch gaps"] = r.get("gaps_us") or 0.0
            source = r.get("phase_source")
        for ph in (*PHASES, OTHER_PHASE, STEP_PHASE, "launch gaps"):
            if ph in parts:
                out.append({**ident, "phase": ph, "ms": parts[ph] / 1e3, "source": source})
    return out


# ---------------------------------------------------------------------------------------
# Chapter 1: the tables and figures of the stored profiles.

MODELS = ("gpt2", "fasttransformer")
PHASE_ORDER = (*PHASES, OTHER_PHASE, STEP_PHASE, "launch gaps")


def _order(r: dict) -> tuple[int, int]:
    """Models in the book's order, then the modes in the benchmark's order."""
    return (MODELS.index(r["preset"]) if r["preset"] in MODELS else 99, PROFILE_MODES.index(r["mode"]))


def stored_profiles(B: int = 32, T: int = 256, device: str | None = None, **overrides: Any) -> list[dict[str, Any]]:
    """The stored profiles of the presets at ``B`` x ``T`` (with ``overrides``: a smoke run's smaller
    models), of one device folder or (None) every GPU folder."""
    return select_rows(load_rows(BENCH, devices=None if device is None else [device]), B, T, **overrides)


def run_status(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """What a measuring call just did: each profile's model, mode, precision, status and error."""
    return to_frame([{"model": r["preset"], "mode": r["mode"], "precision": r["precision"], "status": r["status"],
                      "error": r.get("error", "")} for r in rows])


def _x(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Two-level x labels of a figure's bars: the model as the book names it, and the mode."""
    return [[model_title(r["preset"]) for r in rows], [r["mode"] for r in rows]]


def phase_figures(rows: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """(name, figure) per device and precision: each model and mode's step as a stack of its phases'
    GPU time and the launch gaps (the post's Figure 2, measured)."""
    out = []
    for dev in sorted({r["device_slug"] for r in rows}):
        for prec in [p for p in PRECISIONS if any(r["precision"] == p and r["device_slug"] == dev for r in rows)]:
            sel = sorted((r for r in rows if r["device_slug"] == dev and r["precision"] == prec), key=_order)
            parts = phase_breakdown(sel)
            fig = go.Figure()
            for ph in PHASE_ORDER:
                pts = sorted((p for p in parts if p["phase"] == ph), key=_order)
                if pts:
                    fig.add_bar(name=ph, x=_x(pts),
                                y=[p["ms"] for p in pts], customdata=[[p["source"], p["sdpa_backend"]] for p in pts],
                                hovertemplate="%{y:.3f} ms<br>%{customdata[0]}<br>SDPA: %{customdata[1]}")
            fig.update_layout(barmode="stack", title=f"Phases of one training step, {gpu_of(rows, dev)}, {prec} "
                              f"(B={sel[0]['B']}, T={sel[0]['T']})", yaxis_title="ms per step", legend_title="phase")
            out.append((f"profile-phases-{dev}-{prec}", fig))
    return out


def category_figures(rows: list[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """(name, figure) per device: each fp32 step's GPU time by kernel category, and its launch gaps."""
    out = []
    for dev in sorted({r["device_slug"] for r in rows}):
        sel = sorted((r for r in rows if r["device_slug"] == dev and r["precision"] == "fp32"), key=_order)
        if not sel:
            continue
        x = _x(sel)
        fig = go.Figure()
        for cat in CATEGORIES:
            ys = [sum(k["total_us"] for k in r["kernels"] if k["category"] == cat) / 1e3 for r in sel]
            if any(ys):
                fig.add_bar(name=cat, x=x, y=ys)
        fig.add_bar(name="launch gaps", x=x, y=[(r.get("gaps_us") or 0.0) / 1e3 for r in sel])
        fig.update_layout(barmode="stack", title=f"GPU time by kernel category, {gpu_of(rows, dev)}, fp32",
                          yaxis_title="ms per step", legend_title="category")
        out.append((f"profile-categories-{dev}", fig))
    return out


def _who(rows: list[dict[str, Any]], r: dict[str, Any]) -> dict[str, str]:
    """The profile's GPU and model as the book names them."""
    return {"device": gpu_of(rows, r["device_slug"]), "model": model_title(r["preset"])}


def what_ran(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Per profile: step times, busy time, launch gaps, kernels and launches per step, the SDPA backend."""
    return to_frame([{
        **_who(rows, r), "mode": r["mode"], "precision": r["precision"], "step ms": r["step_ms"],
        "profiled step ms": r["step_ms_profiled"], "busy ms": (r["busy_us"] or 0) / 1e3,
        "launch gaps ms": (r["gaps_us"] or 0) / 1e3, "kernels": r["kernels_per_step"],
        "launches": r["launches_per_step"], "SDPA backend": r["sdpa_backend"], "phase split": r["phase_source"],
    } for r in sorted(rows, key=lambda r: (r["device_slug"], r["precision"], *_order(r)))])


def graph_split(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The whole-step CUDA graphs' phases two ways: from the trace, and from the three graphs' replays."""
    def ms(parts: list[dict] | None, ph: str) -> float | None:
        return next((p["total_us"] / 1e3 for p in parts or [] if p["phase"] == ph), None)

    graphs = sorted((r for r in rows if r["mode"] == "cudagraph"), key=lambda r: (r["device_slug"], r["precision"],
                                                                                  *_order(r)))
    return to_frame([{**_who(rows, r), "precision": r["precision"], "phase": ph,
                      "trace ms": ms(r["phases"], ph), "graph difference ms": ms(r["graph_phases"], ph)}
                     for r in graphs for ph in PHASES])


def heaviest_kernels(rows: list[dict[str, Any]], n: int = 10) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) per eager fp32 profile: its ``n`` kernels with the most GPU time per step."""
    out = []
    for r in sorted((r for r in rows if r["mode"] == "eager" and r["precision"] == "fp32"),
                    key=lambda r: (r["device_slug"], *_order(r))):
        top = sorted(to_rows(r), key=lambda k: (-k["total_us"], k["name"]))[:n]
        out.append((" · ".join(_who(rows, r).values()), to_frame(
            [{"phase": k["phase"], "category": k["category"], "kernel": short_kernel(k["name"]),
              "launches per step": k["count"], "µs per step": k["total_us"]} for k in top])))
    return out


def short_kernel(name: str, width: int = 100) -> str:
    """A kernel's name cut to ``width`` characters in the middle: its start names the library and kernel, its end
    the template arguments that tell two tilings of one GEMM apart, so two kernels never read the same."""
    return name if len(name) <= width else name[: width - 41] + "…" + name[-40:]


def findings(rows: list[dict[str, Any]]) -> str:
    """Chapter 1's closing paragraph from the stored profiles: how the backward compares with the forward,
    what share of each step the launch gaps take per mode, and how much of the kernel time is GEMMs."""
    if not rows:
        return ("No profile of the full-size models is stored for a GPU yet, so this chapter cannot answer its "
                "question here; `bash ci/gpu-run --out OUT --only profile` measures it on a GPU.")
    parts = pd.DataFrame(phase_breakdown(rows))
    out = []
    # every profile's backward / forward; per eager profile, its launch gaps' share and whether they outlast each phase
    ratios: list[float] = []
    eager_gaps: list[tuple[float, bool]] = []
    for (dev, prec), g in parts.groupby(["device_slug", "precision"], sort=True):
        wide = g.pivot_table(index=["preset", "mode"], columns="phase", values="ms", aggfunc="first")
        steps = g.groupby(["preset", "mode"])["step_ms"].first()
        lines = []
        if {"forward", "backward"} <= set(wide.columns):
            fb = (wide["backward"] / wide["forward"]).dropna()
            ratios += list(fb)
            if len(fb):
                lines.append(f"the backward takes {fb.min():.1f}–{fb.max():.1f}× the forward's GPU time over "
                             f"{len(fb)} profiles")
        if "launch gaps" in wide.columns:
            share = (wide["launch gaps"] / steps).dropna()
            eager = wide[wide.index.get_level_values("mode") == "eager"]
            phases = [c for c in ("forward", "backward", "optimizer") if c in eager.columns]
            eager_gaps += [(gap / steps[i], gap > eager.loc[i, phases].max())
                           for i, gap in eager["launch gaps"].dropna().items()]
            by_mode = share.groupby(level="mode").agg(["min", "max"])
            lines.append("the launch gaps take " + "; ".join(
                f"{lo:.0%}–{hi:.0%} of the step in {mode}" if f"{lo:.0%}" != f"{hi:.0%}" else f"{lo:.0%} in {mode}"
                for mode, (lo, hi) in by_mode.iterrows()))
        mine = [r for r in rows if r["device_slug"] == dev and r["precision"] == prec and r.get("kernels")]
        mm = [sum(k["total_us"] for k in r["kernels"] if k["category"] == "matmul")
              / max(sum(k["total_us"] for k in r["kernels"]), 1e-9) for r in mine]
        if mm:
            lines.append(f"GEMMs are {min(mm):.0%}–{max(mm):.0%} of the kernel time")
        if lines:
            out.append(f"**{gpu_of(rows, dev)}, {prec}:** " + "; ".join(lines) + ".")
    if ratios:
        verdict = ("holds for the backward: in every profile it takes more GPU time than the forward"
                   if min(ratios) > 1 else "does not hold for every profile: in some the backward takes no more "
                   "GPU time than the forward")
        shares = [x for x, _ in eager_gaps]
        gaps = (f"; but an eager step waits on its launches for {span_text(min(shares), max(shares), '.0%')} of its "
                "time, longer than its longest phase in every eager profile, so at this size how the step is run "
                "matters more than which phase dominates" if eager_gaps and all(m for _, m in eager_gaps) else "")
        out.append(f"**The post's caption, \"backward and MLP phases dominate\",** {verdict} "
                   f"({span_text(min(ratios), max(ratios), '.1f')}×){gaps}.")
    out.append("The post's \"MLP phase\" is a component, not a phase: kernel names do not tell the MLP's GEMMs "
               "from the attention projections', so chapter 2 counts it by FLOPs and bytes instead.")
    return "\n\n".join(out)
