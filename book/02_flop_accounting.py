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
# redoes that accounting from the configurations alone, with `ftlib.accounting`
# (FLOPs, bytes, saved activations per component) and `ftlib.peaks` (datasheet peaks and
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

# %% tags=["parameters"]
DEVICE = "auto"
SMOKE = True
MEASURE = False

# %%
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

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display

from ftlib import preset
from ftlib.accounting import (
    POST_CLAIMS,
    attention_matrix_traffic,
    attention_mlp_fractions,
    by_component,
    expected_backend,
    kaplan_flops,
    layer_forward_breakdown,
    megatron_flops,
    palm_flops,
    step_summary,
)
from ftlib.peaks import flops_floor, lookup, roofline, step_floor
from ftlib.plots import show

B, T = 32, 256
# The original FastTransformer hands SDPA a (B, 1, T, d) K/V: kv_layout='broadcast'.
# ftlib's preset defaults to the stride-0 expand view, which reaches a fused kernel.
MODELS = {
    "GPT-2": preset("gpt2"),
    "FastTransformer (original, broadcast K/V)": preset("fasttransformer", kv_layout="broadcast"),
    "FastTransformer (expanded K/V)": preset("fasttransformer"),
}
GPT2, FT = MODELS["GPT-2"], MODELS["FastTransformer (original, broadcast K/V)"]


