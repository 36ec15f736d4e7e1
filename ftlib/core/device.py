"""Which device runs (:func:`pick_device`), what it is called (:func:`device_name`,
:func:`device_slug`) and what it can do (:class:`DeviceInfo`, one frozen description that the
precision plan, the engine and the AOT compile check read).

The post's claims are T4 claims. A T4 is sm_75 (Turing): fp16 tensor cores, but no TF32 and no
bf16 ones (both arrived with sm_80, Ampere), and 64 KB of shared memory per block. Nothing
measured on an sm_80+ card transfers to it by relabelling: 'tf32' would run in plain fp32,
Inductor does not emit bf16 kernels below sm_80, and Triton's ``tl.dot`` does not use tensor
cores below sm_80 at all (Triton 3's AccelerateMatmul pass: "Dot op using MMA for compute
capability < 80 has been deprecated. It falls back to the FMA path"; ``tests/test_aot.py``
checks it for the installed Triton).

Three ways to get a description:

* ``DeviceInfo.detect(device)``: the live device (``torch.cuda.get_device_properties``), or the
  CPU. With ``FTLIB_CAPABILITY`` set (e.g. ``7.5``) it describes that capability's GPU instead
  (the table below) and says so (``rehearsal=True``, ``actual`` names the real device): CI and
  an H200 can then rehearse a T4's plan, tile choices and engine decisions.
* ``DeviceInfo.for_capability("7.5")``: planning without the GPU, from ``KNOWN_GPUS``.
* ``DeviceInfo.cpu()``.

Shared memory per block is the opt-in maximum (``cudaDevAttrMaxSharedMemoryPerBlockOptin``,
what Triton checks a kernel against when it loads it), not the 48 KB static default. The
capability table and the rehearsal variable are the kernels' own (:mod:`kernels.limits`), so the
description here and the tiles the kernels choose always agree.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ftlib.core.precision import PRECISIONS
from kernels.limits import ENV_CAPABILITY, Limits, parse_capability, smem_per_block_optin


def pick_device(name: str = "auto") -> torch.device:
    """'auto' -> CUDA if available, else CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"unknown device {name!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} was asked for but CUDA is not available here")
    return dev


def device_name(device: torch.device | str) -> str:
    """The GPU's name as CUDA reports it ('NVIDIA H200'), or the CPU's."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return platform.processor() or platform.machine() or "cpu"


def slug_of_name(name: str) -> str:
    """A GPU's name as its results folder: 'NVIDIA H200' -> 'h200', 'Tesla T4' -> 't4'.

    The one rule for the folder: the runners name it from the live device (:func:`device_slug`)
    and ci/ingest-results from the ``device`` field of a returned row, and the two must agree.
    """
    name = name.lower()
    for prefix in ("nvidia ", "tesla "):
        name = name.replace(prefix, "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def device_slug(device: torch.device | str) -> str:
    """Folder name for results of a device: 'cpu' off CUDA, else :func:`slug_of_name` of its name."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cpu"
    return slug_of_name(device_name(dev))

