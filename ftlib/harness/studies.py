"""What the training studies run: the fair convergence comparison and the speedrun's candidates.

Fair comparisons: every model gets the same initialization scheme ('gpt2'), the same AdamW
parameter groups (decay matrices only), the same recipe and the same held-out evaluation; several
seeds give a mean and spread.

The speedrun: least wall-clock time of training steps to validation loss 1.50 on TinyShakespeare,
nanoGPT's own recipe under ``torch.compile`` (the reference) against FastTransformer-style models
on the engine. Every candidate runs in the same loop (``ftlib.training.trainer.train``). The list
below holds what is still worth running: the reference and the finalists, which run every seed.
Candidates measured before and no longer run keep their rows (``data/results/<gpu>/speedrun.jsonl``,
each labelled in its ``model`` field, which is how the views show them); git keeps their recipes.
"""

from __future__ import annotations

from typing import Any

from ftlib.model.config import ModelConfig, preset
from ftlib.training.trainer import Recipe, recipe

# The book's fair comparison: nanoGPT's optimizer recipe at the post's batch shape.
FAIR = recipe("nanogpt-char", batch_size=32, steps=2000, decay_steps=2000, precision="tf32",
              compile="default", eval_interval=100, eval_iters=40)

REFERENCE = "nanogpt-char (reference)"
TARGET_LOSS = 1.50  # the speedrun's validation loss
# The second target: the best validation loss nanoGPT's README reports for its shakespeare_char
# recipe (karpathy/nanoGPT README, "the best validation loss is 1.4697").
NANOGPT_BEST_LOSS = 1.4697
SIGNIFICANCE = 0.01  # a claimed time needs p below this that the seeds' mean loss at the stop is <= the target
CLAIM_SEEDS = 3  # ... and at least this many seeds, every one of them at the target
# The record the book aims at on an H200, in training-step seconds (a claimed time, over at least
# GOAL_SEEDS seeds that all reach the loss): each target loss -> its time goal.
RECORD_GOALS_S = {TARGET_LOSS: 1.5, NANOGPT_BEST_LOSS: 3.0}
GOAL_SEEDS = 5
SEEDS = (0, 1, 2)
# The finalists get two seeds more: their best losses sit within ~0.01 of the target, so whether and
# when a seed reaches 1.50 varies, and the speed-up needs more than three samples.
FINALIST_SEEDS = (1, 2, 3, 4)
SUITE_ORDER = ("convergence-original", "convergence", "speedrun", "speedrun-repeat", "convergence-nanogpt",
               "speedrun-record", "speedrun-muon-trial", "speedrun-head-to-head")
RECORD_SEEDS = (0, 1, 2, 3, 4)  # the second target's runs: five seeds each, every candidate
# The Muon trial's seeds: ten for each way of running the update, since the batched products round
# differently and a small effect on the loss needs more seeds than the record suite runs to show.
TRIAL_SEEDS = tuple(range(10))
# A smoke run's model and recipe (CPU checks): everything shrunk, the horizons scaled down.
SMOKE_MODEL = dict(n_layer=1, n_embd=48, block_size=32)  # 48: divisible by 6 and 8 heads
SMOKE_RECIPE = dict(steps=20, batch_size=4, block_size=32, eval_interval=10, eval_iters=2, compile=None,
                    decay_steps=20, warmup=2, precision="fp32")


def fair_models() -> dict[str, ModelConfig]:
    """GPT-2, FastTransformer and one-change ablations, all with the same init scheme."""
    same = dict(init="gpt2")
    return {
        "gpt2": preset("gpt2", **same),
        "fasttransformer": preset("fasttransformer", **same),
        "gpt2 + MQA": preset("gpt2", n_kv_head=1, **same),
        "gpt2 + 2x MLP": preset("gpt2", mlp_ratio=2.0, **same),
        "gpt2 + RMSNorm": preset("gpt2", norm="rmsnorm", **same),
    }


