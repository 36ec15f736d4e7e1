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
# are in the docstring of `ftlib/analysis/accounting.py`; the short version: a matmul of
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

# %% [markdown]
# This chapter computes analytically, so it ignores the three parameters; it always uses
# the post's shape, B = 32 and T = 256.

# %% tags=["hide-cell"]
from IPython.display import Markdown, display

from ftlib.views import accounting as av
from ftlib.views.plots import show
from ftlib.views.tables import show_frame

# The three models, at the post's shape B = 32, T = 256 (ftlib.views.accounting.MODELS). The original
# FastTransformer hands SDPA a (B, 1, T, d) K/V (kv_layout='broadcast'); ftlib's preset defaults to
# the stride-0 expanded view, which reaches a fused kernel.

# %% [markdown]
# ## One block, forward: the post's table
#
# The matmuls of one block's forward pass, in GFLOP, with QKᵀ and A·V counted over the full
# T × T (what the explicit softmax executes) and halved for the causal mask (what a fused
# kernel skips).

# %%
show_frame(av.block_forward_table(), decimals=2, name="block-forward-gflop")

# %% [markdown]
# ## The 4% / 64% claim
#
# The post: QKᵀ and A·V are 4.0% of block compute, the MLP 64%. The shares below are of
# the block's forward matmul FLOPs, full and causal.

# %%
show_frame(av.shares_table(), name="attention-mlp-shares")
display(Markdown(av.shares_text()))

# %% [markdown]
# ## The 2× MLP: 8.59 → 4.30 GFLOP
#
# This part of the post's arithmetic holds: halving the hidden width halves both MLP
# matmuls (the exact half rounds to the post's figure or one hundredth below it; both columns
# to two decimals, as the post gives them).

# %%
show_frame(av.mlp_table(), decimals=2, name="mlp-gflop")

# %% [markdown]
# The shares move the other way in FastTransformer: with a smaller MLP and projection,
# the (unchanged) attention matmuls are a larger part of its block.

# %%
display(Markdown(av.ft_block_text()))

# %% [markdown]
# ## The 805 MB of attention probabilities
#
# The post's 805 MB is one (B, H, T, T) fp32 tensor per layer written in forward and read
# in backward, times six layers. The eager GPT-2 step touches that tensor far more often:
# the scores are written by QKᵀ, rescaled, masked, softmaxed (each a read and a write), read
# by A·V, and the backward runs the chain in reverse. The table lists every pass
# (`ftlib.analysis.backends.TT_PASSES`, checked op by op in the tests with a dispatch-mode
# logger). The original FastTransformer, in fp32 with a (B, 1, T, d) K/V, falls back to
# SDPA's math backend (`ftlib.analysis.backends.expected_backend` states the kernel rules), which
# materializes the same tensor.

# %%
show_frame(av.tt_passes_table(), name="tt-passes")
show_frame(av.tt_traffic_table(), digits=4, name="tt-traffic")
display(Markdown(av.tt_text()))

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
show_frame(av.step_table(), digits=4, name="step-summary")

# %% [markdown]
# Megatron's formula is exact for GPT-2 and overcounts FastTransformer, which it does not
# describe (a 2× MLP and one K/V head). The parameters and optimizer states are tiny next
# to the activations, and for GPT-2 the saved (B, H, T, T) probabilities are a large part
# of those.

# %% [markdown]
# ## Where a step's FLOPs and bytes go
#
# Forward + backward + optimizer, per component, summed over the six layers, as executed on
# an H200 in fp32. The components are coloured by the part of the model they belong to
# (the legend's groups): blues and a violet for attention, oranges for the MLP, greens for the
# norms with pink for the residual adds, greys for the embeddings, head and loss, and brown for
# the optimizer.
# The bars name the models short: *FT, original K/V* is FastTransformer as the post wrote
# it, with the (B, 1, T, d) K/V; *FT, expanded K/V* hands SDPA the stride-0 expanded view.

# %%
for name, fig in av.component_figures():
    show(fig, name)

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
show_frame(av.floors_table(), name="step-floors")

# %% [markdown]
# On the H200 in fp32 the FLOP floor and the memory traffic are of the same order; with
# tensor cores (TF32, BF16) the arithmetic floor drops by an order of magnitude and the step
# is bound by bytes (and, in practice, by kernel launches: compare the measured times in
# chapter 3). On the T4 the fp32 arithmetic floor alone is already in the tens of
# milliseconds. Which components are memory-bound is shown below for the H200 in TF32: each
# component's FLOPs per byte against the ridge point, where the TF32 peak and the DRAM
# bandwidth meet. Colours as above; the symbol tells the model.

# %%
show(av.intensity_figure(), "02-intensity-h200-tf32")

# %% [markdown]
# Every component sits left of the TF32 ridge point: at a model width of C = 256 (`n_embd`,
# the size of every projection's input in both models) even the matmuls do too
# few FLOPs per byte to be compute-bound with tensor cores. Cutting FLOPs (the 2× MLP)
# therefore helps less than the FLOP counts suggest, and cutting bytes and kernels (fusion,
# not materializing the probabilities) matters more: the subject of the next chapters.

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
