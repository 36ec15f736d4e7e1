"""The book's four training precisions, each resolved once into what it switches.

* ``fp32``: float32 storage, strict IEEE float32 matmuls (TF32 off).
* ``tf32``: float32 storage, TF32 tensor-core matmuls and convolutions.
* ``bf16`` / ``fp16``: float32 weights, the step under ``torch.autocast`` to that dtype
  (mixed precision, Micikevicius et al. 2018); fp16 with dynamic loss scaling
  (:mod:`ftlib.training.loss_scale`), since its 5 exponent bits flush small gradients to zero.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    """What a precision name switches; :meth:`of` gives the one object per name."""

    name: str
    autocast: torch.dtype | None  # the autocast dtype: bf16 / fp16, None for fp32 storage
    tf32: bool  # TF32 tensor-core matmuls for float32 tensors
    activation_bytes: int  # bytes per activation element (fp32 and tf32: 4; bf16 and fp16: 2)
    loss_scaling: bool  # gradients need dynamic loss scaling (fp16 only)

    @staticmethod
    @functools.cache
    def of(name: str) -> Precision:
        """The precision named ``name`` (one of :data:`PRECISIONS`); a ValueError otherwise."""
        if name not in PRECISIONS:
            raise ValueError(f"unknown precision {name!r}; expected one of {PRECISIONS}")
        autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
        return Precision(name=name, autocast=autocast, tf32=name == "tf32",
                         activation_bytes=2 if autocast is not None else 4, loss_scaling=name == "fp16")

    @contextlib.contextmanager
    def matmul_flags(self) -> Iterator[None]:
        """TF32 on (tf32) or off (the others) for matmuls and convolutions, restored after."""
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                 torch.get_float32_matmul_precision())
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32
        torch.set_float32_matmul_precision("high" if self.tf32 else "highest")
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, mp = saved
            torch.set_float32_matmul_precision(mp)

    @contextlib.contextmanager
    def region(self, device: torch.device | str = "cpu") -> Iterator[None]:
        """Run a region in this precision: :meth:`matmul_flags`, and autocast for bf16 / fp16.

        The autocast's weight-cast cache is off: it lives as long as the region, so steps inside
        one region would otherwise reuse low-precision copies of weights the optimizer has changed.
        """
        with self.matmul_flags():
            if self.autocast is None:
                yield
            else:
                with torch.autocast(device_type=torch.device(device).type, dtype=self.autocast, cache_enabled=False):
                    yield


def precision_region(name: str, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager[None]:
    """``Precision.of(name).region(device)``: the whole step in one of the book's precisions."""
    return Precision.of(name).region(device)
