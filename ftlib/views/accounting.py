"""Chapter 2's tables, figures and sentences: one step's FLOPs and bytes on paper, against the post.

Everything here is computed from :mod:`ftlib.analysis` at the post's shape (B = 32, T = 256), for
GPT-2 and the FastTransformer with its K/V passed two ways (the original's (B, 1, T, d), and the
stride-0 expanded view that reaches a fused kernel).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ftlib.analysis.backends import attention_matrix_traffic, expected_backend
from ftlib.analysis.claims import POST_CLAIMED
from ftlib.analysis.formulas import kaplan_flops, megatron_flops, palm_flops
from ftlib.analysis.peaks import flops_floor, lookup, roofline, step_floor
from ftlib.analysis.totals import attention_mlp_fractions, by_component, layer_forward_breakdown, step_summary
from ftlib.model.config import preset
from ftlib.views.plots import with_subtitle
from ftlib.views.tables import table_view

B, T = 32, 256
MODELS = {
    "GPT-2": preset("gpt2"),
    "FastTransformer (original, broadcast K/V)": preset("fasttransformer", kv_layout="broadcast"),
    "FastTransformer (expanded K/V)": preset("fasttransformer"),
}
SHORT = dict(zip(MODELS, ["GPT-2", "FT, original K/V", "FT, expanded K/V"]))  # the figures' names
GPT2, FT_EXPANDED = "GPT-2", "FastTransformer (expanded K/V)"
H200 = "NVIDIA H200"
# One colour per component, in families, so the 16 components stay apart and related ones read together.
COMPONENTS = {
    "embedding and head": {"embeddings": "#4d4d4d", "head": "#8c8c8c", "loss": "#bdbdbd", "optimizer": "#bcbd22"},
    "attention": {"qkv": "#08306b", "scores": "#2171b5", "softmax": "#6baed6", "attn_v": "#9ecae1",
                  "out_proj": "#6a51a3"},
    "MLP": {"mlp_up": "#d94801", "gelu": "#fdae6b", "mlp_down": "#a63603"},
    "norms and residual": {"norm1": "#006d2c", "norm2": "#41ab5d", "final_norm": "#a1d99b", "residual": "#e7298a"},
}
# Bottom to top: the components of each family together, in the order a step runs them.
STACK = ("qkv", "scores", "softmax", "attn_v", "out_proj", "mlp_up", "gelu", "mlp_down",
         "norm1", "norm2", "final_norm", "residual", "embeddings", "head", "loss", "optimizer")
GROUP_OF = {c: g for g, cs in COMPONENTS.items() for c in cs}
COLOR = {c: col for cs in COMPONENTS.values() for c, col in cs.items()}


@table_view
def block_forward_table() -> list[dict[str, Any]]:
    """One block's forward matmuls in GFLOP, QKᵀ and A·V over the full T × T and over the causal half."""
    names = {"qkv": "QKV projection", "scores": "QKᵀ", "attn_v": "A·V", "out_proj": "out-proj",
             "mlp_up": "MLP up", "mlp_down": "MLP down"}
    heads = {GPT2: "GPT-2", FT_EXPANDED: "FastTransformer"}
    full = {m: layer_forward_breakdown(MODELS[m], B, T) for m in heads}
    causal = {m: layer_forward_breakdown(MODELS[m], B, T, causal=True) for m in heads}

    def line(label: str, pick) -> dict[str, Any]:
        return {"component": label, **{f"{heads[m]} GFLOP, {how}": pick(d[m]) / 1e9
                                       for m in heads for how, d in (("full T × T", full), ("causal", causal))}}

    return [line(names[c], lambda d, c=c: d[c]) for c in names] + [line("block (sum)", lambda d: sum(d.values()))]


def _fractions(causal: bool) -> dict[str, float]:
    return attention_mlp_fractions(MODELS[GPT2], B, T, causal=causal)


@table_view
def shares_table() -> list[dict[str, Any]]:
    """The post's 4% / 64%: attention and MLP shares of GPT-2's block forward matmuls, full and causal."""
    fr = {c: _fractions(c) for c in (False, True)}
    return [{"part of the GPT-2 block": label, "post's share": post, "share, full T × T": fr[False][key],
             "share, causal half": fr[True][key]}
            for label, key, post in (("attention QKᵀ + A·V", "attention", POST_CLAIMED["attention_share"]),
                                     ("MLP", "mlp", POST_CLAIMED["mlp_share"]),
                                     ("QKV + out-proj", "projections", None))]


