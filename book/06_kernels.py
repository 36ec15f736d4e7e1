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
# # 6. Our own kernels and a whole-step engine
#
# **The question.** Chapter 3 found the compiler hard to beat: reduce-overhead, with the
# optimizer placed well, is the fastest standard way to run either model, and the post reports
# that its own hand-written GPT-2 engine did not beat it (on the T4; chapter 7 lists the claim).
# Can kernels written for these models, and an engine that runs the whole training step in one
# CUDA graph, beat the strongest compiled step of the same model and precision, and where does the
# time go?
#
# This chapter writes Triton kernels (`kernels/`), each checked against a plain PyTorch
# reference and timed two ways, then an engine (`ftlib.training.engine`) that runs the whole step on
# flat parameter and gradient buffers in one CUDA graph. The engine is measured in the same
# runs as every compiled configuration (chapter 3's baselines suite), and its losses are
# checked against reference training over 100 steps. The kernels' math, the option trials and
# the sweeps that chose the engine's defaults follow the findings, in an appendix.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/06_kernels.ipynb)

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
from ftlib.harness.results import load_rows
from ftlib.harness.suites import baselines
from ftlib.training.engine.options import EngineOptions
from ftlib.views import baseline_report as br
from ftlib.views import baselines as bv
from ftlib.views import engine as engineview
from ftlib.views import (
    engine_check,
    engine_config,
    engine_findings,
    engine_goals,
    kernel_lessons,
    option_trials,
    steadiness,
    sweeps,
)
from ftlib.views import kernels as kernelview
from ftlib.views import ledger as ledgerview
from ftlib.views.bench import devices, gpu_label, ok_rows, provenance_line
from ftlib.views.engine_findings import weaker_set
from ftlib.views.plots import show
from ftlib.views.tables import show_frame

if MEASURE:
    from ftlib.harness.plans import plan_here, run_plan

    device = pick_device(DEVICE)
    # On a GPU, SMOKE=True and the T4 profile measure the ceilings and the two cheapest ops at full
    # size (the same rows as the full suite, so nothing is stored at a lower quality); on the CPU every
    # driver runs at tiny sizes in the Triton interpreter, which exercises the code, not the kernels'
    # speed. The suite is a program of its own (benchmarks/kernels/suite.py), run from the repository root.
    plan = plan_here("06", SMOKE, device)
    print(plan.announce())
    run_plan(plan, device)
krows = kernelview.kernel_rows(include_cpu=MEASURE)
baseline_rows = load_rows("baselines")
runs = bv.load(baselines(), rows=baseline_rows)  # the engine and every compiled configuration, same runs (chapter 3)
erows = ok_rows("engine", include_cpu=MEASURE)
crows = ok_rows("engine_check", include_cpu=MEASURE)
cand_rows = ok_rows("engine_candidates", include_cpu=MEASURE)  # options on trial (appendix)
for name, rows in (("kernels", krows), ("engine variants", erows), ("engine check", crows)):
    print(f"{name}: measured on", provenance_line(rows) or "nothing stored yet")
show_frame(bv.runs_table(runs), caption="The runs behind the step comparisons")

# %% [markdown]
# ## 1. Why write kernels
#
# The fastest compiled step against two floors of the same step from chapter 2's accounting, at
# the datasheet peaks. The FLOP floor counts only the matmul work at the matmul peak. The eager-step
# floor adds every component's own bound with the bytes an eager step moves (the norms, softmax and
# optimizer are memory-bound); `compiled / eager-step floor` is how far the compiler stays from it.
# A step that fuses ops moves fewer bytes than that and can go below it: GPT-2's engine does, as its
# attention writes the probabilities once where eager's scale, mask, softmax and dropout each move
# the whole T × T tensor. Section 3's speed-of-light ledger sets the engine against floors that count
# what its own kernels must move. Medians over runs; the `engine ms` column shows the engine of the
# current defaults only (an earlier engine's times are in section 3's table).

# %%
show_frame(bv.headroom(runs))

# %% [markdown]
# ## 2. The kernels
#
# The ops of the training step, after Liger-Kernel's layering (kernel, launcher with
# argument checks, `autograd.Function`, thin module; `kernels/README.md`):
#
# * RMSNorm (FastTransformer) and LayerNorm (GPT-2), a tile of rows per program each way
#   (`kernels/rmsnorm.py`, `kernels/layernorm.py`);
# * the residual add fused into the norm after it, with the branch's dropout drawn inside it
#   (`kernels/residual_norm.py`), which the engine applies by default;
# * GPT-2's bias gradients as a deterministic column sum (`kernels/bias_linear.py`);
# * GPT-2's scale, causal mask and softmax as one kernel each way, the probabilities still written
#   (`kernels/causal_softmax.py`), and with the products around them fused too
#   (`kernels/explicit_attention.py`), which the engine applies by default in bf16, fp16 and tf32;
# * FlashAttention-2 for the FastTransformer's multi-query attention (`kernels/attention.py`);
# * the cross-entropy loss and its gradient in one pass (`kernels/cross_entropy.py`);
# * AdamW over flat buffers in one launch (`kernels/adamw.py`);
# * two GEMM kernels that did not beat cuBLAS, GELU in the GEMM epilogues and weight gradients without
#   a reduce kernel (`kernels/gelu_mlp.py`, `kernels/wgrad.py`), engine options off by default;
# * the output head and the loss in two kernels, the logits never stored (`kernels/linear_cross_entropy.py`),
#   an engine option off by default: it lost its trial.
#
# What each computes (its docstring) and how each is built are in the appendix. Each op has a driver in
# `benchmarks/kernels/` that checks every variant (PyTorch, `torch.compile` of the same
# reference, Triton) against an fp64 reference on fresh random inputs, then times it twice:
#
# * **eager**: the call as a user makes it, autograd and launches from Python included
#   (`triton.testing.do_bench`, cold L2). At these sizes this is mostly host time.
# * **in a CUDA graph**: forward and backward captured once and replayed, each replay timed
#   with CUDA events after an L2 flush. This is the time of the kernels, and what they cost
#   inside the engine's graph.
#
# Rates are read against the card's *measured* ceilings: a 1 GiB device-to-device copy
# (read + write) and an 8192² matmul in strict fp32, TF32 and bf16.

# %%
ceilings = kernelview.ceiling_table(krows)
if len(ceilings):
    show_frame(ceilings)
else:
    print("Ceilings not measured yet: run bash ci/gpu-run --only kernels on a GPU (resumable).")

