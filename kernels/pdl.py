"""Programmatic dependent launch (PDL) for the kernels: the next kernel's programs start before this one ends.

Inside a CUDA graph the kernels of a step still run one after another: each starts only once the one before it in
its stream has ended, and its programs then take a while to reach every SM. At the engine's sizes a kernel runs for a
few microseconds, so those gaps are a large part of the step. On sm_90 and later a kernel launched with PDL (CUDA
programming guide, "Programmatic Dependent Launch and Synchronization"; Triton's ``launch_pdl``) may start while
the one before it still runs:

* the kernel before it lets it start as soon as each of its own programs has executed
  ``griddepcontrol.launch_dependents`` (or ended), that is, once its last programs are on the SMs; with the 'exit'
  trigger (:data:`TRIGGERS`) our kernels never execute it, so the next one starts only as their programs end;
* the new kernel's programs then wait in ``griddepcontrol.wait`` until the kernel before has ended and its writes
  are visible, so every load and store after the wait sees memory as it would without PDL.

Every kernel here that takes ``PDL`` calls :func:`_grid_dependency` first, before any load or store, so the result is
the same bit for bit: only the start is earlier. A kernel launched after one that never signals (a cuBLAS GEMM)
starts when that kernel ends, as without PDL, less the launch itself.

PDL is on only inside :func:`programmatic_launch` (the engine's option ``programmatic_launch``), for CUDA tensors
on sm_90 or later; elsewhere (older GPUs, Triton's CPU interpreter, which has no grid dependency control) the
launchers leave it off. The switch is a module setting, not an argument of every launcher: the engine turns it on
around its whole step, forward and backward, and the autograd engine runs the backward's launchers on a thread of
its own, which a context variable would not reach.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import triton
import triton.language as tl

PDL_CAPABILITY = (9, 0)  # griddepcontrol needs sm_90 (PTX ISA, "griddepcontrol")
# Where a kernel lets the next one start, and the value its ``PDL`` constexpr takes for it: 'start', right after its
# own wait (True); 'exit', only as its programs end (2: it never signals, and the CUDA programming guide's
# implicit trigger at each program's exit launches the next kernel).
_EXIT = tl.constexpr(2)
TRIGGERS = {"start": True, "exit": _EXIT.value}
_ON = False
_TRIGGER = "start"


@contextmanager
def programmatic_launch(on: bool = True, trigger: str = "start") -> Iterator[None]:
    """Launch the kernels that take ``PDL`` with programmatic dependent launch while inside (where
    :func:`pdl_args` allows it), each letting the next start at ``trigger`` (one of :data:`TRIGGERS`); restores
    the previous setting on leaving."""
    global _ON, _TRIGGER
    if trigger not in TRIGGERS:
        raise ValueError(f"programmatic_launch: trigger {trigger!r}; expected one of {tuple(TRIGGERS)}")
    before = _ON, _TRIGGER
    _ON, _TRIGGER = bool(on), trigger
    try:
        yield
    finally:
        _ON, _TRIGGER = before


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be launched with PDL: a CUDA device of sm_90 or later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= PDL_CAPABILITY


def pdl_args(t: torch.Tensor) -> dict[str, Any]:
    """The launch arguments of a kernel that takes ``PDL``, for a launch whose tensors are on ``t``'s device:
    ``PDL`` (the trigger's value, :data:`TRIGGERS`) and ``launch_pdl=True`` inside :func:`programmatic_launch` where
    the device supports it, else none (the kernel's ``PDL`` stays False and the launch is an ordinary one)."""
    return {"PDL": TRIGGERS[_TRIGGER], "launch_pdl": True} if _ON and pdl_supported(t.device) else {}


@triton.jit
def _grid_dependency(PDL: tl.constexpr):
    """With PDL: wait until the kernel before this one in the stream has ended and its writes are visible
    (griddepcontrol.wait); then, with the 'start' trigger (``PDL`` True), let the next kernel launched with PDL
    start once every program of this one has come this far (griddepcontrol.launch_dependents), so its programs are
    on the SMs, waiting, when this one ends; with the 'exit' trigger (``PDL`` 2) signal nothing, so the next kernel
    starts as this one's programs end. Called first, before any load or store. Without PDL: nothing."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        if PDL != _EXIT:
            tl.extra.cuda.gdc_launch_dependents()