@dataclass(frozen=True)
class KnownGPU:
    """A GPU the book plans for: datasheet numbers (NVIDIA's product pages)."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    memory_gb: float  # as sold (10^9 bytes)


# The post's card first; one entry per capability is the one ``for_capability`` picks.
KNOWN_GPUS: tuple[KnownGPU, ...] = (
    KnownGPU("Tesla T4", (7, 5), 40, 16.0),
    KnownGPU("A100-SXM4-80GB", (8, 0), 108, 80.0),
    KnownGPU("L4", (8, 9), 58, 24.0),
    KnownGPU("H100-SXM5-80GB", (9, 0), 132, 80.0),
    KnownGPU("H200", (9, 0), 132, 141.0),
)

# torch.nn.functional.scaled_dot_product_attention's CUDA backends and where they run
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: check_flash_attention_hardware_support
# [sm80, sm121], fp16/bf16; check_mem_efficient_hardware_support [sm50, sm121], fp16/fp32 and
# bf16 from sm80; check_cudnn_hardware_support [sm80, sm121], fp16/bf16). 'math' runs anywhere.
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
_DTYPE_NAMES = ("fp32", "fp16", "bf16")


def known_gpu(capability: str | float | tuple[int, int]) -> KnownGPU | None:
    """The first ``KNOWN_GPUS`` entry of that capability, if any."""
    cc = parse_capability(capability)
    return next((g for g in KNOWN_GPUS if g.capability == cc), None)


def _sdpa_backends(capability: tuple[int, int] | None, dtype: str) -> tuple[str, ...]:
    if capability is None:  # CPU: the math path and its fused flash-style CPU kernel
        return ("flash", "math") if dtype in ("fp32", "bf16", "fp16") else ("math",)
    sm = capability[0] * 10 + capability[1]
    out = []
    if 80 <= sm <= 121 and dtype in ("fp16", "bf16"):
        out.append("flash")
    if 50 <= sm <= 121 and (dtype in ("fp32", "fp16") or (dtype == "bf16" and sm >= 80)):
        out.append("efficient")
    if 80 <= sm <= 121 and dtype in ("fp16", "bf16"):
        out.append("cudnn")
    return (*out, "math")


@dataclass(frozen=True)
class DeviceInfo:
    """A device's capabilities, as far as this book's precisions and kernels care.

    ``kind``: 'cuda' or 'cpu'. ``capability``: (major, minor), None on the CPU. ``sm_count``,
    ``total_memory`` (bytes) and ``shared_memory_per_block`` (opt-in maximum, bytes) are None
    where unknown. Derived from the capability (not passed): ``tensor_cores`` (the dtypes with
    tensor-core matmuls: fp16 from sm_70, tf32 and bf16 from sm_80), ``triton_dot_tensor_cores``
    (the ``tl.dot`` input precisions Triton lowers to MMA instructions: tf32, tf32x3, bf16, fp16
    from sm_80, none below; 'ieee' never) and ``sdpa`` ((dtype, backends) pairs).
    ``rehearsal``: True when ``FTLIB_CAPABILITY`` made this description stand in for another
    device, ``actual`` then names the real one. ``source``: 'detected', 'table' or 'cpu'.
    """

    name: str
    kind: str
    capability: tuple[int, int] | None
    sm_count: int | None = None
    total_memory: int | None = None
    shared_memory_per_block: int | None = None
    rehearsal: bool = False
    actual: str | None = None
    source: str = "table"
    tensor_cores: tuple[str, ...] = field(init=False)
    triton_dot_tensor_cores: tuple[str, ...] = field(init=False)
    sdpa: tuple[tuple[str, tuple[str, ...]], ...] = field(init=False)

    def __post_init__(self) -> None:
        bad = []
        if self.kind not in ("cuda", "cpu"):
            bad.append(f"kind={self.kind!r} is not 'cuda' or 'cpu'")
        if self.kind == "cuda" and self.capability is None:
            bad.append("a 'cuda' device needs a capability")
        if self.kind == "cpu" and self.capability is not None:
            bad.append(f"a 'cpu' device has no capability (got {self.capability})")
        for f in ("sm_count", "total_memory", "shared_memory_per_block"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or v <= 0):
                bad.append(f"{f}={v!r} must be a positive int or None")
        if self.rehearsal and not self.actual:
            bad.append("rehearsal=True needs actual (the device really used)")
        if bad:
            raise ValueError("invalid DeviceInfo: " + "; ".join(bad))
        cc = self.capability
        sm = None if cc is None else cc[0] * 10 + cc[1]
        cores: tuple[str, ...] = ()
        if sm is not None and sm >= 70:
            cores = ("fp16",) if sm < 80 else ("tf32", "bf16", "fp16")
        triton = ("tf32", "tf32x3", "bf16", "fp16") if sm is not None and sm >= 80 else ()
        object.__setattr__(self, "tensor_cores", cores)
        object.__setattr__(self, "triton_dot_tensor_cores", triton)
        object.__setattr__(self, "sdpa", tuple((d, _sdpa_backends(cc, d)) for d in _DTYPE_NAMES))

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def cpu(cls) -> DeviceInfo:
        return cls(name="cpu", kind="cpu", capability=None, source="cpu")

    @classmethod
    def for_capability(cls, capability: str | float | tuple[int, int], *, rehearsal_of: str | None = None
                       ) -> DeviceInfo:
        """A description for planning: the known GPU of that capability (``KNOWN_GPUS``), or an
        unnamed 'sm_XY' with the Programming Guide's shared memory and unknown SMs and memory."""
        cc = parse_capability(capability)
        gpu = known_gpu(cc)
        return cls(
            name=gpu.name if gpu else f"sm_{cc[0]}{cc[1]}", kind="cuda", capability=cc,
            sm_count=gpu.sm_count if gpu else None,
            total_memory=int(gpu.memory_gb * 1e9) if gpu else None,
            shared_memory_per_block=smem_per_block_optin(cc),
            rehearsal=rehearsal_of is not None, actual=rehearsal_of, source="table",
        )

    @classmethod
    def detect(cls, device: torch.device | str | None = None) -> DeviceInfo:
        """The device ``device`` (default: the current CUDA device, else the CPU), or with
        ``FTLIB_CAPABILITY`` set, the planned GPU of that capability standing in for it."""
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(device)
        live = cls._live(dev)
        override = os.environ.get(ENV_CAPABILITY, "").strip()
        if not override:
            return live
        try:
            cc = parse_capability(override)
        except ValueError as e:
            raise ValueError(f"{ENV_CAPABILITY}={override!r}: {e}") from None
        return cls.for_capability(cc, rehearsal_of=live.label())

    @classmethod
    def _live(cls, dev: torch.device) -> DeviceInfo:
        if dev.type == "cpu":
            return cls.cpu()
        if dev.type != "cuda":
            raise ValueError(f"no device description for {dev.type!r} devices (only 'cuda' and 'cpu')")
        props = torch.cuda.get_device_properties(dev)
        smem = getattr(props, "shared_memory_per_block_optin", None) or props.shared_memory_per_block
        return cls(name=props.name, kind="cuda", capability=(props.major, props.minor),
                   sm_count=props.multi_processor_count, total_memory=props.total_memory,
                   shared_memory_per_block=int(smem), source="detected")

    # -- questions --------------------------------------------------------------------------

    @property
    def sm(self) -> int | None:
        """The capability as one number (75 for 7.5), None on the CPU."""
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def label(self) -> str:
        """'Tesla T4 (sm_75)', 'cpu'."""
        return self.name if self.sm is None else f"{self.name} (sm_{self.sm})"

    def has_tensor_cores(self, dtype: str) -> bool:
        """Tensor-core matmuls (cuBLAS) for 'fp16', 'bf16' or 'tf32' operands."""
        return dtype in self.tensor_cores

    def triton_dot_uses_tensor_cores(self, input_precision: str) -> bool:
        """Whether ``tl.dot`` with these operands runs on tensor cores here: ``input_precision``
        one of 'tf32', 'tf32x3', 'ieee' (fp32 operands) or 'bf16', 'fp16' (operand dtype)."""
        return input_precision in self.triton_dot_tensor_cores

    def sdpa_backends(self, dtype: str) -> tuple[str, ...]:
        """SDPA backends that can run for q/k/v in ``dtype`` ('fp32', 'fp16', 'bf16'), in
        PyTorch's order of preference; 'math' always."""
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype {dtype!r}; expected one of {_DTYPE_NAMES}")
        return dict(self.sdpa)[dtype]

    def limits(self) -> Limits | None:
        """What the kernels' tile choices read (:mod:`kernels.limits`); None on the CPU."""
        if self.capability is None:
            return None
        return Limits(self.name, self.capability, self.shared_memory_per_block)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["sdpa"] = {d: list(b) for d, b in self.sdpa}
        out["capability"] = None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"
        return out

    def why_not(self, precision: str) -> str | None:
        """None when ``precision`` runs as labelled here; else the reason, in one sentence.

        A row labelled 'tf32' measured on a T4 is an fp32 row (no TF32 tensor cores before sm_80:
        the flag changes nothing), and a 'bf16' row under ``torch.compile`` there is eager bf16
        emulated through fp32 (Inductor does not generate bf16 kernels below sm_80).
        """
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
        if self.kind == "cpu":
            return "no TF32 on the CPU: 'tf32' would compute in fp32" if precision == "tf32" else None
        where = self.label()
        if precision == "tf32" and not self.has_tensor_cores("tf32"):
            return f"no TF32 tensor cores on {where} (TF32 needs sm_80+): 'tf32' would run in fp32"
        if precision == "bf16" and not self.has_tensor_cores("bf16"):
            return (f"no bf16 tensor cores on {where} (bf16 needs sm_80+): bf16 matmuls would be emulated "
                    "and torch.compile would not generate bf16 kernels")
        if precision == "fp16" and not self.has_tensor_cores("fp16"):
            return f"no fp16 tensor cores on {where} (they need sm_70+)"
        return None

    def precisions(self) -> tuple[str, ...]:
        """The precisions that run as labelled here, in :data:`PRECISIONS` order: ('fp32', 'fp16') on
        sm_75, all four on sm_80+."""
        return tuple(p for p in PRECISIONS if self.why_not(p) is None)