# %% [markdown]
# ### Measured: each kernel against PyTorch and torch.compile
# One line per op and case: PyTorch's own ops, `torch.compile` of the same reference and our fastest
# Triton variant, each the fastest of its kind replayed in a CUDA graph, all three from one run. The
# `run` column names it: the run's id, or for rows stored without one, the commit and day of the
# driver's run. `vs compile` and `vs PyTorch` are the other's time over Triton's (above 1: the kernel is
# faster); where that run timed no such variant the cell is "–", since a time from another run is never
# divided into it.
# Under the figure, every variant (eager and in a graph, its rate against the measured ceilings, its
# run) is in the collapsed table; rows with a status other than ok say why in `note`.

# %%
ktable = kernelview.kernel_table(krows)
if not len(ktable):
    print("Kernel rows not measured yet: run bash ci/gpu-run --only kernels on a GPU (resumable).")
else:
    ksummary = kernelview.kernel_summary(ktable)
    gemm = ksummary["op"].isin(kernelview.GEMM_OPS)
    for part, caption in ((ksummary[~gemm], "The kernels the engine runs"),
                          (ksummary[gemm], "The GEMM kernels, off by default")):
        if len(part):
            show_frame(part, caption=caption, preview=list(kernelview.SUMMARY_PREVIEW))
    for name, fig in kernelview.kernel_figures(ktable):
        show(fig, name)
    show_frame(ktable[list(kernelview.KERNEL_TABLE_COLUMNS)], caption="Every variant, with its run",
               collapsed=True)

# %% [markdown]
# ## 3. The engine
#
# `ftlib.training.engine.Engine` swaps each op for its kernel where one applies, makes every parameter
# and gradient a view into one flat fp32 buffer (so AdamW is one launch and `zero_grad` one
# memset), and captures the whole step (memset, forward, loss, backward, AdamW) in one CUDA
# graph. It is measured in the baselines suite beside every compiled configuration, in the
# same process, and each of its speed-ups divides two rows of one run.
#
# ### Against the strongest compiled step
# For each model and precision, the baseline is the fastest correct configuration of that run:
# `torch.compile` in its default or reduce-overhead mode with AdamW run eagerly, fused, or
# compiled together with the whole step, or a manual CUDA graph of the eager or the compiled step.
# Its name stands beside the ratio; the verdict needs every run on one side of 1.

# %%
speedups = br.engine_speedup_table(runs)
show_frame(speedups, preview=list(speedups.columns))
display(Markdown(br.left_out_note(runs)))  # runs without a configuration that won elsewhere, if any
# A device none of whose runs measured a configuration that was strongest on another: its ratios are against less.
display(Markdown("\n\n".join(s for dev in sorted(set(runs["device_slug"])) if (s := weaker_set(dev)))))
# Runs whose engine ran without one of the current defaults measured an earlier engine: its own lines, said here.
display(Markdown(engine_config.options_behind(baseline_rows, set(runs["run_id"])) if len(runs) else ""))
for dev in sorted(set(runs["device_slug"])):
    show(br.config_figure(runs, dev, "bf16"), f"engine-configs-bf16-{dev}")

# %% [markdown]
# ### Where the optimizer sits changes the ratio
# The same engine against three compiled configurations of the same run: the post's (AdamW run
# eagerly after the compiled model), reduce-overhead with the fused AdamW kernel, and the whole
# step compiled, then the strongest of the run. A speed-up measured against the post's setup
# flatters the engine most where the step is shortest, in bf16. Only the runs that measured the
# current engine count here, so a baseline's time is the median of those runs: chapters 3 and 5
# take every run of the baseline and may give another median for the same configuration.

# %%
show_frame(br.placement_effect(runs))

# %% [markdown]
# ### How steady the baseline is from run to run
# A ratio of two rows of one run cancels what the GPU does between runs, not what each step waits on.
# A step that leaves work to the host every step (a graph break, an optimizer launched from Python)
# takes as long as the host lets it once its GPU work is short: then its time moves with the machine
# start, and so does the engine's ratio against it. The engine replays one CUDA graph. Below, the
# strongest baseline of each run over all runs, beside the current engine; then, per GPU, the engine
# lines whose own runs got a slower compiled step than that GPU's runs did as a rule.

# %%
show_frame(steadiness.steadiness_table(runs))
display(Markdown("\n".join(steadiness.steadiness_findings(runs, model) for model in ("fasttransformer", "gpt2"))))
slow = [f"- **{gpu_label(dev)}:** {text}" for dev in sorted(set(runs["device_slug"]))
        if (text := engine_findings.slow_baseline_runs(dev, runs))]
display(Markdown("\n".join(slow) or "No engine line's runs had a slower compiled step than their GPU's other runs."))

# %% [markdown]
# ### Where the engine's step goes
# `benchmarks/kernels/engine_probe.py` runs the engine's step uncaptured under `torch.profiler` and
# sums the CUDA kernel time by kernel. Here that time is grouped into categories
# (`ftlib.views.engine.PROBE_CATEGORIES`), next to the captured step. The graph replays the
# same kernels without the launch gaps, so the two totals should be close. The largest
# categories are where a faster step would come from next; the lines under the table list each profiled
# case's three largest, from the rows. The figure counts the kernels a step launches: each boundary
# between two kernels costs time even inside a graph, so fewer, larger kernels are the other way down.

# %%
prows = engineview.latest_probes(ok_rows("engine_probe", include_cpu=MEASURE))  # each device's newest code
ptable = engineview.probe_table(prows)
if len(ptable):
    print("Measured on:", provenance_line(prows))
    show_frame(ptable, preview=["device", "case", "precision", "captured step µs", "kernel µs", "kernels per step",
                                "matmul", "largest", "largest share"])
    for dev in sorted(set(ptable["device"])):
        display(Markdown(f"Largest kernel classes per step, {gpu_label(dev)}:\n\n"
                         + ledgerview.class_order(prows, dev)))
        show(engineview.probe_launch_figure(prows, dev), f"engine-launches-{dev}")
else:
    print("Not profiled yet: python -m benchmarks.kernels.engine_probe --out DIR on a GPU, then commit "
          "DIR/engine_probe.jsonl under data/results/<gpu>/.")

