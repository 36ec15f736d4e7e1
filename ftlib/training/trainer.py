"""Training runs: recipes, a loop with held-out evaluation, time-to-loss, checkpoints.

Every run, whatever the model, goes through the same loop, so convergence comparisons
differ only in what they name. A step is :func:`ftlib.training.step.train_step` (optionally under
``torch.compile``), or with ``Recipe(engine=True)`` one step of :class:`ftlib.training.engine.Engine`
(Triton kernels, flat AdamW, the whole step in one CUDA graph): the same math, executed
differently, with the same batches, schedule, evaluation and clock.

In fp16 both scale the loss dynamically (``ftlib.training.loss_scale``): ``train_step`` with a
``torch.amp.GradScaler``, the engine with its device-resident scaler; the result's
``loss_scale`` gives the scale reached (None in other precisions).

Wall-clock time counts training steps only (evaluation and batch sampling are excluded
and synchronized out), so "time to validation loss 1.50" credits a faster model for its
speed. The startup is also recorded on its own as ``startup_s``: building the model and
optimizer plus the first step, which holds ``torch.compile``'s compilation (tens of seconds
on the H200); for the engine, building it (kernel JIT, warm-up steps, CUDA-graph capture)
plus its first replay. A one-off cost like that can dominate a short run, so results
report the time with it and without it (the steps after the first).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ftlib.core.precision import PRECISIONS, Precision, precision_region
from ftlib.core.progress import progress_bar
from ftlib.core.timing import sync
from ftlib.model.config import ModelConfig
from ftlib.model.gpt import GPT
from ftlib.training.data import CharDataset, SequentialBatches, random_batch
from ftlib.training.engine.options import key_items, option_names
from ftlib.training.step import grad_scaler, make_optimizer, train_step

# These fields enter ``Recipe.key_repr`` only when set: a recipe that does not use them keys as it
# did before they existed, and a recipe's engine options enter as
# ``ftlib.training.engine.options.key_items`` says (each option's rule is stated once, with the option).
_KEYED_WHEN_SET = ("engine", "engine_options", "optimizer", "muon_lr", "schedule", "cooldown")
OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "trapezoid")


@dataclass(frozen=True)
class Recipe:
    steps: int = 200
    batch_size: int = 32
    block_size: int = 256
    lr: float = 3e-4
    min_lr: float | None = None  # None: constant learning rate
    warmup: int = 0
    decay_steps: int | None = None  # cosine decay horizon (nanoGPT: lr_decay_iters)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    decay_scheme: str = "matrices"
    grad_clip: float | None = 1.0
    precision: str = "fp32"
    compile: str | None = None  # None, 'default' or 'reduce-overhead'
    sampler: str = "random"  # 'random' windows or 'sequential' batches
    eval_interval: int = 50
    eval_iters: int = 50  # batches per split for each loss estimate
    seed: int = 0
    # Train through ftlib.training.engine.Engine (kernels, flat AdamW, one CUDA graph per step)
    # instead of train_step; excludes torch.compile. Its attention kernel has no dropout:
    # with config.dropout > 0 attention stays on PyTorch's SDPA (the other kernels still apply).
    engine: bool = False
    # Engine options as (name, value) pairs (hashable, so the recipe stays frozen), e.g.
    # (("fuse_residual_norm", True),): ftlib.training.engine.EngineOptions but capture; engine=True only.
    engine_options: tuple[tuple[str, Any], ...] = ()
    # 'muon': Muon for the 2-D weights inside the blocks at ``muon_lr``, AdamW (``lr``) for the
    # rest (ftlib.training.muon); 'adamw': AdamW for everything.
    optimizer: str = "adamw"
    muon_lr: float = 0.02
    # 'cosine': warm-up, cosine from lr to min_lr at decay_steps (nanoGPT). 'trapezoid': warm-up,
    # lr held, then a linear cool-down to min_lr over the ``cooldown`` steps ending at decay_steps
    # (the schedule of the public speedruns; Hägele et al. 2024, "Scaling Laws and Compute-Optimal
    # Training Beyond Fixed Training Durations").
    schedule: str = "cosine"
    cooldown: int | None = None

    def __post_init__(self) -> None:
        bad = []
        for f in ("steps", "batch_size", "block_size", "eval_interval", "eval_iters"):
            if getattr(self, f) < 1:
                bad.append(f"{f}={getattr(self, f)} must be >= 1")
        if self.sampler not in ("random", "sequential"):
            bad.append(f"sampler={self.sampler!r} is not 'random' or 'sequential'")
        if self.compile not in (None, "default", "reduce-overhead"):
            bad.append(f"compile={self.compile!r} is not None, 'default' or 'reduce-overhead'")
        if self.precision not in PRECISIONS:
            bad.append(f"precision={self.precision!r} is not one of {PRECISIONS}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            bad.append(f"grad_clip={self.grad_clip} must be positive (or None for no clipping)")
        if self.engine and self.compile is not None:
            bad.append(f"engine=True with compile={self.compile!r}: the engine captures the step itself")
        if self.engine and self.decay_scheme != "matrices":
            bad.append(f"engine=True with decay_scheme={self.decay_scheme!r}: the engine decays matrices only")
        allowed = option_names(recipe=True)
        unknown = sorted({k for k, _ in self.engine_options} - set(allowed))
        if unknown:
            bad.append(f"engine_options {unknown} not in {allowed}")
        if self.engine_options and not self.engine:
            bad.append(f"engine_options={self.engine_options!r} need engine=True")
        if self.optimizer not in OPTIMIZERS:
            bad.append(f"optimizer={self.optimizer!r} is not one of {OPTIMIZERS}")
        if not self.muon_lr > 0:
            bad.append(f"muon_lr={self.muon_lr} must be positive")
        if self.schedule not in SCHEDULES:
            bad.append(f"schedule={self.schedule!r} is not one of {SCHEDULES}")
        if self.schedule == "trapezoid" and (self.cooldown is None or self.cooldown < 1 or self.min_lr is None):
            bad.append("schedule='trapezoid' needs cooldown >= 1 (steps) and a min_lr to cool down to")
        if self.cooldown is not None and self.schedule != "trapezoid":
            bad.append(f"cooldown={self.cooldown} applies to schedule='trapezoid' only")
        if bad:
            raise ValueError("invalid Recipe: " + "; ".join(bad))

    def replace(self, **changes: Any) -> Recipe:
        return dataclasses.replace(self, **changes)

    def key_repr(self) -> str:
        """``repr(self)`` as result keys hash it: the engine's fields only when set, its options as
        ``key_items`` keeps them (a run stored under a key is then recognized as done)."""
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "engine_options":
                value = key_items(tuple(o) for o in value)
            if f.name in _KEYED_WHEN_SET and value == f.default:
                continue
            shown.append(f"{f.name}={value!r}")
        return f"{type(self).__qualname__}({', '.join(shown)})"

    def lr_at(self, step: int) -> float:
        """AdamW's learning rate at ``step``: linear warm-up, then cosine decay to ``min_lr``
        (nanoGPT's get_lr; Loshchilov & Hutter 2017) or the trapezoid's plateau and linear cool-down.
        Muon's rate follows the same factor (``lr_factor``)."""
        if step < self.warmup:
            return self.lr * (step + 1) / (self.warmup + 1)
        if self.min_lr is None:
            return self.lr
        horizon = self.decay_steps or self.steps
        if step > horizon:
            return self.min_lr
        if self.schedule == "trapezoid":
            start = horizon - self.cooldown
            if step < start:
                return self.lr
            return self.lr + (self.min_lr - self.lr) * (step - start) / self.cooldown
        ratio = (step - self.warmup) / max(1, horizon - self.warmup)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.lr - self.min_lr)


