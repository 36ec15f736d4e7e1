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
# # 1. Where the time goes, measured
#
# The post's Figure 2 is a "full-step phase latency breakdown across frameworks": for each
# way of running the step (eager PyTorch, `torch.compile`, CUDA graphs, hand-written CUDA)
# a stacked bar of forward, backward and optimizer time, with the caption's verdict that
# "backward and MLP phases dominate". The original repository does not measure that figure
# for its CUDA-graph mode: it splits the graph's step time by fixed fractions. This chapter
# measures every bar, on the step that every later chapter times (zero_grad, forward, loss,
# backward, AdamW), with `torch.profiler`.
#
# **How a profile is read** (`ftlib.harness.profiling`, whose docstring has the details):
#
# * *Phases.* Forward, backward and optimizer are each wrapped in a profiler range. A GPU
#   kernel belongs to the range whose CPU code *launched* it (the trace links the two by a
#   correlation id), not to the range that happens to be open while it runs: the GPU runs
#   behind the CPU, so a kernel launched late in the forward often executes during the
#   backward.
# * *Categories.* Each kernel name is sorted into matmul, attention, softmax, norm,
#   elementwise, reduction, optimizer, memcpy/memset or other (`classify_kernel`). Names
#   tell a GEMM from a softmax, but not the MLP's GEMMs from the attention projections'; the
#   post's "MLP phase" is a component, which chapter 2 counts by FLOPs instead.
# * *Launch gaps.* The step time (CUDA events, measured without the profiler, whose CPU
#   overhead would widen the gaps) minus the time during which at least one kernel was
#   running. This is the time the GPU waited for the CPU to issue work.
# * *Whole-step CUDA graph.* A single `cudaGraphLaunch` issues every kernel of the step, so
#   the ranges cannot divide it. `ftlib` captures three graphs instead: forward only,
#   forward + backward, and the full step. It splits the full step's kernel sequence at the
#   lengths of the other two, and only when the names match one for one. It also times the
#   replays of all three, so forward = t(forward), backward = t(forward + backward) −
#   t(forward) and optimizer = t(step) − t(forward + backward). Both splits are measured.
# * *Which attention kernel ran* is read from the trace too (`sdpa_backend`): the CPU op
#   (`aten::_scaled_dot_product_efficient_attention`, `..._attention_math`, ...) and the
#   kernel names (`fmha_cutlassF...`, `flash_fwd...`).

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/01_profiling.ipynb)

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

# %% tags=["hide-cell"]
import plotly.graph_objects as go

from ftlib.core.device import device_slug, pick_device
from ftlib.harness import profiling as fp
from ftlib.harness.results import load_rows
from ftlib.views.plots import show
from ftlib.views.tables import show_table

device = pick_device(DEVICE)
PRESETS = ["gpt2", "fasttransformer"]
# The post's configuration, or a small one for CPU runs and CI.
B, T = (4, 64) if SMOKE else (32, 256)
OVERRIDES = {"n_layer": 2} if SMOKE else {}
if device.type == "cuda":
    MODES = list(fp.MODES)
    PRECISIONS = ["fp32"] if SMOKE else ["fp32", "tf32", "bf16"]
else:
    MODES, PRECISIONS = ["eager"], ["fp32"]  # the graph modes need CUDA; Inductor on CPU is slow

# %% [markdown]
# ## Measuring (only with `MEASURE = True`)
# `profile_suite` profiles every model × mode × precision on this device and appends one row
# per profile to `data/results/<device>/profile.jsonl`. Profiles already stored are skipped,
# so an interrupted run resumes where it stopped. With `MEASURE = False`, the chapter shows
# the stored GPU rows only, so its outputs do not depend on the machine that runs it.