# %% [markdown]
# ### Speed of light, class by class
# Each category of the profile against two floors: its FLOPs at the datasheet peak of the pipe
# they run on (tensor cores of the step's precision for matrix products and attention, the FP32
# pipes for elementwise work), and its bytes at the DRAM bandwidth, each tensor moved once per op as
# chapter 2's accounting counts them. The larger is the class's speed of light, and `measured / speed
# of light` says how far the engine is from it. The accounting components behind each class are listed
# first; the partial sums, the copies and casts (but for the bytes of the bf16 weight shadow) and the
# kernels no pattern names have none, so they have no floor ("–"). The time between kernels is kept out
# of every floor: `gaps µs (measured)` is what the row itself measures, the captured step minus the
# profiled kernel time, spread over the step's kernels (`measured gap per kernel µs` in the totals) and
# counted per class by its kernels. A ratio under 1 is no kernel beating physics: a fused kernel skips
# intermediates the per-op accounting counts, and one activation of this step fits in the L2 cache.
# GPT-2's attention on the engine's kernels is counted as any kernel that keeps its probabilities must
# move them: P written once forward and read once backward, every product on causal tiles only; where
# its products run on cuBLAS instead (strict fp32), those kernels count as matmul, so its attention
# class holds the softmax alone against the floor of all three.
# The totals set the captured step against the sum of the class floors and against the step's own
# roofline. The figure and the lines under it show the current default engine for each model and precision
# profiled (the option variants are in the tables); the lines say where each case is furthest from its
# floor, by the time above it.

# %%
if len(ptable):
    show_frame(ledgerview.component_map(), caption="Accounting components behind each kernel class")
    for dev in ledgerview.devices_of(prows):
        dev_rows = [r for r in prows if r.get("device_slug") == dev]
        show_frame(ledgerview.ledger(dev_rows), preview=["case", "class", "measured µs", "kernels", "speed of light µs",
                                                         "bound", "measured / speed of light", "gaps µs (measured)"])
        show_frame(ledgerview.ledger_totals(dev_rows), preview=["case", "captured step µs", "sum of floors µs",
                                                                "roofline µs", "step / sum of floors",
                                                                "step / roofline", "gaps µs (measured)",
                                                                "measured gap per kernel µs"])
        if ledgerview.figure_rows(dev_rows, dev):
            show(ledgerview.ledger_figure(dev_rows, dev), f"engine-ledger-{dev}")
            display(Markdown(ledgerview.ledger_summary(dev_rows, dev)))
        else:
            display(Markdown(ledgerview.no_default_profile(dev)))

# %% [markdown]
# ### What each kernel buys
# Each variant of the `engine` suite changes one thing in the default engine: one kernel switched off
# (`-op`, falling back to the PyTorch op the model uses), all of them (`no-kernels`), the graph
# (`uncaptured`), a fusion or layout (`unfused residual-norm`, `heads layout`, `-fused-softmax`,
# `-bias-kernel`, the bf16 defaults), or for GPT-2 the fused attention in place of its explicit softmax
# (`+flash-attn`). Each model and precision is read from the newest run that measured its default engine
# and its variants; the lines under the table name that run and which engine its default was, and list the
# suite's variants no run has measured yet. `delta ms` is the variant's step time minus the default
# engine's of the same run, with each row's p20–p80 range beside it: for `-op` and `no-kernels` a positive
# delta is what the kernel buys and a negative one says the PyTorch op is faster inside the graph; for
# `uncaptured` it is what the CUDA graph buys; for `+flash-attn` a negative delta says the fused attention
# would pay. `changes the step` is False where the variant's engine ran the same step as the default's
# (switching off a kernel the default did not run): its delta is only noise.

# %%
deltas = engineview.kernel_deltas(erows)
if len(deltas):
    show_frame(deltas, preview=["device", "model", "precision", "variant", "ms", "engine ms", "delta ms",
                                "delta %", "beyond spread", "changes the step"])
    display(Markdown(engineview.deltas_note(erows)))
else:
    print(engineview.NOT_MEASURED)

# %% [markdown]
# ### 100 steps against reference training
# The engine and `train_step` with `torch.optim.AdamW` train side by side from the same
# weights on the same batches (`ftlib.training.engine.check_against_reference`); the check passes when
# every step's loss agrees within the precision's tolerance (`ftlib.harness.bench.step.CHECK_RTOL`).
# The figure draws each model's default engine; the option variants checked are in its legend, drawn
# on a click. On the error's log axis a step where both losses agree to the last bit (an error of 0) is
# drawn at 10⁻⁹. The table and figure hold the checks that ran to the end; a check of the newest run that did
# not (its step failed) or whose losses disagreed is named under the table, with its cause.

# %%
if not crows:
    print(engineview.NOT_MEASURED)
else:
    show_frame(engine_check.loss_table(crows), preview=["device", "model", "precision", "steps", "ref loss last",
                                                      "max rel err", "rtol", "ok"])
    display(Markdown(engine_check.failures(load_rows("engine_check", include_cpu=MEASURE))
                     or "Every check of each device's newest run passed."))
    for dev in devices(crows):
        show(engine_check.loss_figure(crows, dev), f"engine-check-{dev}")

# %% [markdown]
# ### The goals, and what stands in the way
# The engine was built toward goals set before it was measured, at the baselines suite's shape: FastTransformer
# in bf16 at most 1.0 ms a step and at least 1.5× as fast as the strongest compiled step of the same run, in tf32
# at most 1.5 ms and at least 1.6×; GPT-2 as written (its probabilities still materialized) at least 1.2× in both
# (`ftlib.views.engine_goals` says why each). A goal is met only when every run of the current engine meets it,
# with the verdict rule's 3 runs on 2 machine starts; for a goal not met, the step's profile (the ledger above)
# says where the time above the floors goes.

# %%
goals = engine_goals.goal_table(runs)
if len(goals):
    show_frame(goals, preview=["device", "model", "precision", "goal", "engine ms", "speed-up", "runs",
                               "step-time goal", "speed-up goal"])
display(Markdown(engine_goals.goal_findings(runs, prows)))

# %% [markdown]
# ## What we found

# %%
display(Markdown(kernel_lessons.closing(krows, erows, prows, cand_rows,
                                        kernel_lessons.devices_of(krows, erows, runs))))
display(Markdown(engine_goals.goal_summary(runs)))

# %% [markdown]
# ## Appendix: the kernels' math and how the defaults were chosen
#
# What follows supports the findings above: each kernel with the math its docstring states (folded: open
# "Show code cell output"), the fastest variant of each case in the run the kernel table reads, what the
# measurements decided about each default of the engine, the options on trial, and the tile and grid sweeps.

# %% [markdown]
# ### RMSNorm (FastTransformer)
# A tile of rows per program both ways, saving only the inverse RMS; the backward writes one
# weight-gradient partial per tile and the launcher sums them. `benchmarks/kernels/rmsnorm_dev.py` times
# the alternatives in the kernel table of section 2 (its collapsed table of every variant): v3 takes one
# row per program forward and one program per SM backward, v4 and v5 tiles of 16 and 4 rows, v6 to v8
# persistent weight-gradient partials.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("rmsnorm")))