def shares_text() -> str:
    full, causal = _fractions(False), _fractions(True)
    post_gflop = POST_CLAIMED["attention_share"] * full["block_gflop"]
    return (f"Attention is {full['attention']:.1%} of the block as GPT-2 executes it "
            f"({causal['attention']:.1%} counting only the causal half), not "
            f"{POST_CLAIMED['attention_share']:.0%}: a QKᵀ + A·V of "
            f"{full['attention_gflop']:.2f} GFLOP, {full['attention_gflop'] / post_gflop:.1f} times the "
            f"{post_gflop:.2f} GFLOP that the post's {POST_CLAIMED['attention_share']:.0%} of this "
            f"{full['block_gflop']:.2f} GFLOP block would be. "
            f"The MLP share is {full['mlp']:.1%} ({causal['mlp']:.1%} causal), not "
            f"{POST_CLAIMED['mlp_share']:.0%}.")


@table_view
def mlp_table() -> list[dict[str, Any]]:
    """The MLP's forward GFLOP per layer, computed beside the post's 8.59 -> 4.30."""
    mlp = {m: attention_mlp_fractions(MODELS[m], B, T)["mlp_gflop"] for m in (GPT2, FT_EXPANDED)}
    return [{"MLP per layer, forward": "GPT-2 (4×)", "post claims GFLOP": POST_CLAIMED["mlp_gflop_gpt2"],
             "computed GFLOP": mlp[GPT2]},
            {"MLP per layer, forward": "FastTransformer (2×)",
             "post claims GFLOP": POST_CLAIMED["mlp_gflop_fasttransformer"], "computed GFLOP": mlp[FT_EXPANDED]}]


def ft_block_text() -> str:
    f = attention_mlp_fractions(MODELS[FT_EXPANDED], B, T)
    return (f"FastTransformer block: attention {f['attention']:.1%}, MLP {f['mlp']:.1%}, "
            f"projections {f['projections']:.1%} of {f['block_gflop']:.2f} GFLOP.")


def _traffic() -> dict[str, dict[str, Any]]:
    cap = lookup(H200).capability
    return {m: attention_matrix_traffic(c, B, T, "fp32", capability=cap) for m, c in MODELS.items()}


@table_view
def tt_passes_table() -> list[dict[str, Any]]:
    """Every pass over GPT-2's (B, H, T, T) tensor in one eager step, reads and writes."""
    return [{"phase": p["phase"], "op": p["op"], "reads": p["reads"], "writes": p["writes"]}
            for p in _traffic()[GPT2]["passes"]]


@table_view
def tt_traffic_table() -> list[dict[str, Any]]:
    """Per model (fp32, the H200's kernel choice): the (B, H, T, T) traffic per step, two ways."""
    return [{"model (fp32, H200 kernel choice)": m, "backend": t["backend"],
             "one (B,H,T,T) tensor MB": t["tensor_bytes"] / 1e6,
             "passes per layer": t["reads_per_layer"] + t["writes_per_layer"],
             "write-once-read-once MB/step": t["write_once_read_once_per_step"] / 1e6,
             "actual MB/step": t["bytes_per_step"] / 1e6} for m, t in _traffic().items()]


def tt_text() -> str:
    tr = _traffic()
    g, orig, exp = tr[GPT2], tr["FastTransformer (original, broadcast K/V)"], tr[FT_EXPANDED]
    return (f"Post's claim: {POST_CLAIMED['attention_matrix_mb_per_step']:.0f} MB. The write-once, read-once "
            f"model gives {g['write_once_read_once_per_step'] / 1e6:.0f} MB, so the post's number is that "
            f"lower bound; eager GPT-2 moves {g['bytes_per_step'] / 1e9:.2f} GB, "
            f"{g['bytes_per_step'] / g['write_once_read_once_per_step']:.1f}× more. "
            f"The original FastTransformer does not avoid it: in fp32 its attention runs on the "
            f"`{orig['backend']}` backend and moves {orig['bytes_per_step'] / 1e9:.2f} GB; only the "
            f"expanded K/V reaches a fused kernel (`{exp['backend']}`).")


