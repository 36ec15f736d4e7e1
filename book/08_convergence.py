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
# With `MEASURE = True` the chapter trains on this machine (tiny models when `SMOKE`) and
# stores the rows; otherwise it shows the rows stored by `ci/gpu-run`.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/fasttransformer-book/fasttransformer-book/blob/main/book/08_convergence.ipynb)

# %% tags=["parameters"]
DEVICE = "auto"
SMOKE = True
MEASURE = False
CHECKPOINT = "checkpoints/speedrun.pt"  # where section 6 saves the model it trains

# %%
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

# %%
import math

import plotly.graph_objects as go

from ftlib.benchview import provenance_line
from ftlib.convergence import (
    FAIR,
    REFERENCE,
    REPEATED,
    SUITE_ORDER,
    TARGET_LOSS,
    aggregate,
    checkpoint_roundtrip,
    repeat_table,
    run_suites,
    speedrun_curves,
    speedrun_pooled,
    speedrun_verdict,
    summary,
)
from ftlib.env import pick_device
from ftlib.plots import show
from ftlib.results import load_rows
from ftlib.tables import show_table

device = pick_device(DEVICE)
if MEASURE:
    run_suites(SUITE_ORDER, device, smoke=SMOKE, budget_s=600)


def stored(bench):
    """Rows of a bench: this device's fresh ones when measuring, else the committed GPU ones."""
    return load_rows(bench, include_cpu=MEASURE)


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
    show_table([
        {"model": r["model"], "seed": r["seed"], "steps": r["steps_done"],
         "post's perplexity exp(batch loss)": math.exp(r["history"][-1]["batch_loss"]),
         "train perplexity exp(train loss)": math.exp(r["history"][-1]["train_loss"]),
         "validation perplexity exp(val loss)": math.exp(r["history"][-1]["val_loss"])}
        for r in sorted(orig, key=lambda r: (r["seed"], r["model"]))
    ])

# %% [markdown]
# ## 2. A fair comparison
# Every model below uses the `gpt2` initialization (N(0, 0.02), residual projections scaled
# by 1/√(2L)), decays only its matrices, and follows nanoGPT's optimizer recipe at the
# post's batch shape (B = 32, T = 256). The recipe:

# %%
show_table([{"field": k, "value": str(v)} for k, v in FAIR.__dict__.items() if k != "seed"])

# %%
fair = stored("convergence")
if not fair:
    print("No stored rows for convergence yet.")
else:
    print("Measured on:", provenance_line(fair))
    show_table(summary(fair))
    agg = aggregate(fair)
    for axis, label in (("step", "optimizer step"), ("tokens", "tokens seen"), ("time_s", "training time (s)")):
        fig = go.Figure()
        for model, pts in agg.items():
            x = [p[axis] for p in pts]
            fig.add_trace(go.Scatter(x=x, y=[p["val_mean"] for p in pts], mode="lines", name=model,
                                     error_y=dict(type="data", symmetric=False,
                                                  array=[p["val_max"] - p["val_mean"] for p in pts],
                                                  arrayminus=[p["val_mean"] - p["val_min"] for p in pts])))
        fig.update_layout(title=f"Validation loss vs {label} (mean, min–max over seeds)",
                          xaxis_title=label, yaxis_title="validation loss", height=420)
        show(fig, f"convergence-val-{axis}")

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
    show_table(summary(nano))
    pts = aggregate(nano)["nanogpt-char"]
    fig = go.Figure([
        go.Scatter(x=[p["step"] for p in pts], y=[p["val_mean"] for p in pts], name="validation"),
        go.Scatter(x=[p["step"] for p in pts], y=[p["train_mean"] for p in pts], name="train"),
    ])
    fig.update_layout(title="nanogpt-char: train and validation loss (mean over seeds)",
                      xaxis_title="step", yaxis_title="loss", height=400)
    show(fig, "convergence-nanogpt")