# %% [markdown]
# ### The residual add fused into the next norm
# In a pre-norm block every residual add `s = x + r` is followed by a norm of `s`. One kernel
# forward writes both `s` and the norm's output, and one kernel backward adds the two
# gradients that reach `s` while it computes the norm's backward. The same kernel covers
# RMSNorm and LayerNorm. The engine applies it by default: the model's blocks compute
# `x, h = add_norm(x, branch, norm)` through one seam (`ftlib.model.block.AddNorm`), which the engine
# fills with the fused kernel (`ftlib.training.engine.norms.FusedAddNorm`). Its tile sizes are timed
# in the kernel table of section 2 (`residual_norm_dev`'s v3, v5 and v6: 16, 4 and 8 rows per tile); the grid the
# engine runs its backward on is the option `norm_bwd_grid`, whose default the line under this text gives.
#
# Training with dropout (the speedrun of chapter 8 keeps nanoGPT's residual dropout) adds
# two kernels per branch: `nn.Dropout` forward draws and stores a mask, and its backward
# reads it. The same kernel also applies the branch's dropout, `s = x + r·m/(1-p)`.
# It draws the keep mask `m` from Philox (`tl.rand`) keyed by the element's index and a seed
# that it reads from a device tensor. The backward draws the same mask again, so it is never
# stored. Reading the seed from memory is what makes this work inside a CUDA graph: a seed
# passed as a kernel argument would be frozen into the graph at capture, and the engine
# instead increments the seed tensor at the start of every step. The backward also writes
# the branch's gradient in the branch's own dtype (bf16 under autocast), so no cast kernel
# follows it. The `residual dropout` rows of the kernel table time it against
# eager and compiled dropout + add + norm with the same mask.

# %% tags=["remove-input"]
grid = EngineOptions().norm_bwd_grid
display(Markdown(f"The engine's residual-norm backward runs on `norm_bwd_grid = {grid!r}` by default "
                 "(rows per tile, programs per SM; with `norm_dw_into_buffer`), the forward on its launcher's "
                 "row tiles (`kernels/residual_norm.py`, `ROWS`)." if grid else
                 "The engine's residual-norm backward runs on its launcher's grid by default (`norm_bwd_grid=None`)."))

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("residual_norm")))

# %% [markdown]
# ### LayerNorm (GPT-2)
# Same structure with the mean and an optional bias; PyTorch's own `F.layer_norm` is already
# one fused kernel each way, so this is the op with the least to gain.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("layernorm")))

# %% [markdown]
# ### Bias gradients (GPT-2)
# Every GPT-2 Linear has a bias, and its gradient is a column sum of `dy` over the 8,192 rows
# of a batch. The kernel splits the rows so that there are a few programs per SM and sums the
# small (splits, N) partials in a fixed order. The result is deterministic, with no atomics.
# The matrix products stay on cuBLAS. `bias_grad_dev`'s rows in the kernel table of section 2 compare it
# with PyTorch's `dy.sum(0)` and torch.compile, at each of GPT-2's widths.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("bias_linear")))

# %% [markdown]
# ### GPT-2's softmax, kept as written
# GPT-2 as the post wrote it materializes the (B, nh, T, T) scores and runs scale, causal
# mask and softmax as three PyTorch kernels, and three more in the backward. torch.compile
# keeps the materialized probabilities but fuses the three into one kernel each way
# (in a profile of compile-ro GPT-2 it is named `triton_per_fused__softmax_exp_masked_fill_mul...`).
# This kernel is that fusion: the same function and the same materialized probabilities,
# with one read and one write per element forward, two reads and one write backward. The engine
# runs it by default for explicit attention (`fused_softmax`); the `-fused-softmax` variant of section 3's
# "What each kernel buys" switches it off.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("causal_softmax")))

# %% [markdown]
# ### GPT-2's attention with its products fused, the probabilities still written
# Around that softmax, GPT-2's attention runs two batched matrix products forward (q kᵀ and P v) and
# four backward, on cuBLAS, which needs q, k, v and the output in head-major layout: the step copies
# them there and back and concatenates the three gradients. Every (T, T) tensor in between (the
# scores, the probabilities, their gradients) crosses memory. These three kernels keep what GPT-2
# writes, P, and fuse the rest, FlashAttention-2's tiling with P stored instead of recomputed: the
# forward takes each row's maximum and sum, then writes P (zeros above the diagonal, as GPT-2's masked
# softmax writes them) and multiplies it by v as stored; the backward reads P back in two kernels,
# with the softmax's row sums taken from P itself, as GPT-2's backward takes them. q, k and v are
# read from the qkv projection's output and the result written in place, so the layout copies go
# too. It is the engine option `fuse_softmax_matmuls`, a default since it won its trial in the engine
# in bf16 and tf32 (the table of options on trial, "How an option becomes a default", below). In strict
# fp32 its products would be IEEE FMA, as cuBLAS's are there, and it was not measured faster, so the
# engine keeps cuBLAS's products around the fused softmax unless a dot precision is set. Their causal programs are
# unequal too: variants v5 and v7 of section 2's kernel table launch each grid's heaviest block first, as the fused
# MQA attention's `heavy_first` below does; the engine does so under bf16 (option `explicit_heavy_first`).

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("explicit_attention")))

# %% [markdown]
# ### Fused MQA attention
# FlashAttention-2's forward and backward. The FastTransformer's single K/V head is read by
# index from every query head (pointer arithmetic, `h // (nh // nkv)`), never expanded or
# copied; SDPA needs the expanded (stride-0) K/V to take its fused kernel in fp32 (chapter 4).
# Under the causal mask the programs are unequal: the last query block visits every key block, the first one
# visits one. Variants v10 and v11 of section 2's kernel table launch each row's heaviest block first
# (`heavy_first`; longest processing time first, the order of the `SingleTileLPTScheduler` in the FlashAttention
# repository's tile schedulers), so the light ones fill the tail; the same programs, the same sums. The engine
# launches them so (option `attention_heavy_first`).
# Variants v12 and v13 balance the dK/dV kernel's programs instead (`pair_key_blocks`): program j takes key
# blocks j and n − 1 − j, which visit n + 1 query blocks together, so no program is longer than the others (the
# pairing of chunks i and 2N − 1 − i that balances causal attention over N ranks in Llama 3's context
# parallelism, arXiv:2407.21783, sec. 3.3.2).

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("attention")))