RECIPES: dict[str, Recipe] = {
    # The original repository's convergence script: constant lr, sequential batches, fp32.
    "original": Recipe(steps=200, batch_size=32, block_size=256, lr=3e-4, betas=(0.9, 0.999),
                       weight_decay=0.01, grad_clip=1.0, sampler="sequential", eval_interval=50),
    # nanoGPT config/train_shakespeare_char.py: lr 1e-3 cosine to 1e-4 over 5000, warm-up 100,
    # beta2 0.99, weight decay 0.1, B=64, T=256, bf16, compiled, eval every 250 on 200 batches.
    "nanogpt-char": Recipe(steps=5000, batch_size=64, block_size=256, lr=1e-3, min_lr=1e-4, warmup=100,
                           decay_steps=5000, betas=(0.9, 0.99), weight_decay=0.1, grad_clip=1.0,
                           precision="bf16", compile="default", eval_interval=250, eval_iters=200),
}


def recipe(name: str, **overrides: Any) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {sorted(RECIPES)}")
    return RECIPES[name].replace(**overrides)


def make_recipe_optimizer(model: GPT, rec: Recipe, device: torch.device):
    """The recipe's optimizer for plain steps: AdamW on ``param_groups`` (fused on CUDA), or Muon for
    the block matrices with AdamW for the rest (``ftlib.training.muon``). Every group carries its
    base rate as ``initial_lr``, which :meth:`_PlainSteps.set_lr` scales by the schedule's factor."""
    fused = device.type == "cuda" or None
    if rec.optimizer == "muon":
        from ftlib.training.muon import make_muon_adamw

        return make_muon_adamw(model, muon_lr=rec.muon_lr, adamw_lr=rec.lr, betas=rec.betas,
                               weight_decay=rec.weight_decay, fused=fused)
    opt = make_optimizer(model, lr=rec.lr, betas=rec.betas, weight_decay=rec.weight_decay,
                         scheme=rec.decay_scheme, fused=fused)
    for group in opt.param_groups:
        group.setdefault("initial_lr", rec.lr)
    return opt


