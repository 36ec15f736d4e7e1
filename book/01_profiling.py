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
# measures the bars with `torch.profiler`, on the step that every later chapter times (zero_grad,
# forward, loss, backward, AdamW): eager and one CUDA graph of the whole step in each precision,
# and `torch.compile` (reduce-overhead) in fp32, the post's precision. The hand-written engine's
# step is profiled in chapter 6, kernel class by kernel class against its floors. The step times
# here come from the profiling runs themselves (one process each); chapter 3's repeated runs are
# the ones to compare configurations by, and an eager step, which follows the host's CPU, can
# differ between the two by far more than a graph's.
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

# %% tags=["hide-cell"]
from IPython.display import Markdown, display

from ftlib.core.device import device_slug, pick_device
from ftlib.harness.plans import plan_here, run_plan
from ftlib.harness.profiles import part, view_smoke
from ftlib.views import profile as pv
from ftlib.views.plots import show
from ftlib.views.tables import show_frame

device = pick_device(DEVICE)
# The post's configuration, or small models for CPU runs and CI (ftlib.harness.profiles).
PROFILES = part("01", view_smoke(SMOKE, MEASURE), "profile")
B, T = PROFILES.shape
OVERRIDES = dict(PROFILES.size)

# %% [markdown]
# ## Measuring (only with `MEASURE = True`)
# `profile_suite` profiles every model × mode × precision this device runs as labelled and appends
# one row per profile to `data/results/<device>/profile.jsonl`. Profiles already stored are skipped,
# so an interrupted run resumes where it stopped. With `MEASURE = False`, the chapter shows
# the stored GPU rows only, so its outputs do not depend on the machine that runs it.

# %% tags=["nbval-ignore-output", "hide-input"]
if MEASURE:
    plan = plan_here("01", SMOKE, device)  # what SMOKE measures here, and how long it should take
    print(plan.announce())
    fresh = run_plan(plan, device)["profile"]
    show_frame(pv.run_status(fresh))
    rows = pv.stored_profiles(B, T, device_slug(device), **OVERRIDES)
else:
    # The full models at the post's size, from every GPU that has stored profiles.
    rows = pv.stored_profiles(32, 256)
if not rows:
    print("No stored profile rows for this selection (data/results/<gpu>/profile.jsonl): "
          "the figures below are skipped. Run with MEASURE=True on a GPU to produce them.")

# %% [markdown]
# ## Figure 2, measured: phases of the step
# One bar per model and mode: the GPU time of the forward, backward and optimizer phases,
# plus "other" where there is any (work outside the three ranges, such as the bookkeeping of
# CUDA-graph trees) and the launch gaps. The height of a bar is the step time. When the trace could not
# split a whole-step graph, its bar shows the three-graph differences instead, and these
# include the graph's internal gaps.

# %%
for name, fig in pv.phase_figures(rows):
    show(fig, name)

# %% [markdown]
# ## The same steps by kernel category
# The phases say *when* the GPU is busy and the categories say *with what*. FastTransformer's
# RMSNorm is plain PyTorch (`x * rsqrt(mean(x²) + eps) * w`), so in eager mode it appears
# as its elementwise and reduction kernels, not as "norm". Inductor fuses it into one
# kernel, which `classify_kernel` recognises by the fused ops in its name.

# %%
for name, fig in pv.category_figures(rows):
    show(fig, name)

# %% [markdown]
# ## What ran: attention backend, kernels and launches per step
# `busy` is the time during which some kernel was running (on CPU: some op). On a GPU the
# launch gaps are the unprofiled step time minus `busy`. On a CPU the profiler slows the
# ops themselves, so there the gaps are taken from the profiled step time.
# `kernels` counts the GPU kernels a step ran, `launches` the kernel and graph launches that the
# CPU issued during it: a whole-step CUDA graph needs one launch for the entire step, and eager
# mode needs one per kernel. `phase split` says how the phases were divided: `trace` by the
# profiler ranges that launched each kernel, `graph-prefix` (a whole-step graph) by matching the
# step's kernel sequence against the forward-only and forward + backward graphs' (see above).
# The SDPA backend column shows, from the trace, whether FastTransformer's attention got a fused
# kernel or fell back to the math path.

# %%
if rows:
    show_frame(pv.what_ran(rows), preview=["device", "model", "mode", "precision", "step ms", "launch gaps ms",
                                            "launches", "SDPA backend"])

# %% [markdown]
# ## The whole-step graph, split two ways
# For the `cudagraph` mode, the phases from the trace (kernel time only) are set beside the
# phases from the three graphs' replay times, which also include the gaps inside each graph.
# If the two splits disagree, the difference is idle time inside the graph, not an error in
# either split.

# %%
split = pv.graph_split(rows)
if not split.empty:
    show_frame(split)
else:
    print("No cudagraph profiles in this selection.")

# %% [markdown]
# ## The heaviest kernels of the eager step
# The ten kernels that take the most GPU time per step in eager fp32, for each model. The
# kernel names show which library did the work: cuBLAS (`sgemm`, `xmma`, `nvjet`), PyTorch's
# own kernels (`vectorized_elementwise_kernel`, `cunn_SoftMaxForward`) and, for
# attention, the memory-efficient (`fmha_cutlass`) or flash kernels when they ran.

# %%
for title, table in pv.heaviest_kernels(rows):
    print(title)
    show_frame(table)

# %% [markdown]
# ## Reading the figures against the post
# The post's caption says that backward and MLP dominate. Where profiles are stored, the
# backward phase in the bars above can be compared directly with the forward phase. The category bars show how much of
# the step is GEMM work at all, and the "launch gaps" segment shows how long the GPU waits
# for work. That segment is where the modes should differ: eager mode launches one kernel
# per operation, Inductor fuses elementwise operations into fewer kernels, and a CUDA graph
# needs one launch per graph. The next chapters ask whether the post's speed-up comes from
# the architectural changes or from having fewer launches.

# %% [markdown]
# ## What we found

# %%
display(Markdown(pv.findings(rows)))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
