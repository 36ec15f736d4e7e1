# ---
# jupyter:
#   accelerator: GPU
#   colab:
#     gpuType: T4
#     provenance: []
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,jupytext,accelerator,colab,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Where the FLOPs and bytes go
#
# Section 2 of the post "calculated the exact arithmetic operations (FLOPs) and memory
# transfers for every single layer in the block" and concluded that at T = 256 the
# attention matmuls are 4% of the block's compute and the MLP 64%, and that GPT-2's
# explicit attention moves 805 MB of (B, H, T, T) probabilities per step. This chapter
# redoes that accounting from the configurations alone, with `ftlib.analysis.accounting`
# (FLOPs, bytes, saved activations per component) and `ftlib.analysis.peaks` (datasheet peaks and
# a roofline). Nothing here is measured: it is arithmetic, checked in
# `tests/test_accounting.py` against `torch.utils.flop_counter.FlopCounterMode` on real
# forward and backward passes of every configuration and ablation.
#
# The conventions (what a FLOP is, which bytes count, how the causal mask is treated)
# are in the docstring of `ftlib/accounting.py`; the short version: a matmul of
# (m, k) by (k, n) is 2mnk FLOPs, backward matmuls cost twice the forward, and bytes are
# what each ATen op of an eager step reads and writes once.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/02_flop_accounting.ipynb)

# %% tags=["parameters", "hide-cell"]
DEVICE = "auto"
SMOKE = True
MEASURE = False

# %% tags=["remove-cell"]
# Colab set-up: only on Colab. Clone the book (its stored results are in data/results/),
# install ftlib without dependencies (Colab's torch stays) and work from book/.
import sys