# The engine options of the finalists. Their names (as stored in the rows) call bf16 norm outputs
# plus bf16 weights "bf16 weights and norms".
BF16 = (("bf16_norm_out", True), ("bf16_weights", True))
FUSED_DROPOUT = BF16 + (("fuse_dropout", True), ("dropout_rng4", False))  # one Philox call per element
FUSED_DROPOUT_RNG4 = BF16 + (("fuse_dropout", True), ("dropout_rng4", True))  # one per 4 columns
NN_DROPOUT = BF16 + (("fuse_dropout", False),)  # nn.Dropout modules

# The finalists, all the same model (256 x 6, FastTransformer's block: MQA, 2x MLP, RMSNorm, no biases;
# gpt2 init, tied embeddings, attention dropout 0 so that the engine's attention kernel runs) on the
# engine in bf16 at nanoGPT's B = 64, lr 3e-3 cosine to a tenth of it, steps capped at twice the horizon:
# (name as the rows store it, residual dropout, cosine horizon, weight decay, engine options).
FINALISTS: tuple[tuple[str, float, int, float, tuple[tuple[str, Any], ...]], ...] = (
    ("256x6 FT-style, engine + bf16 weights and norms + fused dropout, dropout 0.2, attention dropout 0, lr 3e-3, "
     "cosine to 1,400", 0.2, 1400, 0.1, FUSED_DROPOUT),
    ("256x6 FT-style, engine + bf16 weights and norms + fused dropout, dropout 0.2, attention dropout 0, lr 3e-3, "
     "cosine to 1,200", 0.2, 1200, 0.1, FUSED_DROPOUT),
    ("256x6 FT-style, engine + bf16 weights and norms + fused dropout, dropout 0.1, attention dropout 0, lr 3e-3, "
     "cosine to 1,400", 0.1, 1400, 0.1, FUSED_DROPOUT),
    ("256x6 FT-style, engine + bf16 weights and norms + fused dropout, dropout 0.1, attention dropout 0, "
     "weight decay 0.3, lr 3e-3, cosine to 1,400", 0.1, 1400, 0.3, FUSED_DROPOUT),
    ("256x6 FT-style, engine + bf16 weights and norms, dropout 0.1, attention dropout 0, weight decay 0.3, lr 3e-3, "
     "cosine to 1,400", 0.1, 1400, 0.3, NN_DROPOUT),
    ("256x6 FT-style, engine + bf16 weights and norms + fused dropout per 4 columns, dropout 0.1, attention dropout 0, "
     "weight decay 0.3, lr 3e-3, cosine to 1,400", 0.1, 1400, 0.3, FUSED_DROPOUT_RNG4),
)
# What the public speedruns taught (Jordan et al., modded-nanogpt: Muon for the hidden matrices,
# ReLU², QK-norm, logit soft-capping, a held learning rate then a linear cool-down), tried on the
# finalists' model and step: each candidate runs seed 0 first, like every candidate, and earns more
# seeds by its time to the target. (name, model changes, recipe changes.)
EXPLORING: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("256x6 FT-style, engine + bf16 weights and norms + fused dropout per 4 columns, dropout 0.1, Muon 0.02 for the "
     "block matrices, AdamW 3e-3 for the rest, trapezoid to 1,000 (cool-down 400)",
     {}, dict(optimizer="muon", muon_lr=0.02, schedule="trapezoid", decay_steps=1000, cooldown=400)),
    ("256x6 FT-style + ReLU² + QK-norm, engine + bf16 weights and norms + fused dropout per 4 columns, "
     "dropout 0.1, Muon 0.02, AdamW 3e-3, trapezoid to 1,000 (cool-down 400)",
     dict(activation="relu2", qk_norm=True),
     dict(optimizer="muon", muon_lr=0.02, schedule="trapezoid", decay_steps=1000, cooldown=400)),
    ("256x6 FT-style + ReLU² + QK-norm + logit soft-cap 15, engine + bf16 weights and norms + fused dropout "
     "per 4 columns, dropout 0.1, Muon 0.03, AdamW 4e-3, trapezoid to 800 (cool-down 300)",
     dict(activation="relu2", qk_norm=True, logit_softcap=15.0),
     dict(optimizer="muon", muon_lr=0.03, lr=4e-3, min_lr=4e-4, schedule="trapezoid", decay_steps=800,
          cooldown=300)),
)
# The same Muon with the matrices of each shape orthogonalized together (the engine's ``muon_grouped``:
# one batched Newton-Schulz per shape instead of one per matrix, the same update), at the first
# exploration's recipe and at horizons aimed at each target: a shorter one for 1.50, a longer one and
# nanoGPT's width (384, six heads of 64, dropout 0.2) for nanoGPT's best loss. (name, model changes,
# recipe changes.)
GROUPED = BF16 + (("fuse_dropout", True), ("dropout_rng4", True), ("muon_grouped", True))
_GROUPED_NAME = "engine + bf16 weights and norms + fused dropout per 4 columns + grouped Muon"
EXPLORING_GROUPED: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = tuple(
    (f"{model_name}, {_GROUPED_NAME}, dropout {dropout}, Muon 0.02 for the block matrices, AdamW 3e-3 for the "
     f"rest, trapezoid to {horizon:,} (cool-down {cooldown})",
     model, dict(optimizer="muon", muon_lr=0.02, schedule="trapezoid", decay_steps=horizon, cooldown=cooldown,
                 engine_options=GROUPED))
    for model_name, model, dropout, horizon, cooldown in (
        ("256x6 FT-style", {}, 0.1, 1000, 400),
        ("256x6 FT-style", {}, 0.1, 700, 300),
        ("256x6 FT-style", {}, 0.1, 1400, 500),
        ("384x6 FT-style", dict(n_embd=384, n_head=6, dropout=0.2), 0.2, 1000, 400),
    ))
