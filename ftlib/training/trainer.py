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
report the time with it and without it (the steps after the first). When a target is
reached, the loss on the whole validation split (:func:`full_split_loss`) is computed at
that step, after the clock has stopped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from ftlib.core.precision import Precision, precision_region
from ftlib.core.progress import progress_bar
from ftlib.core.timing import sync
from ftlib.model.config import ModelConfig
from ftlib.model.gpt import GPT
from ftlib.training.data import CharDataset, SequentialBatches, random_batch
from ftlib.training.recipe import RECIPES, Recipe, make_recipe_optimizer, recipe
from ftlib.training.step import grad_scaler, train_step

__all__ = ["RECIPES", "Recipe", "estimate_loss", "full_split_loss", "load_checkpoint", "recipe", "save_checkpoint",
           "train"]

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


@torch.no_grad()
def full_split_loss(
    model: GPT, data: torch.Tensor, block_size: int, device: torch.device, prec: str = "fp32",
    windows_per_batch: int = 64,
) -> tuple[float, int]:
    """Mean loss over every position of ``data`` once, and how many positions that is (``len(data) - 1``).

    The inputs ``data[:-1]`` are cut into non-overlapping windows of ``block_size`` (the last one
    shorter where the length is not a multiple), each predicting the next token at every position;
    the mean is over positions, so the short window counts by its length. Unlike
    :func:`estimate_loss` (random windows, a sample), this is the split's loss itself.
    """
    was_training = model.training
    model.eval()
    x_all, y_all = data[:-1], data[1:]
    n = len(x_all)
    full = n // block_size * block_size
    # (windows, T) blocks of whole windows, then the remainder as one (1, r) window
    parts = [(x_all[:full].view(-1, block_size), y_all[:full].view(-1, block_size))]
    if full < n:
        parts.append((x_all[full:].view(1, -1), y_all[full:].view(1, -1)))
    total = torch.zeros((), dtype=torch.float64, device=device)
    with precision_region(prec, device):
        for xs, ys in parts:
            for i in range(0, len(xs), windows_per_batch):
                x, y = xs[i:i + windows_per_batch].to(device), ys[i:i + windows_per_batch].to(device)
                logits, _ = model(x)  # (b, t, V)
                total += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                                           reduction="sum").double()
    model.train(was_training)
    return float(total) / n, n


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
    include the startup from step 1 on. Evaluation is never timed.

    At a reached target, ``full_val_loss`` is :func:`full_split_loss` on the validation split at
    that step (over ``full_val_positions`` positions, taking ``full_val_s`` seconds, untimed);
    all three are None when no target was reached.
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
                # one batch per step (the recipe has no gradient accumulation)
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
    model = runner.trained_model()  # a plain GPT (the engine's weights copied out): any window length runs
    full_val, full_val_n, full_val_s = None, None, None
    if reached_at is not None:  # the model as it was at the stopping evaluation: no step followed it
        sync(device)
        t0 = time.perf_counter()
        full_val, full_val_n = full_split_loss(model, ds.val, rec.block_size, device, prec=rec.precision)
        sync(device)
        full_val_s = time.perf_counter() - t0
    result = {
        "config": config.to_dict(), "config_hash": config.config_hash(), "recipe": dataclasses.asdict(rec),
        "history": history, "best_val_loss": best, "train_time_s": train_time,
        "build_s": build_s, "first_step_s": first_step_s, "startup_s": startup_s,
        "steps_done": history[-1]["step"], "reached": reached_at,
        "full_val_loss": full_val, "full_val_positions": full_val_n, "full_val_s": full_val_s,
        "engine": runner.describe(),
        "loss_scale": runner.loss_scale(),
    }
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