if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    import os
    import subprocess

    root, url = "/content/fasttransformer-book", "https://github.com/fasttransformer-book/fasttransformer-book"
    if not os.path.exists(root):
        subprocess.run(["git", "clone", "--depth", "1", url, root], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", root], check=True)
    sys.path.insert(0, root)
    os.chdir(os.path.join(root, "book"))

# %% [markdown]
# This chapter computes analytically, so it ignores the three parameters; it always uses
# the post's shape, B = 32 and T = 256.

# %% tags=["hide-cell"]
import math

import pandas as pd
import plotly.graph_objects as go
from IPython.display import Markdown, display

from ftlib import preset
from ftlib.analysis.backends import attention_matrix_traffic, expected_backend
from ftlib.analysis.claims import POST_CLAIMED
from ftlib.analysis.formulas import kaplan_flops, megatron_flops, palm_flops
from ftlib.analysis.peaks import flops_floor, lookup, roofline, step_floor
from ftlib.analysis.totals import attention_mlp_fractions, by_component, layer_forward_breakdown, step_summary
from ftlib.views.plots import show
from ftlib.views.tables import show_table

B, T = 32, 256
# The original FastTransformer hands SDPA a (B, 1, T, d) K/V: kv_layout='broadcast'.
# ftlib's preset defaults to the stride-0 expand view, which reaches a fused kernel.
MODELS = {
    "GPT-2": preset("gpt2"),
    "FastTransformer (original, broadcast K/V)": preset("fasttransformer", kv_layout="broadcast"),
    "FastTransformer (expanded K/V)": preset("fasttransformer"),
}
# The figures' short names for the same three models.
SHORT = dict(zip(MODELS, ["GPT-2", "FT, original K/V", "FT, expanded K/V"]))
GPT2, FT = MODELS["GPT-2"], MODELS["FastTransformer (original, broadcast K/V)"]

# %% [markdown]
# ## One block, forward: the post's table
#
# The matmuls of one block's forward pass, in GFLOP, with QKᵀ and A·V counted over the full
# T × T (what the explicit softmax executes) and halved for the causal mask (what a fused
# kernel skips).

# %%
names = {"qkv": "QKV projection", "scores": "QKᵀ", "attn_v": "A·V", "out_proj": "out-proj",
         "mlp_up": "MLP up", "mlp_down": "MLP down"}
bd = {m: layer_forward_breakdown(MODELS[m], B, T) for m in ("GPT-2", "FastTransformer (expanded K/V)")}
bdc = {m: layer_forward_breakdown(MODELS[m], B, T, causal=True) for m in bd}
heads = {"GPT-2": "GPT-2", "FastTransformer (expanded K/V)": "FastTransformer"}


def gflop_row(label, pick):
    return {"component": label, **{f"{heads[m]} GFLOP, {how}": pick(d[m]) / 1e9
                                   for m in bd for how, d in (("full T × T", bd), ("causal", bdc))}}


show_table([gflop_row(names[c], lambda d, c=c: d[c]) for c in names]
           + [gflop_row("block (sum)", lambda d: sum(d.values()))], name="block-forward-gflop")

# %% [markdown]
# ## The 4% / 64% claim
#
# The post: QKᵀ and A·V are 4.0% of block compute, the MLP 64%. The shares below are of
# the block's forward matmul FLOPs, full and causal.

# %%
fr = {c: attention_mlp_fractions(GPT2, B, T, causal=c) for c in (False, True)}
show_table([
    {"part of the GPT-2 block": label, "post's share": post,
     "share, full T × T": fr[False][key], "share, causal half": fr[True][key]}
    for label, key, post in (("attention QKᵀ + A·V", "attention", POST_CLAIMED["attention_share"]),
                             ("MLP", "mlp", POST_CLAIMED["mlp_share"]),
                             ("QKV + out-proj", "projections", None))
], name="attention-mlp-shares")
display(Markdown(
    f"Attention is {fr[False]['attention']:.1%} of the block as GPT-2 executes it "
    f"({fr[True]['attention']:.1%} counting only the causal half), not "
    f"{POST_CLAIMED['attention_share']:.0%}: a QKᵀ + A·V of "
    f"{fr[False]['attention_gflop']:.2f} GFLOP, four times the post's figure. "
    f"The MLP share is {fr[False]['mlp']:.1%} ({fr[True]['mlp']:.1%} causal), not "
    f"{POST_CLAIMED['mlp_share']:.0%}."
))

# %% [markdown]
# ## The 2× MLP: 8.59 → 4.30 GFLOP
#
# This part of the post's arithmetic holds: halving the hidden width halves both MLP
# matmuls (the exact half rounds to the post's figure or one hundredth below it).

# %%
mlp = {m: attention_mlp_fractions(MODELS[m], B, T)["mlp_gflop"] for m in ("GPT-2", "FastTransformer (expanded K/V)")}
show_table([
    {"MLP per layer, forward": "GPT-2 (4×)", "post claims GFLOP": POST_CLAIMED["mlp_gflop_gpt2"],
     "computed GFLOP": mlp["GPT-2"]},
    {"MLP per layer, forward": "FastTransformer (2×)", "post claims GFLOP": POST_CLAIMED["mlp_gflop_fasttransformer"],
     "computed GFLOP": mlp["FastTransformer (expanded K/V)"]},
], digits=4, name="mlp-gflop")

# %% [markdown]
# The shares move the other way in FastTransformer: with a smaller MLP and projection,
# the (unchanged) attention matmuls are a larger part of its block.

# %%
ftfr = attention_mlp_fractions(MODELS["FastTransformer (expanded K/V)"], B, T)
display(Markdown(
    f"FastTransformer block: attention {ftfr['attention']:.1%}, MLP {ftfr['mlp']:.1%}, "
    f"projections {ftfr['projections']:.1%} of {ftfr['block_gflop']:.2f} GFLOP."
))

# %% [markdown]
# ## The 805 MB of attention probabilities
#
# The post's 805 MB is one (B, H, T, T) fp32 tensor per layer written in forward and read
# in backward, times six layers. The eager GPT-2 step touches that tensor far more often:
# the scores are written by QKᵀ, rescaled, masked, softmaxed (each a read and a write), read
# by A·V, and the backward runs the chain in reverse. The table lists every pass
# (`ftlib.analysis.accounting.TT_PASSES`, checked op by op in the tests with a dispatch-mode
# logger). The original FastTransformer, in fp32 with a (B, 1, T, d) K/V, falls back to
# SDPA's math backend (`ftlib.analysis.accounting.expected_backend` states the kernel rules), which
# materializes the same tensor.

# %%
tr = {m: attention_matrix_traffic(MODELS[m], B, T, "fp32", capability=lookup("NVIDIA H200").capability)
      for m in MODELS}
g = tr["GPT-2"]
show_table([{"phase": p["phase"], "op": p["op"], "reads": p["reads"], "writes": p["writes"]} for p in g["passes"]],
           name="tt-passes")
show_table([
    {"model (fp32, H200 kernel choice)": m, "backend": t["backend"],
     "one (B,H,T,T) tensor MB": t["tensor_bytes"] / 1e6,
     "passes per layer": t["reads_per_layer"] + t["writes_per_layer"],
     "write-once-read-once MB/step": t["write_once_read_once_per_step"] / 1e6,
     "actual MB/step": t["bytes_per_step"] / 1e6}
    for m, t in tr.items()
], digits=4, name="tt-traffic")
display(Markdown(
    f"Post's claim: {POST_CLAIMED['attention_matrix_mb_per_step']:.0f} MB. The write-once, read-once "
    f"model gives {g['write_once_read_once_per_step'] / 1e6:.0f} MB, so the post's number is that "
    f"lower bound; eager GPT-2 moves {g['bytes_per_step'] / 1e9:.2f} GB, "
    f"{g['bytes_per_step'] / g['write_once_read_once_per_step']:.1f}× more. "
    f"The original FastTransformer does not avoid it: in fp32 its attention runs on the "
    f"`{tr['FastTransformer (original, broadcast K/V)']['backend']}` backend and moves "
    f"{tr['FastTransformer (original, broadcast K/V)']['bytes_per_step'] / 1e9:.2f} GB; only the "
    f"expanded K/V reaches a fused kernel (`{tr['FastTransformer (expanded K/V)']['backend']}`)."
))

# %% [markdown]
# ## A whole training step
#
# Forward, backward and the AdamW update, summed over all components (as executed on an
# H200 in fp32: explicit softmax for GPT-2, math backend for the original FastTransformer,
# the memory-efficient kernel for the expanded one, which halves QKᵀ and A·V but recomputes
# the scores in backward). Next to the sum, the closed forms of the literature, which count
# matmuls only: Kaplan et al. 2020 (6N plus a causal context term, no head),
# Megatron-LM (Narayanan et al. 2021; assumes a 4× MLP and full K/V heads) and PaLM
# (6N + 12·L·H·Q·T per token, full T × T), the count behind the FLOP floors below.

# %%
cap = lookup("NVIDIA H200").capability
summ = {m: step_summary(c, B, T, precision="fp32", capability=cap) for m, c in MODELS.items()}
per_step = [
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
]
show_table([{"per step": what, **{m: f(MODELS[m], summ[m]) for m in MODELS}} for what, f in per_step],
           digits=4, name="step-summary")

# %% [markdown]
# Megatron's formula is exact for GPT-2 and overcounts FastTransformer, which it does not
# describe (a 2× MLP and one K/V head). The parameters and optimizer states are tiny next
# to the activations, and for GPT-2 the saved (B, H, T, T) probabilities are a large part
# of those.

# %% [markdown]
# ## Where a step's FLOPs and bytes go
#
# Forward + backward + optimizer, per component, summed over the six layers, as executed on
# an H200 in fp32. The components are coloured by the part of the model they belong to:
# blues for attention, oranges for the MLP, greens for the norms, greys for the rest.
# The bars name the models short: *FT, original K/V* is FastTransformer as the post wrote
# it, with the (B, 1, T, d) K/V; *FT, expanded K/V* hands SDPA the stride-0 expanded view.

# %%
# One colour per component, in families, so the 16 components stay apart and related ones read together.
COMPONENTS = {
    "embedding and head": {"embeddings": "#4d4d4d", "head": "#8c8c8c", "loss": "#bdbdbd", "optimizer": "#8c564b"},
    "attention": {"qkv": "#08306b", "scores": "#2171b5", "softmax": "#6baed6", "attn_v": "#9ecae1",
                  "out_proj": "#6a51a3"},
    "MLP": {"mlp_up": "#d94801", "gelu": "#fdae6b", "mlp_down": "#a63603"},
    "norms and residual": {"norm1": "#006d2c", "norm2": "#41ab5d", "final_norm": "#a1d99b", "residual": "#e7298a"},
}
# Bottom to top: the components of each family together, in the order a step runs them.
STACK = ["qkv", "scores", "softmax", "attn_v", "out_proj", "mlp_up", "gelu", "mlp_down",
         "norm1", "norm2", "final_norm", "residual", "embeddings", "head", "loss", "optimizer"]
GROUP_OF = {c: g for g, cs in COMPONENTS.items() for c in cs}
COLOR = {c: col for cs in COMPONENTS.values() for c, col in cs.items()}
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
    show(fig, f"02-step-{key}-by-component")

# %% [markdown]
# ## Rooflines: T4 and H200
#
# A step cannot be faster than its FLOPs at the datasheet peak, nor than its bytes at the
# DRAM bandwidth. Two floors per device and precision: the PaLM FLOP count at the matmul
# peak, and the sum over components of
# max(FLOPs / peak, bytes / bandwidth) with each component's executed FLOPs and eager bytes
# (elementwise work at the FP32 rate). The second is a floor for an *eager* step; a
# compiler that fuses elementwise ops removes bytes and can go below it. The T4 has no TF32
# and no BF16, so its tensor-core row is FP16. Peaks are datasheet numbers
# (`ftlib.analysis.peaks.PEAKS`, with sources), not readings.

# %%
floors = []
for dev, precs in (("Tesla T4", ("fp32", "fp16")), ("NVIDIA H200", ("fp32", "tf32", "bf16"))):
    d = lookup(dev)
    for prec in precs:
        for m, c in MODELS.items():
            floors.append({"device": d.name, "precision": prec, "model": m, "peak TFLOP/s": d.rate(prec) / 1e12,
                           "GB/s": d.bandwidth_gbs, "FLOP floor ms": flops_floor(palm_flops(c, B, T), d, prec) * 1e3,
                           "roofline floor ms": step_floor(c, B, T, d, prec)["floor_s"] * 1e3})
show_table(floors, name="step-floors")

# %% [markdown]
# On the H200 in fp32 the FLOP floor and the memory traffic are of the same order; with
# tensor cores (TF32, BF16) the arithmetic floor drops by an order of magnitude and the step
# is bound by bytes (and, in practice, by kernel launches: compare the measured times in
# chapter 1). On the T4 the fp32 arithmetic floor alone is already in the tens of
# milliseconds. Which components are memory-bound is shown below for the H200 in TF32: each
# component's FLOPs per byte against the ridge point, where the TF32 peak and the DRAM
# bandwidth meet. Colours as above; the symbol tells the model.

# %%
d = lookup("NVIDIA H200")
ridge = d.rate("tf32") / d.bandwidth
per_comp = {m: pd.DataFrame(roofline(MODELS[m], B, T, d, "tf32")).groupby("component", sort=False)[["flops", "bytes"]]
            .sum() for m in list(MODELS)[:2]}
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
                             marker=dict(color="#555", size=sizes[m], symbol=sym, line=dict(width=2, color="#555"))))