# The leader's step at higher learning rates, to shorten the horizon: its 700 steps miss the 1.5 s goal
# at its step time, which needs about 500. Muon's rate raised with AdamW's where the horizon is
# shortest (modded-nanogpt raised both together as its runs got shorter). (name, model changes,
# recipe changes.)
EXPLORING_FASTER: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = tuple(
    (f"256x6 FT-style, {_GROUPED_NAME}, dropout 0.1, Muon {muon} for the block matrices, AdamW {adam:.0e} for the "
     f"rest, trapezoid to {horizon:,} (cool-down {cooldown})".replace("e-03", "e-3"),
     {}, dict(optimizer="muon", muon_lr=muon, lr=adam, min_lr=adam / 10, schedule="trapezoid",
              decay_steps=horizon, cooldown=cooldown, engine_options=GROUPED))
    for muon, adam, horizon, cooldown in ((0.03, 3e-3, 700, 300), (0.03, 3e-3, 550, 250), (0.04, 4e-3, 500, 250)))
# The leader's recipe at half the batch: a step of 32 sequences takes about two thirds of the time of one
# of 64 at this model's size, so the 1.5 s goal needs 1.50 within about 750 steps of 32, fewer tokens than
# the leader's 670 steps of 64; smaller batches often reach a loss in fewer tokens. (name, model changes,
# recipe changes.)
EXPLORING_SMALL_BATCH: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = tuple(
    (f"256x6 FT-style, {_GROUPED_NAME}, dropout 0.1, batch 32, Muon 0.02 for the block matrices, AdamW 3e-3 "
     f"for the rest, trapezoid to {horizon:,} (cool-down {cooldown})",
     {}, dict(batch_size=32, optimizer="muon", muon_lr=0.02, schedule="trapezoid", decay_steps=horizon,
              cooldown=cooldown, engine_options=GROUPED))
    for horizon, cooldown in ((800, 300), (1000, 400)))
