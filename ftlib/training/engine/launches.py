"""The engine's programmatic dependent launch (option ``programmatic_launch``): where it applies, and the context
its step runs in.

With it, every Triton kernel of the step that takes ``PDL`` (``kernels/pdl.py``) is launched so that it may start
while the kernel before it in its stream still runs, waiting on the GPU, not in the launch queue, until that kernel's
writes are visible; the results are the same bit for bit. It needs sm_90 or later (Hopper's grid dependency control);
inside the step's CUDA graph the launches become programmatic edges. This module imports no Triton: the kernels'
module is imported only where the option applies.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from ftlib.core.device import DeviceInfo
from ftlib.training.engine.options import EngineOptions

PDL_CAPABILITY = (9, 0)  # kernels.pdl.PDL_CAPABILITY, kept equal by tests/test_programmatic_launch_option.py


def programmatic_launch_applies(options: EngineOptions, kernels_applied: dict[str, bool], info: DeviceInfo,
                                notes: dict[str, str]) -> bool:
    """Whether the step's kernels launch with PDL: the option on, a CUDA device of sm_90 or later, and some
    Triton kernel in the step; where the option is on and does not apply, ``notes`` says why."""
    if not options.programmatic_launch:
        return False
    why = None
    if info.kind != "cuda":
        why = "not applicable: programmatic dependent launch is for CUDA devices of sm_90 or later"
    elif info.capability < PDL_CAPABILITY:
        why = f"not applicable: needs sm_90 or later, {info.name} is sm_{info.capability[0]}{info.capability[1]}"
    elif not any(kernels_applied.values()):
        why = "not applied: no Triton kernel runs in this step"
    when = ("once every program of it has waited" if options.programmatic_trigger == "start"
            else "only as its programs end")
    notes["programmatic_launch"] = why or ("the step's Triton kernels launched with programmatic dependent "
                                           "launch, each waiting on the GPU for the kernel before it (kernels/pdl.py)"
                                           f" and letting the next one start {when}")
    return why is None


def step_launches(on: bool, trigger: str = "start") -> AbstractContextManager:
    """The context the step runs in: the kernels' programmatic launch switched on where ``on``, each kernel letting
    the next start at ``trigger`` (option ``programmatic_trigger``), else nothing."""
    if not on:
        return nullcontext()
    from kernels.pdl import programmatic_launch

    return programmatic_launch(True, trigger)