# A line shape and a separate annotation: on a log axis an annotation's x is given as log10(x).
fig.add_shape(type="line", x0=ridge, x1=ridge, y0=0, y1=1, yref="paper", line=dict(dash="dash", color="#333"))
fig.add_annotation(x=math.log10(ridge), y=1, yref="paper", yanchor="bottom", showarrow=False, xanchor="right",
                   text=f"H200 TF32 ridge point: {ridge:.0f} FLOP/B")
xs = [p["flops"] / p["bytes"] for f in per_comp.values() for _, p in f.iterrows()] + [ridge]
ys = [p["flops"] / 1e9 for f in per_comp.values() for _, p in f.iterrows()]
fig.update_layout(title="Arithmetic intensity per component (one step, fp32 tensors, H200 TF32 peak)",
                  xaxis=dict(type="log", title="FLOP per byte (log scale)", dtick=1,
                             range=[math.log10(min(xs)) - 0.3, math.log10(max(xs)) + 0.3]),
                  yaxis=dict(type="log", title="GFLOP per step (log scale)", dtick=1,
                             range=[math.log10(min(ys)) - 0.3, math.log10(max(ys)) + 0.3]),
                  legend=dict(traceorder="grouped", tracegroupgap=8, font_size=11), height=680)
show(fig, "02-intensity-h200-tf32")

# %% [markdown]
# Every component sits left of the TF32 ridge point: at C = 256 even the matmuls do too
# few FLOPs per byte to be compute-bound with tensor cores. Cutting FLOPs (the 2× MLP)
# therefore helps less than the FLOP counts suggest, and cutting bytes and kernels (fusion,
# not materializing the probabilities) matters more: the subject of the next chapters.
