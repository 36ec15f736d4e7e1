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
# # 10. What we found
#
# **The question.** After nine chapters of measurements: which of the post's claims hold, which
# do not, and what does the study teach about designing a small transformer for the GPU that
# trains it? Everything below is computed from the same committed result rows as the chapters
# before it; the verdicts follow chapter 7's rules.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/10_findings.ipynb)

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
from IPython.display import Markdown, display

from ftlib.harness.results import device_folders
from ftlib.views.bench import gpu_label
from ftlib.views.findings import WHAT_TO_TRY, lessons, show_findings

# %% [markdown]
# ## The verdicts

# %%
for device in device_folders(include_cpu=MEASURE):
    show_findings(device)

# %% [markdown]
# ## What the measurements teach

# %%
for device in device_folders(include_cpu=MEASURE):
    display(Markdown(f"### On the {gpu_label(device)}\n\n" + lessons(device)))
display(Markdown(WHAT_TO_TRY))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