# %% tags=["nbval-ignore-output", "hide-input"]
if MEASURE:
    counts = dict(steps=2, warmup=2, timing_steps=5) if SMOKE else dict(steps=5, warmup=5, timing_steps=50)
    fresh = fp.profile_suite(PRESETS, MODES, PRECISIONS, B, T, device, store=True, **counts, **OVERRIDES)
    show_table([{"model": r["preset"], "mode": r["mode"], "precision": r["precision"],
                 "status": r["status"], "error": r.get("error", "")} for r in fresh])
    rows = fp.select_rows(load_rows(fp.BENCH, devices=[device_slug(device)]), B, T, **OVERRIDES)
else:
    # The full models at the post's size, from every GPU that has stored profiles.
    rows = fp.select_rows(load_rows(fp.BENCH), 32, 256)
devices = sorted({r["device_slug"] for r in rows})
if not rows:
    print("No stored profile rows for this selection (data/results/<gpu>/profile.jsonl): "
          "the figures below are skipped. Run with MEASURE=True on a GPU to produce them.")

# %% [markdown]
# ## Figure 2, measured: phases of the step
# One bar per model and mode: the GPU time of the forward, backward and optimizer phases,
# plus "other" (work outside the three ranges, such as the bookkeeping of CUDA-graph
# trees) and the launch gaps. The height of a bar is the step time. When the trace could not
# split a whole-step graph, its bar shows the three-graph differences instead, and these
# include the graph's internal gaps.

# %%
PHASE_ORDER = [*fp.PHASES, fp.OTHER_PHASE, fp.STEP_PHASE, "launch gaps"]
MODE_ORDER = list(fp.MODES)


def _x(r):
    return (PRESETS.index(r["preset"]) if r["preset"] in PRESETS else 99, MODE_ORDER.index(r["mode"]))


for dev_slug in devices:
    for prec in [p for p in ["fp32", "tf32", "bf16", "fp16"] if any(
            r["precision"] == p and r["device_slug"] == dev_slug for r in rows)]:
        sel = sorted((r for r in rows if r["device_slug"] == dev_slug and r["precision"] == prec), key=_x)
        parts = fp.phase_breakdown(sel)
        fig = go.Figure()
        for ph in PHASE_ORDER:
            pts = [p for p in parts if p["phase"] == ph]
            if not pts:
                continue
            pts.sort(key=_x)
            fig.add_bar(name=ph, x=[[p["preset"] for p in pts], [p["mode"] for p in pts]],
                        y=[p["ms"] for p in pts],
                        customdata=[[p["source"], p["sdpa_backend"]] for p in pts],
                        hovertemplate="%{y:.3f} ms<br>%{customdata[0]}<br>SDPA: %{customdata[1]}")
        fig.update_layout(barmode="stack", title=f"Phases of one training step, {dev_slug}, {prec} "
                          f"(B={sel[0]['B']}, T={sel[0]['T']})", yaxis_title="ms per step",
                          legend_title="phase")
        show(fig, f"profile-phases-{dev_slug}-{prec}")

# %% [markdown]
# ## The same steps by kernel category
# The phases say *when* the GPU is busy and the categories say *with what*. FastTransformer's
# RMSNorm is plain PyTorch (`x * rsqrt(mean(x²) + eps) * w`), so in eager mode it appears
# as its elementwise and reduction kernels, not as "norm". Inductor fuses it into one
# kernel, which `classify_kernel` recognises by the fused ops in its name.

# %%
for dev_slug in devices:
    sel = sorted((r for r in rows if r["device_slug"] == dev_slug and r["precision"] == "fp32"), key=_x)
    if not sel:
        continue
    fig = go.Figure()
    for cat in fp.CATEGORIES:
        ys = [sum(k["total_us"] for k in r["kernels"] if k["category"] == cat) / 1e3 for r in sel]
        if any(ys):
            fig.add_bar(name=cat, x=[[r["preset"] for r in sel], [r["mode"] for r in sel]], y=ys)
    fig.add_bar(name="launch gaps", x=[[r["preset"] for r in sel], [r["mode"] for r in sel]],
                y=[(r.get("gaps_us") or 0.0) / 1e3 for r in sel])
    fig.update_layout(barmode="stack", title=f"GPU time by kernel category, {dev_slug}, fp32",
                      yaxis_title="ms per step", legend_title="category")
    show(fig, f"profile-categories-{dev_slug}")

