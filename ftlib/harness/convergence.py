"""Convergence studies and the speedrun, stored as result rows (resumable).

Fair comparisons (issue 7): every model gets the same initialization scheme ('gpt2'),
the same AdamW parameter groups (decay matrices only), the same recipe and the same
held-out evaluation; several seeds give a mean and spread.

The speedrun (least wall-clock time to validation loss 1.50) runs every candidate in the
same loop (``ftlib.training.trainer.train``), whether it executes with ``torch.compile`` or on the
engine; rows record the time to target with and without the one-off startup (compilation,
or the engine's kernel JIT and graph capture), since that alone can dominate a short run.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Iterable
from typing import Any

import torch

from ftlib.core.device import device_slug
from ftlib.harness.provenance import provenance
from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import ModelConfig, preset
from ftlib.training.data import CharDataset, random_batch
from ftlib.training.trainer import Recipe, recipe, train

# The book's fair comparison: nanoGPT's optimizer recipe at the post's batch shape.
FAIR = recipe("nanogpt-char", batch_size=32, steps=2000, decay_steps=2000, precision="tf32",
              compile="default", eval_interval=100, eval_iters=40)


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


REFERENCE = "nanogpt-char (reference)"


# Session 5's fused-dropout candidates: (name suffix, residual dropout, recipe changes), all at
# attention dropout 0 (the attention kernel). The dropout 0.2 / 0.1 runs at lr 3e-3, cosine to
# 1,400 repeat the best regularized and the best unregularized recipe on the faster step; the
# others try to reach 1.50 in fewer steps: an earlier anneal, a shorter warm-up, more weight
# decay (the 256x6 model overfits: train 1.15 vs validation 1.50), half the batch at ~0.7x the lr.
FUSED_DROPOUT_RUNS = tuple(
    (f"dropout {p}, attention dropout 0, {label}", p,
     dict(lr=lr, min_lr=round(lr / 10, 12), decay_steps=h, steps=2 * h, **extra))
    for p, label, lr, h, extra in (
        (0.2, "lr 3e-3, cosine to 1,400", 3e-3, 1400, {}),
        (0.2, "lr 3e-3, cosine to 1,200", 3e-3, 1200, {}),
        (0.1, "lr 3e-3, cosine to 1,400", 3e-3, 1400, {}),
        (0.15, "lr 3e-3, cosine to 1,200", 3e-3, 1200, {}),
        (0.2, "lr 3e-3, warm-up 50, cosine to 1,300", 3e-3, 1300, {"warmup": 50}),
        (0.1, "weight decay 0.3, lr 3e-3, cosine to 1,400", 3e-3, 1400, {"weight_decay": 0.3}),
        (0.2, "B=32, lr 2e-3, cosine to 2,400", 2e-3, 2400, {"batch_size": 32}),
    ))


def speedrun_candidates() -> dict[str, tuple[ModelConfig, Recipe]]:
    """nanoGPT's recipe and co-designed variants, all run to validation loss 1.50.

    The run order (for seed 0) is the dict order, skipping what is stored: the reference,
    then the engine candidates from the most to the least promising, then the first
    candidates (compiled; their rows are stored, their names and keys must not change).

    Engine candidates run in bf16 on ``ftlib.training.engine.Engine`` (kernels, flat AdamW, the whole
    step in one CUDA graph) and decay the learning rate over a horizon matched to where
    they should reach 1.50: annealing over 5,000 steps and stopping at ~1,300 wastes it.
    They keep dropout: on 1M characters every model here overfits within ~20 epochs, and
    the dropout-free runs of the fair comparison (B=32) level off above 1.50. With dropout > 0
    the engine's attention stays on PyTorch's SDPA (its kernel has no dropout; the
    RMSNorm/LayerNorm, cross-entropy and AdamW kernels and the CUDA graph still apply).
    Steps are capped at about twice the horizon so a candidate that misses costs little.
    """
    nano = recipe("nanogpt-char", eval_interval=50, eval_iters=50)
    base = preset("nanogpt-char")
    eng = nano.replace(compile=None, engine=True)
    # FastTransformer's block at 256 x 6: MQA, 2x MLP, RMSNorm, no biases; gpt2 init, tied
    # embeddings and dropout 0.1, as the compiled candidate that reached 1.50 at step 1,500.
    ft = preset("fasttransformer", init="gpt2", tie_weights=True, dropout=0.1)
    # The same block at nanoGPT's width (6 heads of 64), 4 layers: less serial work per step.
    wide = base.replace(n_layer=4, n_kv_head=1, mlp_ratio=2.0, norm="rmsnorm")
    fused = (("fuse_residual_norm", True),)
    bf16_levers = (("bf16_norm_out", True), ("bf16_weights", True))
    return {
        REFERENCE: (base, nano),
        "256x6 FT-style, engine, lr 3e-3, cosine to 1,400": (
            ft, eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800)),
        "256x6 FT-style, engine, B=128, lr 4e-3, cosine to 900": (
            ft, eng.replace(batch_size=128, lr=4e-3, min_lr=4e-4, decay_steps=900, steps=1800)),
        # Added after the first engine runs (2026-12-02; best so far: the lr 3e-3 run above).
        # Execution: the same run with every residual add fused into the RMSNorm after it.
        "256x6 FT-style, engine + fused residual-norm, lr 3e-3, cosine to 1,400": (
            ft, eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800, engine_options=fused)),
        # Sample efficiency: a higher peak and a shorter horizon (1,100-1,150 steps reached 1.50 above).
        "256x6 FT-style, engine + fused residual-norm, lr 4e-3, cosine to 1,100": (
            ft, eng.replace(lr=4e-3, min_lr=4e-4, decay_steps=1100, steps=2200, engine_options=fused)),
        # Added 2026-12-02, session 3. Dropout 0 lets the attention kernel in (packed, no layout
        # copies; ~20% of an FT step in round 3) at the risk of overfitting before 1.50.
        "256x6 FT-style, engine, dropout 0, lr 3e-3, cosine to 1,200": (
            ft.replace(dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1200, steps=2400,
                                                 engine_options=fused)),
        # A higher peak still, with a shorter horizon.
        "256x6 FT-style, engine + fused residual-norm, lr 5e-3, cosine to 1,000": (
            ft, eng.replace(lr=5e-3, min_lr=5e-4, decay_steps=1000, steps=2000, engine_options=fused)),
        # Dropout 0 alone stopped at 1.55 (overfit). Keep the residual/embedding dropout and drop
        # only the attention-probability dropout, so the packed attention kernel runs (~0.35 ms
        # per FT step at B=32 in round 4: -attention) while the regularization mostly stays.
        "256x6 FT-style, engine, attention dropout 0, lr 3e-3, cosine to 1,400": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800)),
        "256x6 FT-style, engine, attention dropout 0, lr 4e-3, cosine to 1,200": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=4e-3, min_lr=4e-4, decay_steps=1200, steps=2400)),
        # The best so far (attention dropout 0, lr 3e-3, cosine to 1,400) reached 1.50 at steps
        # 1,150-1,350: shorter horizons anneal earlier.
        "256x6 FT-style, engine, attention dropout 0, lr 3e-3, cosine to 1,200": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1200, steps=2400)),
        "256x6 FT-style, engine, attention dropout 0, lr 3e-3, cosine to 1,000": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1000, steps=2000)),
        # Prepared in session 3, not yet run: the best run so far (2.8x the reference excluding
        # startup) with the fused norms writing bf16 (no cast kernels around them; same values).
        "256x6 FT-style, engine + bf16 norm out, attention dropout 0, lr 3e-3, cosine to 1,400": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800,
                                                      engine_options=(("bf16_norm_out", True),))),
        "256x6 FT-style, engine + bf16 norm out + bf16 weights, attention dropout 0, lr 3e-3, cosine to 1,400": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800,
                                                      engine_options=(("bf16_norm_out", True),
                                                                      ("bf16_weights", True)))),
        # Added in session 4. With five seeds the bf16 run above reached 1.50 on four: its validation
        # loss bottoms out at 1.50-1.51 from ~1,300 steps while the training loss falls to 1.15
        # (overfitting). nanoGPT's own residual dropout, 0.2, narrows that gap; these run every
        # finalist seed (ALL_SEEDS), since a candidate that misses on one seed has not met the target.
        "256x6 FT-style, engine + bf16 levers, dropout 0.2, attention dropout 0, lr 3e-3, cosine to 1,400": (
            ft.replace(dropout=0.2, attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800,
                                                                  engine_options=bf16_levers)),
        "256x6 FT-style, engine + bf16 levers, dropout 0.15, attention dropout 0, lr 3e-3, cosine to 1,400": (
            ft.replace(dropout=0.15, attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400,
                                                                   steps=2800, engine_options=bf16_levers)),
        "256x6 FT-style, engine + bf16 levers, dropout 0.2, attention dropout 0, lr 4e-3, cosine to 1,400": (
            ft.replace(dropout=0.2, attn_dropout=0.0), eng.replace(lr=4e-3, min_lr=4e-4, decay_steps=1400, steps=2800,
                                                                  engine_options=bf16_levers)),
        # Added in session 5 (engine round 5): the residual dropout inside the fused residual-norm
        # kernels (kernels/residual_norm.py; no dropout kernels: ~0.2 ms of a ~2.8 ms step) and the
        # bf16 gradient of each branch written by the norm's backward (no cast kernel).
        **{f"256x6 FT-style, engine + bf16 levers + fused dropout, {name}": (
            ft.replace(dropout=p, attn_dropout=0.0),
            eng.replace(engine_options=bf16_levers + (("fuse_dropout", True), ("dropout_rng4", False)), **r))
           for name, p, r in FUSED_DROPOUT_RUNS},
        # Added at the end of session 5. The fastest qualified run above (dropout 0.1, weight decay 0.3)
        # without the fused dropout (per-element Philox made the step slower: engine_probe.jsonl), and
        # with its mask drawn per 4 columns (the engine's default since: 2.68 vs 2.82 ms per step).
        "256x6 FT-style, engine + bf16 levers, dropout 0.1, attention dropout 0, weight decay 0.3, lr 3e-3, "
        "cosine to 1,400": (
            ft.replace(attn_dropout=0.0), eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800,
                                                      weight_decay=0.3,
                                                      engine_options=bf16_levers + (("fuse_dropout", False),))),
        "256x6 FT-style, engine + bf16 levers + fused dropout per 4 columns, dropout 0.1, attention dropout 0, "
        "weight decay 0.3, lr 3e-3, cosine to 1,400": (
            ft.replace(attn_dropout=0.0),
            eng.replace(lr=3e-3, min_lr=3e-4, decay_steps=1400, steps=2800, weight_decay=0.3,
                        engine_options=bf16_levers + (("fuse_dropout", True), ("dropout_rng4", True)))),
        "384x4 MQA + 2x MLP + RMSNorm, engine, lr 2e-3, cosine to 1,300": (
            wide, eng.replace(lr=2e-3, min_lr=2e-4, decay_steps=1300, steps=2600)),
        # Execution only: nanoGPT's model and recipe unchanged, on the engine instead of torch.compile.
        "nanogpt-char on the engine (same model and recipe)": (base, eng),
        # The recipe changed: dropout 0 lets the engine's attention kernel in; does it still reach 1.50?
        "nanogpt-char on the engine, dropout 0 (recipe changed)": (base.replace(dropout=0.0), eng.replace(steps=2500)),
        "nanogpt-char, MQA + 2x MLP + RMSNorm": (base.replace(n_kv_head=1, mlp_ratio=2.0, norm="rmsnorm"), nano),
        "nanogpt-char, MQA + RMSNorm, lr 2e-3": (base.replace(n_kv_head=1, norm="rmsnorm"), nano.replace(lr=2e-3)),
        "256x6 fasttransformer-style, lr 2e-3": (
            preset("fasttransformer", init="gpt2", tie_weights=True, dropout=0.1),
            nano.replace(lr=2e-3, min_lr=2e-4)),
    }


# The speedrun step that benchmarks/kernels/engine_probe.py profiles.
SPEEDRUN_PROBE = ("256x6 FT-style, engine + bf16 levers + fused dropout, dropout 0.2, attention dropout 0, "
                  "lr 3e-3, cosine to 1,400")

# Candidates that get every finalist seed whether or not their seed 0 was the fastest.
# (Session 4's regularized candidates ran seeds 0-3 with nn.Dropout; they left this list when the
# engine's default became the fused dropout, so that no candidate mixes the two executions.)
ALL_SEEDS = (
    "256x6 FT-style, engine + bf16 levers + fused dropout, dropout 0.2, attention dropout 0, lr 3e-3, cosine to 1,400",
    "256x6 FT-style, engine + bf16 levers + fused dropout, dropout 0.2, attention dropout 0, lr 3e-3, cosine to 1,200",
    "256x6 FT-style, engine + bf16 levers + fused dropout, dropout 0.1, attention dropout 0, lr 3e-3, cosine to 1,400",
    "256x6 FT-style, engine + bf16 levers + fused dropout, dropout 0.1, attention dropout 0, weight decay 0.3, "
    "lr 3e-3, cosine to 1,400",
    "256x6 FT-style, engine + bf16 levers, dropout 0.1, attention dropout 0, weight decay 0.3, lr 3e-3, "
    "cosine to 1,400",
    "256x6 FT-style, engine + bf16 levers + fused dropout per 4 columns, dropout 0.1, attention dropout 0, "
    "weight decay 0.3, lr 3e-3, cosine to 1,400",
)


def steady_time_to_target(row: dict[str, Any]) -> float | None:
    """Time to target without the startup; None where not reached or not recorded (older rows)."""
    return row.get("time_to_target_excl_startup_s")


def speedrun_finalists(rows: list[dict[str, Any]], always: Iterable[str] = ()) -> list[str]:
    """The reference, the seed-0 candidate with the least time to target excluding startup, and
    the candidates named in ``always`` (:data:`ALL_SEEDS`), in that order, without repeats.

    Excluding startup, because a compile or JIT cache warmed by an earlier run can shorten
    a startup; rows stored before the startup was recorded are not candidates.
    """
    done = [r for r in rows if r.get("seed") == 0 and r.get("status") == "ok" and r["model"] != REFERENCE
            and steady_time_to_target(r) is not None]
    best = min(done, key=steady_time_to_target, default=None)
    return list(dict.fromkeys([REFERENCE] + ([best["model"]] if best is not None else []) + list(always)))


SEEDS = (0, 1, 2)
# The speedrun's finalists get two seeds more: their best losses sit within ~0.01 of the target,
# so whether and when a seed reaches 1.50 varies, and the speed-up needs more than three samples.
FINALIST_SEEDS = (1, 2, 3, 4)
TARGET_LOSS = 1.50  # the speedrun's validation loss (issue 7)
# The speedrun's verdict sits within the GPU's run-to-run noise (a run repeated on a fresh machine
# moved by up to 25%), so the reference and these candidates run every seed a second time
# (``speedrun-repeat``) and :func:`speedrun_pooled` pools first runs and repeats.
REPEATED = (ALL_SEEDS[3], ALL_SEEDS[5])
SUITE_ORDER = ("convergence-original", "convergence", "speedrun", "speedrun-repeat", "convergence-nanogpt")


def suites(smoke: bool) -> dict[str, dict]:
    """bench name -> runs, seeds and target; smoke shrinks everything for CPU checks."""
    tiny = dict(n_layer=1, n_embd=48, block_size=32) if smoke else {}  # 48: divisible by 6 and 8 heads
    shrink = dict(steps=20, batch_size=4, block_size=32, eval_interval=10, eval_iters=2, compile=None,
                  decay_steps=20, warmup=2, precision="fp32") if smoke else {}
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
        # Every candidate with seed 0; then seeds 1-4 for the reference, the fastest and ALL_SEEDS.
        "speedrun": dict(
            # Smoke: horizons scaled down (not all set to 20), so candidates that differ only in
            # their horizon keep distinct keys.
            runs={n: (c.replace(**tiny), r.replace(**{**shrink, "decay_steps": min(20, max(3, r.decay_steps // 70))})
                      if smoke else r) for n, (c, r) in speedrun_candidates().items()},
            seeds=SEEDS[:1], target=TARGET_LOSS, more_seeds=FINALIST_SEEDS, always=ALL_SEEDS),
    }
    # Every seed of the reference and of REPEATED once more, keyed as repeats of the speedrun's runs.
    speed = table["speedrun"]
    table["speedrun-repeat"] = dict(runs={n: speed["runs"][n] for n in (REFERENCE, *REPEATED)},
                                    seeds=SEEDS[:1] if smoke else SEEDS[:1] + FINALIST_SEEDS,
                                    target=TARGET_LOSS, repeat_of="speedrun")
    return table



def run_suites(names: Iterable[str], device, smoke: bool = False, budget_s: float | None = None,
               ds: CharDataset | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Run the named suites (see :func:`suites`) until done or ``budget_s`` seconds have passed."""
    import time

    from ftlib.training.data import load_tinyshakespeare

    deadline = time.time() + budget_s if budget_s else None
    ds = ds or load_tinyshakespeare()
    table = suites(smoke)
    new = []
    for name in names:
        s = table[name]
        new += run_study(name, s["runs"], ds, s["seeds"], device, target_val_loss=s["target"],
                         deadline=deadline, progress=progress, repeat_of=s.get("repeat_of"))
        if s.get("more_seeds") and not (deadline is not None and time.time() > deadline):
            finalists = speedrun_finalists(ResultStore(name, device_slug(torch.device(device))).rows(),
                                           always=s.get("always", ()))
            new += run_study(name, {n: s["runs"][n] for n in finalists}, ds, s["more_seeds"], device,
                             target_val_loss=s["target"], deadline=deadline, progress=progress)
        if deadline is not None and time.time() > deadline:
            break
    return new