# %% [markdown]
# ### Fused cross-entropy
# The loss and its gradient in one pass over the logits: the row's softmax is in registers
# when the loss is computed, so the backward only scales the stored gradient.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("cross_entropy")))

# %% [markdown]
# ### Flat AdamW
# One launch for the whole model over flat fp32 buffers (decayed parameters first), reading
# the step count and learning rate from device tensors so a captured graph replays it.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("adamw")))

# %% [markdown]
# ### Two GEMM kernels that did not beat cuBLAS
# The engine leaves its matrix products to cuBLAS. Two kernels tried to take a small job off the
# side of a product, and the kernel table of section 2 times each against cuBLAS and torch.compile:
#
# * **GELU in the GEMM epilogues** (`kernels/gelu_mlp.py`). The up-projection stores z and gelu(z)
#   from the accumulator; backward, the product through the down-projection is multiplied by gelu'(z)
#   before it is stored. That removes the MLP's two elementwise GELU kernels; cuBLASLt offers the
#   same fusion as its GELU and DGELU epilogues.
# * **Weight gradients without a reduce kernel** (`kernels/wgrad.py`). A weight gradient reduces
#   over all 8,192 rows of a batch into a small output, so cuBLAS splits the reduction and sums the
#   slices with a second kernel. This kernel adds each slice into the fp32 gradient with atomic adds
#   instead: one kernel per gradient.
#
# Both are Triton tile GEMMs. Alone, the weight-gradient kernel ties or beats cuBLAS in some cases and loses in
# others (section 2's table); in the engine's step neither won its trial against cuBLAS's GEMMs (the option
# trials below), so both stay engine options, off by default.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("gelu_mlp") + "\n\n" + kernelview.kernel_math("wgrad")))

# %% [markdown]
# ### The head and the loss in two kernels
# The head's GEMM has only 65 output columns, one per character, and its cross-entropy reads those 65 logits
# per row once. `kernels/linear_cross_entropy.py` forms a block of rows' logits in registers, takes their
# log-sum-exp and loss there, and in the backward forms them again to make both gradients of the head from
# the same tile, so the logits and their gradient never go through memory and cuBLAS's unaligned kernels for
# the head go. The kernel table of section 2 times it against the same work done as the engine does it
# without the option, and the option's trial below in the whole step. Both found the two kernels slower than
# the GEMMs and the loss kernel they replace. Where the time goes inside them (each program's atomic adds of
# its partial dW, tiles padded from 65 columns to 128) is not measured here.

# %% tags=["remove-input", "hide-output"]
display(Markdown(kernelview.kernel_math("linear_cross_entropy")))

# %% [markdown]
# ### The fastest variant of each case
# Per op and case, in the run the kernel table of section 2 reads: the fastest variant in a CUDA graph and
# how much faster it is than each other kind's fastest variant of that run.

# %%
if len(ktable):
    print("\n".join(kernelview.fastest_variants(ktable)))

# %% [markdown]
# ### What the measurements decided
# Each default of the engine is timed against its alternative, in the table of section "What each
# kernel buys" or in the trials below:
#
# * In strict fp32 the engine keeps SDPA's memory-efficient attention: our kernel's dots would run as
#   FMA instructions there, without tensor cores, and only run in fp32 when asked
#   (`attention_precision`). The fp32 attention rows of section 2's kernel table say by how much on
#   the GPUs that measured them (`python -m benchmarks.kernels.suite --ops attention` adds another).
# * Attention reads q, k and v straight from the packed projection output and writes (B, T, C)
#   (`attention_layout='packed'`), and every residual add is fused into the norm after it
#   (`kernels/residual_norm.py`); the `heads layout` and `unfused residual-norm` variants of "What each kernel buys"
#   measure both against the defaults.
# * GPT-2's bias gradients run on a Triton column sum (`kernels/bias_linear.py`); under bf16 the
#   fused norms write bf16 (what the next Linear's cast would produce anyway) and the Linear
#   layers read one bf16 copy of the flat weights made once per step. None of these changes
#   what is computed; the `-bias-kernel`, `-bf16 norm out` and `-bf16 weights` variants measure
#   each against the defaults.
# * With dropout on (the speedrun, chapter 8), each branch's residual dropout runs inside the
#   fused residual-norm: the random stream changes, the distribution does not.
# * Strict fp32 is bound by cuBLAS's SIMT matrix products. The routes labelled 3xTF32 run
#   attention and the Linear layers on tensor cores at fp32 accuracy (`kernels/linear.py`): a
#   different algorithm, shown as its own route.
# * GPT-2's engine keeps its materialized softmax (the model as the post wrote it) and runs its
#   scale, causal mask and softmax as one kernel each way, as `torch.compile` does with the
#   same ops. The `+flash-attn` route computes the same function with the attention kernel
#   instead: it adopts one of the post's four changes as a kernel, not as a change to the model.

