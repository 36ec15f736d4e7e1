"""tests/conftest.py's kernel-test modes: a kernel test that cannot run where it was asked to
fails with the reason; it is never skipped (a skipped kernel test would let a run pass that
tested no kernel). Each case runs one small kernel test in a fresh pytest process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
ONE_KERNEL_TEST = "tests/test_kernels_rmsnorm.py::test_rstd_saved"


def _pytest(code: str | None, env_changes: dict[str, str | None], *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    args = ["-q", "-p", "no:cacheprovider", "-rfEs", *extra, ONE_KERNEL_TEST]
    cmd = [sys.executable, "-m", "pytest", *args] if code is None else [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the no-CUDA failure; this machine has CUDA")
def test_gpu_mode_without_cuda_fails_and_says_why(tmp_path):
    # With FTLIB_TEST_PROGRESS=1 (ci/test-kernels-gpu) the failure is printed as it happens, before
    # pytest's end-of-run sections a time limit could cut off; the JUnit file names the device.
    xml = tmp_path / "junit.xml"
    out = _pytest(None, {"FTLIB_TEST_GPU": "1", "FTLIB_TEST_PROGRESS": "1"}, f"--junitxml={xml}")
    assert out.returncode == 1, out.stdout + out.stderr
    summary = out.stdout.strip().splitlines()[-1]
    assert "1 failed" in summary and "skipped" not in summary, summary
    assert "FTLIB_TEST_GPU=1" in out.stdout and "torch.cuda.is_available() is False" in out.stdout
    early = out.stdout.split("short test summary info")[0]
    assert f"progress: FAILED {ONE_KERNEL_TEST} (in call)" in early and "torch.cuda.is_available() is False" in early
    assert "progress: tests/test_kernels_rmsnorm.py done: 0 passed, 1 failed, 0 skipped; 1/1 tests" in out.stdout
    assert 'name="kernel_device_name" value="no CUDA device' in xml.read_text()


def test_progress_lines_and_the_junit_device_in_the_interpreter(tmp_path):
    xml = tmp_path / "junit.xml"
    out = _pytest(None, {"FTLIB_TEST_GPU": None, "FTLIB_TEST_PROGRESS": "1"}, f"--junitxml={xml}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "progress: 1 tests in 1 files" in out.stdout
    assert "progress: tests/test_kernels_rmsnorm.py done: 1 passed, 0 failed, 0 skipped; 1/1 tests" in out.stdout
    assert "progress: FAILED" not in out.stdout
    assert 'name="kernel_device_name" value="Triton interpreter on the CPU"' in xml.read_text()
    quiet = _pytest(None, {"FTLIB_TEST_GPU": None, "FTLIB_TEST_PROGRESS": None})
    assert quiet.returncode == 0 and "progress:" not in quiet.stdout  # off unless asked for


def test_interpreter_that_cannot_run_fails_and_says_why():
    # triton imported before conftest could set TRITON_INTERPRET: the interpreter is unusable.
    code = "import sys, triton, pytest; sys.exit(pytest.main(sys.argv[1:]))"
    out = _pytest(code, {"FTLIB_TEST_GPU": None, "TRITON_INTERPRET": None})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout and "skipped" not in out.stdout
    assert "triton was imported before tests/conftest.py set TRITON_INTERPRET=1" in out.stdout


# Built in a process where TRITON_INTERPRET=0 on the CPU: the engine runs no kernel there, and must import no module
# that defines one. Importing it would build its @triton.jit functions compiled for good, so a later engine in the same
# process (a test after the speedrun's kernel-less smoke run, under TRITON_INTERPRET=1) would launch them outside the
# interpreter.
NO_KERNEL_ENGINES = """
import sys, torch, triton
from ftlib.model.config import preset
from ftlib.training.engine import Engine
for name, nkv in (("fasttransformer", 1), ("gpt2", 4)):
    for prec in ("bf16", "tf32", "fp32"):
        cfg = preset(name, n_layer=1, n_embd=64, n_head=4, n_kv_head=nkv, block_size=16)
        eng = Engine(cfg, 1, 16, prec, "cpu")
        x = torch.randint(0, cfg.vocab_size, (1, 16))
        eng.step(x, x)
        assert not any(eng.kernels.values()), eng.kernels
built = sorted(name for name, m in sys.modules.items() if name.startswith("kernels.")
               and any(isinstance(v, triton.runtime.JITFunction) for v in vars(m).values()))
print("built:", built)
"""


def test_an_engine_without_kernels_builds_none_of_their_functions():
    out = subprocess.run([sys.executable, "-c", NO_KERNEL_ENGINES], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "built: []", out.stdout
