"""Rerun the Triton kernel tests in a fresh process when this one cannot interpret kernels.

TRITON_INTERPRET=1 only works if it is set before the first ``import triton``; in a full
``pytest tests`` session torch has usually imported triton already (kernels._common.
interpreter_ready explains why), and the kernel test modules skip themselves. This test then
runs each of them in its own interpreter process, so the kernels are tested either way.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("triton")

from kernels._common import interpreter_ready  # noqa: E402

HERE = pathlib.Path(__file__).parent
FILES = ["rmsnorm", "layernorm", "cross_entropy", "adamw", "attention", "dev"]


@pytest.mark.skipif(interpreter_ready(), reason="kernel tests already run in this process")
@pytest.mark.parametrize("op", FILES)
def test_kernel_tests_in_fresh_process(op):
    env = dict(os.environ, TRITON_INTERPRET="1")
    path = HERE / f"test_kernels_{op}.py"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True, text=True, env=env, cwd=HERE.parent,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "skipped" not in out.stdout.splitlines()[-1], out.stdout[-2000:]