@torch.no_grad()
def estimate_loss(
    model: GPT, data: torch.Tensor, batch_size: int, block_size: int, iters: int,
    device: torch.device, seed: int = 1234, prec: str = "fp32",
) -> float:
    """Mean loss over ``iters`` random batches drawn with a fixed seed (same batches every call)."""
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    with precision_region(prec, device):
        for _ in range(iters):
            x, y = random_batch(data, batch_size, block_size, generator=g, device=device)
            _, loss = model(x, y)
            total += float(loss)
    model.train(was_training)
    return total / iters


class _PlainSteps:
    """The reference execution: ``train_step`` on the model (optionally compiled) with torch's AdamW."""

    def __init__(self, config: ModelConfig, rec: Recipe, device: torch.device) -> None:
        torch.manual_seed(rec.seed)
        self.model = GPT(config).to(device)
        self.opt = make_recipe_optimizer(self.model, rec, device)
        self.step_model = torch.compile(self.model, mode=rec.compile) if rec.compile else self.model
        self.rec, self.device = rec, device
        self.precision = Precision.of(rec.precision)  # TF32 flags around the step, autocast in train_step
        self.scaler = grad_scaler(rec.precision, device)  # fp16: dynamic loss scaling; else None

    def set_lr(self, lr: float) -> None:
        factor = lr / self.rec.lr  # the schedule's factor, applied to every group's base rate
        for group in self.opt.param_groups:
            group["lr"] = group["initial_lr"] * factor

    def load(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def step(self) -> torch.Tensor:
        with self.precision.matmul_flags():
            return train_step(self.step_model, self.opt, self.x, self.y, grad_clip=self.rec.grad_clip,
                              autocast_dtype=self.precision.autocast, scaler=self.scaler)

    def trained_model(self) -> GPT:
        return self.model

    def describe(self) -> None:
        return None  # nothing beyond the recipe: torch's ops, optionally compiled

    def loss_scale(self) -> dict[str, Any] | None:
        """fp16: the GradScaler's state at the end (host values), else None."""
        if self.scaler is None:
            return None
        return {"scaler": "torch.amp.GradScaler", "scale": self.scaler.get_scale()}


class _EngineSteps:
    """``ftlib.training.engine.Engine``: the same step on kernels and flat buffers, one CUDA graph on CUDA."""

    def __init__(self, config: ModelConfig, rec: Recipe, device: torch.device) -> None:
        from ftlib.training.engine import Engine  # imported here: plain runs never load the engine

        torch.manual_seed(rec.seed)  # dropout's random stream; the weights come from seed=rec.seed below
        # Same initial weights as _PlainSteps (build_model seeds the init like torch.manual_seed + GPT).
        self.muon = rec.optimizer == "muon"
        muon = {"muon_lr": rec.muon_lr * rec.lr_at(0) / rec.lr} if self.muon else {}
        self.engine = Engine(config, rec.batch_size, rec.block_size, rec.precision, device, seed=rec.seed,
                             lr=rec.lr_at(0), betas=rec.betas, weight_decay=rec.weight_decay,
                             grad_clip=rec.grad_clip, **muon, **dict(rec.engine_options))
        self.model = self.engine.model  # its parameters are views into the engine's flat buffer
        self.config, self.device, self.rec = config, device, rec

    def set_lr(self, lr: float) -> None:
        # Device scalars the captured graph reads on every replay; Muon's rate follows the same factor.
        self.engine.set_lr(lr, self.rec.muon_lr * lr / self.rec.lr if self.muon else None)

    def load(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.engine.static_x.copy_(x)
        self.engine.static_y.copy_(y)

    def step(self) -> torch.Tensor:
        # On CUDA the graph's static output: the next replay overwrites it (the loop clones it).
        return self.engine.step(self.engine.static_x, self.engine.static_y)

    def trained_model(self) -> GPT:
        """A plain ``GPT`` with the trained weights (no kernels, own storage): for sampling and checkpoints."""
        with torch.random.fork_rng(devices=[]):  # its throw-away init must not move the global RNG
            plain = GPT(self.config).to(self.device)
        plain.load_state_dict(self.model.state_dict())
        return plain

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()  # kernels applied, and why not where not (e.g. attention with dropout)

    def loss_scale(self) -> dict[str, Any] | None:
        """fp16: the engine's loss scaler state at the end (host values), else None."""
        return self.engine.loss_scale_state()


def train(
    config: ModelConfig,
    rec: Recipe,
    ds: CharDataset,
    device: torch.device | str = "cpu",
    target_val_loss: float | None = None,
    time_budget_s: float | None = None,
    progress: bool = True,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Train ``config`` with ``rec`` and return the history and summary.

    Stops at ``rec.steps``, at the first evaluation with validation loss <= ``target_val_loss``
    (a speedrun), or once training wall time exceeds ``time_budget_s``.

    Timing: ``build_s`` (model, optimizer, and for the engine its kernels, warm-up and
    capture), ``first_step_s`` (for ``torch.compile``, the compilation), ``startup_s`` (their
    sum) and ``train_time_s`` (startup plus every later step). History ``time_s`` values
    include the startup from step 1 on.
    """

    device = torch.device(device)
    config.check_sequence(rec.block_size)
    sync(device)  # CUDA context creation is nobody's build time
    t_build = time.perf_counter()
    runner = _EngineSteps(config, rec, device) if rec.engine else _PlainSteps(config, rec, device)
    sync(device)
    build_s = time.perf_counter() - t_build
    model = runner.model
    g = torch.Generator().manual_seed(rec.seed)
    seq = SequentialBatches(ds.train, rec.batch_size, rec.block_size, device) if rec.sampler == "sequential" else None
    history: list[dict[str, Any]] = []
    train_time = 0.0
    first_step_s: float | None = None
    best = math.inf
    reached_at: dict[str, Any] | None = None
    bar = progress_bar(range(rec.steps + 1), progress, desc=f"train {config.config_hash()}", leave=False)
    last_loss = None
    for step in bar:
        if step % rec.eval_interval == 0 or step == rec.steps:
            sync(device)
            ev = {
                "step": step, "tokens": step * rec.batch_size * rec.block_size, "time_s": train_time,
                "train_loss": estimate_loss(model, ds.train, rec.batch_size, rec.block_size, rec.eval_iters,
                                            device, prec=rec.precision),
                "val_loss": estimate_loss(model, ds.val, rec.batch_size, rec.block_size, rec.eval_iters,
                                          device, prec=rec.precision),
                "lr": rec.lr_at(step),
                # loss of the last training batch: what the original script reports as "perplexity"
                "batch_loss": float(last_loss) if last_loss is not None else None,
            }
            history.append(ev)
            best = min(best, ev["val_loss"])
            bar.set_postfix(val=f"{ev['val_loss']:.3f}")
            if target_val_loss is not None and reached_at is None and ev["val_loss"] <= target_val_loss:
                reached_at = ev
                break
            if time_budget_s is not None and train_time >= time_budget_s:
                break
        if step == rec.steps:
            break
        x, y = next(seq) if seq is not None else random_batch(
            ds.train, rec.batch_size, rec.block_size, generator=g, device=device)
        runner.load(x, y)
        runner.set_lr(rec.lr_at(step))
        sync(device)
        t0 = time.perf_counter()
        loss = runner.step()
        sync(device)
        dt = time.perf_counter() - t0
        if first_step_s is None:
            first_step_s = dt
            dt += build_s  # the startup is paid once, before the first step's result
        train_time += dt
        last_loss = loss.clone()  # outside the clock; the engine's next replay overwrites its output
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {float(loss)} at step {step}")
    startup_s = build_s + (first_step_s or 0.0)
    result = {
        "config": config.to_dict(), "config_hash": config.config_hash(), "recipe": dataclasses.asdict(rec),
        "history": history, "best_val_loss": best, "train_time_s": train_time,
        "build_s": build_s, "first_step_s": first_step_s, "startup_s": startup_s,
        "steps_done": history[-1]["step"], "reached": reached_at,
        "engine": runner.describe(),
        "loss_scale": runner.loss_scale(),
    }
    model = runner.trained_model()
    if checkpoint is not None:
        save_checkpoint(checkpoint, model, config, rec, result)
    result["model"] = model
    return result


def save_checkpoint(path: Path, model: GPT, config: ModelConfig, rec: Recipe, result: dict | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in (result or {}).items() if k != "model"}
    tmp = path.with_suffix(".tmp")
    torch.save({"config": config.to_dict(), "recipe": dataclasses.asdict(rec), "state_dict": model.state_dict(),
                "result": meta}, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """The model of a checkpoint (config rebuilt and validated) and its saved metadata."""
    ck = torch.load(Path(path), map_location=device, weights_only=False)
    model = GPT(ModelConfig(**ck["config"])).to(device)
    model.load_state_dict(ck["state_dict"])
    return model, ck