def run_key(bench: str, cfg: ModelConfig, rec: Recipe, target: float | None) -> str:
    """The result key of one run (``Recipe.key_repr`` keeps the keys of rows stored before new fields)."""
    return row_key(bench, cfg.config_hash(), rec.batch_size, rec.block_size, str(rec.compile),
                   rec.precision, {"recipe": rec.key_repr(), "target": target})


def _row(name: str, cfg: ModelConfig, rec: Recipe, out: dict, device, key: str, target) -> dict[str, Any]:
    reached = out["reached"]
    startup = out["startup_s"]
    return {
        **provenance(device), "key": key, "model": name, "config": cfg.to_dict(),
        "config_hash": cfg.config_hash(), "recipe": out["recipe"], "seed": rec.seed,
        "params": sum(p.numel() for p in out["model"].parameters()),
        "execution": "engine" if rec.engine else (f"compile {rec.compile}" if rec.compile else "eager"),
        "engine": out["engine"],
        "history": out["history"], "best_val_loss": out["best_val_loss"],
        "train_time_s": out["train_time_s"], "steps_done": out["steps_done"], "target": target,
        "build_s": out["build_s"], "first_step_s": out["first_step_s"], "startup_s": startup,
        # All wall time of training steps, the startup (compile / JIT + capture) included ...
        "time_to_target_s": reached["time_s"] if reached else None,
        # ... and without it: the steps after the first (a target reached at step 0 took none).
        "time_to_target_excl_startup_s": (max(0.0, reached["time_s"] - startup) if reached["step"] > 0 else 0.0)
        if reached else None,
        "steps_to_target": reached["step"] if reached else None, "status": "ok",
    }


