"""Every Triton kernel the package launches compiles, to cubin, for the GPUs the book runs on: sm_90 (H200)
and sm_75 (Tesla T4), with the argument types, constexprs and launch options of the engine's launches.

The kernel tests run the kernels in Triton's CPU interpreter, which accepts code a GPU compile rejects
(a @triton.jit function reading a module-level float that is not a tl.constexpr ran there and raised
NameError on the H200). Here the launchers are driven on CPU tensors with each launch recorded instead
of run, and every distinct launch is compiled for its target in child processes (tests/kernel_compile.py:
this process runs the interpreter, whose functions cannot be compiled). About 90 s on two idle cores with
an empty Triton cache (~200 distinct launches: ~130 for sm_90, ~70 for sm_75), 15 s with a warm one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kernel_compile import (
    BY_CAPABILITY,
    GPU_ANSWERED,
    JIT_HELPERS,
    PDL_ANSWERED,
    STREAMS_ONLY,
    device_dependent_functions,
    jit_functions,
    jit_helpers_are_called,
)

ROOT = Path(__file__).resolve().parent.parent
CCS = (90, 75)
# Compile failures that are known bugs, (capability, kernel) -> the bug: each is xfail(strict=True), so
# the bug stays visible in every run and its fix turns the test red until the entry goes.
KNOWN_FAILURES: dict[tuple[int, str], str] = {}


def _params() -> list[Any]:
    """(capability, kernel) for every @triton.jit kernel in kernels/ but the helpers, known failures marked."""
    out = []
    for cc in CCS:
        for kernel in jit_functions():
            if kernel in JIT_HELPERS:
                continue
            reason = KNOWN_FAILURES.get((cc, kernel))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(cc, kernel, marks=marks, id=f"sm_{cc}-{kernel.removeprefix('kernels.')}"))
    return out


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    pytest.importorskip("triton")
    from benchmarks.kernels.aot import EXIT_NO_TOOLCHAIN

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FTLIB_CAPABILITY")}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated so it does not warn
    jobs = min(os.cpu_count() or 1, 4)  # each compiling process holds torch and Triton (~0.7 GB)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "kernel_compile.py"), "--cc", ",".join(map(str, CCS)),
                           "--jobs", str(jobs)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode == EXIT_NO_TOOLCHAIN:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_every_device_dependent_helper_answers_for_the_target():
    # A launcher helper that asks the device (its type, its SM count) would answer for the CPU during the
    # capture, and the launches recorded would not be the GPU's, unless kernel_compile answers for the target.
    assert sorted(device_dependent_functions()) == sorted(GPU_ANSWERED + BY_CAPABILITY + STREAMS_ONLY + PDL_ANSWERED)


def test_the_launches_cover_every_kernel_for_every_target(rows):
    for cc in CCS:
        launched = {r["kernel"] for r in rows if r["cc"] == cc}
        missing = sorted(set(jit_functions()) - set(JIT_HELPERS) - launched)
        assert not missing, (f"sm_{cc}: no launch of {missing} was captured: drive its launcher in "
                             "tests/kernel_launches.py (or, for a function only called from other kernels, "
                             "list it in kernel_compile.JIT_HELPERS)")


def test_every_kernel_that_takes_pdl_compiles_with_it_for_hopper(rows):
    # The engine option programmatic_launch (kernels/pdl.py): each kernel with a PDL parameter also launched with
    # PDL=True for sm_90 (kernel_launches.drive's pass), whose griddepcontrol instructions then compile there.
    from kernel_compile import _jit_defs

    takes = {name for name, node in _jit_defs().items() if "PDL" in [a.arg for a in node.args.args]}
    takes -= set(JIT_HELPERS)
    assert len(takes) >= 20, sorted(takes)
    with_pdl = {r["kernel"] for r in rows if r["cc"] == 90 and "PDL=True" in r["label"]}
    assert with_pdl == takes, (sorted(takes - with_pdl), sorted(with_pdl - takes))
    assert all(r["ok"] for r in rows if r["cc"] == 90 and "PDL=True" in r["label"])
    assert not any("PDL=True" in r["label"] for r in rows if r["cc"] == 75)  # no grid dependency control there


def test_jit_helpers_exist_are_called_from_kernels_and_never_launched(rows):
    assert all(jit_helpers_are_called().values()), jit_helpers_are_called()
    launched = {r["kernel"] for r in rows}
    assert not launched & set(JIT_HELPERS), "launched directly: not a helper, drop it from JIT_HELPERS"


def test_launches_fit_each_targets_shared_memory(rows):
    # A kernel that needs more shared memory per block than the GPU allows compiles, then fails to load.
    # Autotuned kernels may: their autotuner skips a configuration that does not load.
    from kernels.limits import smem_per_block_optin

    over = [f"sm_{r['cc']} {r['kernel']} [{r['label']}]: {r['shared']} bytes > {limit}" for r in rows
            if r["ok"] and not r["autotuned"]
            and r["shared"] > (limit := smem_per_block_optin((r["cc"] // 10, r["cc"] % 10)))]
    assert not over, "\n".join(over)


@pytest.mark.parametrize(("cc", "kernel"), _params())
def test_kernel_compiles_for_target(rows, cc, kernel):
    mine = [r for r in rows if r["cc"] == cc and r["kernel"] == kernel]
    assert mine, f"no launch of {kernel} for sm_{cc} (test_the_launches_cover_every_kernel_for_every_target)"
    failed = [r for r in mine if not r["ok"]]
    if failed:
        pytest.fail(f"sm_{cc} {kernel}: {len(failed)} of {len(mine)} launches do not compile\n" + _report(failed),
                    pytrace=False)


def _report(failed: list[dict]) -> str:
    """The first failure in full (the error and its causes), then every failing specialization in a line."""
    first = failed[0]
    lines = [f"[{first['label']}]:", first["error"], "", "failing specializations:"]
    lines += [f"  [{r['label']}]: {r['error'].splitlines()[-1][:200]}" for r in failed]
    return "\n".join(lines)