@table_view
def step_table() -> list[dict[str, Any]]:
    """One training step per model (fp32, the H200's kernel choice): FLOPs four ways, bytes, memory."""
    cap = lookup(H200).capability
    summ = {m: step_summary(c, B, T, precision="fp32", capability=cap) for m, c in MODELS.items()}
    per_step = (
        ("attention backend (fp32, H200)", lambda c, s: expected_backend(c, "fp32", cap)),
        ("GFLOP as executed", lambda c, s: s["flops"] / 1e9),
        ("GFLOP, causal useful work", lambda c, s: s["flops_causal"] / 1e9),
        ("GFLOP, matmuls only (full T×T)", lambda c, s: s["gemm_flops"] / 1e9),
        ("Kaplan 2020 GFLOP", lambda c, s: kaplan_flops(c, B, T) / 1e9),
        ("Megatron-LM 2021 GFLOP", lambda c, s: megatron_flops(c, B, T) / 1e9),
        ("PaLM 2022 GFLOP", lambda c, s: palm_flops(c, B, T) / 1e9),
        ("forward GFLOP", lambda c, s: s["fwd_flops"] / 1e9),
        ("backward GFLOP", lambda c, s: s["bwd_flops"] / 1e9),
        ("optimizer GFLOP", lambda c, s: s["opt_flops"] / 1e9),
        ("DRAM GB (eager, op by op)", lambda c, s: s["bytes"] / 1e9),
        ("FLOP per byte", lambda c, s: s["intensity"]),
        ("parameters", lambda c, s: s["params"]),
        ("activations saved for backward MB", lambda c, s: s["saved_activation_bytes"] / 1e6),
        ("weights + grads + AdamW states MB",
         lambda c, s: (s["param_bytes"] + s["grad_bytes"] + s["adamw_state_bytes"]) / 1e6),
    )
    return [{"per step": what, **{m: f(MODELS[m], summ[m]) for m in MODELS}} for what, f in per_step]


def component_figures() -> list[tuple[str, go.Figure]]:
    """(name, figure) for FLOPs and for bytes: one step's stack by component, per model (fp32, H200)."""
    cap = lookup(H200).capability
    out = []
    for key, unit, scale in (("flops", "GFLOP", 1e9), ("bytes", "GB", 1e9)):
        comp = {m: by_component(c, B, T, key=key, precision="fp32", capability=cap) for m, c in MODELS.items()}
        fig = go.Figure([
            go.Bar(name=c, x=[SHORT[m] for m in MODELS], y=[comp[m].get(c, 0.0) / scale for m in MODELS],
                   marker_color=COLOR[c], legendgroup=GROUP_OF[c], legendgrouptitle_text=GROUP_OF[c],
                   hovertemplate=f"{c}: %{{y:.3g}} {unit}<extra>%{{x}}</extra>")
            for c in STACK
        ])
        fig.update_layout(barmode="stack", title=f"One training step, B={B}, T={T}, fp32: {unit} by component",
                          yaxis_title=f"{unit} per step", height=620,
                          legend=dict(traceorder="reversed+grouped", groupclick="toggleitem", tracegroupgap=8))
        out.append((f"02-step-{key}-by-component", fig))
    return out


@table_view
def floors_table() -> list[dict[str, Any]]:
    """The step's two floors per device and precision: the PaLM FLOPs at the matmul peak, and the sum
    of every component's roofline bound with the bytes an eager step moves (datasheet peaks)."""
    out = []
    for dev, precs in (("Tesla T4", ("fp32", "fp16")), (H200, ("fp32", "tf32", "bf16"))):
        d = lookup(dev)
        for prec in precs:
            for m, c in MODELS.items():
                out.append({"device": d.name, "precision": prec, "model": m, "peak TFLOP/s": d.rate(prec) / 1e12,
                            "GB/s": d.bandwidth_gbs, "FLOP floor ms": flops_floor(palm_flops(c, B, T), d, prec) * 1e3,
                            "eager-step floor ms": step_floor(c, B, T, d, prec)["floor_s"] * 1e3})
    return out


# Markers closer than this on both log axes (in decades) are drawn on top of one another at the figure's size.
COINCIDE_DECADES = 0.05


