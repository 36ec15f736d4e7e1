"""Reading the step-level rows for chapter 6: the compiler ceiling, the engine, its 100-step check.

Sources (all rows of ``ftlib.bench`` or ``ci/gpu_bench.py``, read with :func:`ftlib.benchview.ok_rows`):

* ``fig1`` / ``precision``: eager, whole-step CUDA graph, torch.compile default and
  reduce-overhead (chapters 3 and 5).
* ``engine``: the engine (``mode='engine'``, label = the preset) measured in the same run as
  compile-ro and the CUDA graph; then variants labelled ``'<preset> engine <change>'``
  (``-rmsnorm``: that kernel off, ``no-kernels``, ``uncaptured``, ``+flash-attn``).
* ``engine_check``: one row per (model, precision), the engine and the reference trained
  100 steps side by side (``losses_engine``, ``losses_ref``, ``max_rel_err``, ``ok``).

Every function takes rows and returns table rows, verdicts or figures; comparisons against
the engine use baselines from the engine's own run, where the same session measured both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.benchview import pick, select
from ftlib.plots import MODEL_COLORS, PALETTE, legend_below

MODELS = ("gpt2", "fasttransformer")
MODES = ("eager", "cudagraph", "compile", "compile-ro", "engine")
SHORT_MODES = {"eager": "eager", "cudagraph": "CUDA graph", "compile": "compile", "compile-ro": "compile-ro",
               "engine": "engine"}
PRECISIONS = ("fp32", "tf32")
SHAPE = {"B": 32, "T": 256}
TARGET_FT_SPEEDUP = 1.5  # the issue: FastTransformer engine >= 1.5x faster than compile-ro, fp32 and tf32
NOT_MEASURED = "not measured yet: run bash ci/gpu-run --only engine_check,engine"


def _round(r: dict[str, Any]) -> int:
    return int((r.get("extra") or {}).get("round", 1))


def latest_round(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per results file (``bench``), only the rows of its newest engine round.

    ``ci/gpu_bench.py`` tags engine cases with ``extra['round']`` and measures every round
    together with its own baselines; older rounds stay stored for the record but are not
    mixed into one comparison. Rows without a round are round 1.
    """
    rows = list(rows)
    newest: dict[str, int] = {}
    for r in rows:
        newest[r.get("bench", "")] = max(newest.get(r.get("bench", ""), 1), _round(r))
    return [r for r in rows if _round(r) == newest[r.get("bench", "")]]


def _shape(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in latest_round(rows) if r.get("B") == SHAPE["B"] and r.get("T") == SHAPE["T"]]


def engine_devices(engine_rows: Iterable[dict[str, Any]]) -> list[str]:
    """Devices with at least one headline engine row."""
    return sorted({r["device_slug"] for r in _shape(engine_rows) if r.get("mode") == "engine"
                   and r.get("label") in MODELS})


