"""A tidy store of benchmark result rows: one JSON object per line, one file per bench and device.

Layout: ``results_dir()/<device_slug>/<bench>.jsonl``, where ``results_dir()`` is
``$FTLIB_RESULTS_DIR`` or ``data/results`` of the repository. GPU folders (``h200/``,
``t4/``) are committed and read by the chapters; ``cpu/`` holds local smoke runs only.

Every row carries a ``key``: a hash of what was measured (bench, config hash, B, T,
mode, precision, extras), so a rerun can measure only what is missing. Writes replace
the whole file atomically (temporary file + ``os.replace``), so a run killed mid-write
leaves either the old file or the new one, never a torn line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

try:  # POSIX advisory locks keep two writers (a notebook and the runner) from losing rows
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

CPU_SLUG = "cpu"


def results_dir() -> Path:
    """``$FTLIB_RESULTS_DIR`` if set, else ``data/results`` of the repository holding ftlib."""
    env = os.environ.get("FTLIB_RESULTS_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "data" / "results"


def row_key(
    bench: str, config_hash: str, B: int, T: int, mode: str, precision: str, extra: dict | None = None
) -> str:
    """Stable short hash of the measured configuration; equal keys mean 'same measurement'."""
    ident = {"bench": bench, "config_hash": config_hash, "B": int(B), "T": int(T),
             "mode": mode, "precision": precision, "extra": extra or {}}
    blob = json.dumps(ident, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _jsonable(v: Any) -> Any:
    """JSON has no NaN/inf: store them as null so every reader (JS, pandas) can parse the file."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


class ResultStore:
    """The rows of one bench on one device, at ``root/<device_slug>/<bench>.jsonl``."""

    def __init__(self, bench: str, device_slug: str, root: Path | str | None = None) -> None:
        if not bench or "/" in bench or bench.startswith("."):
            raise ValueError(f"bench name {bench!r} must be a plain file stem")
        self.bench = bench
        self.device_slug = device_slug
        self.root = Path(root) if root is not None else results_dir()
        self.path = self.root / device_slug / f"{bench}.jsonl"

    def rows(self) -> list[dict]:
        return _read_jsonl(self.path)

    def latest(self) -> dict[str, dict]:
        """key -> the last row written with that key (a retry supersedes an earlier error)."""
        return {r["key"]: r for r in self.rows() if "key" in r}

    def has(self, key: str, skip_status: Iterable[str] | None = None) -> bool:
        """True if a row with ``key`` exists; rows whose status is in ``skip_status`` do not count."""
        row = self.latest().get(key)
        if row is None:
            return False
        return not (skip_status and row.get("status") in set(skip_status))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def append(self, row: dict) -> None:
        """Add one row: rewrite the file to a temporary sibling, fsync, then ``os.replace``."""
        if "key" not in row:
            raise ValueError("a result row needs a 'key' (see row_key)")
        line = json.dumps(_jsonable(row), sort_keys=True, allow_nan=False) + "\n"
        with self._locked():
            old = self.path.read_bytes() if self.path.exists() else b""
            if old and not old.endswith(b"\n"):
                old += b"\n"
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.bench}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(old + line.encode("utf-8"))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise


def device_folders(root: Path | str | None = None) -> list[str]:
    """Device folders that hold results, sorted."""
    base = Path(root) if root is not None else results_dir()
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []


def load_rows(
    bench: str,
    devices: Iterable[str] | None = None,
    include_cpu: bool = False,
    root: Path | str | None = None,
    latest_only: bool = True,
) -> list[dict]:
    """Rows of ``bench`` from every device folder (or the named ones).

    CPU rows (local smoke runs) are left out unless ``include_cpu`` or 'cpu' is named.
    With ``latest_only``, only the last row of each (device, key) is kept.
    """
    base = Path(root) if root is not None else results_dir()
    names = list(devices) if devices is not None else device_folders(base)
    if devices is None and not include_cpu:
        names = [n for n in names if n != CPU_SLUG]
    out: list[dict] = []
    for name in names:
        store = ResultStore(bench, name, base)
        rows = list(store.latest().values()) if latest_only else store.rows()
        for r in rows:
            r.setdefault("device_slug", name)
        out.extend(rows)
    return out
