"""Test-session setup: where the Triton kernels run, decided once, before Triton is imported.

Two modes, chosen by the environment variable ``FTLIB_TEST_GPU``:

* unset (or anything but "1"): the kernels run on CPU tensors in Triton's interpreter.
  ``TRITON_INTERPRET=1`` only takes effect if it is set before the first ``import triton``
  (Triton builds its own ``@triton.jit`` library functions at import), and torch may import
  Triton early (e.g. through torch.utils.flop_counter), so it is set here, before any test
  module is imported.
* ``FTLIB_TEST_GPU=1``: ``TRITON_INTERPRET`` is removed and the kernels are compiled and run
  on CUDA tensors (``ci/test-kernels-gpu`` runs just those tests and writes a log).

Tests that run kernels carry the ``kernels`` marker (any test that asks for the
``kernel_device`` fixture gets it) and create their tensors on ``kernel_device``. Before each
of them runs, the mode is checked: no CUDA in GPU mode, or an interpreter that cannot run
kernels in CPU mode, makes the test FAIL with the reason. A skip would let a run that tested
no kernel pass.
"""

from __future__ import annotations

import os
import sys

import pytest

GPU_MODE = os.environ.get("FTLIB_TEST_GPU") == "1"
# Recorded before this file touches the environment: if Triton is already loaded, setting
# TRITON_INTERPRET now cannot switch its interpreter on (see kernels._common.interpreter_ready).
TRITON_PRELOADED = "triton" in sys.modules

if GPU_MODE:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = "1"


def kernel_mode_problem() -> str | None:
    """Why the kernel tests cannot run in this process's mode, or None when they can."""
    import torch

    if GPU_MODE:
        if not torch.cuda.is_available():
            return ("FTLIB_TEST_GPU=1 asks for the kernels compiled on a CUDA GPU, but torch.cuda.is_available() "
                    f"is False (torch {torch.__version__}, CUDA build {torch.version.cuda}). Run on a machine with "
                    "a CUDA GPU and a CUDA build of torch, or unset FTLIB_TEST_GPU to use the CPU interpreter.")
        import triton.language.standard as std

        if type(std.cdiv).__name__ == "InterpretedFunction":
            return ("FTLIB_TEST_GPU=1 but triton was imported with TRITON_INTERPRET set (before tests/conftest.py "
                    "removed it), so its library functions run in the interpreter; unset TRITON_INTERPRET.")
        return None
    try:
        from kernels._common import interpreter_ready
    except ImportError as e:  # triton missing: the op modules cannot be imported either
        return f"the Triton interpreter is not available: {e}. Install triton (requirements.txt)."
    if not interpreter_ready():
        why = ("triton was imported before tests/conftest.py set TRITON_INTERPRET=1 (by a pytest plugin, "
               "sitecustomize or PYTHONSTARTUP that imports torch or triton)" if TRITON_PRELOADED
               else f"TRITON_INTERPRET is {os.environ.get('TRITON_INTERPRET')!r} when triton was imported")
        return (f"the kernels cannot run in Triton's CPU interpreter in this process: {why}. Run pytest so that "
                "nothing imports triton before tests/conftest.py, or on a GPU with FTLIB_TEST_GPU=1.")
    return None


@pytest.fixture(scope="session")
def kernel_device():
    """The device the kernel tests put their tensors on: ``cuda`` with FTLIB_TEST_GPU=1, else ``cpu``."""
    import torch

    return torch.device("cuda" if GPU_MODE else "cpu")


@pytest.fixture()
def cpu_interpreter() -> None:
    """For tests of a CPU-only code path that runs kernels in the interpreter (e.g. the dev
    harness's CPU timing rows): skipped in GPU mode, where that path is not taken; failing,
    like the kernel tests, when the interpreter cannot run here."""
    if GPU_MODE:
        pytest.skip("tests the CPU (Triton interpreter) path; FTLIB_TEST_GPU=1 runs the kernels compiled")
    problem = kernel_mode_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test on kernel_device runs kernels: it is selected by `-m kernels` and checked below.
    for item in items:
        if "kernel_device" in getattr(item, "fixturenames", ()) and item.get_closest_marker("kernels") is None:
            item.add_marker(pytest.mark.kernels)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if item.get_closest_marker("kernels") is not None:
        problem = kernel_mode_problem()
        if problem is not None:
            pytest.fail(problem, pytrace=False)


def kernel_device_description() -> str:
    """Where the kernel tests run, in words: for the report header and the JUnit file."""
    if not GPU_MODE:
        return "Triton interpreter on the CPU"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (FTLIB_TEST_GPU=1 without CUDA: every kernel test fails)"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return (f"{torch.cuda.get_device_name(0)}, compiled (torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"triton {triton_version})")


@pytest.fixture(scope="session", autouse=True)
def _record_kernel_device(record_testsuite_property) -> None:
    # ci/test-kernels-gpu reads this from the JUnit file for its summary line.
    record_testsuite_property("kernel_device_name", kernel_device_description())


def pytest_report_header(config: pytest.Config) -> str:
    return f"kernel tests: {kernel_device_description()}"
