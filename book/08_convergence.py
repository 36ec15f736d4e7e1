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
# # 8. Convergence, done properly
#
# The post compares one training-loss point: step 200 of two models that were initialized
# differently (PyTorch defaults for GPT-2, N(0, 0.02) for FastTransformer) and decayed
# different parameter groups, on batches taken in order, with no held-out data. Its
# "perplexity 11.98 vs 12.45" is exp(loss of step 200's training batch).
#
# This chapter redoes it: the same initialization scheme and optimizer groups for every
# model, validation loss on the held-out 10%, three seeds with their spread, runs long
# enough to separate and overfit, and curves against steps, tokens and wall-clock time.
# Then a speedrun: the least time on the H200 to validation loss 1.50.
#
# With `MEASURE = True` the chapter trains on this machine (tiny models when `SMOKE = True`; with
# `SMOKE = "t4"` the post's own experiment only, at full size) and stores the rows; otherwise it
# shows the rows stored by `ci/gpu-run`.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/08_convergence.ipynb)

# %% tags=["parameters", "hide-cell"]
DEVICE = "auto"
# With MEASURE: True, small models (CI, CPU); "t4", the post's models at full size in the precisions this
# GPU runs, about ten minutes on a T4 (what Colab sets); False, every case (ftlib.harness.profiles).
SMOKE = True
MEASURE = False
CHECKPOINT = "checkpoints/speedrun.pt"  # where section 6 saves the model it trains

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
from ftlib.core.device import device_slug, pick_device
from ftlib.harness.convergence import checkpoint_roundtrip
from ftlib.harness.plans import plan_here, run_plan
from ftlib.harness.profiles import checkpoint_smoke, part, rows_device, view_smoke
from ftlib.harness.studies import FAIR, REFERENCE, REPEATED
from ftlib.views import convergence as cv
from ftlib.views import leaderboard as lb
from ftlib.views import record as rec
from ftlib.views import speedrun as sr
from ftlib.views.bench import provenance_line
from ftlib.views.plots import show
from ftlib.views.tables import group_rows, show_frame

device = pick_device(DEVICE)
TINY = part("08", view_smoke(SMOKE, MEASURE), "convergence").tiny  # the models the views look for
if MEASURE:  # every study (tiny with SMOKE=True), or the T4 profile: the post's experiment at full size
    plan = plan_here("08", SMOKE, device)
    print(plan.announce())
    run_plan(plan, device)


def stored(bench):
    """The suite's rows at this chapter's size: this device's when measuring (small models or every
    study), else every stored GPU's, this one's included under the T4 profile.

    Tables carry a device column and figures are drawn per device, so runs of different devices
    (or a smoke run's tiny models) are never pooled.
    """
    return cv.stored_rows(bench, rows_device(SMOKE, MEASURE, device_slug(device)), smoke=TINY)


# %% [markdown]
# ## 1. The post's experiment, as it ran
# Original inits, original optimizer groups, 200 sequential batches, seed 42 (and two more
# seeds). "Perplexity" as the post computed it is exp(loss of the last training batch); the
# held-out perplexity is exp(validation loss).

# %%
orig = stored("convergence-original")
if not orig:
    print("No stored rows for convergence-original yet: run ci/gpu-run (or this chapter with MEASURE=True).")
else:
    print("Measured on:", provenance_line(orig))
    show_frame(cv.original_table(orig), preview=cv.ORIGINAL_PREVIEW)

# %% [markdown]
# ## 2. A fair comparison
# Every model below uses the `gpt2` initialization (N(0, 0.02), residual projections scaled
# by 1/√(2L)), decays only its matrices, and follows nanoGPT's optimizer recipe at the
# post's batch shape (B = 32, T = 256). The recipe:

# %%
show_frame(cv.recipe_table(FAIR))

# %% [markdown]
# The curves below show the mean over seeds with the min–max range as bars. Their loss axis runs
# from just under the lowest loss to the loss of the second evaluation, so that the end of
# training, where the models differ, is readable; the first evaluation (about 4.2, the loss of
# a uniform guess over 65 characters) is above the frame. The time axis counts the training steps
# after the first: the startup (building the model and the first, compiling step) is in the table
# above the curves, because a process with a cold compile cache pays it once and the seeds after
# it barely at all.