def run_study(
    bench: str,
    runs: dict[str, tuple[ModelConfig, Recipe]],
    ds: CharDataset,
    seeds: Iterable[int],
    device: torch.device | str,
    target_val_loss: float | None = None,
    time_budget_s: float | None = None,
    deadline: float | None = None,
    progress: bool = True,
    repeat_of: str | None = None,
) -> list[dict[str, Any]]:
    """Train every (run, seed) not yet stored under ``bench``; return the new rows.

    ``deadline`` (a ``time.time()`` value) stops starting new runs when passed, so a
    bounded GPU session ends cleanly; what is left is measured by the next call.
    ``repeat_of`` names the bench whose runs these repeat: each row then gets the key of
    the first run plus ``-repeat1`` and ``repeat_of_key`` (one repeat per run; a row already
    marked as a repeat of that key counts, as do the rows stored before this option existed).
    """
    import time

    device = torch.device(device)
    store = ResultStore(bench, device_slug(device))
    new = []
    for seed in seeds:
        for name, (cfg, rec) in runs.items():
            rec = rec.replace(seed=seed)
            key = run_key(repeat_of or bench, cfg, rec, target_val_loss)
            base, key = key, (f"{key}-repeat1" if repeat_of else key)
            if store.has(key, skip_status=("error",)):  # a failed run is tried again
                continue
            if repeat_of and any(r.get("repeat_of_key") == base and r.get("status", "ok") == "ok"
                                 for r in store.rows()):
                continue
            if deadline is not None and time.time() > deadline:
                return new
            try:
                out = train(cfg, rec, ds, device, target_val_loss=target_val_loss,
                            time_budget_s=time_budget_s, progress=progress)
            except Exception as e:  # one failed run (an engine that cannot capture, a NaN) is a row, not the end
                row = {**provenance(device), "key": key, "model": name, "config": cfg.to_dict(),
                       "config_hash": cfg.config_hash(), "recipe": dataclasses.asdict(rec), "seed": seed,
                       "status": "error", "error": f"{type(e).__name__}: {e}"[:2000],
                       "traceback": traceback.format_exc()[-3000:]}
                store.append(row)
                new.append(row)
                continue
            row = _row(name, cfg, rec, out, device, key, target_val_loss)
            if repeat_of:
                row["repeat_of_key"] = base
            row["sample"] = sample_text(out["model"], ds, device, seed=seed)
            store.append(row)
            new.append(row)
    return new


