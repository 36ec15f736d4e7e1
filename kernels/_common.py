"""Shared launcher helpers: argument checks with clear messages, compute dtypes, grid sizes."""

from __future__ import annotations

import os

import torch
import triton.language as tl

# Storage dtypes the kernels accept. float64 is there so that torch.autograd.gradcheck can
# run through the autograd.Functions (the interpreter and the GPU both support fp64 loads).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def interpret_mode() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels need CUDA tensors, or CPU tensors when the Triton interpreter is on."""
    if t.is_cuda:
        return
    if t.device.type == "cpu" and interpret_mode():
        return
    raise ValueError(
        f"{name} is on device {t.device}; Triton kernels need a CUDA tensor "
        "(or set TRITON_INTERPRET=1 before importing triton to run on the CPU)"
    )


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
    ndim: int | None = None,
    contiguous: bool = True,
) -> None:
    """Raise a TypeError/ValueError naming the argument when ``t`` is not what a kernel expects."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_device(name, t)
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in dtypes]}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {t.stride()}); call .contiguous() first")


def same_device(*named: tuple[str, torch.Tensor]) -> None:
    devs = {n: t.device for n, t in named}
    if len(set(devs.values())) > 1:
        raise ValueError(f"tensors on different devices: {devs}")


def compute_dtype(dtype: torch.dtype) -> tl.dtype:
    """Accumulate in fp32 for fp32/bf16/fp16 storage (as Liger does), in fp64 for fp64."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def row_tile_warps(rows: int, block_n: int) -> int:
    """Warps for a (rows, block_n) row tile: one per 1,024 elements, 1 to 8 (the row-tile norm
    kernels; 4 x 256 -> 1 warp, the RMSNorm winner in kernels.jsonl)."""
    return min(8, max(1, rows * block_n // 1024))


def num_programs(device: torch.device, work: int) -> int:
    """Programs for a persistent reduction grid: one per SM (capped by the work items).

    Liger's RMSNorm backward uses one program per SM, each accumulating a partial dweight
    over its rows, and reduces the (n_programs, N) partials with one torch.sum.
    """
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4  # interpreter: a few programs still exercise the partial-sum reduction
    return max(1, min(sms, work))


def interpreter_ready() -> bool:
    """True when Triton kernels can run in the CPU interpreter in this process.

    TRITON_INTERPRET=1 must be set before the first ``import triton``: Triton's own
    ``@triton.jit`` library functions (tl.max's combine function, ...) are built at import
    and stay compiled-mode objects otherwise. torch can import triton on its own (e.g.
    torch.utils.flop_counter does), so a process that imports torch first cannot interpret
    kernels; tests/conftest.py therefore sets it before any test module is imported.
    """
    import triton.language.standard as std

    return interpret_mode() and type(std.cdiv).__name__ == "InterpretedFunction"