# %%
fair = stored("convergence")
if not fair:
    print("No stored rows for convergence yet.")
else:
    print("Measured on:", provenance_line(fair))
    show_frame(cv.seed_table(fair))
    for name, fig in cv.loss_figures(fair):
        show(fig, name)

# %% [markdown]
# ## 3. nanoGPT's recipe, the reference
# nanoGPT's shakespeare_char model with its own recipe (dropout 0.2, B = 64, lr 1e-3, bf16,
# compiled), run past the point where it starts to overfit.

# %%
nano = stored("convergence-nanogpt")
if not nano:
    print("No stored rows for convergence-nanogpt yet.")
else:
    print("Measured on:", provenance_line(nano))
    show_frame(cv.seed_table(nano))
    for name, fig in cv.train_val_figures(nano):
        show(fig, name)

# %% [markdown]
# ## 4. The speedrun: least time to validation loss 1.50
# Each candidate trains until its validation loss first reaches 1.50 (evaluated every 50
# steps). Every candidate runs in the same loop with the same batches and evaluation; what
# differs is the model, the recipe and the execution: `torch.compile` (nanoGPT's choice) or the
# book's engine (Triton kernels, a flat AdamW, the whole step replayed as one CUDA graph;
# `ftlib.training.engine`). The engine's attention kernel has no dropout, so the "attention
# dropout 0" candidates keep nanoGPT-style dropout on the embeddings and residual branches only
# (`ModelConfig.attn_dropout`); the "fused dropout" ones draw their residual dropout inside the
# fused residual-norm kernels (chapter 6), which changes the random stream, not the distribution
# of the masks.
#
# The later candidates take what the public speedruns found (Jordan et al. 2024, "Muon: An optimizer
# for hidden layers in neural networks"; the modded-nanogpt speedrun): Muon for the matrices inside the
# blocks, with AdamW for the embeddings, the head and the gains (`ftlib.training.muon`), and a learning
# rate held, then cooled linearly to a tenth (the "trapezoid"); some add ReLU², QK-norm and logit
# soft-capping. Muon orthogonalizes each matrix's update with five Newton-Schulz iterations. One matrix
# at a time, at this model's size, that is a few hundred short kernels per step, so the "grouped Muon"
# candidates run the same update with the matrices of each shape stacked into one batched iteration
# (the engine option `muon_grouped`, `ftlib.training.muon.muon_update_grouped_`).
#
# The record the book aims at: validation loss 1.50 in at most 1.5 s of training steps, and nanoGPT's
# best, 1.4697, in at most 3 s, each as a mean over at least five seeds that all reach it. The findings
# at the end of the chapter set each goal against the closest result.
#
# The rules are those of the public NanoGPT speedrun (modded-nanogpt):
#
# 1. **Only training steps are timed.** Compilation, the engine's kernel JIT, warm-up and graph
#    capture are paid once before the first step; they are reported apart ("startup") and not
#    counted. Evaluation is never timed. The claimed time of a candidate is the mean over its
#    seeds of the training-step time to the first evaluation at or below the target. (The first
#    step, which holds the compilation, goes untimed with it: one step of about a thousand.)
# 2. **The loss must be significantly at or below the target.** Over the seeds, the validation
#    losses at the stop must have a mean at or below the target with p < 0.01 (a one-sided
#    one-sample t-test); a candidate with one seed has no p-value. A run stops at the first
#    evaluation at or below 1.50, so the estimate that stopped it is at or below 1.50 by
#    construction, and a test on it leans towards passing. The loss on the whole split (rule 3)
#    did not decide the stop: where every seed has it, the test is made on it (the table says
#    which loss each p-value comes from).
# 3. **The loss is checked on the whole split, and tokens are counted.** The validation loss
#    that stops a run is an estimate from 50 random batches. At the stop, the loss on the whole
#    validation split (every position once, in consecutive windows of 256) is computed too, off
#    the clock, and shown beside it; so are the tokens trained on (steps × batch × block) beside
#    the seconds. Runs stored before the whole-split loss was recorded show a gap there.
# 4. **Only the model and the recipe change.** Every candidate is a model and a recipe one can
#    write in nanoGPT's own code (the engine executes the same math); the validation split is used
#    only to decide when to stop.
#
# A candidate enters the leaderboard only if every seed it ran reached the target; the others
# are listed below it, with how many seeds did not. nanoGPT's recipe is the reference, and each
# candidate's speed-up is its mean time against nanoGPT's. A second target is the best validation
# loss nanoGPT's README reports for this recipe, 1.4697; only runs aimed at it or lower count
# for it. Rows of different GPUs are never pooled.
#
# Every candidate runs seed 0 first. The fastest of them, the reference, and the candidates listed
# in `ftlib.harness.studies.ALL_SEEDS` then run seeds 1-4. Below the leaderboard, every run, and
# the book's verdict on its own goal (3x nanoGPT's speed, `ftlib.views.speedrun.speedrun_verdict`).
# The verdict takes the fastest candidate that reached 1.50 on every seed it ran, at least three,
# and compares it with the reference seed by seed on the seeds both ran, so its speed-up can differ
# from the leaderboard's ratio of means.