# The leader's recipe on smaller models: the step's time falls about with the blocks' work (fewer
# layers, or narrower ones with six heads of 32), so a model that needs at most about a third more
# tokens than the leader's to reach 1.50 gets there sooner; its horizon is longer by about that much.
# (name, model changes, recipe changes.)
EXPLORING_SMALLER: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = tuple(
    (f"{model_name}, {_GROUPED_NAME}, dropout 0.1, Muon 0.02 for the block matrices, AdamW 3e-3 for the rest, "
     "trapezoid to 900 (cool-down 300)",
     model, dict(optimizer="muon", muon_lr=0.02, schedule="trapezoid", decay_steps=900, cooldown=300,
                 engine_options=GROUPED))
    for model_name, model in (("256x4 FT-style", dict(n_layer=4)), ("192x6 FT-style", dict(n_embd=192, n_head=6))))
# The head-to-head: nanoGPT's recipe and the leaderboard's fastest claimed candidate (chapter 8; a test
# checks that this is still the leader of the stored H200 rows).
HEAD_TO_HEAD = (REFERENCE, EXPLORING_GROUPED[1][0])
# Every finalist runs every seed (FINALIST_SEEDS too); these also run each seed a second time
# (``speedrun-repeat``), since the verdict sits within the GPU's run-to-run noise.
ALL_SEEDS = tuple(name for name, *_ in FINALISTS)
REPEATED = (ALL_SEEDS[3], ALL_SEEDS[5])
SPEEDRUN_PROBE = ALL_SEEDS[0]  # the speedrun step that benchmarks/kernels/engine_probe.py profiles


def speedrun_candidates() -> dict[str, tuple[ModelConfig, Recipe]]:
    """The reference and the finalists, in run order: name -> (config, recipe)."""
    nano = recipe("nanogpt-char", eval_interval=50, eval_iters=50)
    engine = nano.replace(compile=None, engine=True)
    ft = preset("fasttransformer", init="gpt2", tie_weights=True, attn_dropout=0.0)
    out = {REFERENCE: (preset("nanogpt-char"), nano)}
    for name, dropout, horizon, wd, options in FINALISTS:
        out[name] = (ft.replace(dropout=dropout),
                     engine.replace(lr=3e-3, min_lr=3e-4, decay_steps=horizon, steps=2 * horizon, weight_decay=wd,
                                    engine_options=options))
    # The explorations start from the last finalist (weight decay 0.3, Philox per 4 columns).
    base_cfg, base_rec = out[ALL_SEEDS[5]]
    explorations = EXPLORING + EXPLORING_GROUPED + EXPLORING_FASTER + EXPLORING_SMALL_BATCH + EXPLORING_SMALLER
    for name, model, rec in explorations:
        r = base_rec.replace(**rec)
        out[name] = (base_cfg.replace(**model), r.replace(steps=2 * r.decay_steps))
    return out