# %% [markdown]
# ## 4. The speedrun: least time to validation loss 1.50
# Each candidate trains until its validation loss first reaches 1.50 (evaluated every 50
# steps; evaluation time is not counted). Every candidate runs in the same loop with the
# same batches and evaluation; what differs is the model, the recipe and the execution:
# `torch.compile` (nanoGPT's choice) or the book's engine (Triton kernels, a flat AdamW,
# the whole step replayed as one CUDA graph; `ftlib.engine`).
#
# Time is counted twice. *Time to target* is all wall time of training steps, the startup
# included: for `torch.compile` the first step, which compiles; for the engine its
# construction (kernel JIT, warm-up steps, graph capture) and first step. *Excluding
# startup* counts the steps after the first only. A compiler's or Triton's on-disk cache
# warmed by an earlier run shortens a startup, so the second figure is the steadier one.
# Rows stored before the startup was recorded have no value for it; a mean is over the
# seeds that recorded it. The engine's attention kernel has no dropout: candidates that keep
# dropout on the attention probabilities run attention through PyTorch's SDPA inside the
# captured step; the "attention dropout 0" candidates keep nanoGPT-style dropout on the
# embeddings and residual branches only (`ModelConfig.attn_dropout`), so the kernel runs.
# The "fused dropout" candidates go one step further: their residual dropout runs inside the
# engine's fused residual-norm kernels (chapter 6) instead of as separate dropout kernels. That
# changes the random stream, not the distribution of the masks, so it is an execution change
# like the engine itself.
#
# Every candidate runs seed 0 first. The fastest of them (excluding startup), the reference,
# and the candidates listed in `ftlib.convergence.ALL_SEEDS` then run seeds 1-4. The verdict
# (`ftlib.convergence.speedrun_verdict`) counts only candidates that reached 1.50 on every
# seed they ran, and at least three seeds. Among those it takes the one with the least mean
# time excluding startup and compares it with the reference seed by seed, on the seeds both
# recorded. This rule matters because the small models' validation loss bottoms out close
# to 1.50. A candidate that is fastest on the seeds where it gets there, but misses on one
# seed, has not met the target. If no candidate qualifies, the verdict reports the fastest
# one, how many of its seeds reached the target, and "not met".

# %%
speed = stored("speedrun")
ok_speed = [r for r in speed if r.get("status", "ok") == "ok"]
if not ok_speed:
    print("No stored rows for speedrun yet.")
else:
    print("Measured on:", provenance_line(ok_speed))
    table = summary(ok_speed)
    ref = next((r for r in table if r["model"].endswith("(reference)")), {})
    for r in table:
        for col, name in (("time to target s (mean)", "speed-up vs reference"),
                          ("excl. startup s (mean)", "speed-up excl. startup")):
            t, t_ref = r.get(col), ref.get(col)
            r[name] = (t_ref / t) if (t_ref and t) else None
    show_table(sorted(table, key=lambda r: (r["time to target s (mean)"] is None, r["time to target s (mean)"] or 0)))
    # Per run: how it executed, its startup, and when it got there.
    show_table([
        {"model": r["model"], "seed": r["seed"], "execution": r.get("execution", f"compile {r['recipe']['compile']}"),
         "precision": r["recipe"]["precision"], "B": r["recipe"]["batch_size"], "lr": r["recipe"]["lr"],
         "dropout": r["config"]["dropout"], "attn dropout": r["config"].get("attn_dropout"),
         "startup s": r.get("startup_s"),
         "steps to target": r.get("steps_to_target"), "time to target s": r.get("time_to_target_s"),
         "excl. startup s": r.get("time_to_target_excl_startup_s"), "best val loss": r["best_val_loss"]}
        for r in sorted(ok_speed, key=lambda r: (r["model"], r["seed"]))
    ], digits=4)
    failed = [r for r in speed if r.get("status", "ok") != "ok"]
    for r in failed:
        print(f"failed: {r['model']} (seed {r['seed']}): {r.get('error', '')[:200]}")
    v = speedrun_verdict(ok_speed)
    if v is None:
        print("No candidate has reached the target yet.")
    else:
        for how in ("excl. startup", "incl. startup"):
            x = v[f"speed-up {how}"]
            print(f"target {v['target']:g}x, {how}: {v['candidate']} (reached 1.50 on {v['seeds reached']} seeds): "
                  + (f"{x:.2f}x on seeds {v[f'seeds {how}']} -> {v[f'verdict {how}']}" if x else "no common seeds"))
        # The two finalists' runs: validation loss against training time without the startup.
        fig = go.Figure()
        for c in speedrun_curves(ok_speed, [REFERENCE, v["candidate"]]):
            fig.add_trace(go.Scatter(x=c["time_s"], y=c["val_loss"], mode="lines+markers",
                                     name=f"{c['model']}, seed {c['seed']}",
                                     line=dict(dash="dot" if c["model"] == REFERENCE else "solid")))
        fig.add_hline(y=TARGET_LOSS, line_dash="dash", annotation_text="target")
        fig.update_layout(title="Speedrun: validation loss vs training time, startup excluded",
                          xaxis_title="training time excluding startup (s)", yaxis_title="validation loss",
                          yaxis_range=[1.3, 2.6], height=520, legend=dict(orientation="h", y=-0.25))
        show(fig, "speedrun-curves")

