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
# Measured modes: eager and the manual whole-step CUDA graph in fp32 and tf32 (suite `grid`),
# and `torch.compile` with reduce-overhead in fp32 (suites `ladder` and `grid_compile`).
# Every table reads the stored rows through `ftlib.views.codesign`; a suite not run yet shows
# as "–" with the command that measures it. Each table says how many runs stand behind it, and
# the closing section says which numbers carry a verdict (at least 3 runs on 2 machine starts)
# and which describe fewer runs than that.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/04_codesign.ipynb)

# %% tags=["parameters", "hide-cell"]
DEVICE = "auto"
# With MEASURE: True, small models (CI, CPU); "t4", the post's models at full size in the precisions this
# GPU runs, about ten minutes on a T4 (what Colab sets); False, every case (ftlib.harness.profiles).
SMOKE = True
MEASURE = False

# %% tags=["remove-cell"]
# Colab set-up: only on Colab. Clone the book (its stored results are in data/results/),
# install ftlib without dependencies (Colab's torch stays), work from book/, and measure on this
# GPU with the T4 profile (the post's models at full size, about ten minutes a chapter on a T4).
import sys

if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    import os
    import subprocess

    # A folder for the rows you measure, e.g. "/content/drive/MyDrive/fasttransformer-rows": the
    # runtime's disk is gone when it ends, Google Drive is not. Empty: rows stay on the runtime.
    KEEP_ROWS_IN = ""  # @param {type:"string"}
    root = os.environ.get("FTLIB_COLAB_ROOT", "/content/fasttransformer-book")
    url = os.environ.get("FTLIB_REPO", "https://github.com/fasttransformer-book/fasttransformer-book")
    if not os.path.exists(root):
        subprocess.run(["git", "clone", "--depth", "1", url, root], check=True)
    if os.environ.get("FTLIB_COLAB_PIP", "1") == "1":
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", root], check=True)
    sys.path.insert(0, root)
    os.chdir(os.path.join(root, "book"))
    from ftlib.harness.colab import keep_results

    keep_results(KEEP_ROWS_IN)
    MEASURE, SMOKE = True, "t4"

# %% tags=["hide-input"]
from IPython.display import Markdown, display

from ftlib.core.device import device_slug, pick_device
from ftlib.harness.plans import plan_here, run_plan
from ftlib.harness.profiles import part, view_smoke
from ftlib.model.ablations import ladder
from ftlib.views import codesign as cv
from ftlib.views import codesign_findings as cf
from ftlib.views.bench import devices, gpu_label, not_measured, ok_rows, provenance_line
from ftlib.views.plots import show
from ftlib.views.tables import show_frame

# The grid this chapter shows: a smoke run's small models at a small shape, the T4 profile's cells
# (each change alone and all four), or the whole grid at the post's shape (ftlib.harness.profiles).
SIZES = part("04", view_smoke(SMOKE, MEASURE), "grid")
B, T = SIZES.shapes[0]
GRID, LADDER = SIZES.configs(), SIZES.sized(ladder())
if MEASURE:
    device = pick_device(DEVICE)
    plan = plan_here("04", SMOKE, device)
    print(plan.announce())
    run_plan(plan, device)
    dev = device_slug(device)
else:
    # The first GPU with rows of this chapter's own suites (the grid, the ladder), else of any it reads.
    dev = (devices(ok_rows(cv.OWN_SOURCES)) or devices(ok_rows(cv.SOURCES)) or [None])[0]
rows = cv.measured(dev, include_cpu=MEASURE) if dev else []
print("Measured on:", provenance_line(rows) or "nothing stored yet")

# %% [markdown]
# ## What each cell costs on paper, and what it costs on the H200 (B = 32, T = 256)
# FLOPs and bytes per training step from `ftlib.analysis.accounting` (fp32, the kernel PyTorch is expected
# to pick on an H200), measured medians from the grid suites: eager and CUDA graph (`grid`), and
# compiled with reduce-overhead (`grid_compile`; the ladder's rungs also from `ladder`).

# %%
table = cv.grid_table(rows, GRID, B, T)
# Every table of this chapter holds the rows of one device, named in its caption.
grid_runs = cv.grid_runs(rows, GRID, B, T)
show_frame(table, preview=cv.GRID_PREVIEW,
           caption=f"measured on the {gpu_label(dev)}; the runs behind each column below")
show_frame(grid_runs, caption=f"the runs behind the grid, {gpu_label(dev)}")
missing = cv.unmeasured(table, "compile-ro", "fp32")
if missing:
    print(f"compile-ro, {len(missing)} of {len(table)} cells:", not_measured("grid_compile"))

