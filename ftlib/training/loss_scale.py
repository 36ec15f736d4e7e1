"""Dynamic loss scaling for fp16 training: torch's GradScaler for ``train_step``, and a
device-resident equivalent for the engine's captured step.

fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero (Micikevicius et al. 2018,
"Mixed Precision Training", sec. 3.2: a third of an SSD's activation gradients did). Scaling
the loss by S shifts every gradient into range; the optimizer then sees gradients times 1/S.
S is dynamic (sec. 3.2 and ``torch.amp.GradScaler``): when a step's gradients hold an inf or
a nan the step is skipped and S halves; after ``growth_interval`` clean steps S doubles.
bf16 has fp32's exponent range and needs none of this.

:class:`DeviceLossScale` keeps S, the clean-step count and the found-inf flag as device tensors
and updates them with device ops only (``torch._amp_update_scale_``, the kernel
``GradScaler.update`` itself runs), so a whole step can be captured in one CUDA graph and
replayed with no host sync; the flat AdamW kernel (``kernels/adamw.py``) unscales and skips.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LossScaleConfig:
    """``torch.amp.GradScaler``'s knobs, with its defaults: start at 2^16, halve on inf/nan,
    double after 2,000 clean steps."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        bad = []
        if not (isinstance(self.init_scale, (int, float)) and math.isfinite(self.init_scale) and self.init_scale > 0):
            bad.append(f"init_scale={self.init_scale!r} must be a finite positive number")
        if not (isinstance(self.growth_factor, (int, float)) and self.growth_factor > 1):
            bad.append(f"growth_factor={self.growth_factor!r} must be > 1")
        if not (isinstance(self.backoff_factor, (int, float)) and 0 < self.backoff_factor < 1):
            bad.append(f"backoff_factor={self.backoff_factor!r} must lie in (0, 1)")
        if not (isinstance(self.growth_interval, int) and not isinstance(self.growth_interval, bool)
                and self.growth_interval >= 1):
            bad.append(f"growth_interval={self.growth_interval!r} must be an int >= 1")
        if bad:
            raise ValueError("invalid LossScaleConfig: " + "; ".join(bad))

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.amp.GradScaler``."""
        return {"init_scale": float(self.init_scale), "growth_factor": float(self.growth_factor),
                "backoff_factor": float(self.backoff_factor), "growth_interval": int(self.growth_interval)}


def needs_loss_scaling(precision: str) -> bool:
    """fp16 only: bf16 and fp32 have fp32's exponent range."""
    return precision == "fp16"


def make_grad_scaler(
    precision: str, device: torch.device | str, config: LossScaleConfig | None = None
) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler`` for fp16 (``config``'s knobs, default GradScaler's), None otherwise."""
    if not needs_loss_scaling(precision):
        return None
    return torch.amp.GradScaler(torch.device(device).type, **(config or LossScaleConfig()).kwargs())


class DeviceLossScale:
    """Dynamic loss scaling with all its state in 0-dim device tensors (graph-capturable).

    Per step: ``scale_loss(loss).backward()``, then ``unscale_factor_(flat_grad, grad_clip)``
    (sets ``found_inf`` and ``grad_mul``), the optimizer (flat AdamW with
    ``grad_scaling=(grad_mul, found_inf)``, step count advanced by ``step_increment()``), then
    ``update_()``. Same decisions as ``GradScaler`` (unscale, clip the unscaled gradients, skip
    on inf/nan, grow/back off) with these differences, both documented in the methods:
    found-inf comes from the gradient norm, and unscale and clip are one multiply.
    """

    def __init__(self, device: torch.device | str, config: LossScaleConfig | None = None) -> None:
        self.config = config or LossScaleConfig()
        dev = torch.device(device)
        self.scale = torch.full((), float(self.config.init_scale), dtype=torch.float32, device=dev)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=dev)  # clean steps since the last change
        self.found_inf = torch.zeros((), dtype=torch.float32, device=dev)  # 1.0: this step's gradients overflowed
        self.grad_mul = torch.ones((), dtype=torch.float32, device=dev)  # what the optimizer multiplies grads by

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """loss * S (fp32), to call backward on."""
        return loss.float() * self.scale

    @torch.no_grad()
    def unscale_factor_(self, flat_grad: torch.Tensor, grad_clip: float | None = None) -> None:
        """From the scaled gradients: ``found_inf`` = 1 when their norm is not finite, and
        ``grad_mul`` = 1/S, times ``clip_grad_norm_``'s coefficient min(1, clip / (||g/S|| + 1e-6))
        when clipping.

        An inf or nan gradient makes the sum of squares inf or nan, so the norm finds every
        overflow ``GradScaler``'s elementwise check finds, with the reduction clipping needs
        anyway. It also flags finite gradients whose squares overflow fp32 (|g S| around 1e19),
        which the elementwise check would pass; the step is then skipped and S halved, which
        such gradients call for anyway. 1/S is computed like GradScaler's (the fp64 reciprocal
        rounded to fp32) and is a power of two for the default factors, so g * (1/S) * coef is
        exactly (g * (1/S)) * coef, the reference's unscale-then-clip.
        """
        norm = torch.linalg.vector_norm(flat_grad)
        self.found_inf.copy_(torch.logical_not(torch.isfinite(norm)))
        inv = self.scale.double().reciprocal().float()
        if grad_clip is None:
            self.grad_mul.copy_(inv)
        else:
            coef = torch.clamp(grad_clip / (norm * inv + 1e-6), max=1.0)
            self.grad_mul.copy_(inv * coef)

    def step_increment(self) -> torch.Tensor:
        """1 for a clean step, 0 for a skipped one: what the optimizer's step count advances by."""
        return 1.0 - self.found_inf

    @torch.no_grad()
    def update_(self) -> None:
        """GradScaler.update's rule on the device: S *= backoff on inf/nan (tracker to 0), else
        tracker += 1 and S *= growth once it reaches ``growth_interval`` (tracker to 0)."""
        torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf, float(self.config.growth_factor),
                                 float(self.config.backoff_factor), int(self.config.growth_interval))

    @torch.no_grad()
    def reset_(self) -> None:
        """Back to the initial state, in place (captured graphs keep their pointers)."""
        self.scale.fill_(float(self.config.init_scale))
        self.growth_tracker.zero_()
        self.found_inf.zero_()
        self.grad_mul.fill_(1.0)

    def state(self) -> dict[str, float | int]:
        """Current scale, clean-step count and last found-inf flag (host values: syncs)."""
        return {"scale": float(self.scale), "growth_tracker": int(self.growth_tracker),
                "found_inf": float(self.found_inf)}
