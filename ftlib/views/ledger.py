"""A speed-of-light ledger of the engine's training step (chapter 6): each kernel class against its floors.

For every profiled engine step (``engine_probe`` rows, ``benchmarks/kernels/engine_probe.py``) and every
kernel class of :data:`ftlib.views.engine.PROBE_CATEGORIES` (:func:`ftlib.views.engine.probe_category`):

* **measured µs**: the profiler's kernel time of the class in one step (an uncaptured step, averaged);
* **kernels**: the class's launches per step;
* **FLOP floor**: the FLOPs of the accounting components mapped to the class (:data:`COMPONENT_CLASS`;
  :func:`ftlib.analysis.accounting.rows`, as the expected kernel executes them) at the device's datasheet
  peak for the pipe each component runs on (:func:`ftlib.analysis.peaks.compute_rate`: the precision's
  tensor-core rate for matmuls and attention, the FP32 pipes for elementwise work);
* **byte floor**: the same components' bytes (each tensor moved once per op, as the accounting counts
  them) at the DRAM bandwidth (:attr:`ftlib.analysis.peaks.DevicePeaks.bandwidth`);
* **speed of light**: the larger of the two, the roofline of Williams, Waterman & Patterson (2009, CACM),
  and **measured / speed of light**;
* **gaps µs (measured)**: beside the floor, not in it: the class's kernels × the gap per kernel that the
  row itself measures, (captured step − profiled kernel time) / kernels, where the step's time between
  kernels goes if every boundary costs the same.

A class with no accounting counterpart (:data:`NO_COUNTERPART`) has no floor, or only the bytes of the copies
the engine is known to make. :func:`ledger_totals` sets the captured step against the sum of the class floors
and against the whole step's roofline, max(FLOP floor, byte floor), with the measured gaps beside them. Each
row is one device's: floors use that device's peaks, and rows of different devices are never pooled.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.analysis.accounting import PARAM_BYTES, num_params
from ftlib.analysis.accounting import rows as accounting_rows
from ftlib.analysis.backends import EXPLICIT_FUSED, expected_backend
from ftlib.analysis.peaks import DevicePeaks, compute_rate, lookup
from ftlib.model.config import ModelConfig, preset
from ftlib.views.bench import gpu_label, model_title
from ftlib.views.engine import PROBE_CATEGORIES, case_name, probe_category
from ftlib.views.engine_findings import short_name
from ftlib.views.plots import MODEL_COLORS, legend_below
from ftlib.views.tables import group_rows, table_view

CLASSES: tuple[str, ...] = tuple(c for c, _ in PROBE_CATEGORIES) + ("other",)

# Accounting component (ftlib.analysis.accounting's COMPONENTS_*, the optimizer rows) -> kernel class.
COMPONENT_CLASS: dict[str, str] = {
    "qkv": "matmul", "out_proj": "matmul", "mlp_up": "matmul", "mlp_down": "matmul", "head": "matmul",
    "scores": "attention", "softmax": "attention", "attn_v": "attention",
    "norm1": "norms", "norm2": "norms", "final_norm": "norms",
    "loss": "loss",
    "embeddings": "embedding",
    "optimizer": "optimizer", "grad_clip": "optimizer",
    "gelu": "other elementwise", "residual": "other elementwise", "dropout": "other elementwise",
    "embedding dropout": "other elementwise",  # the accounting's dropout rows of 'embeddings'
}
# Components the engine runs inside another class's kernel, with the describe() flag that says so: the
# residual add (forward, and the sum of the stream's two gradients backward) and, with fuse_dropout, the
# residual dropout run inside the fused residual-norm (kernels/residual_norm.py).
FUSED_INTO_NORMS: dict[str, str] = {"residual": "fuse_residual_norm", "dropout": "fuse_dropout"}
# The head's GEMM and the loss, run by the fused head's two kernels under fuse_head_loss.
FUSED_HEAD, FUSED_HEAD_FLAG = "head and loss (fused)", "fuse_head_loss"
# What the floor of a class without accounting components rests on.
NO_COUNTERPART: dict[str, str] = {
    "reductions (sums)": "no floor: the norms' gain and bias gradients summed over per-tile partials "
                         "and GPT-2's bias gradients; their bytes are counted with the norms and matmuls",
    "copies and casts": "the bytes of the bf16 weight shadow where the engine makes one, else no floor; "
                        "autocast's casts and layout copies are not in the accounting",
    "other": "no floor: kernels no pattern names",
}
WIDTH_16 = 2  # bytes of one bf16 element of the weight shadow


def component_class(component: str, describe: dict[str, Any] | None = None) -> str:
    """The kernel class an accounting component's work runs in, given the engine's ``describe()``."""
    flag = FUSED_INTO_NORMS.get(component)
    if flag and (describe or {}).get(flag):
        return "norms"
    if component in ("head", "loss") and (describe or {}).get(FUSED_HEAD_FLAG):
        return FUSED_HEAD
    return COMPONENT_CLASS[component]


@table_view
def component_map() -> list[dict[str, Any]]:
    """The mapping, one line per class: the accounting components it takes (those the engine may fuse
    into the norms named with the flag that does it), or what its floor rests on."""
    out = []
    for cls in CLASSES:
        comps = [c for c in COMPONENT_CLASS if COMPONENT_CLASS[c] == cls]
        if cls == "norms":
            comps += [f"{c} (with {flag})" for c, flag in FUSED_INTO_NORMS.items()]
        elif cls == "other elementwise":
            comps = [f"{c} (unless {FUSED_INTO_NORMS[c]})" if c in FUSED_INTO_NORMS else c for c in comps]
        elif cls == FUSED_HEAD:
            comps = [f"{c} (with {FUSED_HEAD_FLAG})" for c in ("head", "loss")]
        if cls in ("matmul", "loss"):
            comps = [f"{c} (unless {FUSED_HEAD_FLAG})" if c in ("head", "loss") else c for c in comps]
        out.append({"class": cls, "accounting components": ", ".join(comps) or None,
                    "floor from": "FLOPs and bytes" if comps else NO_COUNTERPART.get(cls, "no floor")})
    return out


def flop_rate(d: DevicePeaks, precision: str, kind: str, cls: str, describe: dict[str, Any] | None = None) -> float:
    """FLOP/s of one accounting component on its pipe (:func:`ftlib.analysis.peaks.compute_rate`); where
    the engine runs the class's products as 3xTF32 (``linear_precision`` / ``attention_precision``),
    three TF32 products per fp32 one (the split of NVIDIA/cutlass discussion 385, kernels/linear.py), a
    third of the TF32 peak."""
    route = (describe or {}).get({"matmul": "linear_precision", "attention": "attention_precision"}.get(cls, ""))
    if route == "tf32x3" and kind in ("gemm", "attention") and d.tf32:
        return d.rate("tf32") / 3
    return compute_rate(d, precision, kind)


def case_config(r: dict[str, Any]) -> ModelConfig:
    """The model a probe row profiled: its stored config, else its preset."""
    return ModelConfig(**r["config"]) if r.get("config") else preset(r["preset"])


def attention_backend(r: dict[str, Any], cfg: ModelConfig, capability: tuple[int, int]) -> str:
    """'flash' where the engine ran its own fused attention (causal tiles, scores recomputed in the
    backward, as the accounting's fused backends), 'explicit_fused' where it ran GPT-2's explicit attention
    on its kernels (P written once and read back), else the kernel PyTorch is expected to pick."""
    desc = r.get("describe") or {}
    if "attention" in (desc.get("kernels") or []):
        return "flash"
    if desc.get("fuse_softmax_matmuls"):
        return EXPLICIT_FUSED
    return expected_backend(cfg, r["precision"], capability)


def short_case(r: dict[str, Any]) -> str:
    """'FastTransformer bf16', 'GPT-2 tf32, fused attention', 'speedrun model (256x6, B=64) bf16, fused
    dropout': :func:`case_name` (the options in words) with the precision after the model."""
    name = case_name(r)
    if r["label"].startswith("speedrun"):
        return name.replace(")", f") {r['precision']}", 1) if ")" in name else f"{name} {r['precision']}"
    model = model_title(r.get("preset") or r["label"].split()[0])
    extra = name[len(model):].strip(" ,") if name.startswith(model) else name
    return f"{model} {r['precision']}" + (f", {extra}" if extra else "")


def _peaks(r: dict[str, Any]) -> DevicePeaks | None:
    try:
        return lookup(r.get("device") or "")
    except KeyError:
        return None


def _latest(probe_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ok rows with a known peak, one per (device, case, precision, shape): the newest."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in probe_rows:
        if r.get("status") != "ok" or _peaks(r) is None:
            continue
        k = (r.get("device_slug"), r["label"], r["precision"], r.get("B"), r.get("T"))
        if k not in out or str(r.get("date", "")) >= str(out[k].get("date", "")):
            out[k] = r
    return list(out.values())


def gap_per_kernel(r: dict[str, Any]) -> float | None:
    """The row's own measure of a kernel boundary inside the graph: (captured step − profiled kernel time) /
    kernels per step, in µs; None where the row lacks the step or its kernels, or where its kernels overlap
    (a step on two streams can take less than the sum of its kernels, and then no gap can be read off it)."""
    kernels = r.get("kernels") or []
    n, kernel_us = sum(k.get("count", 0) for k in kernels), sum(k["us"] for k in kernels)
    step = r.get("step_median_us")
    return (step - kernel_us) / n if step and n and step >= kernel_us else None


def _case_ledger(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One probe row's ledger, one dict per class with kernels or accounted work (µs)."""
    d, cfg, desc = _peaks(r), case_config(r), r.get("describe") or {}
    assert d is not None
    flop_us = dict.fromkeys(CLASSES, 0.0)
    nbytes = dict.fromkeys(CLASSES, 0.0)
    flops = dict.fromkeys(CLASSES, 0.0)
    comps: dict[str, list[str]] = {c: [] for c in CLASSES}
    for a in accounting_rows(cfg, r["B"], r["T"], precision=r["precision"], capability=d.capability,
                             backend=attention_backend(r, cfg, d.capability)):
        comp = "embedding dropout" if a["component"] == "embeddings" and a["kind"] == "elementwise" else a["component"]
        cls = component_class(comp, desc)
        flops[cls] += a["flops"]
        flop_us[cls] += 1e6 * a["flops"] / flop_rate(d, r["precision"], a["kind"], cls, desc)
        nbytes[cls] += a["bytes"]
        if comp not in comps[cls]:
            comps[cls].append(comp)
    if desc.get("bf16_weights"):  # one copy of the flat fp32 weights into a bf16 shadow per step
        nbytes["copies and casts"] += num_params(cfg) * (PARAM_BYTES + WIDTH_16)
    measured = dict.fromkeys(CLASSES, 0.0)
    count = dict.fromkeys(CLASSES, 0.0)
    for k in r.get("kernels", []):
        cls = probe_category(k["name"])
        measured[cls] += k["us"]
        count[cls] += k.get("count", 0)
    out, gap = [], gap_per_kernel(r)
    for cls in CLASSES:
        if not (measured[cls] or count[cls] or flops[cls] or nbytes[cls]):
            continue  # a class with neither kernels nor work in this step
        floors = {"FLOPs": flop_us[cls], "bytes": 1e6 * nbytes[cls] / d.bandwidth}
        sol = max(floors.values()) or None
        out.append({"device": r.get("device_slug"), "case": short_case(r), "precision": r["precision"], "class": cls,
                    "measured µs": measured[cls], "kernels": count[cls], "GFLOP": flops[cls] / 1e9,
                    "MB": nbytes[cls] / 1e6, "FLOP floor µs": floors["FLOPs"], "byte floor µs": floors["bytes"],
                    "speed of light µs": sol, "bound": max(floors, key=floors.get) if sol else None,
                    "measured / speed of light": measured[cls] / sol if sol else None,
                    "above floor µs": measured[cls] - sol if sol else None,
                    "gaps µs (measured)": count[cls] * gap if gap is not None else None,
                    "floor from": ", ".join(comps[cls]) or NO_COUNTERPART.get(cls, "no floor")})
    return out


@table_view
def ledger(probe_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiled case (device, case, precision) and kernel class: measured µs per step, kernels, the
    FLOP and byte floors, the speed of light (their max), measured / speed of light, and beside them the
    class's share of the measured gaps between kernels."""
    return [line for r in _latest(probe_rows) for line in _case_ledger(r)]


@table_view
def ledger_totals(probe_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiled case, the whole step: the captured step against the sum of the class floors and against
    the step's roofline, max(FLOP floor, byte floor); beside them the measured gaps between kernels (captured
    step − profiled kernel time) and the gap per kernel."""
    out = []
    for r in _latest(probe_rows):
        lines = _case_ledger(r)
        step, kernel_us = r.get("step_median_us"), sum(x["measured µs"] for x in lines)
        n = sum(x["kernels"] for x in lines)
        flop, byte = sum(x["FLOP floor µs"] for x in lines), sum(x["byte floor µs"] for x in lines)
        floors, roof = sum(x["speed of light µs"] or 0.0 for x in lines), max(flop, byte)
        out.append({"device": r.get("device_slug"), "case": short_case(r), "precision": r["precision"],
                    "captured step µs": step, "kernel µs": kernel_us, "kernels per step": n,
                    "FLOP floor µs": flop, "byte floor µs": byte, "sum of floors µs": floors, "roofline µs": roof,
                    "step / sum of floors": step / floors if step and floors else None,
                    "step / roofline": step / roof if step and roof else None,
                    "gaps µs (measured)": step - kernel_us if step and step >= kernel_us else None,
                    "measured gap per kernel µs": gap_per_kernel(r),
                    # Kernels on two streams run side by side: their sum exceeds the step by this much.
                    "overlap µs": kernel_us - step if step and step < kernel_us else 0.0})
    return out


def figure_rows(probe_rows: Iterable[dict[str, Any]], device: str) -> list[dict[str, Any]]:
    """The cases the figure shows: ``device``'s FastTransformer and GPT-2 steps on the default engine (a label
    that is the model's name alone, no option), each precision profiled."""
    order = ("fp32", "tf32", "bf16")
    rows = [r for r in _latest(probe_rows)
            if r.get("device_slug") == device and r["label"] in ("fasttransformer", "gpt2")]
    return sorted(rows, key=lambda r: (r["label"] != "fasttransformer",
                                       order.index(r["precision"]) if r["precision"] in order else 9))


def no_default_profile(device: str) -> str:
    """What stands in place of the ledger figure where ``device``'s newest profile has no default-engine case."""
    return (f"No profile of the current engine's default steps on the {short_name(device)} yet: the cases "
            "profiled there ran an earlier engine (their names say which of today's defaults they lacked), so the "
            "tables above stand for them and the figure waits for a profile of today's engine.")


PANELS_PER_ROW = 3  # cases side by side in the ledger figure; more go on further rows


def ledger_figure(probe_rows: Iterable[dict[str, Any]], device: str) -> go.Figure:
    """Per case of :func:`figure_rows` (one panel each), per kernel class: the measured µs per step beside
    its speed of light (log scale), labelled with measured / speed of light."""
    cases = figure_rows(probe_rows, device)
    n = max(1, len(cases))
    ncols = min(n, PANELS_PER_ROW)
    nrows = math.ceil(n / ncols)
    titles = ["<br>".join(textwrap.wrap(short_case(r), 32)) for r in cases]
    title_lines = max((t.count("<br>") + 1 for t in titles), default=1)
    # Pixels: a row's panels, and between rows the x-axis ticks and title plus the next titles' lines.
    height, top = 160 + 380 * nrows, 90 + 18 * title_lines
    gap_px = 75 + 18 * title_lines
    fig = make_subplots(rows=nrows, cols=ncols, shared_yaxes=True, horizontal_spacing=0.04,
                        vertical_spacing=min(0.3, gap_px / (height - top - 100)) if nrows > 1 else 0.0,
                        subplot_titles=titles)
    values: list[float] = []
    keyed: set[str] = set()  # models with a "measured" legend entry: one per model colour
    for i, r in enumerate(cases, start=1):
        at = dict(row=(i - 1) // ncols + 1, col=(i - 1) % ncols + 1)
        lines = [x for x in _case_ledger(r) if x["measured µs"] or x["speed of light µs"]]
        y = [x["class"] for x in lines]
        model = r.get("preset") or ""
        color = MODEL_COLORS.get(model, "#555")
        fig.add_trace(go.Bar(y=y, x=[x["measured µs"] or None for x in lines], orientation="h",
                             name=f"measured, {model_title(model or 'other')}", marker_color=color,
                             legendgroup=f"measured {model}", showlegend=model not in keyed,
                             legendrank=1 + len(keyed),
                             text=[f"{x['measured / speed of light']:.1f}×" if x["measured / speed of light"]
                                   else "no floor" if x["measured µs"] else "" for x in lines],
                             textposition="outside", cliponaxis=False), **at)
        keyed.add(model)
        fig.add_trace(go.Bar(y=y, x=[x["speed of light µs"] or None for x in lines], orientation="h",
                             hovertext=[f"bound by {x['bound']}" for x in lines],
                             name="speed of light: max of FLOP and byte floors",
                             marker_color="#c7c7c7",
                             legendgroup="sol", showlegend=i == 1, legendrank=100), **at)
        values += [v for x in lines for v in (x["measured µs"], x["speed of light µs"]) if v]
    axis: dict[str, Any] = dict(type="log", tickangle=0)
    if values:  # decades as ticks; room on the right for the ratio labels
        lo, hi = math.log10(min(values)) - 0.1, math.log10(max(values)) + 0.45
        ticks = [10.0**k for k in range(math.ceil(lo), math.floor(hi) + 1)]
        axis.update(range=[lo, hi], tickvals=ticks, ticktext=[f"{t:,.0f}" for t in ticks])
    fig.update_xaxes(title_text="µs per step", **axis)
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=list(CLASSES))
    fig.update_layout(barmode="group", bargap=0.25, height=height, margin=dict(l=140, t=top),
                      title=f"The engine's step by kernel class, {gpu_label(device)}: measured vs speed of light"
                            "<br><sup>"
                            "each bar's label: measured / speed of light; under 1×, the class's kernels skip "
                            "intermediates the per-op floor counts or find them in L2 (see the text)</sup>")
    return legend_below(fig)


def ledger_summary(probe_rows: Iterable[dict[str, Any]], device: str, top: int = 3) -> str:
    """Markdown, one item per case of :func:`figure_rows`: the step against its floors, the ``top`` classes
    furthest from their speed of light by the time above it (with their ratio), and any class under 1×."""
    out = []
    totals = {t["case"]: t for t in ledger_totals.rows(probe_rows) if t["device"] == device}
    for r in figure_rows(probe_rows, device):
        lines = [x for x in _case_ledger(r) if x["measured / speed of light"] and x["measured µs"]]
        t = totals[short_case(r)]
        far = sorted(lines, key=lambda x: -x["above floor µs"])[:top]
        under = [x for x in lines if x["measured / speed of light"] < 1]
        text = (f"* **{short_case(r)}**: the captured step, {t['captured step µs']:,.0f} µs, is "
                f"{t['step / sum of floors']:.1f}× the sum of its class floors ({t['sum of floors µs']:,.0f} µs) "
                f"and {t['step / roofline']:.1f}× its roofline ({t['roofline µs']:,.0f} µs). Furthest from their "
                "floors, by the time above them: " + ", ".join(
                    f"{x['class']} ({x['above floor µs']:,.0f} µs above, {x['measured / speed of light']:.1f}×)"
                    for x in far) + ".")
        if under:
            text += " Under their floor: " + ", ".join(
                f"{x['class']} ({x['measured / speed of light']:.2f}×)" for x in under) + "."
        no_floor = [x for x in _case_ledger(r) if x["measured µs"] and not x["speed of light µs"]]
        if no_floor:
            text += (" With no floor: " + ", ".join(f"{x['class']} ({x['measured µs']:,.0f} µs)" for x in no_floor)
                     + ".")
        if t["gaps µs (measured)"] and t["measured gap per kernel µs"]:
            text += (f" Between kernels the captured step spends {t['gaps µs (measured)']:,.0f} µs "
                     f"({t['measured gap per kernel µs']:.2f} µs a kernel), in no floor.")
        elif t["overlap µs"]:
            text += (f" Its kernels run on two streams and overlap: their sum exceeds the captured step by "
                     f"{t['overlap µs']:,.0f} µs, so the gaps between kernels cannot be read off the profile.")
        out.append(text)
    return "\n".join(out)


def devices_of(probe_rows: Iterable[dict[str, Any]]) -> list[str]:
    """Devices with at least one ledger row (a known peak), one figure each."""
    return sorted(k for k in group_rows(_latest(probe_rows), "device_slug") if k)


def class_order(probe_rows: Iterable[dict[str, Any]], device: str, top: int = 3) -> str:
    """Markdown, one item per case of :func:`figure_rows`: its ``top`` kernel classes by measured time per step,
    largest first, with each one's share of the kernel time; where ``device`` has no such case, a sentence that
    says so."""
    out = []
    for r in figure_rows(probe_rows, device):
        lines = sorted((x for x in _case_ledger(r) if x["measured µs"]), key=lambda x: -x["measured µs"])
        total = sum(x["measured µs"] for x in lines)
        if total:
            out.append(f"* **{short_case(r)}**: " + ", then ".join(
                f"{x['class']} ({x['measured µs']:,.0f} µs, {x['measured µs'] / total:.0%})" for x in lines[:top]))
    return "\n".join(out) or (f"no profile of the current engine's default steps on the {short_name(device)} "
                              "yet; the cases profiled there ran an earlier engine, and the table above gives their "
                              "classes.")