# %% [markdown]
# ### How much of a speed-up is noise
# Fixing the seed fixes the initial weights, the batches and the dropout masks, but not the
# run. The GPU's atomic adds (the embedding backward) and reduction orders differ from run to
# run, the tiny differences grow, and near a loss floor they move the step where the
# validation loss first crosses 1.50. One device call ran some candidates again on a fresh
# machine from the same commit, with the same seeds, and the `speedrun-repeat` suite runs
# every seed of the reference and of two finalists (`REPEATED`) a second time
# (`speedrun-repeat.jsonl`). The verdict above uses the first run of each seed; the table
# shows how far a second run of the same seed lands from it. A speed-up within that spread
# of the target is not a robust result, so the pooled verdict below treats every run, first
# or repeat, as one sample of the time to 1.50: the ratio of the pooled means, with a 90%
# bootstrap interval (`ftlib.convergence.speedrun_pooled`).
#
# The two sides are not equally noisy. The candidate's step is one CUDA graph replay, so its
# time per step hardly moves between machines; what moves is the step at which it crosses
# 1.50. The reference runs `torch.compile`'s default mode, which launches every kernel from
# Python, so its time per step also follows the host's CPU: its repeats, run in a later
# device session, were slower per step than its first runs at about the same step counts.
# Pooling credits the candidate for that, so the table also gives a floor: the candidate's
# mean against the reference's single fastest run.

# %%
repeats = stored("speedrun-repeat")
if repeats and ok_speed:
    print("Measured on:", provenance_line(repeats))
    show_table(repeat_table(ok_speed, repeats), digits=4)
    pooled = [p for name in REPEATED if (p := speedrun_pooled(ok_speed, repeats, name)) is not None]
    show_table([{**p, "90% interval": f"{p['90% interval'][0]:.2f}-{p['90% interval'][1]:.2f}"} for p in pooled],
               digits=4)
else:
    print("No repeated speedrun runs stored.")

# %% [markdown]
# ## 5. What the trained models write
# 300 characters sampled (temperature 0.8, top-k 40) from each model at the end of its run.

# %%
for r in sorted(fair or [], key=lambda r: r["model"]):
    if r["seed"] == 0:
        print(f"--- {r['model']} (seed 0, best validation loss {r['best_val_loss']:.3f})")
        print(r["sample"])
# The speedrun's models, stopped at validation loss 1.50: the reference and the fastest.
reached = sorted((r for r in ok_speed if r["seed"] == 0 and r.get("time_to_target_s") is not None),
                 key=lambda r: r["time_to_target_s"])
for r in reached[:1] + [r for r in reached[1:] if r["model"].endswith("(reference)")]:
    print(f"--- speedrun: {r['model']} (seed 0, stopped at step {r['steps_to_target']}, "
          f"best validation loss {r['best_val_loss']:.3f})")
    print(r["sample"])

# %% [markdown]
# ## 6. A checkpoint, saved and loaded back
# The speedrun's winner trained once more to 1.50 on this machine (with `SMOKE`: a tiny
# version for 20 steps on PyTorch ops), saved with `ftlib.trainer.save_checkpoint` (config,
# recipe, result and a plain `GPT` state dict, also when the engine trained it in its flat
# buffers), then loaded with `load_checkpoint` into a fresh model. The reloaded model must
# give the same logits on a held-out batch and sample the same text.

# %%
from ftlib.data import load_tinyshakespeare

winner = v["candidate"] if ok_speed and v is not None else REFERENCE
ck = checkpoint_roundtrip(winner, load_tinyshakespeare(), device, CHECKPOINT, smoke=SMOKE)
print("saved to", CHECKPOINT)
show_table([{k: val for k, val in ck.items() if k != "sample"}], digits=3)
assert ck["max |logit difference|"] == 0.0 and ck["same sample"] and ck["config hash matches"]

# %%
# NBVAL_IGNORE_OUTPUT
print(ck["sample"])  # a few hundred characters from the reloaded model (varies with the CPU's arithmetic)