# %% [markdown]
# ### How an option becomes a default
# An option becomes a default when it is faster than the default engine beyond the spread in the same run
# and passes the 100-step check (below); the table shows each trial's outcome. An option on trial is timed
# in its own suite, `engine_candidates`, each case beside the default case it would change. Each default
# has a case in the `engine` suite that switches it off again (`-grad-into-buffer`, `-fused-kv-sum`,
# `-norm-dw-into-buffer`, `-norm-bwd-grid`, `-fuse-softmax-matmuls`, `-bias-into-buffer`,
# `-bf16-bias-weights`, `-branch-bias-into-norm`, `-first-norm-into-buffer`, `-bias-options` for the last
# four at once, `-explicit-dq-one-pass`, `-fc-bias-into-gelu`, `-wgrad-stream`, `-attn-bwd-streams`,
# `-kv-split-2`, `-fused-embedding`, `-relaxed-atomics`, `-fused-head`, `-heavy-first` and `-explicit-heavy-first`;
# the lines under the table of section "What each kernel buys" say which of them have rows). A
# winner becomes a default together with a run of the baselines suite that measures it: a default changes the
# step that every headline ratio times, so until then it stays on trial.
# The options the trials below concern:
#
# * `grad-into-buffer` does what Megatron-LM's `gradient_accumulation_fusion` option does
#   (NVIDIA/Megatron-LM, with its `fused_weight_gradient_mlp_cuda` extension): each Linear's backward
#   writes its weight gradient straight into the flat fp32 gradient buffer, one GEMM with an fp32
#   output, instead of a GEMM, a cast and an add.
# * `fused-kv-sum` concerns multi-query attention's backward: the dK/dV kernel is split over the query
#   heads that share the K/V head and writes one fp32 partial per split; the option sums those
#   partials, casts them and writes them into the packed gradient buffer in one kernel per layer
#   (`kernels/kv_split_sum.py`), where PyTorch takes a sum, a cast and a strided copy for each of dK
#   and dV. GPT-2's multi-head attention has no split, so the option changes nothing there.
# * `norm-dw-into-buffer`: each fused residual-norm's backward adds its weight (and bias) gradient
#   straight into the parameter's view of the flat gradient with atomic adds (`kernels/residual_norm.py`,
#   `dw_partials="atomic"`), which leaves no partial rows for a torch sum and nothing for autograd to add.
# * `norm-bwd-grid`: the grid of that backward (`norm_bwd_grid`): rows per tile and programs per SM,
#   against its launcher's 4-row tiles at 4 programs per SM; the sweep below times the grids alone.
#   The 16-programs-per-SM grids put more loads in flight and pay for more atomic adds.
# * `norm-bwd-pipelined` (an option; its trial was mixed) puts more loads in flight another way: each program of
#   the default grid loops over its run of tiles, and Triton software-pipelines only the loads that feed a
#   `tl.dot`, which this kernel has none of, so each tile's loads wait for the previous tile's arithmetic. The grid
#   '8 rows 4/SM s2' asks for the loop to be pipelined over two tiles (`tl.range`'s `num_stages`): the next
#   tile's loads are in flight while one is computed. The same tiles, the same sums, in the same order. It won
#   some cases (the FastTransformer in bf16) and tied or lost others (the table below), so it is not a default.
# * `fused-embedding` (`fuse_embedding`; it won its trial and is a default now, `-fused-embedding` switches it off):
#   the step's input is x = wte[idx] + wpe[t], which PyTorch runs
#   as a position index, two gathers and an add, and backward as two zeroed tables, two scatter-adds and
#   autograd's two adds into the flat gradient: about ten kernel boundaries around a few MB of traffic. The
#   option runs the model's `embedding_sum` on one kernel that gathers and sums both rows, and its backward on
#   one kernel that adds each row of the gradient into its token's row of the table with atomic adds and sums
#   each position's rows over the batch before adding them (`kernels/embedding_sum.py`).
# * `relaxed-atomics` (`relaxed_atomics`; it won its trial and is a default now, `-relaxed-atomics` switches it off)
#   changes no arithmetic. Alone (section 2's table), the fused embeddings with acquire-release adds lose to what
#   `torch.compile` generates for the same lookups, whose scatter-adds are
#   `tl.atomic_add(..., sem='relaxed')`. Triton's own default is acquire-release: each atomic add is fenced
#   against the program's other memory operations, so in a loop that loads a tile and adds it (the embeddings'
#   backward over its run of the batch, the fused head's dW over its slices of K) the next loads wait for the
#   add, and the adds that end a program (the norms' weight gradients, each split-K tile of `wgrad_splitk`) wait
#   for its stores and for each other. A sum needs only atomicity (nothing reads it before the kernel ends), which
#   is all CUDA's `atomicAdd` promises too (PTX ISA, memory consistency model). The option relaxes the adds of those
#   four kernels; `fused-head` and `relaxed-head`, `splitk` and `relaxed-splitk` time the fused head and the
#   split-K weight gradients again, each without and with it, in the same run. The relaxed adds were faster than
#   the default engine beyond the spread in every case of both models in bf16 and tf32 (the table below). With
#   acquire-release adds the fused head and the split-K kernel lost; with relaxed ones the split-K kernel was mixed
#   (faster for the FastTransformer, slower for GPT-2), and the fused head (`relaxed-head`) was faster than the
#   relaxed adds alone in bf16 in every run of both models, and mixed in tf32 (faster in some runs, slower in
#   others). So both are defaults now: the relaxed adds in every precision, the fused head under bf16 and fp16.
# * `fuse_mlp_act` puts each MLP's GELU in the epilogues of a Triton tile GEMM (`kernels/gelu_mlp.py`;
#   forward the up-projection stores z and gelu(z), backward the product through the down-projection is
#   multiplied by gelu'(z) before it is stored). It removes the two elementwise GELU kernels of every
#   block, and its GEMMs run on Triton instead of cuBLAS. In GPT-2 the step ends up with more kernels,
#   not fewer: the up-projection's bias gradient, which the default path sums inside its GELU kernel
#   (`fc_bias_into_gelu`), takes a column sum and a reduction of its own (the probe's kernel list).
# * The `persistent norm dw` variant of "What each kernel buys" puts the norm backwards' weight-gradient partials
#   one per program instead of one per row tile.
# * `wgrad_splitk` (an option) adds each Linear's weight gradient into the flat gradient from a split-K Triton GEMM.
#   In the engine it lost with acquire-release adds and was mixed with relaxed ones.
# * `wgrad-stream` (`wgrad_side_stream`; a default under bf16 and fp16) moves work rather than removing
#   it. A Linear's backward makes two products of its output gradient dy: dx = dy W, which the layers below
#   wait for, and dW = dyᵀ x, which only the optimizer reads, after the whole backward. The option queues
#   each dW GEMM (and GPT-2's qkv bias sum) on a second CUDA stream as soon as dy is ready and joins that
#   stream once, after the backward, so the weight gradients can run beside the chain of input-gradient,
#   attention and norm kernels, most of which fill only part of the GPU at this size
#   (`ftlib/training/engine/wgrad_stream.py`). Both streams are captured in the one graph. The same split
#   of the backward drives zero-bubble pipeline schedules (Qi et al., arXiv:2401.10241), which move the
#   weight-gradient part later in time. In tf32 the trial was mixed (the table below), so tf32 and fp32
#   keep one stream.
# * `attn-bwd-streams` (`attention_bwd_streams`; a default) does the same inside the attention backward.
#   Its dQ kernel forms D = rowsum(dO ∘ O), which the dK/dV kernel reads, so the two run one after the
#   other, each with a few hundred programs at this size. With the option the dK/dV kernel forms D itself
#   (one more load of O per query tile it visits), the two kernels share no data, and the dK/dV kernel
#   runs on a side stream beside the dQ kernel (`concurrent` in `kernels/attention.py`).
# * `fuse_softmax_matmuls` (GPT-2's attention on the kernels above that write P and fuse the
#   products around it) for GPT-2 as written, the one model whose attention it changes.
# * `attention_kv_split`: how many dK/dV programs share the FastTransformer's one K/V head and its 8 query
#   heads, each writing a partial that the split sum adds up. The launcher's own choice aims at about two
#   programs per SM, which at this size is 4 per K/V head on a GPU with 132 SMs. Splits of 8 and 2 lost
#   while the dK/dV kernel ran after the dQ kernel. With `attn-bwd-streams` it runs beside the dQ kernel,
#   which takes part of the GPU, so both went on trial again as `split 8 beside dQ` and `split 2 beside dQ`
#   (rows never counted with the earlier trial's). The split of 8 lost again. The split of 2 won and is a
#   default now (`attention_kv_split=2`, where 2 divides a model's query heads per K/V head), and `-kv-split-2`
#   gives the dK/dV kernel back the launcher's choice.
# * `bias-into-buffer`, `bf16-bias-weights` and `branch-bias-into-norm` concern GPT-2's Linear biases, which
#   the FastTransformer does not have; `all-bias-options` was all of them with `first-norm-into-buffer`, and
#   the four are defaults now. With
#   the bias kernel alone, each bias costs a column sum into partial rows, a torch sum of those rows and
#   autograd's add into the flat gradient, and in bf16 one autocast cast of its layer's weight and one of
#   the bias per step. `bias-into-buffer` adds each program's column sums straight into the bias's view of
#   the flat gradient with atomic adds (`bias_grad_add_` in `kernels/bias_linear.py`); `bf16-bias-weights`
#   lets those layers read the step's one bf16 copy of the flat buffer, as the FastTransformer's Linears
#   already do; `branch-bias-into-norm` takes the column sums of the attention's and the MLP's output
#   projections inside the residual-norm backward that computes their gradient (`drb_out` in
#   `kernels/residual_norm.py`), so no kernel reads that gradient again for them. None changes what is
#   computed: the same fp32 column sums (added in another order; in bf16 the norm backward sums the
#   gradient before it is rounded to bf16), the same bf16 values.
# * `first-norm-into-buffer`: every norm but one follows a residual add and runs on the fused residual-norm
#   kernels; the first block's first norm has no add before it and runs its own kernel, whose backward leaves
#   partial rows for a torch sum and autograd's add per parameter (GPT-2's LayerNorm backward there also takes
#   one row per step of a loop). The option runs that norm's backward on the fused residual-norm's kernel with
#   no incoming residual gradient, its weight (and bias) gradients added into the flat gradient
#   (`kernels/norm_into.py`).
# * `explicit-one-pass`: GPT-2's attention forward passes over each row's keys twice, once for the row's
#   max and sum and once to write P and multiply it by v, and its dQ kernel twice too, once for the row
#   sums D = rowsum(P * dP) and once for dq, because each key tile needs a number only the whole row
#   gives. At T = 256 a whole row of scores fits one tile in registers, and each kernel passes once:
#   q kᵀ is formed once forward, P is read once and dO vᵀ formed once in the dQ kernel. The products
#   then run over the keys past the diagonal too (masked to zero, never loaded), a small cost at head
#   size 32. The sweep below times these kernels at every query-tile height and warp count.
# * `explicit-dq-one-pass`: the dQ kernel of `explicit-one-pass` alone, the forward left on two passes, at
#   the tile where the sweep below found it faster than the two-pass kernel: 64 query rows on 4 warps (one
#   warpgroup), the whole row of keys in one tile. It is a default now (the table below gives its trial).
#   Its 64 rows of fp32 scores need more shared memory than a Tesla T4 gives a block, so below sm_80 the
#   engine leaves the two-pass kernel in place.
# * `qkv-bias-into-attention` (lost its trial; an option): GPT-2's qkv projection adds a bias, whose gradient is
#   the column sums of d(qkv) = [dq | dk | dv] over the batch and the sequence. The attention's backward kernels
#   hold each of those values once, as they store it, so each adds its tile's column sums into the bias's view of
#   the flat gradient with atomic adds (`db_out` in `kernels/explicit_attention.py`), and the column-sum kernel
#   that would read d(qkv) back goes: one kernel and one read of a (B·T, 3C) tensor per layer. The K part of that
#   gradient is zero in exact arithmetic (a key bias shifts a whole row of scores by the same amount, which the
#   softmax ignores); the kernels add it as computed, as the column sum would. It lost: the sums and their atomic
#   adds cost the attention's backward kernels more time than the column-sum kernels they replace took (the table
#   below).
# * `fc-bias-into-gelu` (a default now): the MLP's up-projection bias gradient is the column sums of dz, the
#   output of GELU's backward. The option runs GELU's backward on the column-sum kernel itself
#   (`gelu_bwd_bias_add_` in `kernels/bias_linear.py`): it reads z and da, writes dz = da · gelu'(z) and adds the
#   column sums of dz as stored into the flat gradient, so the elementwise GELU-backward kernel and the column sum
#   that read dz back become one kernel per layer. `both-bias-sums` is the two options together.
# * `fused-head-loss` (`fuse_head_loss`; a default under bf16 and fp16 now, `-fused-head` switches it off): the
#   vocabulary is 65 characters, so the head is
#   a GEMM with 65 output columns. A row of its output (130 bytes in bf16) is not a multiple of 16 bytes, and cuBLAS
#   runs its kernels for unaligned operands there (the `align1` kernels in the step's profile). The step runs that
#   GEMM, then the cross-entropy kernel, then two more such GEMMs for dx and dW, with the (B·T, 65) logits and their
#   gradient going through memory between them. The option keeps a block of 64 rows' logits (padded to 128 columns)
#   in registers: one kernel forms them, their log-sum-exp and the loss; the backward kernel forms them again and
#   from the same tile makes g = softmax − one-hot (scaled by the loss's incoming gradient), dx = g W and dW = gᵀ x,
#   the last added into the head's view of the flat gradient with atomic adds (`kernels/linear_cross_entropy.py`).
#   Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024, section 3.3) avoids the logits the same way to save
#   memory at large vocabularies; here what goes is kernels and unaligned GEMMs. The logits are fp32 inside the
#   kernels, where the unfused bf16 step rounds them to bf16. It lost its first trial: with acquire-release adds into
#   dW its two kernels take longer than the GEMMs and the loss kernel they replace (the kernel table of section 2
#   times both ways alone). On relaxed adds it won in bf16 (`relaxed-head` above) and was mixed in tf32, so tf32 and
#   fp32 keep cuBLAS's head GEMMs and the loss kernel.
# * `pack-heads` (`attention_pack_heads`; won too little to become a default; an option) changes where rows sit
#   in a tile, not what they sum. The
#   FastTransformer's eight query heads share one K/V head, yet each program of the attention's forward and dQ
#   kernels holds a block of positions of one head and loads every K/V block it needs, so each K/V block travels
#   from L2 to the SMs once per head. The option packs the eight heads of a block of positions into one tile (row r
#   holds position r / 8 of head r mod 8; `kernels/attention_kernels.py`), so each K/V block loaded serves all
#   eight and a tile holds as many rows as before. The FlashAttention repository's Hopper kernels (FlashAttention-3)
#   pack the query heads of a K/V group the same way (their `PackGQA` option). The dK/dV kernel already loops
#   over the query heads of its K/V head, so it stays as it is. The step got faster by a few microseconds only,
#   beyond the spread in some runs and not in others (the table below), and the attention kernels timed alone
#   (section 2's kernel table, variants v8 and v9) take about as long packed as unpacked: loading each K/V block
#   from L2 eight times was not what held these kernels back. At head size 32 each program does little work per
#   block it loads, so their time goes to latency more than to traffic, which is also why the tile sweep found no
#   larger tile faster. The ledger above shows how far above their floors the attention kernels run.
# * `heavy-first` (`attention_heavy_first`; won its trial in bf16 and tf32: a default, with its ablation
#   `fasttransformer -heavy-first`) changes the order in which the attention's programs start, not what they
#   compute. Under the causal mask the forward's and dQ's last query block visits every key block and the first
#   visits one; the dK/dV kernel's first key block is visited by every query block. In the grid's natural order the
#   light blocks of each row launch first and the heavy ones last, so the kernel ends on a tail of its longest
#   programs. The option swaps each grid's axes so the heaviest block of every row starts first and
#   the light ones fill in behind it: longest processing time first, the order of the `SingleTileLPTScheduler` among
#   the FlashAttention repository's tile schedulers. Alone (section 2's kernel table, variants v10 and v11 against v6
#   and v4) the attention's forward and backward got faster, and so did the step, with the other stream's kernels
#   beside them (the table below). Pairing the dK/dV kernel's key blocks instead (v12 and v13), so every program has
#   the same work, did not help as much.
# * `explicit-heavy-first` (`explicit_heavy_first`; won its trial in bf16, mixed in tf32: a default under bf16 and
#   fp16 only, as the fused head and the weight-gradient stream, with its ablation `gpt2 -explicit-heavy-first`) is
#   the same order for GPT-2's own attention kernels, which still write the probabilities it materializes: their forward
#   and dQ kernels' query blocks and their dK/dV kernel's key blocks are unequal under the causal mask in the same
#   way. Section 2's kernel table times them alone (`explicit_attention_dev`'s v5 and v7 against v4 and v6).
# * `pdl` (`programmatic_launch`; lost its trial: an option, off) changes when each Triton kernel starts, not what it
#   computes. In the step's CUDA graph a kernel still starts only once the one before it in its stream has ended, and
#   its programs then take a while to spread over the SMs; at this size most kernels run for a few microseconds, so
#   these boundaries are a good part of the step (the ledger's kernel count). With programmatic dependent launch
#   (CUDA programming guide, "Programmatic Dependent Launch and Synchronization"; sm_90 and later) a kernel may be
#   launched while the one before it still runs: its programs wait on the GPU (`griddepcontrol.wait`) until that
#   kernel's writes are visible, then go on. Every kernel of ours waits first thing, before any load or store
#   (`kernels/pdl.py`), so the results are the same bit for bit; what can change is the gap between kernels. cuBLAS's
#   GEMMs between them are launched as before. The FastTransformer's step got slower, not faster, and GPT-2's did
#   not change beyond the spread (the table below). A likely reading of the slowdown, not measured apart: a
#   kernel's programs launched early sit on the SMs waiting, and in this step those SMs are wanted by the
#   weight-gradient GEMMs and the attention kernel of the other stream, which run beside the main stream's chain.
# * `pdl-exit` (`programmatic_launch` with `programmatic_trigger='exit'`; lost its trial too: an option, off) tested
#   that reading: the same launches, but no kernel of ours signals early (`griddepcontrol.launch_dependents`), so the
#   next kernel is launched only as each one's programs end, by the implicit trigger at a program's exit, and takes
#   SMs only as they free. What it could still win was the launch itself and the time its programs take to reach the
#   SMs. The FastTransformer step got slower, by as much as with the early signal or more (the table below), and
#   GPT-2's was faster in some runs and slower in others, so the early signal was not what PDL cost here. What the
#   table cannot say, and no profile here measured apart, is where that time goes instead: the graph's programmatic
#   edges, or the `wait` each kernel now opens with.
#
# The lines under the table give, per option, how often it was faster beyond the spread, its 100-step
# check, and whether the engine's defaults set it. A case whose `changes the step` is False ran the
# same step as its default (the option does not apply to that model or precision): it does not count
# for or against the option; `–` marks rows stored before the engine described that option.

