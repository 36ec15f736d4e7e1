"""Training recipes: the optimizer, schedule, batch shape, precision and execution of a run.

A :class:`Recipe` is frozen and validated; :func:`recipe` gives the named ones (the original
repository's script, nanoGPT's shakespeare_char). Its ``key_repr`` is what result keys hash: a
field added later enters it only when set, so rows stored before it existed keep their keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from ftlib.core.precision import PRECISIONS
from ftlib.model.gpt import GPT
from ftlib.training.engine.options import key_items, option_names
from ftlib.training.step import make_optimizer

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
        elif self.schedule == "trapezoid" and self.cooldown > (self.decay_steps or self.steps) - self.warmup:
            bad.append(f"cooldown={self.cooldown} is longer than the steps between warm-up ({self.warmup}) and "
                       f"the end of the schedule ({self.decay_steps or self.steps})")
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
