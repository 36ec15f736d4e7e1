"""A benchmark in a fresh process: a whole-process cold start of the compile, with a hard time limit.

``bench_step_isolated`` runs :func:`ftlib.harness.bench.step.bench_step` in a child process
(``python -m ftlib.harness.bench.isolated SPEC ROW``) with empty compile caches, and kills it after
``timeout_s``; a time-out or a crash of the child (segfault, sticky CUDA error) becomes a row.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ftlib.core.device import pick_device
from ftlib.core.repo import repo_root
from ftlib.harness.bench.step import base_row, bench_step, resolve_config
from ftlib.harness.provenance import run_id
from ftlib.model.config import ModelConfig


def cold_cache_env(cache_dir: str | Path) -> dict[str, str]:
    """Environment for a process whose compile caches are empty and whose FX/AOT caches are off."""
    env = dict(os.environ)
    root = str(repo_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(
        # The child's rows belong to this process's run: views pair rows within a run.
        FTLIB_RUN_ID=run_id(),
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        TRITON_CACHE_DIR=str(Path(cache_dir) / "triton"),
        TORCHINDUCTOR_FX_GRAPH_CACHE="0",
        TORCHINDUCTOR_AUTOGRAD_CACHE="0",
    )
    return env


def bench_step_isolated(
    config: ModelConfig | str,
    B: int,
    T: int,
    mode: str = "eager",
    precision: str = "fp32",
    device: torch.device | str = "auto",
    timeout_s: float = 600.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``bench_step`` in a fresh Python process with empty compile caches, killed after ``timeout_s``.

    ``first_step_s`` then is a true cold start of the compile (imports and CUDA context
    excluded: they happen before the first step). A time-out or a crash of the child
    (segfault, sticky CUDA error) becomes a row with status 'timeout' / 'error'.
    """
    cfg, preset_name = resolve_config(config)
    dev = pick_device(device) if isinstance(device, str) else torch.device(device)
    spec = dict(config=cfg.to_dict(), B=B, T=T, mode=mode, precision=precision, device=str(dev), **kwargs)
    spec.setdefault("label", preset_name)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ftlib-bench-") as tmp:
        spec_path, out_path, log_path = (Path(tmp) / n for n in ("spec.json", "row.json", "log.txt"))
        spec_path.write_text(json.dumps(spec))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ftlib.harness.bench.isolated", str(spec_path), str(out_path)],
                env=cold_cache_env(Path(tmp) / "cache"), stdout=log, stderr=subprocess.STDOUT,
                cwd=str(repo_root()), start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                # Its own session: kill the child and the compile workers it started.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        if out_path.exists():
            row = json.loads(out_path.read_text())
        else:
            extra = kwargs.get("extra")
            row = base_row(kwargs.get("bench", "step"), spec["label"], cfg, preset_name, B, T, mode,
                            precision, kwargs.get("optimizer", "default"), dev, extra)
            tail = log_path.read_text(errors="replace")[-2000:]
            if rc is None:
                row.update(status="timeout", error=f"no result within {timeout_s:g} s (whole process)",
                           traceback=tail)
            else:
                row.update(status="error", error=f"benchmark process exited with code {rc}", traceback=tail)
    row.update(isolated=True, timeout_s=timeout_s, wall_s=time.perf_counter() - t0)
    if row.get("status") == "ok":
        row["first_step_cache"] = "cold-process"
    return row


def _child_main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    cfg = ModelConfig(**spec.pop("config"))
    row = bench_step(cfg, **spec)
    Path(out_path).write_text(json.dumps(row, default=str))




if __name__ == "__main__":  # the child of bench_step_isolated
    _child_main(sys.argv[1], sys.argv[2])
