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
# # 0. Setup: the machine, the data, the two models
#
# This book re-examines a blog post, *FastTransformer: Breaking the Compiler Ceiling via
# Architectural Co-Design*, which claims that four changes to a GPT-2 block — multi-query
# attention, fused scaled-dot-product attention, a 2× MLP and pre-RMSNorm — make a small
# character-level model train faster than `torch.compile`d GPT-2 on a Tesla T4 while
# converging as well (the post's figures below). Every number in the book is measured or derived by the code in
# `ftlib/`; the measured ones are stored with their provenance under `data/results/`.
#
# **Parameters.** Every chapter starts with the cell below (tagged `parameters` for
# papermill): `DEVICE` (`"auto"`, `"cpu"`, `"cuda"`), `SMOKE` (`True`: small sizes, for CPU
# runs and CI; `"t4"`: the T4 profile, the post's models at full size in the precisions the GPU runs,
# about ten minutes a chapter on a T4, what the Colab set-up chooses; `False`: every case at full
# size) and `MEASURE` (measure on this machine and store the results; when `False` the
# chapter shows the stored GPU results only, so its outputs are reproducible).

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/00_setup.ipynb)

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
# ## The claim under test
# The post's headline figures, as `ftlib.analysis.claims` records them: claims made on the
# post's GPU, which the later chapters set beside the book's own measurements.

# %%
from IPython.display import Markdown, display

from ftlib.views import setup

display(Markdown(setup.claim_text()))

# %% [markdown]
# ## The machine
# What this notebook is running on. The output differs from machine to machine, so the
# book's tests do not compare it.

# %% tags=["nbval-ignore-output"]
import ftlib
from ftlib.core.device import pick_device
from ftlib.views.tables import show_frame

device = pick_device(DEVICE)
show_frame(setup.machine_table(device))

# %% [markdown]
# ## The data
# Character-level TinyShakespeare. `ftlib.training.data` finds `data/tinyshakespeare/input.txt`
# (or downloads it when online), checks its SHA-256 and splits it 90/10 like nanoGPT.

# %%
from ftlib.training.data import load_tinyshakespeare

ds = load_tinyshakespeare()
show_frame(setup.data_table(ds))
print(ds.decode(ds.train[:120]))

# %% [markdown]
# ## The two models of the post, and nanoGPT's
# `ftlib.preset` builds the exact configurations of the original repository. Each of the
# four co-design changes is one field of `ftlib.ModelConfig`: `n_kv_head` (8 → 1),
# `attn_impl` (`explicit` → `sdpa`), `mlp_ratio` (4 → 2) and `norm` (`layernorm` →
# `rmsnorm`); FastTransformer also drops the biases and initializes with N(0, 0.02) while
# the original GPT-2 baseline keeps PyTorch's defaults — a confound we return to in the
# convergence chapter. `nanogpt-char` is nanoGPT's shakespeare_char model, the reference
# recipe for convergence.

# %%
models = {name: ftlib.build_model(name, seed=0) for name in ftlib.PRESETS}
show_frame(setup.model_table(models))

# %% [markdown]
# How K/V reach the attention kernel matters (chapter 4): the original FastTransformer hands
# SDPA a (B, 1, T, hs) K/V, which in float32 sends PyTorch to its math backend; by default
# `ftlib` hands it a stride-0 `expand`ed view, which the memory-efficient kernel accepts.

# %%
show_frame(setup.kv_table(models))

# %% [markdown]
# ## A first training step
# One step of the shared training function (`ftlib.training.step.train_step`: zero_grad, forward,
# loss, backward, AdamW) on a real batch, to check the whole path runs on this device.

# %%
import torch

from ftlib.training.data import random_batch
from ftlib.training.step import make_optimizer, train_step

model = ftlib.build_model("fasttransformer", seed=0, n_layer=2 if SMOKE else 6).to(device)
opt = make_optimizer(model)
x, y = random_batch(ds.train, 4 if SMOKE else 32, 64 if SMOKE else 256,
                    generator=torch.Generator().manual_seed(0), device=device)
loss = train_step(model, opt, x, y, grad_clip=1.0)
print(f"loss after one step: finite = {bool(torch.isfinite(loss))}")

# %% [markdown]
# ## Words the book uses
# Every chapter names the way a step ran and the rule that compares runs in the same words.

# %%
from ftlib.views.glossary import glossary_markdown

display(Markdown(glossary_markdown()))

# %% [markdown]
# ## What this chapter set up

# %%
display(Markdown(setup.summary_text(models, ds)))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
