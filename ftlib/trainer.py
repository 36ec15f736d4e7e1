"""Training runs: recipes, a loop with held-out evaluation, time-to-loss, checkpoints.

Every run, whatever the model, goes through the same loop and the same
:func:`ftlib.train.train_step`, so convergence comparisons differ only in what they name.
Wall-clock time counts training steps only (evaluation is excluded and synchronized
out), so "time to validation loss 1.50" credits a faster model for its speed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ftlib.config import ModelConfig
from ftlib.data import CharDataset, SequentialBatches, random_batch
from ftlib.model import GPT
from ftlib.train import make_optimizer, precision, train_step


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

    def __post_init__(self) -> None:
        bad = []
        for f in ("steps", "batch_size", "block_size", "eval_interval", "eval_iters"):
            if getattr(self, f) < 1:
                bad.append(f"{f}={getattr(self, f)} must be >= 1")
        if self.sampler not in ("random", "sequential"):
            bad.append(f"sampler={self.sampler!r} is not 'random' or 'sequential'")
        if self.compile not in (None, "default", "reduce-overhead"):
            bad.append(f"compile={self.compile!r} is not None, 'default' or 'reduce-overhead'")
        if bad:
            raise ValueError("invalid Recipe: " + "; ".join(bad))

    def replace(self, **changes: Any) -> Recipe:
        return dataclasses.replace(self, **changes)

    def lr_at(self, step: int) -> float:
        """Linear warm-up then cosine decay to ``min_lr`` (nanoGPT's get_lr; Loshchilov & Hutter 2017)."""
        if step < self.warmup:
            return self.lr * (step + 1) / (self.warmup + 1)
        if self.min_lr is None:
            return self.lr
        horizon = self.decay_steps or self.steps
        if step > horizon:
            return self.min_lr
        ratio = (step - self.warmup) / max(1, horizon - self.warmup)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.lr - self.min_lr)


RECIPES: dict[str, Recipe] = {
    # The original convergence script (facts.md): constant lr, sequential batches, fp32.
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    with precision(prec, device):
        for _ in range(iters):
            x, y = random_batch(data, batch_size, block_size, generator=g, device=device)
            _, loss = model(x, y)
            total += float(loss)
    model.train(was_training)
    return total / iters


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
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    config.check_sequence(rec.block_size)
    torch.manual_seed(rec.seed)
    model = GPT(config).to(device)
    opt = make_optimizer(model, lr=rec.lr, betas=rec.betas, weight_decay=rec.weight_decay,
                         scheme=rec.decay_scheme, fused=device.type == "cuda" or None)
    step_model = torch.compile(model, mode=rec.compile) if rec.compile else model
    g = torch.Generator().manual_seed(rec.seed)
    seq = SequentialBatches(ds.train, rec.batch_size, rec.block_size, device) if rec.sampler == "sequential" else None
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rec.precision)
    history: list[dict[str, Any]] = []
    train_time = 0.0
    best = math.inf
    reached_at: dict[str, Any] | None = None
    bar = tqdm(range(rec.steps + 1), desc=f"train {config.config_hash()}", disable=not progress, leave=False)
    tf32 = "tf32" if rec.precision == "tf32" else "fp32"
    last_loss = None
    for step in bar:
        if step % rec.eval_interval == 0 or step == rec.steps:
            _sync(device)
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
        for group in opt.param_groups:
            group["lr"] = rec.lr_at(step)
        _sync(device)
        t0 = time.perf_counter()
        with precision(tf32, device):
            loss = train_step(step_model, opt, x, y, grad_clip=rec.grad_clip, autocast_dtype=autocast)
        _sync(device)
        train_time += time.perf_counter() - t0
        last_loss = loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {float(loss)} at step {step}")
    result = {
        "config": config.to_dict(), "config_hash": config.config_hash(), "recipe": dataclasses.asdict(rec),
        "history": history, "best_val_loss": best, "train_time_s": train_time,
        "steps_done": history[-1]["step"], "reached": reached_at,
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
