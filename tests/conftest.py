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
import time
from pathlib import Path

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
def nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty filling floating tensors with NaN while the test runs. A block a kernel leaves unwritten
    otherwise holds whatever the allocator last kept there: on a GPU, often the previous call's right answer
    (a buffer of the same size, freed and handed out again), so a comparison with that call could not fail."""
    import torch

    real = torch.empty

    def empty(*args, **kwargs) -> torch.Tensor:
        t = real(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


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
    # Cases that repeat paths other cases cover run only with the kernels compiled (tests/gpu_breadth.py).
    from gpu_breadth import NAME, left_out

    not_kernels = [i.nodeid for i in items if i.get_closest_marker(NAME) and not i.get_closest_marker("kernels")]
    if not_kernels:  # ci/test-kernels-gpu selects `-m kernels`: such a case would run nowhere
        raise pytest.UsageError(f"{NAME} cases that run no kernel on kernel_device: {not_kernels}")
    dropped = left_out(items, GPU_MODE)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(dropped)
        items[:] = [item for item in items if item not in gone]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadgroup`` (ci/test), pytest-xdist's scope scheduler on the units of
    ``tests/xdist_units.run_together``: the largest units (the notebooks) go out first, then one test at a time
    to whichever worker is free. Any other ``--dist`` (ci/test-kernels-gpu's worksteal) keeps pytest-xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RunTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            from xdist_units import run_together  # tests/ is on sys.path (rootdir-relative imports)

            return run_together(nodeid, config.rootpath)

    return RunTogether(config, log)


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


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # ci/test-kernels-gpu reads the device from the JUnit file for its summary line. The file is
    # written by the process pytest was started in; under pytest-xdist that process runs no test
    # (so no fixture could record it), hence a hook, here, on pytest's JUnit writer when present.
    if _is_xdist_worker(session.config):
        return
    for plugin in session.config.pluginmanager.get_plugins():
        if hasattr(plugin, "add_global_property"):  # pytest's LogXML, registered by --junitxml
            plugin.add_global_property("kernel_device_name", kernel_device_description())


def pytest_report_header(config: pytest.Config) -> str:
    return f"kernel tests: {kernel_device_description()}"


class FileProgress:
    """Per-file progress lines, and each failure in full as it happens (FTLIB_TEST_PROGRESS=1).

    pytest prints tracebacks and the failure summary only at the end, so a run stopped by a time
    limit shows neither. With this plugin the log says, as the run goes, which files are done
    (tests, outcomes, elapsed time) and every failing test's report, in the process that prints:
    under pytest-xdist the workers' reports are replayed there, in the order they finish.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.start = time.monotonic()
        self.total: dict[str, int] = {}
        self.done: dict[str, dict[str, int]] = {}
        self.failed: set[str] = set()
        self.skipped: set[str] = set()

    def _line(self, text: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.ensure_newline()
            # xdist's progress dots do not tell the reporter a line is open; end it here.
            if getattr(getattr(tr, "_tw", None), "width_of_current_line", 0):
                tr.write("\n")
            tr.write_line(text)
        else:
            print(text)
        sys.stdout.flush()

    def _count(self, nodeids: list[str]) -> None:
        self.total = {}
        for nodeid in nodeids:
            path = nodeid.split("::")[0]
            self.total[path] = self.total.get(path, 0) + 1
        self._line(f"progress: {len(nodeids)} tests in {len(self.total)} files")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:  # none in the xdist controller: its workers collect
            self._count([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        if not self.total:  # every worker collects the same tests; the first one counts them
            self._count(list(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)
            self._line(f"progress: FAILED {report.nodeid} (in {report.when}), {self._elapsed()}\n"
                       f"{report.longreprtext}")
        elif report.skipped:
            self.skipped.add(report.nodeid)

    @pytest.hookimpl(trylast=True)  # after pytest's own progress mark for the test
    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        path = nodeid.split("::")[0]
        counts = self.done.setdefault(path, {"passed": 0, "failed": 0, "skipped": 0})
        outcome = "failed" if nodeid in self.failed else "skipped" if nodeid in self.skipped else "passed"
        counts[outcome] += 1
        if sum(counts.values()) == self.total.get(path):
            finished = sum(sum(c.values()) for c in self.done.values())
            self._line(f"progress: {path} done: {counts['passed']} passed, {counts['failed']} failed, "
                       f"{counts['skipped']} skipped; {finished}/{sum(self.total.values())} tests, {self._elapsed()}")

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.start:.0f} s"


def pytest_configure(config: pytest.Config) -> None:
    # Only where pytest prints: an xdist worker's output is not shown, its reports are replayed.
    if os.environ.get("FTLIB_TEST_PROGRESS") == "1" and not _is_xdist_worker(config):
        config.pluginmanager.register(FileProgress(config), "ftlib-file-progress")


@pytest.fixture()
def results_root(tmp_path, monkeypatch) -> Path:
    """Results written under a temporary folder (FTLIB_RESULTS_DIR), never into data/results/; a module
    that measures takes it for every test with ``pytestmark = pytest.mark.usefixtures("results_root")``."""
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"
