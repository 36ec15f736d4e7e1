"""What machine and software a result came from: device choice and provenance."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
from pathlib import Path

import torch


def pick_device(name: str = "auto") -> torch.device:
    """'auto' -> CUDA if available, else CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} was asked for but CUDA is not available here")
    return dev


def device_name(device: torch.device | str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return platform.processor() or platform.machine() or "cpu"


def device_slug(device: torch.device | str) -> str:
    """Folder name for results of a device: 'NVIDIA H200' -> 'h200', 'Tesla T4' -> 't4'."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cpu"
    name = device_name(dev).lower()
    for prefix in ("nvidia ", "tesla "):
        name = name.replace(prefix, "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def git_commit() -> str:
    """The checkout's commit (+dirty); ``$FTLIB_COMMIT`` where there is no .git (a copied tree)."""
    if os.environ.get("FTLIB_COMMIT"):
        return os.environ["FTLIB_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def driver_version() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return ""


def provenance(device: torch.device | str = "cpu") -> dict[str, str]:
    """Fields every result row carries: where, with what, when, from which commit."""
    dev = torch.device(device)
    info = {
        "device": device_name(dev),
        "device_type": dev.type,
        "torch": torch.__version__,
        "triton": triton_version(),
        "cuda": torch.version.cuda or "",
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
    }
    if dev.type == "cuda":
        info["driver"] = driver_version()
        p = torch.cuda.get_device_properties(dev)
        info["sm_count"] = str(p.multi_processor_count)
        info["capability"] = f"{p.major}.{p.minor}"
    return info


def progress_bar(iterable, show: bool = True, **kwargs):
    """A tqdm bar over ``iterable`` (a notebook widget where ipywidgets is installed), or the
    plain iterable when ``show`` is False: importing ``tqdm.auto`` in a notebook without
    ipywidgets prints a warning into the cell even when the bar is disabled."""
    if not show:
        return _Quiet(iterable)
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


class _Quiet:
    """An iterable with tqdm's ``set_postfix*`` and ``close`` as no-ops and its ``write``."""

    def __init__(self, iterable) -> None:
        self._it = iterable

    def __iter__(self):
        return iter(self._it)

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def write(msg: str) -> None:
        print(msg)  # as tqdm.write does with the bar disabled