def coincident(points: dict[str, pd.DataFrame], decades: float = COINCIDE_DECADES) -> list[tuple[list[str], list[str]]]:
    """The components whose markers fall on one another: per model (``points[model]`` indexed by component, with
    ``flops`` and ``bytes``), the groups closer than ``decades`` in FLOP per byte and in FLOPs, as
    (components, models), a group shared by several models listed once with all of them."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for model, f in points.items():
        x, y = (f["flops"] / f["bytes"]).map(math.log10), f["flops"].map(math.log10)
        seen: set[str] = set()
        for c in f.index:
            if c in seen:
                continue
            near = [o for o in f.index if o not in seen and abs(x[o] - x[c]) < decades and abs(y[o] - y[c]) < decades]
            seen.update(near)
            if len(near) > 1:
                groups.setdefault(tuple(near), []).append(model)
    return [(list(cs), ms) for cs, ms in groups.items()]


def intensity_figure() -> go.Figure:
    """Each component's FLOPs per byte against the H200's TF32 ridge point, GPT-2 and the original FT."""
    d = lookup(H200)
    ridge = d.rate("tf32") / d.bandwidth
    per_comp = {m: pd.DataFrame(roofline(MODELS[m], B, T, d, "tf32")).groupby("component", sort=False)[
        ["flops", "bytes"]].sum() for m in list(MODELS)[:2]}
    symbols = dict(zip(per_comp, ["circle", "diamond-open"]))
    sizes = dict(zip(per_comp, [8, 15]))  # the open diamond around the dot where both models coincide
    fig = go.Figure()
    for c in STACK:
        pts = [(m, per_comp[m].loc[c]) for m in per_comp if c in per_comp[m].index]
        fig.add_trace(go.Scatter(
            x=[p["flops"] / p["bytes"] for _, p in pts], y=[p["flops"] / 1e9 for _, p in pts], mode="markers", name=c,
            marker=dict(color=COLOR[c], size=[sizes[m] for m, _ in pts], symbol=[symbols[m] for m, _ in pts],
                        line=dict(width=2, color=COLOR[c])),
            legendgroup=GROUP_OF[c], legendgrouptitle_text=GROUP_OF[c], customdata=[SHORT[m] for m, _ in pts],
            hovertemplate=f"{c}, %{{customdata}}<br>%{{x:.3g}} FLOP/B, %{{y:.3g}} GFLOP<extra></extra>"))
    for m, sym in symbols.items():  # the key to the symbols
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=SHORT[m], legendgroup="model",
                                 legendgrouptitle_text="model",
                                 marker=dict(color="#555", size=sizes[m], symbol=sym,
                                             line=dict(width=2, color="#555"))))
    # A line shape and a separate annotation: on a log axis an annotation's x is given as log10(x).
    fig.add_shape(type="line", x0=ridge, x1=ridge, y0=0, y1=1, yref="paper", line=dict(dash="dash", color="#333"))
    fig.add_annotation(x=math.log10(ridge), y=1, yref="paper", yanchor="bottom", showarrow=False, xanchor="right",
                       text=f"H200 TF32 ridge point: {ridge:.0f} FLOP/B")
    xs = [p["flops"] / p["bytes"] for f in per_comp.values() for _, p in f.iterrows()] + [ridge]
    ys = [p["flops"] / 1e9 for f in per_comp.values() for _, p in f.iterrows()]
    hidden = "; ".join(f"{' and '.join(cs)} ({' and '.join(SHORT[m] for m in ms)})" for cs, ms in coincident(per_comp))
    with_subtitle(fig, "Arithmetic intensity per component (one step, fp32 tensors, H200 TF32 peak)",
                  f"Markers on top of one another (the same FLOPs and bytes, or nearly): {hidden}." if hidden else "")
    fig.update_layout(xaxis=dict(type="log", title="FLOP per byte (log scale)", dtick=1,
                                 range=[math.log10(min(xs)) - 0.3, math.log10(max(xs)) + 0.3]),
                      yaxis=dict(type="log", title="GFLOP per step (log scale)", dtick=1,
                                 range=[math.log10(min(ys)) - 0.3, math.log10(max(ys)) + 0.3]),
                      legend=dict(traceorder="grouped", tracegroupgap=8, font_size=11), height=680)
    return fig
