"""The training step shared by benchmarks and training, and the optimizer that goes with it."""

from __future__ import annotations

import torch
import torch.nn as nn

from ftlib.core.precision import PRECISIONS
from ftlib.training.loss_scale import LossScaleConfig, make_grad_scaler


def param_groups(model: nn.Module, weight_decay: float, scheme: str = "matrices") -> list[dict]:
    """AdamW parameter groups.

    'matrices': decay only parameters with >= 2 dims (weights of Linear/Embedding), not
    biases or norm gains - nanoGPT's ``configure_optimizers`` rule, applied to every model
    alike so that a comparison is not confounded by different decay sets.
    'all': decay everything (``torch.optim.AdamW(model.parameters())``).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if scheme == "all":
        return [{"params": params, "weight_decay": weight_decay}]
    if scheme != "matrices":
        raise ValueError(f"unknown weight-decay scheme {scheme!r}; expected 'matrices' or 'all'")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(
    model: nn.Module,
    lr: float = 3e-4,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.01,
    scheme: str = "matrices",
    fused: bool | None = None,
    capturable: bool = False,
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with the original training script's defaults.

    ``capturable=True`` keeps the step count on the device so the step can be captured
    in a CUDA graph; ``fused=True`` uses the single-kernel CUDA implementation.
    """
    kwargs: dict = {"lr": lr, "betas": betas}
    if fused is not None:
        kwargs["fused"] = fused
    if capturable:
        kwargs["capturable"] = True
    return torch.optim.AdamW(param_groups(model, weight_decay, scheme), **kwargs)


def grad_scaler(
    precision: str, device: torch.device | str, config: LossScaleConfig | None = None
) -> torch.amp.GradScaler | None:
    """The loss scaler a step in ``precision`` needs: a ``torch.amp.GradScaler`` for fp16 (dynamic
    loss scaling, :mod:`ftlib.training.loss_scale`), None for fp32, tf32 and bf16."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    return make_grad_scaler(precision, device, config)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    grad_clip: float | None = None,
    autocast_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """zero_grad(set_to_none) + forward + loss + backward + (clip) + optimizer step.

    This is exactly the timed region of the original benchmark. Returns the loss as a
    detached device tensor: no ``.item()``, so no host sync and the step stays capturable.

    ``scaler`` (fp16: :func:`grad_scaler`): the PyTorch AMP recipe's order: backward of the
    scaled loss, ``unscale_`` before clipping (so the clip sees true gradients), ``scaler.step``
    (skips the update when a gradient is inf/nan), ``scaler.update``. With torch's fused AdamW
    nothing here syncs with the host; with the default (for-each) AdamW ``scaler.step`` reads
    the found-inf flag on the host once per step (GradScaler's ``_maybe_opt_step``).
    """
    optimizer.zero_grad(set_to_none=True)
    if autocast_dtype is not None:
        with torch.autocast(device_type=x.device.type, dtype=autocast_dtype):
            _, loss = model(x, y)
    else:
        _, loss = model(x, y)
    if scaler is None:
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return loss.detach()
    scaler.scale(loss).backward()
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
