"""Shared launcher helpers: argument checks with clear messages, compute dtypes, grid sizes."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

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


def out_tensor(name: str, t: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """``t`` checked as a destination of ``shape`` and ``dtype`` with a unit last stride (a strided view a
    kernel writes through), or, for None, a new tensor."""
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(t.shape) != shape or t.dtype != dtype or t.stride(-1) != 1:
        raise ValueError(f"{name} must be {shape} {dtype} with a unit last stride; got {tuple(t.shape)} {t.dtype} "
                         f"strides {t.stride()}")
    return t


def compute_dtype(dtype: torch.dtype) -> tl.dtype:
    """Accumulate in fp32 for fp32/bf16/fp16 storage (as Liger does), in fp64 for fp64."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def dot_precision(dtype: torch.dtype, input_precision: str) -> str:
    """tl.dot's input precision for operands of ``dtype``: ``input_precision`` ('ieee', 'tf32', 'tf32x3') for fp32
    operands; bf16 and fp16 operands multiply on the tensor cores as they are ('ieee', which leaves them so)."""
    return input_precision if dtype == torch.float32 else "ieee"


def upcast_dots(dtype: torch.dtype) -> bool:
    """Whether a kernel's bf16/fp16 tl.dot must multiply in fp32 instead: in Triton's CPU interpreter, which
    mis-computes them (``kernels.attention_kernels._dot``); never on a GPU."""
    return interpret_mode() and dtype in (torch.bfloat16, torch.float16)


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """:func:`compute_dtype` as a torch dtype: what launchers allocate partial sums and statistics in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# The memory orders a kernel's accumulating atomic adds can take (``tl.atomic_add``'s ``sem``). Triton's default,
# 'acq_rel', fences each add against the program's other memory operations, so an add inside a loop waits for
# the loads before it; 'relaxed' keeps only the atomicity, which is all a sum needs when nothing reads it before
# the kernel ends, as CUDA's atomicAdd and the adds torch.compile generates (PTX ISA, "Memory Consistency Model").
ATOMIC_SEMS = ("acq_rel", "relaxed")


def check_atomic_sem(sem: str) -> None:
    """ValueError unless ``sem`` is one of :data:`ATOMIC_SEMS`."""
    if sem not in ATOMIC_SEMS:
        raise ValueError(f"sem={sem!r}; expected one of {ATOMIC_SEMS}")


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


# How the norm backward kernels form their weight-gradient partial sums (launcher argument
# ``dw_partials``): "tile", one partial row per (ROWS, N) tile of the grid, cdiv(M, ROWS) rows;
# "persistent", a grid of a few programs per SM, each looping over a run of tiles and writing
# one partial row (Liger-Kernel's rms_norm backward), so the launcher sums far fewer rows.
DW_PARTIALS = ("tile", "persistent")
# The fused residual-norm backward also takes "atomic": the persistent grid with each program adding
# its row into one (N,) output with atomic adds, so no partial rows and no sum kernel; the output may
# be a gradient buffer that the caller zeroed (the engine's flat gradient), which leaves nothing for
# autograd to add either. Atomic adds make the order of the sum vary from run to run (the value, up
# to float rounding, does not).
ADD_NORM_DW_PARTIALS = DW_PARTIALS + ("atomic",)
# Warps per SM of the default persistent grid: Liger's grid of one program per SM has 4 warps per
# program at N = 256 (its calculate_settings). With the 1-warp (4, 256) row tiles that is 4 programs
# per SM, so each SM keeps several tiles' loads in flight (one warp looping over its tiles alone
# would wait out a memory latency per tile).
PERSISTENT_WARPS_PER_SM = 4


@dataclass(frozen=True)
class RowGrid:
    """A persistent row-tile grid: ``rows`` rows per tile, ``per_sm`` programs per SM and, with ``stages`` above 1,
    each program's loop over its tiles software-pipelined over that many tiles (``tl.range``'s ``num_stages``:
    the next tiles' loads issued while one is computed; a kernel's own ``num_stages`` pipelines only the loads
    that feed a ``tl.dot``, which these norm kernels have none of).

    Named '<rows> rows <per_sm>/SM' and ' s<stages>' after it where stages > 1 (:attr:`name`, what :meth:`parse`
    reads); :meth:`launch` gives the launcher arguments (``rows``, ``programs``, ``loop_stages``) on a device
    (the interpreter counts 4 SMs)."""

    rows: int
    per_sm: int
    stages: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.rows, int) and self.rows >= 1 and self.rows & (self.rows - 1) == 0):
            raise ValueError(f"rows={self.rows!r} must be a power of two (a tl.arange length)")
        if isinstance(self.per_sm, bool) or not isinstance(self.per_sm, int) or self.per_sm < 1:
            raise ValueError(f"per_sm={self.per_sm!r} must be a positive int (programs per SM)")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or not 1 <= self.stages <= 4:
            raise ValueError(f"stages={self.stages!r} must be an int from 1 (no pipelining) to 4")

    @property
    def name(self) -> str:
        return f"{self.rows} rows {self.per_sm}/SM" + (f" s{self.stages}" if self.stages > 1 else "")

    @classmethod
    def parse(cls, text: str) -> RowGrid:
        """'8 rows 16/SM' -> RowGrid(8, 16); '8 rows 4/SM s2' -> RowGrid(8, 4, 2); a ValueError says what is
        wrong."""
        m = re.fullmatch(r"\s*(\d+)\s+rows\s+(\d+)\s*/\s*SM(?:\s+s(\d+))?\s*", text)
        if m is None:
            raise ValueError(f"grid {text!r}: expected '<rows> rows <programs>/SM' and optionally ' s<stages>', "
                             "e.g. '8 rows 16/SM' or '8 rows 4/SM s2'")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1))

    def launch(self, device: torch.device) -> dict[str, int | None]:
        """The launcher's ``rows``, ``programs`` (total: per_sm times the SM count) and ``loop_stages`` (None
        without pipelining)."""
        return {"rows": self.rows, "programs": self.per_sm * num_programs(device, 1 << 30),
                "loop_stages": self.stages if self.stages > 1 else None}


def check_dw_partials(dw_partials: str, programs: int | None = None,
                      allowed: tuple[str, ...] = DW_PARTIALS) -> None:
    """ValueError unless ``dw_partials`` is one of ``allowed`` and ``programs`` None or a positive int."""
    if dw_partials not in allowed:
        raise ValueError(f"dw_partials={dw_partials!r}; expected one of {allowed}")
    if programs is not None and (isinstance(programs, bool) or not isinstance(programs, int) or programs < 1):
        raise ValueError(f"programs={programs!r} must be None (a few per SM) or a positive int")


def persistent_grid(device: torch.device, n_tiles: int, programs: int | None = None,
                    num_warps: int = 1) -> tuple[int, int]:
    """(grid, tiles_per_program) of a persistent loop over ``n_tiles`` row tiles.

    About ``programs`` programs, each taking a contiguous run of tiles_per_program =
    cdiv(n_tiles, programs) tiles; the grid is cdiv(n_tiles, tiles_per_program), so no program is
    left without a tile. ``programs`` None: PERSISTENT_WARPS_PER_SM // ``num_warps`` (at least 1)
    per SM on a GPU, 4 in the interpreter (:func:`num_programs`).
    """
    if n_tiles < 1:
        return 0, 0
    if programs is None:
        per_sm = max(1, PERSISTENT_WARPS_PER_SM // num_warps) if device.type == "cuda" else 1
        programs = num_programs(device, n_tiles) * per_sm
    per_program = -(-n_tiles // max(1, min(programs, n_tiles)))
    return -(-n_tiles // per_program), per_program


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
