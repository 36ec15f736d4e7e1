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
# # 3. The compiler ceiling
#
# **The question.** The post opens with its Figure 1: a hand-written CUDA engine for GPT-2
# beats PyTorch eager but not `torch.compile(mode="reduce-overhead")`, "the compiler ceiling",
# and FastTransformer under the same compiler is faster still. How fast is each way of running
# the same training step, and how much of the compiler's lead is the compiler's?
#
# The book measures both models in every execution mode it has: eager; one CUDA graph of the
# whole step captured by hand (eager kernels, one launch per step, fused capturable AdamW);
# `torch.compile` in its default mode and in reduce-overhead (Inductor's kernels replayed as CUDA
# graphs); and the book's own engine (chapter 6). A small model's step is short, so *where the
# optimizer runs* matters as much as the mode: each compile mode is measured with PyTorch's
# default AdamW run eagerly after the compiled model (what the post did), with the fused AdamW
# kernel, and with forward, backward and AdamW compiled as one function. That function still hands
# the backward to PyTorch's autograd engine between its graphs; a last placement turns on compiled
# autograd, which traces the backward into a graph of its own at run time ([PyTorch's Compiled
# Autograd tutorial](https://docs.pytorch.org/tutorials/intermediate/compiled_autograd_tutorial.html)),
# the compiler's fullest capture of the step; it is measured in bf16 and tf32, and "What we found"
# gives its times against the same whole step without it. The last configuration takes the host out
# altogether: the default-mode compiled model's step, with the fused AdamW, captured by hand as one CUDA
# graph the way the eager step is (runs stored before it was added do not have it). The timed region is the
# original's: zero_grad + forward + loss + backward + AdamW step, median of 50 steps after 10
# warm-ups, CUDA events, rotating random batches. Every configuration is measured in the same
# run, and the whole suite was run in several fresh processes on more than one machine start:
# times are medians over runs, with the slowest and fastest run beside them. The post's T4
# numbers are shown at the end, labelled as claims, beside a roofline *projection* for the T4.
#
# A third model appears beside the two: FastTransformer with its one K/V head passed to fused
# attention as the original code passes it, a (B, 1, T, d) tensor broadcast across the query heads,
# where the model as the book runs it expands it to (B, H, T, d) first. PyTorch's fused kernels turn
# the broadcast shape down and fall back to the math backend, which builds the whole attention matrix;
# chapter 4 measures the difference and chapter 7 sets it against the post's claim that fused
# attention keeps that matrix out of DRAM.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/03_compiler_ceiling.ipynb)

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

from ftlib.core.device import pick_device
from ftlib.harness.plans import plan_here, run_plan
from ftlib.harness.suites import baselines
from ftlib.views import baseline_report as br
from ftlib.views import baselines as bv
from ftlib.views import ceiling
from ftlib.views.engine_findings import weaker_set
from ftlib.views.plots import show
from ftlib.views.tables import show_frame

CASES = baselines()
runs = bv.load(CASES)  # complete runs from committed code, every GPU folder
if MEASURE:  # this machine's own run: small models, the T4 profile, or the whole suite
    device = pick_device(DEVICE)
    plan = plan_here("03", SMOKE, device)
    print(plan.announce())
    mine = run_plan(plan, device)["baselines"]
    todo = plan.part("baselines").cases
    runs = bv.combine(runs, bv.load(todo, rows=mine, tag="this run, small models" if SMOKE is True else "this run"))
show_frame(bv.runs_table(runs), caption="The runs behind this chapter")

# %% [markdown]
# ## Step time per configuration (fp32, B = 32, T = 256)
# The post's Figure 1 is an fp32 figure. Each bar is the median over runs; the whisker spans the
# fastest and the slowest run.

# %%
fp32_devices = sorted(set(runs.loc[runs["precision"] == "fp32", "device_slug"])) if len(runs) else []
for dev in fp32_devices:  # a device whose runs measured other precisions only has no fp32 figure
    show(br.config_figure(runs, dev, "fp32"), f"fig1-{dev}")

# %% [markdown]
# ## FastTransformer against GPT-2, configuration by configuration
# Each ratio divides two rows of the same run (same process, same machine), then the ratios of
# the runs are summarized: a line's ratio is the median of its runs' ratios, which need not equal
# the quotient of the two medians in its ms columns when the runs scatter. The verdict is given
# only when every run agrees: eager and the default compile mode launch their kernels from
# Python and follow the host CPU, so their runs scatter. The last line compares each model at its
# own fastest compiled configuration.

# %%
ft_vs_gpt2 = br.model_table(runs)
show_frame(ft_vs_gpt2[ft_vs_gpt2["precision"] == "fp32"] if not ft_vs_gpt2.empty else ft_vs_gpt2)

# %% [markdown]
# ## Is there a ceiling?
# A CUDA graph of the *eager* kernels removes the launch gaps without any compiler; what
# separates it from the compiled step is fusion. Each GPU is read in fp32, the post's precision;
# a GPU whose runs measured no fp32 is read in the first precision they did.

# %%
for dev in sorted(set(runs["device_slug"])):
    display(Markdown("\n".join(f"- {line}" for line in ceiling.ceiling_findings(runs, dev,
                                                                            ceiling.ceiling_precision(runs, dev)))))

# %% [markdown]
# ## The post's T4 numbers, and what a T4 could do at best
# The post's Figure 1 numbers are claims from a T4 we cannot run here. The projection below comes
# from the book's FLOP and byte accounting and the T4's datasheet (8.1 TFLOP/s fp32, 320 GB/s),
# taken over the whole step: the step's FLOPs at the peak (compute-bound), the bytes an eager step
# moves at the bandwidth (memory-bound), and the larger of the two. The compute-bound time is a
# floor for any implementation; the memory-bound one only for a step that moves the eager bytes,
# since fusion removes bytes. Chapter 2's floors take the larger of the two per component and add
# them up, which gives a higher floor for an eager step, whose components run one after another.

# %%
show_frame(br.post_step_table())
show_frame(br.t4_floor_table())

# %% [markdown]
# ## What we found

# %%
display(Markdown(ceiling.chapter3_findings(runs)))
for dev in sorted(set(runs["device_slug"])):
    # A configuration that won on another GPU but never ran on this one: its fastest is of a smaller set.
    if lack := weaker_set(dev, "its fastest compiled configuration above is the fastest of a smaller set"):
        display(Markdown(lack))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