# %% [markdown]
# ## Which change buys what
# The effect of switching one change on, averaged over the 8 cells where it is off (so every
# combination of the other three counts once): the ratio of step times with and without it.
# A mode whose 16 cells are not all measured shows "–". Eager steps launch every kernel from
# Python and follow the host CPU of the machine start; the CUDA graph and compile-ro replay one
# graph per step. The note under the table compares the eager effects with how far eager steps
# scatter from run to run (the baselines suite's runs of GPT-2 and the FastTransformer, below).

# %%
effects = cv.switch_effects(table)
scatter = cv.run_scatter(rows, B, T)
show_frame(effects, caption=f"measured on the {gpu_label(dev)}, {cv.runs_caption(grid_runs)}")
show_frame(scatter, caption=f"one step from run to run, baselines suite, {gpu_label(dev)}")
display(Markdown(cf.effects_note(effects, grid_runs, scatter)))

# %% [markdown]
# ## The ladder: GPT-2 → FastTransformer, one change at a time
# Each rung adds one change to the one before, in the post's order, and the last drops the
# biases, which gives the FastTransformer. Every rung is timed in each mode; "from" names the
# suite whose row it is (a rung that is also a grid cell comes from the grid suites, the last
# rung also from Figure 1's FastTransformer, whose only difference, the init, leaves the step's
# work unchanged).

# %%
steps = cv.ladder_table(rows, LADDER, B, T)
ladder_runs = cv.grid_runs(rows, LADDER, B, T, cv.LADDER_SOURCES)
show(cv.ladder_figure(steps, dev, B, T), "ladder")
show_frame(steps, preview=cv.LADDER_PREVIEW if len(steps) else None,
           caption=f"measured on the {gpu_label(dev)}, {cv.runs_caption(ladder_runs)}")
if len(cv.unmeasured(steps, "compile-ro", "fp32", "rung")) == len(steps):
    print("compile-ro rungs:", not_measured("ladder"))

# %% [markdown]
# ## Grouped-query attention and the MLP ratio as curves
# On the FastTransformer preset: K/V heads 1, 2, 4, 8 (multi-query → multi-head) and MLP ratio 1…4,
# from the grid suite's run (eager and CUDA graph; colours as in the ladder). The dotted grey line is
# the accounting's GFLOP per step, on the right axis.

# %%
for name, fig in cv.sweep_figures(rows, dev, B, T):
    show(fig, name)

# %% [markdown]
# ## The attention kernel that actually runs, and the cost of the math fallback
# The profiler (chapter 1) reads the SDPA backend off each trace. The original FastTransformer
# passes K/V as (B, 1, T, d). Called as the original calls it, without `enable_gqa=True`, SDPA's
# fused kernels do not take K/V with fewer heads than Q, so it falls back to its math backend,
# which materializes the (B, H, T, T) scores. `ftlib` passes a stride-0
# `expand`ed (B, H, T, d) view instead (no copy), which the memory-efficient kernel accepts.
# "expected" is what the kernel rules in `ftlib.analysis.backends` predict; the trace is what ran.

# %%
# This chapter's GPU first, then any other GPU whose profiles are stored: a backend is a fact of the GPU it ran on.
other = [d for d in devices(ok_rows("profile", include_cpu=MEASURE)) if d != dev]
for d in [dev, *other]:
    kernels = cv.backend_table(d, include_cpu=MEASURE)
    show_frame(kernels, caption=f"profiled on the {gpu_label(d)}")
    if len(kernels) and (kernels["SDPA backend (from trace)"] == cv.NOT_PROFILED).any():
        print(f"SDPA backends from the {gpu_label(d)}'s profiler traces,", not_measured("profile"))

# %% [markdown]
# What the layout costs per mode (fp32, Figure 1's suite, which times both layouts in the same
# run; `compile` is `torch.compile`'s default mode, `compile-ro` its reduce-overhead mode): the
# original layout's step time over the expanded view's, per run, then the median with the lowest
# and highest run over every run that measured both layouts. The step times are each layout's
# median over the same runs, taken apart: where the runs scatter (eager and `compile` launch from
# Python and follow the host), their quotient can differ from the median of the paired ratios,
# which is the number to read.

# %%
cost = cv.fallback_cost(rows, B, T)
show_frame(cost, caption=f"measured on the {gpu_label(dev)}")

# %% [markdown]
# ## What we found

# %%
display(Markdown(cf.chapter4_findings(effects, grid_runs, ladder_runs, scatter, steps, cost)))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
