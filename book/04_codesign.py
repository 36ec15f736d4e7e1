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
# # 4. The four co-design changes, one at a time and together
#
# FastTransformer changes four things at once. Here each is switched on its own and in every
# combination (the 2⁴ grid), starting from the GPT-2 preset, with its FLOP and byte effect from
# the accounting (chapter 2) and its measured effect on the H200:
#
# 1. **Multi-query attention** (Shazeer 2019): one K and one V head shared by the 8 query heads.
#    The QKV projection shrinks from 256→768 to 256→320 outputs (−58% of its weights), and K/V
#    activations by 8×. Attention FLOPs do not change: every query head still attends to all keys.
# 2. **Fused SDPA**: `F.scaled_dot_product_attention` instead of an explicit softmax. Same FLOPs,
#    but the (B, H, T, T) probabilities need not go through DRAM — *if* a fused kernel runs.
# 3. **2× MLP**: 256→512→256 instead of 256→1024→256, half the MLP FLOPs and activations.
# 4. **RMSNorm** (Zhang & Sennrich 2019): no mean, no bias; one reduction instead of two.
#
# The grid keeps GPT-2's biases, so that each cell differs from GPT-2 by exactly the switches
# in its name; FastTransformer itself also drops the biases (the ladder's last step).
# Measured modes: eager and the manual whole-step CUDA graph, in fp32 and tf32.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/04_codesign.ipynb)

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

# %%
import plotly.graph_objects as go

from ftlib.ablations import grid, kv_head_sweep, ladder, mlp_ratio_sweep
from ftlib.accounting import expected_backend, num_params, step_summary
from ftlib.bench import bench_sweep
from ftlib.benchview import devices, ok_rows, pick, provenance_line
from ftlib.env import pick_device
from ftlib.plots import show
from ftlib.tables import show_table

GRID = grid()
if MEASURE:
    device = pick_device(DEVICE)
    small = dict(n_layer=1, n_embd=64) if SMOKE else {}
    modes = ["eager", "cudagraph"] if device.type == "cuda" else ["eager"]
    shape = (4, 64) if SMOKE else (32, 256)
    bench_sweep({k: v.replace(**small) for k, v in GRID.items()}, [shape], modes, ["fp32"], bench="grid",
                device=device, progress=False, **(dict(warmup=3, iters=10) if SMOKE else {}))
rows = ok_rows("grid", include_cpu=MEASURE)
fig1 = ok_rows("fig1", include_cpu=MEASURE)
print("Measured on:", provenance_line(rows) or "nothing stored yet")

# %% [markdown]
# ## What each cell costs on paper, and what it costs on the H200 (B = 32, T = 256)
# FLOPs and bytes per training step from `ftlib.accounting` (fp32, the kernel PyTorch is expected
# to pick on an H200), measured medians from the grid suite.

# %%
dev = devices(rows)[0] if rows else None
table = []
for label, cfg in GRID.items():
    s = step_summary(cfg, 32, 256, precision="fp32")
    line = {"cell": label, "params": num_params(cfg), "GFLOP / step": s["flops"] / 1e9,
            "GB moved / step (eager)": s["bytes"] / 1e9,
            "attention kernel (expected)": expected_backend(cfg, "fp32", (9, 0))}
    for prec in ("fp32", "tf32"):
        for mode in ("eager", "cudagraph"):
            r = pick(rows, device_slug=dev, label=label, mode=mode, precision=prec) if dev else None
            line[f"{mode} {prec} ms"] = r["median_ms"] if r else None
    table.append(line)
show_table(table)

# %% [markdown]
# ## Which change buys what
# The effect of switching one change on, averaged over the 8 cells where it is off (so every
# combination of the other three counts once): the ratio of step times with and without it.