def headroom(step_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, model and precision: eager, CUDA graph and compile-ro against the floors of a step.

    Floors from the accounting at the device's datasheet peaks (chapter 2): the PaLM FLOP
    count at the matmul peak, and the roofline sum over components. ``gap`` = compile-ro over
    the roofline floor: what the compiler leaves for kernels to take.
    """
    from ftlib.accounting import palm_flops
    from ftlib.config import ModelConfig
    from ftlib.peaks import flops_floor, lookup, step_floor

    rows = _shape(step_rows)
    out = []
    for dev in sorted({r["device_slug"] for r in rows}):
        for prec in PRECISIONS:
            for model in MODELS:
                got = {m: pick(rows, device_slug=dev, label=model, mode=m, precision=prec)
                       for m in ("eager", "cudagraph", "compile-ro")}
                ro = got["compile-ro"]
                if ro is None:
                    continue
                try:
                    peaks = lookup(ro["device"])
                except KeyError:
                    continue
                cfg = ModelConfig(**ro["config"])
                B, T = ro["B"], ro["T"]
                roof = step_floor(cfg, B, T, peaks, prec)["floor_s"] * 1e3
                out.append({
                    "device": dev, "model": model, "precision": prec,
                    **{f"{m} ms": (got[m] or {}).get("median_ms") for m in got},
                    "FLOP floor ms": flops_floor(palm_flops(cfg, B, T), peaks, prec) * 1e3,
                    "roofline floor ms": roof, "compile-ro / floor": ro["median_ms"] / roof,
                })
    return out


def step_table(step_rows: Iterable[dict[str, Any]], engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The post's Figure 1 extended by the engine: one row per (device, model, precision, mode).

    engine, compile-ro and cudagraph come from the engine's run where it has them (same
    session), else from fig1/precision; eager and compile from fig1/precision. Devices
    without engine rows are left out.
    """
    eng, steps = _shape(engine_rows), _shape(step_rows)
    out = []
    for dev in engine_devices(eng):
        for prec in PRECISIONS:
            for model in MODELS:
                for mode in MODES:
                    r = pick(eng, device_slug=dev, label=model, mode=mode, precision=prec)
                    src = "engine run"
                    if r is None:
                        r, src = pick(steps, device_slug=dev, label=model, mode=mode, precision=prec), "fig1/precision"
                    if r is None:
                        continue
                    out.append({"device": dev, "model": model, "precision": prec, "mode": mode,
                                "median_ms": r["median_ms"], "p20_ms": r["p20_ms"], "p80_ms": r["p80_ms"],
                                "source": src, "commit": r.get("commit"), "date": str(r.get("date", ""))[:10]})
    return out


def figure1(table: list[dict[str, Any]], device: str) -> go.Figure:
    """Step time per mode for both models, fp32 and tf32 side by side (median, p20-p80)."""
    fig = go.Figure()
    for model in MODELS:
        pts = [t for t in table if t["device"] == device and t["model"] == model]
        fig.add_trace(go.Bar(
            name=model, x=[[t["precision"] for t in pts], [SHORT_MODES[t["mode"]] for t in pts]],
            y=[t["median_ms"] for t in pts], marker_color=MODEL_COLORS.get(model),
            error_y=dict(type="data", symmetric=False, array=[t["p80_ms"] - t["median_ms"] for t in pts],
                         arrayminus=[t["median_ms"] - t["p20_ms"] for t in pts])))
    fig.update_layout(barmode="group", height=450, yaxis_title="ms per step", xaxis_tickangle=0,
                      title=f"Training step per mode, engine included, {device} (median, p20–p80)")
    return fig


def speedups(engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, model, precision: engine vs compile-ro and vs the CUDA graph, all from the engine's run."""
    rows = _shape(engine_rows)
    out = []
    for dev in engine_devices(rows):
        for prec in ("fp32", "tf32", "bf16"):
            for model in MODELS:
                e = pick(rows, device_slug=dev, label=model, mode="engine", precision=prec)
                if e is None:
                    continue
                ro = pick(rows, device_slug=dev, label=model, mode="compile-ro", precision=prec)
                cg = pick(rows, device_slug=dev, label=model, mode="cudagraph", precision=prec)
                out.append({"device": dev, "model": model, "precision": prec, "engine ms": e["median_ms"],
                            "compile-ro ms": ro and ro["median_ms"], "cudagraph ms": cg and cg["median_ms"],
                            "engine over compile-ro": ro and ro["median_ms"] / e["median_ms"],
                            "engine over cudagraph": cg and cg["median_ms"] / e["median_ms"],
                            "check ok": e.get("check_ok")})
    return out


# Engine variants that compute the same function as the headline row by another route, shown
# under the same target and labelled: GPT-2 with the attention kernel in place of its explicit
# softmax (one of the post's four changes, but exact attention all the same), and fp32 steps
# on tensor cores at fp32 accuracy (3xTF32), which is not strict IEEE fp32 arithmetic. GPT-2's
# "+fused-softmax" (round 5's variant) keeps the explicit softmax as written, with scale, mask and
# softmax in one kernel each way (the fusion torch.compile makes); the headline engine from round 6.
ALTERNATIVES: dict[tuple[str, str], tuple[str, ...]] = {
    ("fasttransformer", "fp32"): ("fasttransformer engine, 3xTF32 attention+linear",),
    ("gpt2", "fp32"): ("gpt2 engine +fused-softmax", "gpt2 engine +flash-attn 3xTF32 +linear",
                       "gpt2 engine +flash-attn 3xTF32"),
    ("gpt2", "tf32"): ("gpt2 engine +fused-softmax", "gpt2 engine +flash-attn"),
}


def verdicts(engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each computed from the engine's run (or 'not measured').

    FastTransformer engine at least 1.5x faster than compile-ro in fp32 and in tf32;
    GPT-2 engine faster than compiled (reduce-overhead) GPT-2, fp32 and tf32. One row for the
    headline engine, then one per labelled alternative route (``ALTERNATIVES``) that was measured.
    """
    rows = _shape(engine_rows)
    sp = speedups(engine_rows)
    devs = sorted({s["device"] for s in sp}) or ["(no GPU rows)"]
    out = []
    for dev in devs:
        for model, need, what in (("fasttransformer", TARGET_FT_SPEEDUP, "FastTransformer engine >= 1.5x compile-ro"),
                                  ("gpt2", 1.0, "GPT-2 engine faster than compiled GPT-2")):
            for prec in PRECISIONS:
                s = next((s for s in sp if s["device"] == dev and s["model"] == model and s["precision"] == prec),
                         None)
                ro = s and s["compile-ro ms"]
                routes = [("engine", s and s["engine ms"])]
                for label in ALTERNATIVES.get((model, prec), ()):
                    r = pick(rows, device_slug=dev, label=label, mode="engine", precision=prec)
                    if r is not None:
                        routes.append((label[len(f"{model} engine"):].strip(" ,"), r["median_ms"]))
                for route, ms in routes:
                    x = ro / ms if (ro and ms) else None
                    verdict = "not measured" if x is None else ("met" if (x >= need if need > 1 else x > need) else
                                                                "not met")
                    out.append({"device": dev, "target": f"{what}, {prec}", "route": route, "needed": need,
                                "measured": x, "engine ms": ms, "compile-ro ms": ro, "verdict": verdict})
    return out


def variant_name(r: dict[str, Any]) -> str:
    """'-rmsnorm' for label 'fasttransformer engine -rmsnorm'; 'engine' for a headline row."""
    label, model = r.get("label", ""), r.get("preset") or ""
    prefix = f"{model} engine"
    return label[len(prefix):].strip() if label.startswith(prefix) and label != model else "engine"


def kernel_deltas(engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each kernel buys: every engine variant against the full engine of the same model and precision.

    ``delta ms`` = variant - full engine (positive: the variant is slower, i.e. what was
    switched off was worth that much per step).
    """
    rows = [r for r in _shape(engine_rows) if r.get("mode") == "engine"]
    out = []
    for dev in engine_devices(rows):
        for prec in ("fp32", "tf32", "bf16"):
            for model in MODELS:
                full = pick(rows, device_slug=dev, label=model, precision=prec)
                if full is None:
                    continue
                variants = [r for r in select(rows, device_slug=dev, precision=prec, preset=model)
                            if r.get("label") != model]
                for r in sorted(variants, key=lambda r: r["label"]):
                    out.append({"device": dev, "model": model, "precision": prec, "variant": variant_name(r),
                                "ms": r["median_ms"], "engine ms": full["median_ms"],
                                "delta ms": r["median_ms"] - full["median_ms"],
                                "delta %": 100 * (r["median_ms"] / full["median_ms"] - 1),
                                "kernels": ", ".join((r.get("engine") or {}).get("kernels", [])) or None,
                                "check ok": r.get("check_ok")})
    return out


def loss_table(check_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, model, precision: the 100-step check's agreement (max relative loss error vs rtol),
    newest engine round only."""
    out = []
    order = ("fp32", "tf32", "bf16")
    for r in sorted(latest_round(check_rows), key=lambda r: (
            r["device_slug"], order.index(r["precision"]) if r["precision"] in order else 9, r["label"])):
        ref = r.get("losses_ref") or []
        out.append({"device": r["device_slug"], "model": r["label"], "precision": r["precision"],
                    "steps": r.get("steps"), "ref loss first": ref[0] if ref else None,
                    "ref loss last": ref[-1] if ref else None, "max rel err": r.get("max_rel_err"),
                    "rtol": r.get("rtol"), "param rel err": r.get("param_rel_err"),
                    "ok": r.get("ok", r.get("check_ok")), "kernels": ", ".join(r.get("kernels") or []) or None})
    return out


def loss_figure(check_rows: Iterable[dict[str, Any]], device: str) -> go.Figure:
    """Per precision (columns): engine (solid) and reference (dotted) loss per step, and below it
    the relative difference |engine - reference| / reference per step (log scale).

    One colour per checked case, the same in every panel; the largest relative error of each
    case is in :func:`loss_table`.
    """
    rows = [r for r in latest_round(check_rows) if r["device_slug"] == device and r.get("losses_engine")]
    precs = [p for p in ("fp32", "tf32", "bf16") if any(r["precision"] == p for r in rows)]
    labels = list(dict.fromkeys(r["label"] for r in sorted(rows, key=lambda r: (r["label"] not in MODELS, r["label"]))))
    others = [c for c in PALETTE if c not in MODEL_COLORS.values()]
    colors = {lab: MODEL_COLORS.get(lab) or others[i % len(others)] for i, lab in enumerate(labels)}
    n = max(1, len(precs))
    fig = make_subplots(rows=2, cols=n, subplot_titles=precs + [""] * n, shared_xaxes=True,
                        row_heights=[0.6, 0.4], vertical_spacing=0.08, horizontal_spacing=0.06)
    shown: set[str] = set()
    for i, p in enumerate(precs, start=1):
        for r in (r for r in rows if r["precision"] == p):
            c, first = colors[r["label"]], r["label"] not in shown
            shown.add(r["label"])
            steps = list(range(1, len(r["losses_engine"]) + 1))
            fig.add_trace(go.Scatter(x=steps, y=r["losses_engine"], mode="lines", name=r["label"],
                                     line=dict(color=c), legendgroup=r["label"], showlegend=first),
                          row=1, col=i)
            fig.add_trace(go.Scatter(x=steps, y=r["losses_ref"], mode="lines", name=f"{r['label']} reference",
                                     line=dict(color=c, dash="dot"), legendgroup=r["label"], showlegend=False),
                          row=1, col=i)
            rel = [abs(e - f) / abs(f) if (f and e != f) else None for e, f in zip(r["losses_engine"], r["losses_ref"])]
            fig.add_trace(go.Scatter(x=steps, y=rel, mode="lines", name=f"{r['label']} |engine - ref| / ref",
                                     line=dict(color=c, width=1), legendgroup=r["label"], showlegend=False),
                          row=2, col=i)
        fig.update_xaxes(title_text="step", row=2, col=i)
        fig.update_yaxes(type="log", dtick=1, tickformat=".0e", row=2, col=i)
    for dash, what in (("solid", "engine"), ("dot", "reference (train_step + torch.optim.AdamW)")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=what, line=dict(color="#555", dash=dash),
                                 legendgroup="style", legendgrouptitle_text="line"))
    fig.update_yaxes(title_text="training loss", row=1, col=1)
    fig.update_yaxes(title_text="|engine − ref| / ref", row=2, col=1)
    fig.update_layout(height=620, title=f"Engine vs reference training, {device}: loss per step")
    return legend_below(fig)


# Kernel-name patterns -> category, first match wins (kernels/dev/engine_probe.py's names:
# cuBLAS/CUTLASS GEMMs, our Triton kernels by function name, PyTorch's native kernels).
PROBE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("_attn_", "fmha", "softmax", "attention")),
    ("matmul", ("gemm", "xmma", "nvjet", "_matmul_tile", "splitkreduce")),
    ("norms", ("_add_norm", "_rms_norm", "_layer_norm", "layer_norm")),
    ("optimizer", ("_adamw", "adam")),
    ("loss", ("_cross_entropy", "_ce_", "nll_loss", "log_softmax")),
    ("embedding", ("_embedding", "index", "gather", "scatter", "embedding")),
    ("reductions (sums)", ("reduce_kernel",)),
    ("copies and casts", ("copy", "memcpy", "memset")),
    ("other elementwise", ("elementwise", "gelu", "functor")),
)


def probe_category(kernel_name: str) -> str:
    n = kernel_name.lower()
    return next((cat for cat, pats in PROBE_CATEGORIES if any(p in n for p in pats)), "other")


def probe_table(probe_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiled engine case: the captured step, the CUDA kernel time by category (µs) and each
    category's share of the kernel time (``kernels/dev/engine_probe.py``, an uncaptured step
    under torch.profiler, averaged over 3 steps)."""
    out = []
    for r in probe_rows:
        if r.get("status") != "ok":
            continue
        by: dict[str, float] = {}
        for k in r.get("kernels", []):
            cat = probe_category(k["name"])
            by[cat] = by.get(cat, 0.0) + k["us"]
        total = r.get("kernel_us") or sum(by.values())
        line = {"device": r.get("device_slug"), "case": r["label"], "precision": r["precision"],
                "captured step µs": r.get("step_median_us"), "kernel µs": total}
        for cat, _ in PROBE_CATEGORIES + (("other", ()),):
            line[cat] = by.get(cat, 0.0)
        line["largest"] = max(by, key=by.get) if by else None
        line["largest share"] = (by[line["largest"]] / total) if by and total else None
        out.append(line)
    return out


# What each engine round changed (ENGINE_ROUND in ci/gpu_bench.py; kernels/dev/NOTES.md has
# each round's predictions next to its outcomes).
ROUND_CHANGES = {
    1: "kernels swapped in, flat AdamW, the whole step in one CUDA graph",
    2: "dK/dV split over the MQA group, scatter-add embedding backward, 3xTF32 options",
    3: "strict fp32 keeps SDPA's attention; packed attention and fused residual-norm as variants",
    4: "packed attention and fused residual-norm by default, also into LayerNorm; 4-row RMSNorm tiles",
    5: ("Triton bias gradients; bf16 norm outputs and bf16 weight shadow; 4-row residual-norm tiles; "
        "the branch gradient in its own dtype and residual dropout inside the fused residual-norm"),
    6: "GPT-2's explicit softmax (kept, materialized) with scale, mask and softmax fused",
}


def rounds_table(engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, round, model and precision: the headline engine against compile-ro of the same
    round (each round measured with its own baselines), with what the round changed."""
    rows = [r for r in engine_rows if r.get("B") == SHAPE["B"] and r.get("T") == SHAPE["T"]]
    out = []
    for dev in sorted({r["device_slug"] for r in rows}):
        for rnd in sorted({_round(r) for r in rows if r["device_slug"] == dev}):
            these = [r for r in rows if r["device_slug"] == dev and _round(r) == rnd]
            for model in MODELS:
                for prec in ("fp32", "tf32", "bf16"):
                    e = pick(these, label=model, mode="engine", precision=prec)
                    ro = pick(these, label=model, mode="compile-ro", precision=prec)
                    if e is None:
                        continue
                    out.append({"device": dev, "round": rnd, "model": model, "precision": prec,
                                "engine ms": e["median_ms"], "compile-ro ms": ro and ro["median_ms"],
                                "engine over compile-ro": ro and ro["median_ms"] / e["median_ms"],
                                "changed": ROUND_CHANGES.get(rnd, ""), "commit": e.get("commit")})
    return out


def rounds_figure(table: list[dict[str, Any]], device: str) -> go.Figure:
    """Engine step time per round (solid) against compile-ro of the same round (dotted)."""
    fig = go.Figure()
    colors = {"fasttransformer": "#1f77b4", "gpt2": "#d62728"}
    dash = {"fp32": "solid", "tf32": "dash", "bf16": "dot"}
    symbol = {"fp32": "x", "tf32": "diamond-open", "bf16": "circle-open"}
    for model in MODELS:
        for prec in ("fp32", "tf32", "bf16"):
            pts = [t for t in table if t["device"] == device and t["model"] == model and t["precision"] == prec]
            if not pts:
                continue
            fig.add_trace(go.Scatter(x=[t["round"] for t in pts], y=[t["engine ms"] for t in pts],
                                     mode="lines+markers", name=f"{model} {prec} engine",
                                     line=dict(color=colors[model], dash=dash[prec])))
            ro = [t for t in pts if t["compile-ro ms"]]
            fig.add_trace(go.Scatter(x=[t["round"] for t in ro], y=[t["compile-ro ms"] for t in ro], mode="markers",
                                     name=f"{model} {prec} compile-ro",
                                     marker=dict(color=colors[model], symbol=symbol[prec], size=9)))
    fig.update_layout(height=450, xaxis=dict(title="engine round", dtick=1), yaxis_title="ms per step",
                      title=f"The engine round by round against compile-ro of the same run, {device}")
    return fig
