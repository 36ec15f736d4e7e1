"""What machine, software and code a result came from: the fields every result row carries.

The commit is the one the code runs from; a tree copied to a GPU machine without ``.git``
proves it is that commit with the manifest ``ci/stamp-tree`` writes (git's own content hashes).
A row carries the machine's boot (``machine_id``) and the measuring process (``run_id``): views
pair only rows of one run, and count machine starts for a verdict. It also names the host's processor
(``host_cpu``): a step that leaves work to Python between its kernels runs at the host's pace.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import os
import platform
import subprocess
import uuid
from pathlib import Path

import torch

from ftlib.core.device import device_name
from ftlib.core.repo import repo_root

# Files that do not change what a measurement runs: the results themselves.
_UNTRACKED_OK = ("data/",)
# A tree copied without .git (a GPU machine) carries these two files, written by ci/stamp-tree.
COMMIT_FILE, TREE_FILE = ".ftlib-commit", ".ftlib-tree"


def _git_blob_sha1(path: Path) -> str:
    """The id git gives a file's content: sha1 of ``b"blob <size>\\0" + content`` (git's object format)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_matches_manifest(root: Path, manifest: str) -> list[str]:
    """Paths whose content differs from ``manifest`` (the output of ``git ls-files -s``); [] if none.

    Lets a copied tree (no .git) prove it is the commit it claims to be. Results under
    ``data/`` are left out: they are what a run adds, not what it runs.
    """
    bad = []
    for line in manifest.splitlines():
        meta, _, rel = line.partition("\t")
        parts = meta.split()
        if len(parts) != 3 or not rel or rel.startswith(_UNTRACKED_OK):
            continue
        f = root / rel
        if parts[0] == "120000":  # a symbolic link: git hashes its target path
            ok = f.is_symlink()
        else:
            ok = f.is_file() and _git_blob_sha1(f) == parts[1]
        if not ok:
            bad.append(rel)
    known = {line.partition("\t")[2] for line in manifest.splitlines()}
    for pkg in ("ftlib", "kernels", "ci"):  # code the manifest does not know would also run
        for f in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else []:
            rel = f.relative_to(root).as_posix()
            if rel not in known and "__pycache__" not in rel:
                bad.append(rel)
    return bad


def git_commit() -> str:
    """The commit the code runs from, with ``+dirty`` if the tree differs from it.

    A tree stamped by ``ci/stamp-tree`` (``.ftlib-commit`` and the ``.ftlib-tree`` manifest, as a
    GPU machine receives it) that still matches its manifest file by file is that commit: such a
    copy may carry a stale ``.git`` of its own, so the stamp is asked first. Otherwise, in a git
    checkout, ``git rev-parse`` and ``git status`` (tracked files; ``data/`` aside). Otherwise
    ``$FTLIB_COMMIT`` or the stamp's commit, with ``+dirty`` (the files differ from the manifest)
    or ``+unverified`` (no manifest); ``unknown`` when nothing names a commit.
    """
    root = repo_root()
    stamped = (root / COMMIT_FILE).read_text().strip() if (root / COMMIT_FILE).is_file() else ""
    if stamped and "+" not in stamped and _copied_tree_state(str(root)) == "":
        return stamped
    if (root / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".",
                 *(f":(exclude){p}" for p in _UNTRACKED_OK)],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.strip()
            return out + ("+dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            return "unknown"
    commit = os.environ.get("FTLIB_COMMIT", "").strip() or stamped
    if not commit:
        return "unknown"
    if "+" in commit:
        return commit
    return commit + _copied_tree_state(str(root))


@functools.lru_cache(maxsize=4)
def _copied_tree_state(root: str) -> str:
    """'' when the copied tree matches its manifest, else '+dirty' or '+unverified' (once per process)."""
    manifest = Path(root) / TREE_FILE
    if not manifest.is_file():
        return "+unverified"
    return "+dirty" if tree_matches_manifest(Path(root), manifest.read_text()) else ""


def is_clean_commit(commit: str | None) -> bool:
    """True for a commit id with no ``+dirty``/``+wip``/``+unverified`` suffix (and not 'unknown')."""
    return bool(commit) and commit not in ("unknown", "None") and "+" not in commit


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
    """An id of this machine's current boot: two rows with the same id ran on one machine start.

    Linux gives every boot a random UUID (``/proc/sys/kernel/random/boot_id``); elsewhere the
    host name stands in.
    """
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:13]
    except OSError:
        return platform.node() or "unknown"


@functools.lru_cache(maxsize=1)
def host_cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The host's processor and its logical cores, '<model name> x<cores>' ('' where Linux's
    ``/proc/cpuinfo`` and ``platform.processor()`` name none)."""
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name") and ":" in line]
    name = names[0] if names else platform.processor()
    return f"{name} x{len(names) or os.cpu_count() or 1}" if name else ""


@functools.lru_cache(maxsize=1)
def run_id() -> str:
    """An id of this process's measuring run (``$FTLIB_RUN_ID`` if set): rows of one run pair."""
    return os.environ.get("FTLIB_RUN_ID") or uuid.uuid4().hex[:12]


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
        "machine_id": machine_id(),
        "run_id": run_id(),
        "host_cpu": host_cpu(),
    }
    if dev.type == "cuda":
        info["driver"] = driver_version()
        p = torch.cuda.get_device_properties(dev)
        info["sm_count"] = str(p.multi_processor_count)
        info["capability"] = f"{p.major}.{p.minor}"
    return info