def table(header: list[str], body: list[list]) -> None:
    """Display a Markdown table (formatting only)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    display(Markdown("\n".join(lines)))


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
table(
    ["component", "GPT-2 GFLOP", "GPT-2 causal", "FastTransformer GFLOP", "FastTransformer causal"],
    [[names[c]] + [f"{d[m][c] / 1e9:.2f}" for m in bd for d in (bd, bdc)] for c in names]
    + [["**block**"] + [f"**{sum(d[m].values()) / 1e9:.2f}**" for m in bd for d in (bd, bdc)]],
)

# %% [markdown]
# ## The 4% / 64% claim
#
# The post: QKᵀ and A·V are 4.0% of block compute, the MLP 64%. The shares below are of
# the block's forward matmul FLOPs, full and causal.

# %%
fr = {c: attention_mlp_fractions(GPT2, B, T, causal=c) for c in (False, True)}
table(
    ["share of GPT-2 block FLOPs", "post claims", "full T × T", "causal (half)"],
    [
        ["attention QKᵀ + A·V", f"{POST_CLAIMS['attention_share']:.1%}",
         f"{fr[False]['attention']:.1%}", f"{fr[True]['attention']:.1%}"],
        ["MLP", f"{POST_CLAIMS['mlp_share']:.1%}", f"{fr[False]['mlp']:.1%}", f"{fr[True]['mlp']:.1%}"],
        ["QKV + out-proj", "—", f"{fr[False]['projections']:.1%}", f"{fr[True]['projections']:.1%}"],
    ],
)
display(Markdown(
    f"Attention is {fr[False]['attention']:.1%} of the block as GPT-2 executes it "
    f"({fr[True]['attention']:.1%} counting only the causal half), not "
    f"{POST_CLAIMS['attention_share']:.0%}: a QKᵀ + A·V of "
    f"{fr[False]['attention_gflop']:.2f} GFLOP, four times the post's figure. "
    f"The MLP share is {fr[False]['mlp']:.1%} ({fr[True]['mlp']:.1%} causal), not "
    f"{POST_CLAIMS['mlp_share']:.0%}."
))

# %% [markdown]
# ## The 2× MLP: 8.59 → 4.30 GFLOP
#
# This part of the post's arithmetic holds: halving the hidden width halves both MLP
# matmuls (the exact half rounds to the post's figure or one hundredth below it).

# %%
mlp = {m: attention_mlp_fractions(MODELS[m], B, T)["mlp_gflop"] for m in ("GPT-2", "FastTransformer (expanded K/V)")}
table(
    ["MLP GFLOP per layer, forward", "post claims", "computed"],
    [["GPT-2 (4×)", f"{POST_CLAIMS['mlp_gflop_gpt2']:.2f}", f"{mlp['GPT-2']:.2f}"],
     ["FastTransformer (2×)", f"{POST_CLAIMS['mlp_gflop_fasttransformer']:.2f}",
      f"{mlp['FastTransformer (expanded K/V)']:.2f}"]],
)

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
# (`ftlib.accounting.TT_PASSES`, checked op by op in the tests with a dispatch-mode
# logger). The original FastTransformer, in fp32 with a (B, 1, T, d) K/V, falls back to
# SDPA's math backend (facts.md; `expected_backend`), which materializes the same tensor.

# %%
tr = {m: attention_matrix_traffic(MODELS[m], B, T, "fp32", capability=lookup("NVIDIA H200").capability)
      for m in MODELS}
g = tr["GPT-2"]
table(["phase", "op", "reads", "writes"], [[p["phase"], p["op"], p["reads"], p["writes"]] for p in g["passes"]])
table(
    ["model (fp32, H200 kernel choice)", "backend", "one (B,H,T,T) tensor MB", "passes per layer",
     "write-once-read-once MB/step", "actual MB/step"],
    [[m, t["backend"], f"{t['tensor_bytes'] / 1e6:.1f}", t["reads_per_layer"] + t["writes_per_layer"],
      f"{t['write_once_read_once_per_step'] / 1e6:.0f}", f"{t['bytes_per_step'] / 1e6:.0f}"]
     for m, t in tr.items()],
)
display(Markdown(
    f"Post's claim: {POST_CLAIMS['attention_matrix_mb_per_step']:.0f} MB. The write-once, read-once "
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
# (6N + 12·L·H·Q·T per token, full T × T), the count facts.md uses for its floors.

# %%
cap = lookup("NVIDIA H200").capability
summ = {m: step_summary(c, B, T, precision="fp32", capability=cap) for m, c in MODELS.items()}
table(
    ["per step", *MODELS],
    [
        ["attention backend (fp32, H200)", *[expected_backend(c, "fp32", cap) for c in MODELS.values()]],
        ["GFLOP as executed", *[f"{s['flops'] / 1e9:.1f}" for s in summ.values()]],
        ["GFLOP, causal useful work", *[f"{s['flops_causal'] / 1e9:.1f}" for s in summ.values()]],
        ["GFLOP, matmuls only (full T×T)", *[f"{s['gemm_flops'] / 1e9:.1f}" for s in summ.values()]],
        ["Kaplan 2020 GFLOP", *[f"{kaplan_flops(c, B, T) / 1e9:.1f}" for c in MODELS.values()]],
        ["Megatron-LM 2021 GFLOP", *[f"{megatron_flops(c, B, T) / 1e9:.1f}" for c in MODELS.values()]],
        ["PaLM 2022 GFLOP", *[f"{palm_flops(c, B, T) / 1e9:.1f}" for c in MODELS.values()]],
        ["forward / backward / optimizer GFLOP",
         *[f"{s['fwd_flops'] / 1e9:.1f} / {s['bwd_flops'] / 1e9:.1f} / {s['opt_flops'] / 1e9:.2f}"
           for s in summ.values()]],
        ["DRAM GB (eager, op by op)", *[f"{s['bytes'] / 1e9:.2f}" for s in summ.values()]],
        ["FLOP per byte", *[f"{s['intensity']:.1f}" for s in summ.values()]],
        ["parameters", *[f"{s['params']:,}" for s in summ.values()]],
        ["activations saved for backward MB", *[f"{s['saved_activation_bytes'] / 1e6:.0f}" for s in summ.values()]],
        ["weights + grads + AdamW states MB",
         *[f"{(s['param_bytes'] + s['grad_bytes'] + s['adamw_state_bytes']) / 1e6:.1f}" for s in summ.values()]],
    ],
)

# %% [markdown]
# Megatron's formula is exact for GPT-2 and overcounts FastTransformer, which it does not
# describe (a 2× MLP and one K/V head). The parameters and optimizer states are tiny next
# to the activations, and for GPT-2 the saved (B, H, T, T) probabilities are a large part
# of those.

# %% [markdown]
# ## Where a step's FLOPs and bytes go
#
# Forward + backward + optimizer, per component, summed over the six layers, as executed on
# an H200 in fp32.

# %%
order = ["embeddings", "norm1", "qkv", "scores", "softmax", "attn_v", "out_proj", "residual", "norm2",
         "mlp_up", "gelu", "mlp_down", "final_norm", "head", "loss", "optimizer"]
for key, unit, scale in (("flops", "GFLOP", 1e9), ("bytes", "GB", 1e9)):
    comp = {m: by_component(c, B, T, key=key, precision="fp32", capability=cap) for m, c in MODELS.items()}
    fig = go.Figure([
        go.Bar(name=c, x=list(MODELS), y=[comp[m].get(c, 0.0) / scale for m in MODELS]) for c in order
    ])
    fig.update_layout(barmode="stack", title=f"One training step, B={B}, T={T}, fp32: {unit} by component",
                      yaxis_title=unit, legend_traceorder="normal", height=520)
    show(fig, f"02-step-{key}-by-component")

# %% [markdown]
# ## Rooflines: T4 and H200
#
# A step cannot be faster than its FLOPs at the datasheet peak, nor than its bytes at the
# DRAM bandwidth. Two floors per device and precision: the PaLM FLOP count at the matmul
# peak (facts.md's floors), and the sum over components of
# max(FLOPs / peak, bytes / bandwidth) with each component's executed FLOPs and eager bytes
# (elementwise work at the FP32 rate). The second is a floor for an *eager* step; a
# compiler that fuses elementwise ops removes bytes and can go below it. The T4 has no TF32
# and no BF16, so its tensor-core row is FP16. Peaks are datasheet numbers
# (`ftlib.peaks.PEAKS`, with sources), not readings.

# %%
body = []
for dev, precs in (("Tesla T4", ("fp32", "fp16")), ("NVIDIA H200", ("fp32", "tf32", "bf16"))):
    d = lookup(dev)
    for prec in precs:
        row = [d.name, prec, f"{d.rate(prec) / 1e12:.0f}", f"{d.bandwidth_gbs:,.0f}"]
        for c in MODELS.values():
            sf = step_floor(c, B, T, d, prec)
            row += [f"{flops_floor(palm_flops(c, B, T), d, prec) * 1e3:.2f}", f"{sf['floor_s'] * 1e3:.2f}"]
        body.append(row)
table(
    ["device", "precision", "peak TFLOP/s", "GB/s",
     *[f"{m}: {k}" for m in MODELS for k in ("FLOP floor ms", "roofline ms")]],
    body,
)

# %% [markdown]
# On the H200 in fp32 the FLOP floor and the memory traffic are of the same order; with
# tensor cores (TF32, BF16) the arithmetic floor drops by an order of magnitude and the step
# is bound by bytes (and, in practice, by kernel launches: compare the measured times in
# facts.md and chapter 1). On the T4 the fp32 arithmetic floor alone is already in the tens of
# milliseconds. Which components are memory-bound is shown per row below for the H200 in
# TF32.

# %%
rf = {m: roofline(c, B, T, "NVIDIA H200", "tf32") for m, c in list(MODELS.items())[:2]}
fig = go.Figure()
for m, rs in rf.items():
    comp: dict[str, list[float]] = {}
    for r in rs:
        acc = comp.setdefault(r["component"], [0.0, 0.0])
        acc[0] += r["flops"]
        acc[1] += r["bytes"]
    fig.add_trace(go.Scatter(
        x=[v[0] / v[1] for v in comp.values()], y=[v[0] / 1e9 for v in comp.values()], mode="markers+text",
        text=list(comp), textposition="top center", name=m,
    ))
d = lookup("NVIDIA H200")
ridge = d.rate("tf32") / d.bandwidth
fig.add_vline(x=ridge, line_dash="dash", annotation_text=f"H200 TF32 ridge point ({ridge:.0f} FLOP/B)")
fig.update_layout(title="Arithmetic intensity per component (one step, fp32 tensors, TF32 peak)",
                  xaxis_type="log", yaxis_type="log", xaxis_title="FLOP per byte",
                  yaxis_title="GFLOP per step", height=560)
show(fig, "02-intensity-h200-tf32")

# %% [markdown]
# Every component sits left of the TF32 ridge point: at C = 256 even the matmuls do too
# few FLOPs per byte to be compute-bound with tensor cores. Cutting FLOPs (the 2× MLP)
# therefore helps less than the FLOP counts suggest, and cutting bytes and kernels (fusion,
# not materializing the probabilities) matters more: the subject of the next chapters.