# %%
switches = ("MQA", "SDPA", "MLP2x", "RMS")
effect_rows = []
for prec in ("fp32", "tf32"):
    for mode in ("eager", "cudagraph"):
        line = {"mode": f"{mode} {prec}"}
        for sw in switches:
            ratios = []
            for label in GRID:
                names = () if label == "gpt2" else tuple(label.split("+"))
                if sw in names:
                    continue
                on = tuple(n for n in switches if n in names or n == sw)
                on_label = "+".join(on)
                a = pick(rows, device_slug=dev, label=label, mode=mode, precision=prec) if dev else None
                b = pick(rows, device_slug=dev, label=on_label, mode=mode, precision=prec) if dev else None
                if a and b:
                    ratios.append(a["median_ms"] / b["median_ms"])
            line[f"{sw} speed-up"] = (sum(ratios) / len(ratios)) if ratios else None
        effect_rows.append(line)
show_table(effect_rows)

# %% [markdown]
# ## The ladder: GPT-2 → FastTransformer, one change at a time

# %%
LADDER = ladder()
steps = list(LADDER)
grid_label = {"gpt2": "gpt2", "+MQA": "MQA", "+SDPA": "MQA+SDPA", "+MLP2x": "MQA+SDPA+MLP2x",
              "+RMS": "MQA+SDPA+MLP2x+RMS"}
fig = go.Figure()
for prec in ("fp32", "tf32"):
    for mode in ("eager", "cudagraph"):
        ys = []
        for st in steps:
            if st in grid_label:
                r = pick(rows, device_slug=dev, label=grid_label[st], mode=mode, precision=prec) if dev else None
            else:  # the last rung is the FastTransformer preset, measured in the fig1/precision suites
                r = pick(fig1, device_slug=dev, label="fasttransformer", mode=mode, precision=prec) if dev else None
            ys.append(r["median_ms"] if r else None)
        fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines+markers", name=f"{mode} {prec}"))
fig.update_layout(title=f"Cumulative ladder, {dev} (B=32, T=256)", yaxis_title="ms per step", height=430)
show(fig, "ladder")

# %% [markdown]
# ## Grouped-query attention and the MLP ratio as curves
# On the FastTransformer preset: K/V heads 1, 2, 4, 8 (multi-query → multi-head) and MLP ratio 1…4.

# %%
for title, sweep, xs in (("K/V heads", kv_head_sweep(), [1, 2, 4, 8]),
                         ("MLP ratio", mlp_ratio_sweep(), [1.0, 1.5, 2.0, 3.0, 4.0])):
    fig = go.Figure()
    for prec in ("fp32", "tf32"):
        for mode in ("eager", "cudagraph"):
            ys = [(pick(rows, device_slug=dev, label=lbl, mode=mode, precision=prec) or {}).get("median_ms")
                  for lbl in sweep]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{mode} {prec}"))
    fig.add_trace(go.Scatter(x=xs, y=[step_summary(c, 32, 256)["flops"] / 1e9 for c in sweep.values()],
                             name="GFLOP / step (accounting)", yaxis="y2", line=dict(dash="dot")))
    fig.update_layout(title=f"{title} sweep on FastTransformer, {dev}", xaxis_title=title,
                      yaxis_title="ms per step", yaxis2=dict(overlaying="y", side="right", title="GFLOP"),
                      height=420)
    show(fig, f"sweep-{title}")

# %% [markdown]
# ## The attention kernel that actually runs, and the cost of the math fallback
# The profiler (chapter 1) reads the SDPA backend off the trace; the original FastTransformer
# passes K/V as (B, 1, T, d), which in fp32 sends SDPA to its math backend. `ftlib` passes a
# stride-0 `expand`ed (B, H, T, d) view instead, which the memory-efficient kernel accepts.

# %%
prof = ok_rows("profile", include_cpu=MEASURE)
show_table([{"device": r["device_slug"], "model": r["preset"], "mode": r["mode"], "precision": r["precision"],
             "SDPA backend (from trace)": r["sdpa_backend"]} for r in prof if r["mode"] == "eager"])
def fig1_ms(label, mode):
    return (pick(fig1, device_slug=dev, label=label, mode=mode, precision="fp32") or {}).get("median_ms")


show_table([{"mode": m, "expand view ms": fig1_ms("fasttransformer", m),
             "original (B,1,T,d) ms": fig1_ms("fasttransformer-broadcast", m)}
            for m in ("eager", "cudagraph", "compile", "compile-ro")])
