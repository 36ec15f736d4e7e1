"""Every Triton kernel compiled ahead of time for sm_75 (T4), sm_80 (A100) and sm_90 (H100/H200)
on this CPU, at the tiles each launcher picks for that device: does it fit the device's shared
memory, and do its matmuls use tensor cores where ``ftlib.core.device`` says Triton's do?

The compiler runs in child processes (``python -m benchmarks.kernels.aot --jobs 2``): this process runs
Triton's interpreter (tests/conftest.py), whose jit functions cannot be compiled. About 50 s of
CPU with an empty Triton cache (the sm_75 attention kernels' FMA code is a third of it), split
over two worker processes: ~35 s on two cores; ~10 s with a warm cache (TRITON_CACHE_DIR).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftlib.core.device import DeviceInfo

ROOT = Path(__file__).resolve().parent.parent
CCS = (75, 80, 90)


@pytest.fixture(scope="module")
def rows():
    pytest.importorskip("triton")
    from benchmarks.kernels.aot import EXIT_NO_TOOLCHAIN

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FTLIB_CAPABILITY")}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated so it does not warn
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kernels.aot", "--cc", ",".join(map(str, CCS)), "--json",
                           "--jobs", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode == EXIT_NO_TOOLCHAIN:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def _by(rows, cc, prefix):
    return [r for r in rows if r["cc"] == cc and r["label"].startswith(prefix)]


def test_every_kernel_compiles_for_every_target(rows):
    for cc in CCS:
        labels = {r["label"].split()[0] for r in rows if r["cc"] == cc}
        assert {"attention.fwd", "attention.bwd_dq", "attention.bwd_dkdv", "adamw", "rmsnorm.fwd", "rmsnorm.bwd",
                "layernorm.fwd", "layernorm.bwd", "residual_norm.fwd", "residual_norm.bwd", "causal_softmax.fwd",
                "causal_softmax.bwd", "cross_entropy", "bias_linear.col_sum", "linear"} <= labels, (cc, labels)


def test_chosen_tiles_fit_each_devices_shared_memory(rows):
    for r in rows:
        if r["label"].startswith("linear"):
            continue  # autotune candidates: Triton skips those that do not load (next test)
        assert r["fits"], f"sm_{r['cc']} {r['label']}: {r['shared']} bytes > {r['smem_limit']}"


def test_each_device_keeps_some_gemm_configuration(rows):
    for cc in CCS:
        assert any(r["fits"] for r in _by(rows, cc, "linear")), cc


def test_smem_estimate_bounds_what_triton_compiles(rows):
    from kernels.tiles import Tiles, smem_estimate

    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    for r in _by(rows, 75, "attention") + _by(rows, 80, "attention") + _by(rows, 90, "attention"):
        tiles = Tiles(r["block_m"], r["block_n"], r["num_warps"], r["num_stages"])
        est = smem_estimate(r["label"].split()[0].split(".")[1], r["head_size"], dt[r["dtype"]], tiles, r["cc"])
        assert r["shared"] <= est, f"sm_{r['cc']} {r['label']}: compiled {r['shared']} > estimate {est}"


def test_tensor_core_instructions_where_the_device_description_says(rows):
    for r in rows:
        if r["dot"] is None:
            assert not r["mma"], r["label"]
            continue
        info = DeviceInfo.for_capability(f"{r['cc'] // 10}.{r['cc'] % 10}")
        assert bool(r["mma"]) == info.triton_dot_uses_tensor_cores(r["dot"]), (r["cc"], r["label"], r["mma"])
        if r["mma"] and r["dot"] in ("tf32", "tf32x3"):
            assert all(".tf32" in m for m in r["mma"] if "mma_async" in m or "mma.sync" in m), r["mma"]


def test_t4_runs_every_tl_dot_on_fma_and_the_fp32_dkdv_kernel_needs_smaller_tiles(rows):
    t4 = _by(rows, 75, "attention")
    assert t4 and all(not r["mma"] and r["fma"] > 0 for r in t4)
    dkdv = [r for r in t4 if r["label"].startswith("attention.bwd_dkdv hs=64 fp32")]
    assert dkdv and (dkdv[0]["block_m"], dkdv[0]["block_n"]) != (64, 64) and dkdv[0]["fits"]
    h100 = [r for r in _by(rows, 90, "attention") if r["dot"] in ("tf32", "fp16")]
    assert h100 and all(any(m.startswith("wgmma.mma_async") for m in r["mma"]) for r in h100)