# %%
speed = stored("speedrun")
record = stored("speedrun-record")  # runs aimed at the second target, nanoGPT's best loss
ok_speed = cv.ok_runs(speed)
verdicts = {}  # device -> the speedrun's verdict on that device's runs
if not ok_speed:
    print("No stored rows for speedrun yet.")
else:
    print("Measured on:", provenance_line(ok_speed))
for dev, dev_rows in group_rows(speed + record).items():
    show_frame(lb.leaderboard(dev_rows, dev), digits=4, preview=lb.LEADERBOARD_PREVIEW, caption=f"leaderboard on {dev}")
    # The reference and the leading candidates: every seed's curve, by rank (names in the table).
    show(lb.leaderboard_figure(dev_rows, dev), f"speedrun-leaderboard-{dev}")
    dev_ok = cv.ok_runs(dev_rows)
    show_frame(sr.runs_of(dev_ok, dev), digits=4, preview=sr.RUNS_PREVIEW, caption=f"every run on {dev}")
    v = verdicts[dev] = sr.speedrun_verdict(dev_ok)
    print(sr.verdict_text(v, dev))
v = next((verdicts[d] for d in sorted(verdicts) if verdicts[d] is not None), None)

# %% [markdown]
# ### Grouped against per-matrix Muon, in one call
# The grouped update computes what the per-matrix one computes (`tests/test_muon.py` holds the two
# equal to float rounding), so the two should differ in time per step only. The suite
# `speedrun-muon-trial` runs the leading grouped candidate and its per-matrix twin on the same seeds,
# alternating, in one call; the test on the seeds' best losses says whether they differ beyond the
# seeds.

# %%
trial = stored("speedrun-muon-trial")
if not trial:
    print("The Muon trial has no stored rows yet: python ci/gpu_train.py --suites speedrun-muon-trial on a GPU.")
for dev in sorted(group_rows(trial)):
    trial_table, trial_text = rec.muon_trial(trial, dev)
    if len(trial_table):
        show_frame(trial_table, digits=4, caption=f"the Muon trial on {dev}")
    print(trial_text)

# %% [markdown]
# ### How much of a speed-up is noise
# Fixing the seed fixes the initial weights, the batches and the dropout masks, but not the
# run. The GPU's atomic adds (the embedding backward) and reduction orders differ from run to
# run, the tiny differences grow, and near a loss floor they move the step where the
# validation loss first crosses 1.50. Some candidates were run again on a fresh machine
# from the same commit, with the same seeds, and the `speedrun-repeat` suite runs
# every seed of the reference and of two finalists (`REPEATED`) a second time
# (`speedrun-repeat.jsonl`). The verdict above uses the first run of each seed; the table
# shows how far a second run of the same seed lands from it. A speed-up within that spread
# of the target is not a robust result, so the pooled verdict below treats every run, first
# or repeat, as one sample of the time to 1.50: the ratio of the pooled means, with a 90%
# bootstrap interval (`ftlib.views.speedrun.speedrun_pooled`).
#
# The two sides are not equally noisy. The candidate's step is one CUDA graph replay, so its
# time per step hardly moves between machines; what moves is the step at which it crosses
# 1.50. The reference runs `torch.compile`'s default mode, which launches every kernel from
# Python, so its time per step also follows the host's CPU: its repeats, run later on
# another machine, were slower per step than its first runs at about the same step counts.
# Pooling credits the candidate for that, so the table also gives a floor: the candidate's
# mean against the reference's single fastest run.

