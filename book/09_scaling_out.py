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
# # 9. Scaling out: data-parallel training
#
# Every chapter so far ran one GPU. The natural next question for a model this small is what
# a second (or eighth) GPU buys. Data parallelism is the only kind worth asking about here: a
# replica of GPT-2 (4.8M parameters) or FastTransformer (2.6M) with its AdamW state is tens of
# megabytes, so there is nothing to shard (FSDP/ZeRO would only add a parameter all-gather to
# the same gradient reduction). Each GPU runs the whole training step on its own
# `B_per_rank` sequences, and PyTorch's `DistributedDataParallel` averages the gradients with
# bucketed NCCL all-reduces that overlap the backward pass (Li et al. 2020, VLDB). The code is
# `ftlib.harness.ddp_bench`, launched by `torchrun`, one process per GPU; `ci/gpu_ddp.sh` runs it at
# 1, 2, 4 and 8 GPUs for both models, fp32 and bf16.
#
# The cost DDP adds is one all-reduce of the fp32 gradients per step. Its volume follows from
# the parameter count alone, so the accounting comes first; the measurements (step time,
# throughput, scaling efficiency, and the all-reduce kernels' time read from `torch.profiler`)
# follow where stored rows exist.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/09_scaling_out.ipynb)

# %% tags=["parameters", "hide-cell"]
DEVICE = "auto"
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
import subprocess
import sys
from pathlib import Path

import torch
from IPython.display import Markdown, display

from ftlib.core.device import pick_device
from ftlib.harness.suites import baselines
from ftlib.views import baselines as bv
from ftlib.views import ddp
from ftlib.views.bench import ok_rows, provenance_line
from ftlib.views.plots import show
from ftlib.views.tables import show_frame

if MEASURE:
    # One torchrun per world size: all local GPUs (NCCL), or 2 gloo processes on a CPU.
    device = pick_device(DEVICE)
    n_max = torch.cuda.device_count() if device.type == "cuda" else 2
    size = (["--override", "n_layer=1,n_embd=64", "--B", "4", "--T", "64", "--steps", "10", "--warmup", "3"]
            if SMOKE else ["--B", "32", "--T", "256", "--steps", "50", "--warmup", "10"])
    for n in [w for w in ddp.WORLD_SIZES if w <= n_max]:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
             "-m", "ftlib.harness.ddp_bench", "--preset", *ddp.MODELS, "--precision", "fp32", "--device", device.type,
             *size],
            cwd=Path.cwd().parent, capture_output=True, text=True)
        print("\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("[ddp]")) or proc.stderr[-2000:])
rows = ok_rows("ddp", include_cpu=MEASURE)
print("Data-parallel steps measured on:", provenance_line(rows) or "no GPU yet (the single-GPU steps below are "
      "chapter 3's stored rows)")

# %% [markdown]
# ## The accounting: how many bytes one step all-reduces
#
# Gradients stay fp32 under autocast, so a step reduces `4 × n_params` bytes whatever the
# compute precision. A ring all-reduce (a reduce-scatter, then an all-gather) makes every GPU
# send and receive `2(n−1)/n` of that (Patarasuk & Yuan 2009; nccl-tests' "bus bandwidth"
# uses the same factor). The last column is a floor at the H200's datasheet NVLink
# bandwidth (900 GB/s both directions, 450 GB/s each way): a lead, not a reading.

# %%
show_frame(ddp.allreduce_table())

# %%
show(ddp.allreduce_figure(), "ddp-allreduce-volume")

# %% [markdown]
# ## What FastTransformer's smaller parameter count means here
#
# Multi-query attention (K and V one head wide) and the 2× MLP remove about half of GPT-2's
# parameters, and with them the same share of the all-reduce. Below: that share, computed, and
# the floor set beside the stored single-GPU H200 step of chapter 3 (eager, fp32, B = 32,
# T = 256), the compute each GPU does between two all-reduces under weak scaling.

# %%
print(ddp.fewer_bytes_text())
step_runs = bv.load(baselines())  # chapter 3's complete runs from committed code, every GPU folder
show_frame(ddp.floor_vs_step(step_runs))

# %% [markdown]
# Even at eight GPUs the bandwidth floor of the gradient all-reduce is a small share of one eager
# fp32 step, and a larger but still small share of the fastest single-GPU step stored (the last
# columns; the closing below gives both): bandwidth is not what limits data parallelism for models
# this small. What can limit it is latency (each bucket's all-reduce has a fixed cost of some
# microseconds), the overlap DDP manages with backward, and launch overhead, which is why the
# measurements below (none stored in this edition), not the floor, decide. FastTransformer's
# fewer bytes shrink a cost that is already small; what weighs more is the step the all-reduce
# hides behind. A shorter step
# leaves less backward to overlap with and makes any fixed all-reduce cost a larger share, and
# which model's step is shorter depends on the mode and precision (chapter 5).

# %% [markdown]
# ## Measured: step time, throughput and scaling efficiency
#
# Weak scaling: every GPU keeps `B_per_rank` sequences, so the global batch grows with the
# GPU count and the ideal step time stays flat. The step is timed with CUDA events after
# warm-up (median, p20–p80, the slowest rank per step); throughput counts the tokens of all
# GPUs; efficiency is throughput at n GPUs over n times throughput at one. The all-reduce time
# is read from `torch.profiler` (the NCCL AllReduce kernels; on CPU, gloo's `all_reduce`
# events) in a separate profiled window, and its bytes from the shapes the profiler recorded;
# both overlap backward compute, so they bound the cost from above, and the step overhead over
# one GPU is the exposed part.

# %%
if not rows:
    print("No multi-GPU measurement is stored in this edition. On a machine with 2 to 8 GPUs, "
          "`OUT=<dir> bash ci/gpu_ddp.sh` measures this section (the README's 'Measure on a GPU').")
else:
    show_frame(ddp.ddp_table(rows))

# %%
for name, fig in ddp.scaling_figures(rows):
    show(fig, name)

# %% [markdown]
# ## Correctness
#
# Data parallelism must not change what is learnt. With equal slices of one global batch, the
# mean of the per-GPU mean losses is the full batch's mean loss, so DDP's averaged gradients
# equal one process's gradients on the whole batch up to fp32 rounding. Each measured row
# carries that check (`grads ok`: relative difference ≤ 1e-5, fp32), and
# `tests/test_distributed.py` checks it on two CPU processes (gloo) to 1e-6, together with
# three training steps whose losses match single-process training on the concatenated batch.

# %% [markdown]
# ## What we found

# %%
display(Markdown(ddp.findings(step_runs, rows)))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
