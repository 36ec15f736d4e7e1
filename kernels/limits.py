"""What a GPU allows one Triton program: its opt-in shared memory per block, and its capability.

The attention launchers choose their tiles from these (:mod:`kernels.tiles`). The live GPU's
come from torch (``torch.cuda.get_device_properties``: ``shared_memory_per_block_optin``, what
Triton checks a compiled kernel against when it loads it, not the 48 KB static default). With
``FTLIB_CAPABILITY`` set (e.g. ``7.5``) every launch takes the limits of a GPU of that
capability instead, on any device, the CPU interpreter included: the rehearsal that lets an
H200 (or CI) choose a T4's tiles. ``ftlib.core.device.DeviceInfo`` reads the same variable and
this table, so its description and the kernels' limits always agree.

Imports torch only (no Triton), so a CPU-only install can read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ENV_CAPABILITY = "FTLIB_CAPABILITY"
KB = 1024

# Maximum shared memory per thread block (opt-in), bytes, per compute capability: CUDA C++
# Programming Guide, "Compute Capabilities", technical specifications per compute capability.
SMEM_PER_BLOCK_OPTIN: dict[tuple[int, int], int] = {
    (7, 0): 96 * KB, (7, 2): 48 * KB, (7, 5): 64 * KB,
    (8, 0): 163 * KB, (8, 6): 99 * KB, (8, 7): 163 * KB, (8, 9): 99 * KB,
    (9, 0): 227 * KB, (10, 0): 227 * KB, (12, 0): 99 * KB,
}


def parse_capability(value: str | float | tuple[int, int]) -> tuple[int, int]:
    """'7.5', '75', 'sm_75', 7.5 or (7, 5) -> (7, 5); a ValueError naming the value otherwise."""
    if isinstance(value, tuple):
        if len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value):
            return (int(value[0]), int(value[1]))
        raise ValueError(f"capability {value!r} must be (major, minor) non-negative ints")
    text = str(value).strip().lower().removeprefix("sm_").removeprefix("sm")
    try:
        if "." in text:
            major, minor = text.split(".")
            cc = (int(major), int(minor))
        else:
            n = int(text)
            cc = (n // 10, n % 10)
    except ValueError:
        raise ValueError(f"capability {value!r} is not like '7.5', '75' or 'sm_75'") from None
    if not (1 <= cc[0] <= 20 and 0 <= cc[1] <= 9):
        raise ValueError(f"capability {value!r} is out of range (major 1-20, minor 0-9)")
    return cc


def smem_per_block_optin(capability: tuple[int, int]) -> int | None:
    """The capability's opt-in shared memory per block from the Programming Guide's table (an
    unlisted minor version takes the closest lower one of its major version)."""
    if capability in SMEM_PER_BLOCK_OPTIN:
        return SMEM_PER_BLOCK_OPTIN[capability]
    older = [cc for cc in SMEM_PER_BLOCK_OPTIN if cc[0] == capability[0] and cc < capability]
    return SMEM_PER_BLOCK_OPTIN[max(older)] if older else None


@dataclass(frozen=True)
class Limits:
    """A GPU as the kernels' tile choices see it: a name for messages, its capability, and its
    opt-in shared memory per block in bytes (None: unknown, no limit is checked)."""

    name: str
    capability: tuple[int, int]
    smem_per_block: int | None

    @property
    def sm(self) -> int:
        """The capability as one number (75 for 7.5): it picks the compiled code path."""
        return self.capability[0] * 10 + self.capability[1]

    def label(self) -> str:
        """'Tesla T4 (sm_75)'."""
        return f"{self.name} (sm_{self.sm})"

    @classmethod
    def for_capability(cls, capability: str | float | tuple[int, int], name: str | None = None) -> Limits:
        cc = parse_capability(capability)
        return cls(name or f"sm_{cc[0]}{cc[1]}", cc, smem_per_block_optin(cc))


_CACHE: dict[tuple[str, str], Limits | None] = {}


def device_limits(device: torch.device) -> Limits | None:
    """The limits kernels on ``device`` launch under: the live GPU's, a rehearsed capability's
    (``FTLIB_CAPABILITY``), or None on the CPU (the interpreter has no shared-memory limit).
    Cached per device and rehearsal."""
    override = os.environ.get(ENV_CAPABILITY, "").strip()
    key = (str(device), override)
    if key not in _CACHE:
        if override:
            try:
                _CACHE[key] = Limits.for_capability(override)
            except ValueError as e:
                raise ValueError(f"{ENV_CAPABILITY}={override!r}: {e}") from None
        elif device.type == "cuda":
            p = torch.cuda.get_device_properties(device)
            smem = getattr(p, "shared_memory_per_block_optin", None) or p.shared_memory_per_block
            _CACHE[key] = Limits(p.name, (p.major, p.minor), int(smem))
        else:
            _CACHE[key] = None
    return _CACHE[key]