# %%
repeats = stored("speedrun-repeat")
if not (repeats and ok_speed):
    print("No repeated speedrun runs stored.")
else:
    print("Measured on:", provenance_line(repeats))
first_runs = group_rows(ok_speed)
for dev, dev_repeats in group_rows(repeats).items():
    show_frame(sr.repeat_table(first_runs.get(dev, []), dev_repeats), digits=4, preview=sr.REPEATS_PREVIEW)
    pooled = sr.pooled_table(first_runs.get(dev, []), dev_repeats, REPEATED, dev)
    if len(pooled):
        show_frame(pooled, digits=4)

# %% [markdown]
# ## 5. What the trained models write
# 300 characters sampled (temperature 0.8, top-k 40) from each model at the end of its run.

# %%
written = sr.samples(fair or [], ok_speed, group_rows(ok_speed))
if written:
    print(written)

# %% [markdown]
# ## 6. A checkpoint, saved and loaded back
# The speedrun's winner trained once more to 1.50 on this machine (with `SMOKE`: a tiny
# version for 20 steps on PyTorch ops), saved with `ftlib.training.trainer.save_checkpoint` (config,
# recipe, result and a plain `GPT` state dict, also when the engine trained it in its flat
# buffers), then loaded with `load_checkpoint` into a fresh model. The reloaded model must
# give the same logits on a held-out batch and sample the same text.

# %%
from ftlib.training.data import load_tinyshakespeare

winner = v["candidate"] if v is not None else REFERENCE
text_ds = load_tinyshakespeare()  # the character dataset (its training split also counts epochs below)
ck = checkpoint_roundtrip(winner, text_ds, device, CHECKPOINT, smoke=checkpoint_smoke(SMOKE))
print("saved to", CHECKPOINT)
show_frame(cv.checkpoint_table(ck), digits=3)
assert ck["max |logit difference|"] == 0.0 and ck["same sample"] and ck["config hash matches"]

# %% tags=["nbval-ignore-output"]
print(ck["sample"])  # a few hundred characters from the reloaded model (varies with the CPU's arithmetic)

# %% [markdown]
# ## What we found
# Computed from the rows above, per GPU: the fair comparison, the speedrun's leaderboard per
# target, the Muon trial, and each record goal against the closest result (for a target reached, its time split
# into steps and time per step; for one not reached, the lowest best loss any candidate reached,
# and how far its loss had risen again by the end of the run: a loss that turns up is the model
# overfitting the training split, which more steps do not cure).

# %%
print(cv.fair_findings(fair, "python ci/gpu_train.py --suites convergence-original,convergence"))
for dev in sorted(group_rows(speed)) or [device_slug(device)]:
    print()
    print(lb.findings(speed + record, dev))
    print(rec.limits(speed + record, dev, train_tokens=len(text_ds.train)))
    if trial:  # grouped against per-matrix Muon: same seeds, one call
        print(rec.muon_trial(trial, dev)[1])

# %% tags=["remove-cell"]
# Colab: keep your rows: only on Colab. Zip the rows measured on this GPU, to download or keep;
# from a checkout of the book, python ci/ingest-results <unzipped folder> --gpu <gpu> adds them.
if "google.colab" in sys.modules:  # pragma: no cover - only on Colab
    from ftlib.core.device import device_slug, pick_device
    from ftlib.harness.colab import pack_results

    print(pack_results("/content/fasttransformer-rows.zip", device_slug(pick_device("auto"))))
