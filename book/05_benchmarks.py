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
# # 5. Benchmarks: throughput, precision, compile time, sequence length
#
# The post's Figure 3 (throughput), its precision outlook, its compile-time claim
# (4.31 s → 1.22 s), its "eager inversion" (FastTransformer eager faster than compiled
# GPT-2) and its Figure 5 (sequence sweep at a fixed 8,192 tokens per step), each measured
# by `ftlib.bench` and read here from `data/results/<gpu>/`. The post's T4 claims stand beside
# them, labelled as claims.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/05_benchmarks.ipynb)

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

# %% tags=["hide-input"]
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib import preset
from ftlib.bench import bench_sweep
from ftlib.benchview import MODE_NAMES, devices, not_measured, ok_rows, pick, provenance_line, same_config
from ftlib.claims import POST_CLAIMED, POST_GPU, post_step_rows
from ftlib.env import pick_device
from ftlib.plots import MODEL_COLORS, legend_below, log_ticks, show
from ftlib.sweepview import (
    PROJECTION,
    SWEEP_T,
    compile_time_table,
    eager_inversion_table,
    post_sweep_claims,
    sweep_rows,
    sweep_table,
    t4_projection,
)
from ftlib.tables import show_table

MODELS = ("gpt2", "fasttransformer")
MODEL_NAMES = {"gpt2": "GPT-2", "fasttransformer": "FastTransformer"}
# Short legend names; the tables below name the projection and the claim in full.
SHORT_PROJECTION, SHORT_CLAIM = f"{POST_GPU} roofline projection", f"post's claim ({POST_GPU})"
# A smoke run measures small models at small shapes; the sweep's views then look for those.
SMALL = dict(n_layer=1, n_embd=64) if (MEASURE and SMOKE) else {}
TOKENS, TS = (256, (32, 64)) if (MEASURE and SMOKE) else (8192, SWEEP_T)
shape = (4, 64) if (MEASURE and SMOKE) else (32, 256)
if MEASURE:
    device = pick_device(DEVICE)
    modes = ["eager", "compile-ro"] if device.type == "cuda" else ["eager"]
    precs = ["tf32", "bf16"] if device.type == "cuda" else ["bf16"]
    it = dict(warmup=3, iters=10) if SMOKE else {}
    bench_sweep({m: preset(m, **SMALL) for m in MODELS}, [shape], modes, precs, bench="precision",
                device=device, progress=False, **it)
    for T in TS:
        bench_sweep({m: preset(m, block_size=T, **SMALL) for m in MODELS}, [(TOKENS // T, T)], modes, ["fp32"],
                    bench="tsweep", device=device, progress=False, **it)
# One size per device, so rows of different model sizes never share a figure or a table.
rows = [r for r in ok_rows(["fig1", "precision"], include_cpu=MEASURE) if r.get("label") in MODELS
        and (r["B"], r["T"]) == shape and same_config(r, preset(r["label"], **SMALL))]
print("Measured on:", provenance_line(rows) or "nothing stored yet")

# %% [markdown]
# ## Throughput (the post's Figure 3), B = 32, T = 256

# %%
PRECS = ("fp32", "tf32", "bf16")
for dev in devices(rows):
    fig = go.Figure()
    for label in MODELS:
        xs, ys = [[], []], []
        for prec in PRECS:
            for mode in ("eager", "cudagraph", "compile", "compile-ro"):
                r = pick(rows, device_slug=dev, label=label, mode=mode, precision=prec)
                if r:
                    xs[0].append(prec)
                    xs[1].append(mode)
                    ys.append(r["tokens_per_s"])
        fig.add_trace(go.Bar(name=label, x=xs, y=ys, marker_color=MODEL_COLORS[label]))
    fig.update_layout(barmode="group", title=f"Training throughput, {dev} (B = 32, T = 256)",
                      yaxis_title="tokens / s", height=450)
    show(fig, f"fig3-{dev}")
post = {(r["label"], r["mode"]): r for r in post_step_rows()}
show_table([{"source": f"post (claim), {POST_GPU}", "model": m, "mode": "compile-ro",
             "tokens/s": post[(m, "compile-ro")]["tokens_per_s"]} for m in MODELS])

# %% [markdown]
# ## Speed-up of FastTransformer over GPT-2, per precision and mode
# The post claims +44.5% (1.445×) in fp32 under reduce-overhead on a T4.

# %%
table = []
for dev in devices(rows):
    for prec in PRECS:
        for mode in ("eager", "cudagraph", "compile", "compile-ro"):
            g = pick(rows, device_slug=dev, label="gpt2", mode=mode, precision=prec)
            f = pick(rows, device_slug=dev, label="fasttransformer", mode=mode, precision=prec)
            if g and f:
                table.append({"device": dev, "precision": prec, "mode": MODE_NAMES[mode],
                              "gpt2 ms": g["median_ms"], "fasttransformer ms": f["median_ms"],
                              "speed-up": g["median_ms"] / f["median_ms"],
                              "peak MB gpt2": g.get("peak_mem_mb"), "peak MB FT": f.get("peak_mem_mb")})
show_table(table)
print(f"post's claim ({POST_GPU}, fp32, reduce-overhead): {POST_CLAIMED['speedup_compiled']}x")

# %% [markdown]
# ## The eager inversion
# The post: FastTransformer in plain eager mode beats compiled GPT-2 (98 ms vs 102 ms on its
# T4), "so the gain isn't a compiler trick". Each line compares the two steps on one device,
# precision and sequence length (at 8,192 tokens per step along the sweep); the verdict is
# computed from the two medians.

# %%
for dev in devices(rows):
    show_table(eager_inversion_table(dev, include_cpu=MEASURE, tokens=TOKENS, **SMALL))

# %% [markdown]
# ## Compile time (first step)
# Wall time of the first step, which includes tracing and compilation (the post's
# "compile time", claimed 4.31 s for GPT-2 and 1.22 s for FastTransformer on its machine).
# The `compile_time` suite runs each case in a fresh process with empty compile caches, the
# closest to what a user meets; Figure 1's rows compile with an empty cache directory inside
# a process that has already compiled other models. The ratio is the post's "3.5× faster" form.

# %%
for dev in devices(rows):
    ct = compile_time_table(dev, include_cpu=MEASURE, **SMALL)
    show_table(ct)
    if not any(r["source"].startswith("compile_time") for r in ct):
        print("cold-process rows:", not_measured("compile_time"))

# %% [markdown]
# ## Sequence length at a fixed 8,192 tokens per step (the post's Figure 5)
# T from 128 to 4096 with B = 8192 / T, so every step trains on the same number of tokens;
# the context (`block_size`) is T. The post's Figure 5 covers T = 128…1024 and states one number,
# at T = 128. Beside the measured curves: that claim, and for the T4 a roofline *projection*,
# the ratio of the two models' floor times (FLOPs and eager bytes from `ftlib.accounting`, the
# T4's datasheet peaks), which no implementation can beat and real steps do not reach.
# The fp32 and tf32 tables follow the figures; the lines after them name every T at which the
# FastTransformer is slower than GPT-2, per precision and mode (eager rows are host-bound at
# short T and noisy there). Where the tf32 lines name long contexts, a likely cause (not yet
# checked against a profile at those T) is the attention kernel: with fp32 storage SDPA takes its
# memory-efficient kernel, which chapter 1's profiles show as the same SIMT fp32 kernel
# (`fmha_cutlassF_f32...`) in tf32 as in fp32: it gains nothing from TF32, while GPT-2's explicit QKᵀ and AV
# are ordinary matmuls that TF32 puts on tensor cores. As T grows, attention's share of the
# FLOPs grows with it. Chapter 6's attention kernel runs these dots in TF32.

# %%
sweep_devs = devices(ok_rows("tsweep", include_cpu=MEASURE))
proj, claims = t4_projection(), post_sweep_claims()
for dev in sweep_devs or [None]:
    sweep = sweep_rows(dev, include_cpu=MEASURE, tokens=TOKENS, **SMALL) if dev else []
    if sweep:
        print("Measured on:", provenance_line(sweep))
    else:
        print(f"T sweep on {dev or 'a GPU'}:", not_measured("fig5,tsweep"))
    # Colour: the precision; line: the mode (solid compile-ro, dashed eager). Claims and projections in grey.
    prec_color, mode_dash = {"fp32": "#1f77b4", "tf32": "#ff7f0e"}, {"compile-ro": "solid", "eager": "dash"}
    speed = go.Figure()
    tput = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                         subplot_titles=[MODEL_NAMES[m] for m in MODELS])
    for prec in ("fp32", "tf32"):
        for mode in ("compile-ro", "eager"):
            pts = sweep_table(sweep, prec, mode)
            if pts:
                style = dict(color=prec_color[prec], dash=mode_dash[mode])
                speed.add_trace(go.Scatter(x=[p["T"] for p in pts], y=[p["speed-up"] for p in pts],
                                           mode="lines+markers", name=f"{prec} {mode}", line=style))
                for i, m in enumerate(MODELS, start=1):
                    tput.add_trace(go.Scatter(x=[p["T"] for p in pts], y=[p[f"{m} tokens/s"] for p in pts],
                                              mode="lines+markers", name=f"{prec} {mode}", line=style,
                                              legendgroup=f"{prec} {mode}", showlegend=i == 1), row=1, col=i)
    speed.add_trace(go.Scatter(x=[p["T"] for p in proj], y=[p["floor ratio"] for p in proj], name=SHORT_PROJECTION,
                               mode="lines", line=dict(dash="dot", color="#7f7f7f")))
    speed.add_trace(go.Scatter(x=[c["T"] for c in claims], y=[c["speed-up"] for c in claims], name=SHORT_CLAIM,
                               mode="markers", marker=dict(symbol="star", size=14, color="#333")))
    speed.add_hline(y=1, line=dict(color="#999", width=1))
    where = dev or "no GPU rows"
    ts = [p["T"] for p in proj]
    speed.update_layout(title=f"FastTransformer speed-up over GPT-2 vs T, {TOKENS:,} tokens/step, {where}",
                        xaxis=dict(title=f"T (B = {TOKENS} / T)", **log_ticks(ts)),
                        yaxis_title="speed-up (GPT-2 step time / FastTransformer's)", height=460)
    show(legend_below(speed), f"fig5-speedup-{dev}")
    for i, m in enumerate(MODELS, start=1):
        tput.add_trace(go.Scatter(x=[p["T"] for p in proj], y=[p[f"{m} floor tokens/s"] for p in proj],
                                  name=SHORT_PROJECTION, mode="lines", line=dict(dash="dot", color="#7f7f7f"),
                                  legendgroup="projection", showlegend=i == 1), row=1, col=i)
    tput.add_trace(go.Scatter(x=[c["T"] for c in claims], y=[c["fasttransformer tokens/s"] for c in claims],
                              name=SHORT_CLAIM, mode="markers", marker=dict(symbol="star", size=14, color="#333")),
                   row=1, col=2)
    tput.update_xaxes(title_text=f"T (B = {TOKENS} / T)", **log_ticks(ts))
    tput.update_layout(title=f"Training throughput vs T (the post's Figure 5), {where}", yaxis_title="tokens / s",
                       height=480)
    show(legend_below(tput), f"fig5-throughput-{dev}")
    # The columns a reader compares first; every column is in the collapsed table and its CSV.
    key_cols = ["T", "B", "gpt2 ms", "fasttransformer ms", "speed-up", "gpt2 tokens/s", "fasttransformer tokens/s"]
    show_table(sweep_table(sweep, "fp32", "compile-ro") + claims, preview=[*key_cols, "source"],
               caption=f"fp32, compile-ro, {where}")
    show_table(sweep_table(sweep, "tf32", "compile-ro"), preview=key_cols, caption=f"tf32, compile-ro, {where}")
    # Where the co-designed model stops paying: the T at which it is slower than GPT-2.
    for prec in ("fp32", "tf32"):
        for mode in ("compile-ro", "eager"):
            pts = sweep_table(sweep, prec, mode)
            slower = [p["T"] for p in pts if p["speed-up"] < 1]
            if pts:
                print(f"{dev} {prec} {mode}: FastTransformer slower than GPT-2 at T = {slower or 'none'}")
show_table(proj, [c for c in proj[0] if c != "source"], caption=PROJECTION)
