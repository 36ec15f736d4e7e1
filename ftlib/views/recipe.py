"""A training recipe in words (chapter 8): one line per setting that applies to it, named for a reader, with
the :class:`ftlib.training.recipe.Recipe` field beside it for one who reads the code."""

from __future__ import annotations

from typing import Any

from ftlib.training.recipe import Recipe
from ftlib.views.tables import table_view

_DECAY = {"matrices": "matrices only (not biases or norm gains; nanoGPT's rule)", "all": "every parameter"}
_SAMPLER = {"random": "random windows of the training split", "sequential": "consecutive windows, in order"}


def _lines(rec: Recipe) -> list[tuple[str, str, Any]]:
    """(setting, field, value as shown) for each setting that applies to ``rec``."""
    muon = rec.optimizer == "muon"
    out = [("training steps", "steps", rec.steps), ("sequences per batch", "batch_size", rec.batch_size),
           ("tokens per sequence", "block_size", rec.block_size),
           ("optimizer", "optimizer", "Muon for the blocks' matrices, AdamW for the rest" if muon else "AdamW"),
           ("peak learning rate" + (" (AdamW)" if muon else ""), "lr", rec.lr)]
    if muon:
        out.append(("peak learning rate (Muon)", "muon_lr", rec.muon_lr))
    out.append(("warm-up steps", "warmup", rec.warmup))
    if rec.min_lr is None:
        out.append(("learning-rate schedule", "min_lr", "constant after the warm-up"))
    else:
        end = rec.decay_steps or rec.steps
        out += [("learning-rate schedule", "schedule", "cosine decay" if rec.schedule == "cosine" else
                 f"held, then a linear cool-down over the last {rec.cooldown} steps"),
                ("final learning rate", "min_lr", rec.min_lr), ("schedule ends at step", "decay_steps", end)]
    out += [("AdamW betas", "betas", f"{rec.betas[0]}, {rec.betas[1]}"),
            ("weight decay", "weight_decay", rec.weight_decay),
            ("weight decay applies to", "decay_scheme", _DECAY.get(rec.decay_scheme, rec.decay_scheme)),
            ("gradient clipping (global norm)", "grad_clip", "none" if rec.grad_clip is None else rec.grad_clip),
            ("precision", "precision", rec.precision),
            ("execution", "engine / compile", "the book's engine (chapter 6)" if rec.engine else
             f"torch.compile, {rec.compile} mode" if rec.compile else "eager PyTorch"),
            ("batches", "sampler", _SAMPLER.get(rec.sampler, rec.sampler)),
            ("evaluation every", "eval_interval", f"{rec.eval_interval} steps"),
            ("batches per loss estimate", "eval_iters", rec.eval_iters)]
    if rec.engine and rec.engine_options:
        out.append(("engine options", "engine_options", ", ".join(f"{k}={v}" for k, v in rec.engine_options)))
    return out


@table_view
def recipe_table(rec: Recipe) -> list[dict[str, Any]]:
    """A recipe's settings (the seed aside: each run has its own), those that do not apply to it left out."""
    return [{"setting": s, "value": str(v), "field": f} for s, f, v in _lines(rec)]