def describe_row(r: dict[str, Any]) -> str:
    """One log line for a stored row, finished or failed (for the GPU runner's output)."""
    head = f"{r['model']:<48} seed {r['seed']}"
    if r.get("status", "ok") != "ok":
        return f"{head}: {r.get('status')} {str(r.get('error', ''))[:200]}"

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}s"

    return (f"{head}: best val {r['best_val_loss']:.4f} steps {r['steps_done']} train {r['train_time_s']:.1f}s "
            f"startup {s(r.get('startup_s'))} to-target {s(r.get('time_to_target_s'))} "
            f"(excl. startup {s(r.get('time_to_target_excl_startup_s'))})")


def sample_text(model, ds: CharDataset, device, n: int = 300, seed: int = 0, prompt: str = "\n") -> str:
    """``n`` characters sampled (temperature 0.8, top-k 40) after ``prompt``, reproducibly."""
    model.eval()
    g = torch.Generator(device=torch.device(device)).manual_seed(seed)
    idx = torch.tensor([ds.encode(prompt)], dtype=torch.long, device=device)
    out = model.generate(idx, n, temperature=0.8, top_k=40, generator=g)
    return ds.decode(out[0, len(prompt):].tolist())


def checkpoint_roundtrip(name: str, ds: CharDataset, device: torch.device | str, path,
                         smoke: bool = True) -> dict[str, Any]:
    """Train speedrun candidate ``name`` to 1.50 (at smoke size: 20 steps of a tiny model, on
    PyTorch ops), save it with :func:`ftlib.training.trainer.save_checkpoint`, load it back, and check
    that the reloaded model is the trained one: the same logits on a held-out batch and the
    same sampled text. The engine trains in its own flat buffers; its checkpoint holds a plain
    ``GPT``'s state dict, so it reloads without the kernels."""
    from pathlib import Path

    from ftlib.training.trainer import load_checkpoint

    device = torch.device(device)
    cfg, rec = suites(smoke)["speedrun"]["runs"][name]
    if smoke:  # the engine's kernels would run in Triton's interpreter on CPU (minutes)
        rec = rec.replace(engine=False, engine_options=(), precision="fp32")
    path = Path(path)
    out = train(cfg, rec, ds, device, target_val_loss=TARGET_LOSS, progress=False, checkpoint=path)
    trained = out["model"].eval()
    model, ck = load_checkpoint(path, device)
    model.eval()
    g = torch.Generator().manual_seed(0)
    x, _ = random_batch(ds.val, 4, rec.block_size, generator=g, device=device)  # (4, T) held-out windows
    with torch.no_grad():
        a, b = trained(x)[0], model(x)[0]
    text = sample_text(model, ds, device)
    return {"model": name, "steps": out["steps_done"], "best val loss": out["best_val_loss"],
            "checkpoint MB": path.stat().st_size / 2**20, "saved": sorted(ck),
            "config hash matches": ModelConfig(**ck["config"]).config_hash() == cfg.config_hash(),
            "max |logit difference|": (a - b).abs().max().item(),
            "same sample": text == sample_text(trained, ds, device), "sample": text}


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of finished runs (failed runs are stored too, with status 'error' and no history)."""
    return [r for r in rows if r.get("status", "ok") == "ok"]


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _runs_of_one_config(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Finished runs grouped by (device, model, config hash): the seeds of one model at one size on
    one device, never pooled with another device's runs or a smoke run's smaller model."""
    from ftlib.views.tables import group_rows

    return group_rows(_ok(rows), "device_slug", "model", "config_hash")