# %% [markdown]
# ## What ran: attention backend, kernels and launches per step
# `busy` is the time during which some kernel was running (on CPU: some op). On a GPU the
# launch gaps are the unprofiled step time minus `busy`. On a CPU the profiler slows the
# ops themselves, so there the gaps are taken from the profiled step time.
# `launches` counts the kernel and graph launches that the CPU issued during a step.
# A whole-step CUDA graph needs one launch for the entire step, and eager mode needs one
# per kernel. The SDPA backend column shows, from the trace, whether FastTransformer's
# attention got a fused kernel or fell back to the math path.

# %%
if rows:
    show_table([{
        "device": r["device_slug"], "model": r["preset"], "mode": r["mode"], "precision": r["precision"],
        "step ms": r["step_ms"], "profiled step ms": r["step_ms_profiled"], "busy ms": (r["busy_us"] or 0) / 1e3,
        "launch gaps ms": (r["gaps_us"] or 0) / 1e3, "kernels": r["kernels_per_step"],
        "launches": r["launches_per_step"], "SDPA backend": r["sdpa_backend"], "phase split": r["phase_source"],
    } for r in sorted(rows, key=lambda r: (r["device_slug"], r["precision"], *_x(r)))],
        preview=["device", "model", "mode", "precision", "step ms", "launch gaps ms", "launches", "SDPA backend"])

# %% [markdown]
# ## The whole-step graph, split two ways
# For the `cudagraph` mode, the phases from the trace (kernel time only) are set beside the
# phases from the three graphs' replay times, which also include the gaps inside each graph.
# If the two splits disagree, the difference is idle time inside the graph, not an error in
# either split.

# %%
graph_rows = sorted((r for r in rows if r["mode"] == "cudagraph"),
                    key=lambda r: (r["device_slug"], r["precision"], *_x(r)))
if graph_rows:
    show_table([{
        "device": r["device_slug"], "model": r["preset"], "precision": r["precision"], "phase": ph,
        "trace ms": next((p["total_us"] / 1e3 for p in r["phases"] if p["phase"] == ph), None),
        "graph difference ms": next((p["total_us"] / 1e3 for p in r["graph_phases"] or [] if p["phase"] == ph),
                                    None),
    } for r in graph_rows for ph in fp.PHASES])
else:
    print("No cudagraph profiles in this selection.")

# %% [markdown]
# ## The heaviest kernels of the eager step
# The ten kernels that take the most GPU time per step in eager fp32, for each model. The
# kernel names show which library did the work: cuBLAS (`sgemm`, `xmma`, `nvjet`), PyTorch's
# own kernels (`vectorized_elementwise_kernel`, `cunn_SoftMaxForward`) and, for
# attention, the memory-efficient (`fmha_cutlass`) or flash kernels when they ran.

# %%
for r in sorted((r for r in rows if r["mode"] == "eager" and r["precision"] == "fp32"),
                key=lambda r: (r["device_slug"], *_x(r))):
    top = sorted(fp.to_rows(r), key=lambda k: (-k["total_us"], k["name"]))[:10]
    print(f"{r['device_slug']} · {r['preset']}")
    show_table([{"phase": k["phase"], "category": k["category"], "kernel": k["name"][:90],
                 "per step": k["count"], "µs per step": k["total_us"]} for k in top])

# %% [markdown]
# ## Reading the figures against the post
# The post's caption says that backward and MLP dominate. In the measured bars, the backward
# phase can be compared directly with the forward phase. The category bars show how much of
# the step is GEMM work at all, and the "launch gaps" segment shows how long the GPU waits
# for work. That segment is where the modes should differ: eager mode launches one kernel
# per operation, Inductor fuses elementwise operations into fewer kernels, and a CUDA graph
# needs one launch per graph. The next chapters ask whether the post's speed-up comes from
# the architectural changes or from having fewer launches.
