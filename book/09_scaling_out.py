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
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import torch

from ftlib import preset
from ftlib.analysis.allreduce import NVLINK_GBS, allreduce_volume, ring_floor_s
from ftlib.core.device import pick_device
from ftlib.views.bench import devices, ok_rows, pick, provenance_line
from ftlib.views.ddp import scaling
from ftlib.views.plots import MODEL_COLORS, log_ticks, show
from ftlib.views.tables import show_table

MODELS = {"gpt2": preset("gpt2"), "fasttransformer": preset("fasttransformer")}
WORLD_SIZES = [1, 2, 4, 8]
if MEASURE:
    # One torchrun per world size: all local GPUs (NCCL), or 2 gloo processes on a CPU.
    device = pick_device(DEVICE)
    n_max = torch.cuda.device_count() if device.type == "cuda" else 2
    size = (["--override", "n_layer=1,n_embd=64", "--B", "4", "--T", "64", "--steps", "10", "--warmup", "3"]
            if SMOKE else ["--B", "32", "--T", "256", "--steps", "50", "--warmup", "10"])
    for n in [w for w in WORLD_SIZES if w <= n_max]:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
             "-m", "ftlib.harness.ddp_bench", "--preset", *MODELS, "--precision", "fp32", "--device", device.type,
             *size],
            cwd=Path.cwd().parent, capture_output=True, text=True)
        print("\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("[ddp]")) or proc.stderr[-2000:])
rows = ok_rows("ddp", include_cpu=MEASURE)
print("Measured on:", provenance_line(rows) or "nothing stored yet")

# %% [markdown]
# ## The accounting: how many bytes one step all-reduces
#
# Gradients stay fp32 under autocast, so a step reduces `4 × n_params` bytes whatever the
# compute precision. A ring all-reduce (a reduce-scatter, then an all-gather) makes every GPU
# send and receive `2(n−1)/n` of that (Patarasuk & Yuan 2009; nccl-tests' "bus bandwidth"
# uses the same factor). The last column is a floor at the H200's datasheet NVLink
# bandwidth (900 GB/s both directions, 450 GB/s each way): a lead, not a reading.

# %%
h200_link = NVLINK_GBS["NVIDIA H200"] / 2  # GB/s per direction
acct = []
for name, cfg in MODELS.items():
    for n in WORLD_SIZES:
        v = allreduce_volume(cfg, n)
        acct.append({"model": name, "GPUs": n, "parameters": v["n_params"], "gradient MB": v["grad_bytes"] / 1e6,
                     "ring factor 2(n-1)/n": v["ring_factor"], "sent per GPU MB": v["ring_bytes_per_rank"] / 1e6,
                     "NVLink floor µs (H200)": ring_floor_s(cfg, n, h200_link) * 1e6})
show_table(acct)

# %%
fig = go.Figure()
for name, cfg in MODELS.items():
    fig.add_trace(go.Scatter(name=name, x=WORLD_SIZES, mode="lines+markers", line_color=MODEL_COLORS[name],
                             y=[allreduce_volume(cfg, n)["ring_bytes_per_rank"] / 1e6 for n in WORLD_SIZES]))
fig.update_layout(title="Gradient bytes each GPU sends per step (ring all-reduce, fp32 gradients)",
                  xaxis=dict(title="GPUs", **log_ticks(WORLD_SIZES)), yaxis_title="MB per GPU per step", height=400)
show(fig, "ddp-allreduce-volume")

# %% [markdown]
# ## What FastTransformer's smaller parameter count means here
#
# Multi-query attention (K and V one head wide) and the 2× MLP remove most of GPT-2's block
# parameters, and with them the same share of the all-reduce. Below: that share, computed, and
# the floor set beside the stored single-GPU H200 step of chapter 3 (eager, fp32, B = 32,
# T = 256), the compute each GPU does between two all-reduces under weak scaling.

# %%
g2, ft = (allreduce_volume(MODELS[m], 8) for m in ("gpt2", "fasttransformer"))
print(f"FastTransformer all-reduces {1 - ft['grad_bytes'] / g2['grad_bytes']:.1%} fewer bytes per step than GPT-2 "
      f"({ft['grad_bytes'] / 1e6:.2f} MB vs {g2['grad_bytes'] / 1e6:.2f} MB), at every GPU count.")
steps = ok_rows("baselines")
context = []
for name, cfg in MODELS.items():
    step = pick(steps, device_slug="h200", label=name, mode="eager", precision="fp32", optimizer_kind="default")
    floor_ms = ring_floor_s(cfg, 8, h200_link) * 1e3
    context.append({"model": name, "H200 1-GPU eager step ms (stored)": step and step["median_ms"],
                    "8-GPU all-reduce floor ms": floor_ms,
                    "floor / step": (floor_ms / step["median_ms"]) if step else None})
show_table(context)

# %% [markdown]
# Even at eight GPUs the bandwidth floor of the gradient all-reduce is a fraction of a percent
# of one step: bandwidth is not what limits data parallelism for models this small. What can
# limit it is latency (each bucket's all-reduce has a fixed cost of some microseconds), the
# overlap DDP manages with backward, and launch overhead, which is why the measurements below,
# not the floor, decide. FastTransformer's ~47% fewer bytes halve a cost that is already small;
# what weighs more is the step the all-reduce hides behind. A shorter step leaves less backward
# to overlap with and makes any fixed all-reduce cost a larger share, and which model's step is
# shorter depends on the mode and precision (chapter 5: in eager fp32, above, FastTransformer's
# is the longer one).

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
table = scaling(rows)
if not table:
    print("No multi-GPU rows stored yet: data/results/*/ddp.jsonl does not exist. Run "
          "`OUT=<dir> bash ci/gpu_ddp.sh` on a machine with 2-8 GPUs and commit its ddp.jsonl into "
          "data/results/<gpu>/ to fill this section. The accounting above does not depend on it.")
else:
    show_table([{"device": r["device_slug"], "model": r["label"], "precision": r["precision"], "mode": r["mode"],
                 "ranks (GPUs)": r["world_size"], "backend": r["backend"], "B per rank": r["B_per_rank"],
                 "step ms": r["median_ms"], "p20–p80 ms": f"{r['p20_ms']:.2f}–{r['p80_ms']:.2f}",
                 "tokens/s": r["tokens_per_s"], "speed-up": r["speedup"], "efficiency": r["efficiency"],
                 "overhead ms": r["step_overhead_ms"], "all-reduce ms (profiled)": r.get("comm_ms"),
                 "all-reduces/step": r.get("comm_calls_per_step"),
                 "MB reduced (measured)": (r.get("allreduce_bytes_measured") or 0) / 1e6 or None,
                 "MB (accounting)": r["grad_bytes"] / 1e6, "grads ok": r.get("check_ok")} for r in table])

# %%
for dev in devices(table):
    for field, title, ytitle in (("median_ms", "step time", "ms per step"),
                                 ("tokens_per_s", "throughput (all GPUs)", "tokens/s"),
                                 ("efficiency", "weak-scaling efficiency", "tok/s(n) / (n · tok/s(1))")):
        fig = go.Figure()
        for r0 in [r for r in table if r["device_slug"] == dev and r["world_size"] == 1]:
            pts = [r for r in table if r["device_slug"] == dev and r["label"] == r0["label"]
                   and r["precision"] == r0["precision"] and r["mode"] == r0["mode"]]
            fig.add_trace(go.Scatter(name=f"{r0['label']} {r0['precision']} {r0['mode']}", mode="lines+markers",
                                     x=[r["world_size"] for r in pts], y=[r[field] for r in pts]))
        fig.update_layout(title=f"DDP {title}, {dev}", yaxis_title=ytitle, height=400,
                          xaxis=dict(title="ranks (one GPU each)", **log_ticks(r["world_size"] for r in table)))
        show(fig, f"ddp-{field}-{dev}")

# %% [markdown]
# ## Correctness
#
# Data parallelism must not change what is learnt. With equal slices of one global batch, the
# mean of the per-GPU mean losses is the full batch's mean loss, so DDP's averaged gradients
# equal one process's gradients on the whole batch up to fp32 rounding. Every stored row
# carries that check (`grads ok`: relative difference ≤ 1e-5, fp32), and
# `tests/test_distributed.py` checks it on two CPU processes (gloo) to 1e-6, together with
# three training steps whose losses match single-process training on the concatenated batch.