def aggregate(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per model, per evaluated step: mean, min and max over seeds of val/train loss and time.

    Seeds are pooled only within one device and one config; where a model name has runs on
    several devices or at several sizes, each gets its own entry, named with its device and
    parameter count.
    """
    groups = _runs_of_one_config(rows)
    names = [model for _, model, _ in groups]
    out: dict[str, list[dict[str, Any]]] = {}
    for (dev, model, _), rs in groups.items():
        name = model if names.count(model) == 1 else f"{model} ({dev}, {rs[0].get('params', 0):,} params)"
        by_step: dict[int, list[dict]] = {}
        for r in rs:
            for ev in r["history"]:
                by_step.setdefault(ev["step"], []).append(ev)
        pts = []
        for step in sorted(by_step):
            evs = by_step[step]
            vals = [e["val_loss"] for e in evs]
            pts.append({
                "step": step, "tokens": evs[0]["tokens"], "n_seeds": len(evs),
                "time_s": sum(e["time_s"] for e in evs) / len(evs),
                "val_mean": sum(vals) / len(vals), "val_min": min(vals), "val_max": max(vals),
                "train_mean": sum(e["train_loss"] for e in evs) / len(evs),
            })
        out[name] = pts
    return out


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per device, model and config: seeds, best validation loss (mean, min, max), time to target.

    Time to target twice: all training-step wall time (startup included), and without the
    startup (first step: compilation, or the engine's JIT and capture). Rows stored before
    the startup was recorded have no value for the second; its mean is over the seeds that do.
    Runs of different devices or sizes are separate lines (``device``, ``params``).
    """
    groups = _runs_of_one_config(rows)
    speedrun = any(r.get("target") is not None for rs in groups.values() for r in rs)  # else no timing columns
    table = []
    for (dev, model, _), rs in groups.items():
        best = [r["best_val_loss"] for r in rs]
        ttt = [r["time_to_target_s"] for r in rs if r.get("time_to_target_s") is not None]
        line = {
            "device": dev, "model": model, "params": rs[0]["params"], "seeds": len(rs),
            "best val loss (mean)": sum(best) / len(best), "min": min(best), "max": max(best),
            "time to target s (mean)": sum(ttt) / len(ttt) if ttt else None,
        }
        if speedrun:
            line["excl. startup s (mean)"] = _mean([steady_time_to_target(r) for r in rs])
            line["startup s (mean)"] = _mean([r.get("startup_s") for r in rs])
            line["steps to target (mean)"] = _mean([r.get("steps_to_target") for r in rs])
        line["reached"] = f"{len(ttt)}/{len(rs)}"
        line["train time s (mean)"] = sum(r["train_time_s"] for r in rs) / len(rs)
        table.append(line)
    return table


def suite_rows(bench: str, rows: Iterable[dict[str, Any]], smoke: bool = False) -> list[dict[str, Any]]:
    """The rows of ``bench`` that ran one of the suite's own models at the suite's size.

    A smoke run stores tiny models under the same names as the full-size ones; selecting by the
    config hash keeps each out of the other's tables (``smoke`` picks which size is wanted).
    Repeats are matched against the runs they repeat.
    """
    table = suites(smoke)
    if bench not in table:
        return list(rows)
    runs = table[table[bench].get("repeat_of") or bench]["runs"]
    return [r for r in rows if r.get("model") in runs and r.get("config_hash") == runs[r["model"]][0].config_hash()]


TARGET_SPEEDUP = 3.0  # issue 7: at least 3x faster than nanoGPT's recipe to validation loss 1.50


def speedrun_verdict(rows: list[dict[str, Any]], target: float = TARGET_SPEEDUP,
                     min_seeds: int = 3) -> dict[str, Any] | None:
    """The fastest candidate that reached the target on every seed it ran (at least ``min_seeds``),
    against the reference on the seeds both recorded: the speed-up with and without startup.

    A candidate that missed 1.50 on one seed has not met the target however fast its other
    seeds were, so only candidates that reached it on all of their (>= ``min_seeds``) seeds
    can get 'met'. When none qualifies, the fastest candidate by mean time excluding startup
    over the seeds that reached it is reported, with 'not met' and how many seeds reached.
    Seeds are matched because a seed's batches and the state of the compile cache change a
    run's time; the ratio is of the sums over the common seeds (a ratio of means). ``None``
    without a reference or a candidate that reached the target.
    """
    by: dict[str, dict[int, dict]] = {}
    for r in _ok(rows):
        by.setdefault(r["model"], {})[r["seed"]] = r
    ref = {s: r for s, r in by.pop(REFERENCE, {}).items() if r.get("time_to_target_s") is not None}
    steady = {m: _mean([steady_time_to_target(r) for r in rs.values()]) for m, rs in by.items()}
    steady = {m: t for m, t in steady.items() if t is not None}
    if not ref or not steady:
        return None

    def reached(rs: dict[int, dict]) -> int:
        return sum(r.get("time_to_target_s") is not None for r in rs.values())

    qualified = [m for m in steady if len(by[m]) >= min_seeds and reached(by[m]) == len(by[m])]
    best = min(qualified or steady, key=steady.get)
    cand = {s: r for s, r in by[best].items() if r.get("time_to_target_s") is not None}

    def ratio(key) -> tuple[float | None, list[int]]:
        seeds = sorted(s for s in set(ref) & set(cand) if key(ref[s]) is not None and key(cand[s]) is not None)
        if not seeds:
            return None, []
        return sum(key(ref[s]) for s in seeds) / sum(key(cand[s]) for s in seeds), seeds

    def verdict(x: float | None) -> str | None:
        if x is None:
            return None
        return "met" if x >= target and best in qualified else "not met"

    x_steady, seeds_steady = ratio(steady_time_to_target)
    x_all, seeds_all = ratio(lambda r: r["time_to_target_s"])
    return {"candidate": best, "target": target, "seeds reached": f"{reached(by[best])}/{len(by[best])}",
            "qualified": best in qualified,
            "speed-up excl. startup": x_steady, "seeds excl. startup": seeds_steady,
            "speed-up incl. startup": x_all, "seeds incl. startup": seeds_all,
            "verdict excl. startup": verdict(x_steady), "verdict incl. startup": verdict(x_all)}


def speedrun_pooled(rows: list[dict[str, Any]], repeats: list[dict[str, Any]], candidate: str,
                    target: float = TARGET_SPEEDUP, n_boot: int = 4000) -> dict[str, Any] | None:
    """The reference against ``candidate`` over every run: first runs and repeats pooled.

    Two runs of one seed differ on the GPU as much as two seeds do, so each run is one sample
    of the time to 1.50 (excluding startup). The speed-up is the ratio of the pooled means; its
    90% interval is a percentile bootstrap (runs resampled within each side, fixed generator so
    the book prints the same interval every time). 'met' needs every candidate run to have
    reached the target and the pooled ratio at or above ``target``; ``interval clears target``
    says whether the interval's lower end does too. The reference (``torch.compile``'s default
    mode, a kernel launch per op) depends on the host's CPU, the captured engine hardly: a
    floor against the reference's fastest run is returned too. ``None`` without timed runs on
    both sides.
    """
    import random

    pool = _ok(rows) + _ok(repeats)
    ref = [t for r in pool if r["model"] == REFERENCE if (t := steady_time_to_target(r)) is not None]
    cand = [r for r in pool if r["model"] == candidate]
    times = [t for r in cand if (t := steady_time_to_target(r)) is not None]
    if not ref or not times:
        return None
    x = (sum(ref) / len(ref)) / (sum(times) / len(times))
    rng = random.Random(0)
    boot = sorted((sum(a) / len(a)) / (sum(b) / len(b)) for a, b in
                  ((rng.choices(ref, k=len(ref)), rng.choices(times, k=len(times))) for _ in range(n_boot)))
    lo, hi = boot[int(0.05 * n_boot)], boot[int(0.95 * n_boot) - 1]
    reached_all = len(times) == len(cand)
    return {"candidate": candidate, "target": target,
            "reference runs": len(ref), "candidate runs": len(cand), "reached": f"{len(times)}/{len(cand)}",
            "reference s (mean)": sum(ref) / len(ref), "candidate s (mean)": sum(times) / len(times),
            "candidate s (min)": min(times), "candidate s (max)": max(times),
            "speed-up excl. startup (pooled)": x, "90% interval": (lo, hi),
            # A floor: the reference's single fastest run against the candidate's mean.
            "speed-up vs fastest reference run": min(ref) / (sum(times) / len(times)),
            "verdict": "met" if reached_all and x >= target else "not met",
            "interval clears target": reached_all and lo >= target}


def speedrun_curves(rows: list[dict[str, Any]], models: Iterable[str],
                    exclude_startup: bool = True) -> list[dict[str, Any]]:
    """Validation loss against training wall time for each run of ``models``, one entry per
    (model, seed): ``time_s`` and ``val_loss`` lists from the run's evaluation history.

    With ``exclude_startup`` the one-off startup (compilation or the engine's JIT and capture)
    is taken off every point after step 0; runs stored before the startup was recorded are left out.
    """
    out = []
    for r in sorted(_ok(rows), key=lambda r: (r["model"], r["seed"])):
        if r["model"] not in models:
            continue
        startup = r.get("startup_s")
        if exclude_startup and startup is None:
            continue
        shift = startup if exclude_startup else 0.0
        hist = r.get("history") or []
        out.append({"model": r["model"], "seed": r["seed"],
                    "time_s": [max(0.0, h["time_s"] - shift) if h["step"] > 0 else 0.0 for h in hist],
                    "val_loss": [h["val_loss"] for h in hist]})
    return out


def repeat_table(rows: list[dict[str, Any]], repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each repeated run (``speedrun-repeat.jsonl``: the same key, i.e. candidate, recipe and seed,
    run again on a fresh machine from the same commit) next to its stored first run.

    The GPU's run-to-run nondeterminism (atomic adds in the embedding backward, reduction orders)
    makes two runs of one seed part ways within steps; near a loss floor that moves the step at
    which 1.50 is first reached. The spread between the two is the noise the speed-up sits in.
    """
    first = {r["key"]: r for r in rows}
    out = []
    for rep in repeats:
        a = first.get(rep.get("repeat_of_key", rep["key"]))
        if a is None:
            continue
        ta, tb = steady_time_to_target(a), steady_time_to_target(rep)
        out.append({"device": rep.get("device_slug"), "model": rep["model"], "seed": rep["seed"],
                    "steps to target (first)": a.get("steps_to_target"),
                    "steps to target (repeat)": rep.get("steps_to_target"),
                    "excl. startup s (first)": ta, "excl. startup s (repeat)": tb,
                    "repeat / first": (tb / ta) if (ta and tb) else None,
                    "best val loss (first)": a["best_val_loss"], "best val loss (repeat)": rep["best_val_loss"]})
    return out