def suites(smoke: bool) -> dict[str, dict]:
    """bench name -> runs, seeds and target; ``smoke`` shrinks everything for CPU checks."""
    tiny = SMOKE_MODEL if smoke else {}
    shrink = SMOKE_RECIPE if smoke else {}
    original = recipe("original").replace(**shrink)
    table = {
        # The post's experiment as the original ran it: original inits, 200 sequential steps, seed 42.
        "convergence-original": dict(
            runs={"gpt2": (preset("gpt2", **tiny), original),
                  "fasttransformer": (preset("fasttransformer", **tiny), original)},
            seeds=(42, 0, 1), target=None),
        "convergence": dict(
            runs={n: (c.replace(**tiny), FAIR.replace(**shrink)) for n, c in fair_models().items()},
            seeds=SEEDS, target=None),
        # nanoGPT's own recipe, cut at 2,500 of its 5,000 steps: past the overfitting point (~1,750).
        "convergence-nanogpt": dict(
            runs={"nanogpt-char": (preset("nanogpt-char", **tiny),
                                   recipe("nanogpt-char", steps=2500, eval_interval=100,
                                          eval_iters=40).replace(**shrink))},
            seeds=SEEDS, target=None),
        # Every candidate with seed 0; then FINALIST_SEEDS for the reference, the fastest and ALL_SEEDS.
        "speedrun": dict(
            # Smoke: horizons scaled down (not all set to 20), so candidates that differ only in their
            # horizon keep distinct keys.
            runs={n: (c.replace(**tiny), _smoke_recipe(r, shrink) if smoke else r)
                  for n, (c, r) in speedrun_candidates().items()},
            seeds=SEEDS[:1], target=TARGET_LOSS, more_seeds=FINALIST_SEEDS, always=ALL_SEEDS),
    }
    # Every seed of the reference and of REPEATED once more, keyed as repeats of the speedrun's runs.
    speed = table["speedrun"]
    table["speedrun-repeat"] = dict(runs={n: speed["runs"][n] for n in (REFERENCE, *REPEATED)},
                                    seeds=SEEDS[:1] if smoke else SEEDS[:1] + FINALIST_SEEDS,
                                    target=TARGET_LOSS, repeat_of="speedrun")
    # The second target, nanoGPT's best loss: its recipe, the leading finalist, and the grouped-Muon
    # explorations. Runs no longer worth their time keep their rows: the per-matrix Muon explorations
    # (the grouped update computes the same step in fewer kernels) and the leading finalist with its
    # horizon doubled, whose best loss stayed above the target.
    lead = ALL_SEEDS[5]
    record = {n: speed["runs"][n] for n in (REFERENCE, lead, *(name for name, *_ in EXPLORING_GROUPED))}
    table["speedrun-record"] = dict(runs=record, seeds=SEEDS[:1] if smoke else RECORD_SEEDS,
                                    target=NANOGPT_BEST_LOSS)
    # The grouped Muon update against the per-matrix one it computes, in one process: the leading grouped
    # candidate and its per-matrix twin alternate over the same seeds, so machine, data order and
    # seeds are shared and only the execution of the update differs.
    table["speedrun-muon-trial"] = dict(runs=dict(muon_trial_runs(speed["runs"])),
                                        seeds=SEEDS[:1] if smoke else TRIAL_SEEDS, target=TARGET_LOSS)
    # The record's speed-up measured like for like: nanoGPT's recipe and the leaderboard's fastest claimed
    # candidate alternate over the same seeds in one process, so both meet the same machine start and host
    # (the reference's compiled step, launched from Python, moves with the host far more than a replayed
    # graph does) and both report the whole validation split at their stop.
    table["speedrun-head-to-head"] = dict(runs={n: speed["runs"][n] for n in HEAD_TO_HEAD},
                                          seeds=SEEDS[:1] if smoke else RECORD_SEEDS, target=TARGET_LOSS)
    return table


def muon_trial_runs(runs: dict[str, tuple[ModelConfig, Recipe]]) -> list[tuple[str, tuple[ModelConfig, Recipe]]]:
    """(name, (config, recipe)) of the Muon trial: the grouped 700-step candidate of ``runs``, then its twin with
    the per-matrix update (the same recipe without the engine option ``muon_grouped``)."""
    name = EXPLORING_GROUPED[1][0]
    cfg, rec = runs[name]
    twin = tuple((k, v) for k, v in rec.engine_options if k != "muon_grouped")
    return [(name, (cfg, rec)), (name.replace(" + grouped Muon", ""), (cfg, rec.replace(engine_options=twin)))]


def _smoke_recipe(r: Recipe, shrink: dict[str, Any]) -> Recipe:
    """A candidate's recipe for a smoke run: shrunk, with its horizon (and cool-down) and its batch scaled
    down rather than all set to the same, so candidates that differ only there keep distinct keys."""
    decay = min(20, max(3, r.decay_steps // 70))
    scaled = {"decay_steps": decay} | ({"cooldown": max(1, r.cooldown * decay // r.decay_steps)} if r.cooldown else {})
    if "batch_size" in shrink:  # the candidates' batch is 64 unless named: 64 -> the smoke batch, 32 -> half of it
        scaled["batch_size"] = max(1, shrink["batch_size"] * r.batch_size // 64)
    return r.replace(**{**shrink, **scaled})


def is_smoke(config: dict[str, Any]) -> bool:
    """Whether a stored row's model config is a smoke run's (``SMOKE_MODEL``), whatever its name."""
    return all(config.get(k) == v for k, v in SMOKE_MODEL.items())
