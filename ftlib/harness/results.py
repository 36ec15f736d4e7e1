"""A tidy store of benchmark result rows: one JSON object per line, one file per bench and device.

Layout: ``results_dir()/<device_slug>/<bench>.jsonl``, where ``results_dir()`` is
``$FTLIB_RESULTS_DIR`` or ``data/results`` of the repository. GPU folders (``h200/``,
``t4/``) are committed and read by the chapters; ``cpu/`` holds local smoke runs only.

A reader's own measurements can live elsewhere and be *added* to the stored ones:
``$FTLIB_MY_RESULTS`` (say a Google Drive folder on Colab, which outlasts the runtime) receives
every row measured here, and the views read it beside ``results_dir()``. ``$FTLIB_RESULTS_DIR``
instead *replaces* the stored results (the tests use it to read synthetic rows only).

Every row carries a ``key``: a hash of what was measured (bench, config hash, B, T,
mode, precision, extras), so a rerun can measure only what is missing. Writes hold the
file's lock and replace the whole file atomically (temporary file + ``os.replace``), so
concurrent writers lose no row and a run killed mid-write leaves either the old file or the
new one, never a torn line. A line that is not a JSON object raises :class:`ResultsFileError`
naming the file and the line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

try:  # POSIX advisory locks keep two writers (a notebook and the runner) from losing rows
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

CPU_SLUG = "cpu"
FILE_MODE = 0o644  # a new result file: readable by all, like the repository's other files


def results_dir() -> Path:
    """``$FTLIB_RESULTS_DIR`` if set, else ``data/results`` of the repository holding ftlib."""
    env = os.environ.get("FTLIB_RESULTS_DIR")
    if env:
        return Path(env)
    from ftlib.core.repo import repo_root  # here, so that loading this module needs only the standard library

    return repo_root() / "data" / "results"


def my_results_dir() -> Path | None:
    """``$FTLIB_MY_RESULTS``: where this machine's rows go, read beside the stored ones (None: unset)."""
    env = os.environ.get("FTLIB_MY_RESULTS")
    return Path(env) if env else None


def read_roots() -> list[Path]:
    """The folders the views read: the stored results, then the reader's own where set and different."""
    roots = [results_dir()]
    mine = my_results_dir()
    if mine is not None and mine.resolve() != roots[0].resolve():
        roots.append(mine)
    return roots


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


class ResultsFileError(ValueError):
    """A result file that cannot be read as one JSON object per line: the message names the
    file, the line and what to do."""

    def __init__(self, path: Path | str, lineno: int, problem: str) -> None:
        self.path, self.lineno, self.problem = Path(path), lineno, problem
        super().__init__(
            f"{path}, line {lineno}: {problem}. A result file holds one JSON object per line; this line is "
            "damaged (a torn write, an edit or a merge conflict). Restore the file from git "
            f"(git checkout -- {path}) or delete that line, then run again; its row is measured again "
            "if it is missing."
        )


def parse_row(line: str, path: Path | str = "<row>", lineno: int = 1) -> dict:
    """One line of a result file as a row (a JSON object); ``ResultsFileError`` if it is not one."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ResultsFileError(path, lineno, f"not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(row, dict):
        raise ResultsFileError(path, lineno, f"a JSON {type(row).__name__}, not an object")
    return row


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if line:
            rows.append(parse_row(line, path, lineno))
    return rows


class ResultStore:
    """The rows of one bench on one device, at ``root/<device_slug>/<bench>.jsonl``."""

    def __init__(self, bench: str, device_slug: str, root: Path | str | None = None) -> None:
        if not bench or "/" in bench or bench.startswith("."):
            raise ValueError(f"bench name {bench!r} must be a plain file stem")
        self.bench = bench
        self.device_slug = device_slug
        self.root = Path(root) if root is not None else (my_results_dir() or results_dir())
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
    def locked(self) -> Iterator[None]:
        """Hold this file's write lock (an advisory ``flock`` on a ``.lock`` sibling): every writer
        (``append``, ``ci/ingest-results``) reads and replaces the file inside it, so two writers
        cannot both start from the same old contents and lose each other's rows."""
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

    def write_atomic(self, data: bytes) -> None:
        """Replace the file with ``data``: a temporary sibling, fsync, then ``os.replace``, so a
        reader (or a crash) sees the old file or the new one, never a torn line. Call it inside
        :meth:`locked`. The new file keeps the old one's permissions; a new file gets 0644
        (``mkstemp`` creates 0600, which would hide committed results from other users)."""
        mode = stat.S_IMODE(self.path.stat().st_mode) if self.path.exists() else FILE_MODE
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.bench}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def append(self, row: dict) -> None:
        """Add one row: under :meth:`locked`, rewrite the file with the row at the end (:meth:`write_atomic`)."""
        if "key" not in row:
            raise ValueError("a result row needs a 'key' (see row_key)")
        line = json.dumps(_jsonable(row), sort_keys=True, allow_nan=False) + "\n"
        with self.locked():
            old = self.path.read_bytes() if self.path.exists() else b""
            if old and not old.endswith(b"\n"):
                old += b"\n"  # a last line written without its newline (by hand, or another tool)
            self.write_atomic(old + line.encode("utf-8"))


def device_folders(root: Path | str | None = None, include_cpu: bool = False) -> list[str]:
    """Device folders that hold results (at least one results file; a folder holding only a lock is
    empty), sorted (of ``root``, or of every folder the views read). The CPU folder (a reader's local
    smoke runs, ``bash ci/run-book``) only with ``include_cpu``, as :func:`load_rows`."""
    bases = [Path(root)] if root is not None else read_roots()
    return sorted({p.name for base in bases if base.exists() for p in base.iterdir()
                   if p.is_dir() and any(p.glob("*.jsonl")) and (include_cpu or p.name != CPU_SLUG)})


def load_rows(
    bench: str,
    devices: Iterable[str] | None = None,
    include_cpu: bool = False,
    root: Path | str | None = None,
    latest_only: bool = True,
) -> list[dict]:
    """Rows of ``bench`` from every device folder (or the named ones), of ``root`` or of every
    folder the views read (:func:`read_roots`: the stored results and the reader's own).

    CPU rows (local smoke runs) are left out unless ``include_cpu`` or 'cpu' is named.
    With ``latest_only``, only the last row of each (device, key) is kept.
    """
    bases = [Path(root)] if root is not None else read_roots()
    out: list[dict] = []
    for base in bases:
        names = list(devices) if devices is not None else device_folders(base, include_cpu=include_cpu)
        for name in names:
            store = ResultStore(bench, name, base)
            rows = list(store.latest().values()) if latest_only else store.rows()
            for r in rows:
                r.setdefault("device_slug", name)
            out.extend(rows)
    if latest_only and len(bases) > 1:  # a key stored in both folders counts once (the reader's copy)
        out = list({(r["device_slug"], r.get("key")): r for r in out}.values())
    return out