# %%
if cand_rows:
    show_frame(option_trials.candidate_table(cand_rows), digits=3,
               preview=["device", "precision", "engine", "option", "default ms", "option ms", "delta µs",
                        "beyond spread"])
    display(Markdown(option_trials.candidate_summary(cand_rows, crows)))
else:
    print("not measured yet: bash ci/gpu-run --only engine_candidates")
display(Markdown(option_trials.unmeasured_text(cand_rows)))

# %% [markdown]
# ### Tiles and grids, swept
# Launch choices are swept at the headline shape before any goes on trial: the attention
# kernels' tiles (block sizes, warps and pipeline stages, forward and backward apart;
# `benchmarks/kernels/attention_tiles_dev.py`), the same tiles for GPT-2's explicit-attention kernels in
# bf16 and tf32 (`benchmarks/kernels/explicit_tiles_dev.py`: they also store and load the probabilities; its
# 'one-pass' variants are the kernels of `explicit-one-pass`, at each query-tile height and warp count: in the
# backward that is the one-pass dQ kernel, which the engine runs by default through `explicit-dq-one-pass`,
# while the one-pass forward is no default; its 'one-pass ... + dkdv' variants keep the engine's one-pass dQ
# kernel and try each tile on the dK/dV kernel), and
# the residual-norm backward's grid (rows per tile, programs per SM;
# `benchmarks/kernels/norm_bwd_grid_dev.py`). Each variant is checked against the
# fp64 reference, then timed in a CUDA graph; below, each sweep's fastest variants, the launcher's default
# and the variant the engine runs (`the engine's`), and whether the fastest differs from the default by more
# than the spread of the replays. Only such a difference goes on trial in the engine, where the whole step
# decides.

# %%
sweep_tab = sweeps.sweep_table(krows)
if len(sweep_tab):
    show_frame(sweep_tab, digits=4)
    display(Markdown("\n".join(f"- {s}" for s in sweeps.sweep_findings(krows))))
display(Markdown(sweeps.unswept_text(krows)))

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
