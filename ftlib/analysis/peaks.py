"""Datasheet peaks of the GPUs the book meets, and a roofline over the accounting rows.

Peaks are *leads, not readings*: vendor datasheet numbers (boost clock, dense tensor
math, i.e. without the 2:4 sparsity factor the datasheets often print first). Keys are
the names ``torch.cuda.get_device_name()`` reports; :func:`lookup` also matches looser
spellings ('A100', 'h100', 'Tesla T4').

Roofline (Williams, Waterman & Patterson 2009, CACM): a kernel needs at least
``max(flops / peak_flops, bytes / peak_bandwidth)`` seconds. Summing that floor per
component (:func:`roofline`) is a tighter floor than applying it to the step totals,
because a memory-bound softmax cannot borrow time from a compute-bound matmul.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ftlib.analysis.accounting import PRECISION_BYTES, rows
from ftlib.model.config import ModelConfig


@dataclass(frozen=True)
class DevicePeaks:
    name: str  # as torch.cuda.get_device_name() reports it
    capability: tuple[int, int]  # CUDA compute capability (sm_XY)
    sms: int
    fp32: float  # TFLOP/s, non-tensor FP32 (FFMA)
    tf32: float | None  # TFLOP/s, dense TF32 tensor core; None where absent
    bf16: float | None  # TFLOP/s, dense BF16 tensor core; None where absent
    fp16: float  # TFLOP/s, dense FP16 tensor core (FP32 accumulate where the sheet says)
    bandwidth_gbs: float  # DRAM bandwidth, GB/s (10^9 bytes/s)
    l2_mb: float
    source: str
    aliases: tuple[str, ...] = ()

    def rate(self, precision: str) -> float:
        """Peak matmul FLOP/s (not TFLOP/s) for a precision name."""
        tflops = {"fp32": self.fp32, "tf32": self.tf32, "bf16": self.bf16, "fp16": self.fp16}[precision]
        if tflops is None:
            raise ValueError(f"{self.name} has no {precision} tensor cores")
        return tflops * 1e12

    @property
    def bandwidth(self) -> float:
        """DRAM bandwidth in bytes/s."""
        return self.bandwidth_gbs * 1e9


PEAKS: dict[str, DevicePeaks] = {
    p.name: p
    for p in (
        DevicePeaks(
            "Tesla T4", (7, 5), 40, fp32=8.1, tf32=None, bf16=None, fp16=65.0,
            bandwidth_gbs=320.0, l2_mb=4.0, aliases=("t4",),
            source="NVIDIA T4 Tensor Core GPU datasheet (2019): FP32 8.1 TFLOPS, mixed FP16/FP32 "
            "65 TFLOPS, 320 GB/s GDDR6; Turing TU104: 40 SMs, 4 MB L2 (Turing architecture whitepaper)",
        ),
        DevicePeaks(
            "NVIDIA L4", (8, 9), 58, fp32=30.3, tf32=60.0, bf16=121.0, fp16=121.0,
            bandwidth_gbs=300.0, l2_mb=48.0, aliases=("l4",),
            source="NVIDIA L4 datasheet (2023): FP32 30.3, TF32 120*, BF16/FP16 242* TFLOPS "
            "(* with sparsity, halved here), 300 GB/s; AD104: 58 SMs, 48 MB L2 (Ada whitepaper)",
        ),
        DevicePeaks(
            "NVIDIA A100-SXM4-80GB", (8, 0), 108, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0,
            bandwidth_gbs=2039.0, l2_mb=40.0, aliases=("a100sxm480gb", "a100sxm80gb", "a100"),
            source="NVIDIA A100 datasheet (2021): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense, "
            "80GB SXM 2,039 GB/s; 108 SMs, 40 MB L2 (A100 whitepaper)",
        ),
        DevicePeaks(
            "NVIDIA A100-SXM4-40GB", (8, 0), 108, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0,
            bandwidth_gbs=1555.0, l2_mb=40.0, aliases=("a100sxm440gb", "a100sxm40gb"),
            source="NVIDIA A100 datasheet (2021): 40GB SXM 1,555 GB/s; compute as A100 80GB",
        ),
        DevicePeaks(
            "NVIDIA A100 80GB PCIe", (8, 0), 108, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0,
            bandwidth_gbs=1935.0, l2_mb=40.0, aliases=("a10080gbpcie", "a100pcie80gb"),
            source="NVIDIA A100 datasheet (2021): 80GB PCIe 1,935 GB/s; compute as A100 SXM",
        ),
        DevicePeaks(
            "NVIDIA A100-PCIE-40GB", (8, 0), 108, fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0,
            bandwidth_gbs=1555.0, l2_mb=40.0, aliases=("a100pcie40gb", "a100pcie"),
            source="NVIDIA A100 datasheet (2021): 40GB PCIe 1,555 GB/s; compute as A100 SXM",
        ),
        DevicePeaks(
            "NVIDIA H100 80GB HBM3", (9, 0), 132, fp32=67.0, tf32=495.0, bf16=989.0, fp16=989.0,
            bandwidth_gbs=3350.0, l2_mb=50.0, aliases=("h10080gbhbm3", "h100sxm", "h100"),
            source="NVIDIA H100 datasheet (2023), SXM: FP32 67, TF32 989*, BF16/FP16 1,979* TFLOPS "
            "(* sparse, halved here), 3.35 TB/s; 132 SMs, 50 MB L2 (Hopper whitepaper)",
        ),
        DevicePeaks(
            "NVIDIA H100 PCIe", (9, 0), 114, fp32=51.0, tf32=378.0, bf16=756.0, fp16=756.0,
            bandwidth_gbs=2000.0, l2_mb=50.0, aliases=("h100pcie",),
            source="NVIDIA H100 datasheet (2023), PCIe: FP32 51, TF32 756*, BF16 1,513* TFLOPS "
            "(* sparse, halved here), 2 TB/s; 114 SMs, 50 MB L2",
        ),
        DevicePeaks(
            "NVIDIA H200", (9, 0), 132, fp32=67.0, tf32=495.0, bf16=989.0, fp16=989.0,
            bandwidth_gbs=4800.0, l2_mb=50.0, aliases=("h200sxm", "h200"),
            source="NVIDIA H200 datasheet (2024), SXM: FP32 67, TF32 989*, BF16/FP16 1,979* TFLOPS "
            "(* sparse, halved here), 4.8 TB/s HBM3e; GH100 die: 132 SMs, 50 MB L2",
        ),
        DevicePeaks(
            "NVIDIA H200 NVL", (9, 0), 132, fp32=60.0, tf32=418.0, bf16=836.0, fp16=836.0,
            bandwidth_gbs=4800.0, l2_mb=50.0, aliases=("h200nvl",),
            source="NVIDIA H200 datasheet (2024), NVL: FP32 60, TF32 835*, BF16/FP16 1,671* TFLOPS "
            "(* sparse, halved here), 4.8 TB/s",
        ),
    )
}


def _norm_name(name: str) -> str:
    s = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidia", "tesla", "geforce"):
        s = s.replace(prefix, "")
    return s


def lookup(name: str) -> DevicePeaks:
    """The peaks for a device name: exact key, else the longest alias (or normalized key)
    contained in the normalized name ('NVIDIA H200 NVL' -> H200 NVL, 'A100' -> A100 SXM4 80GB)."""
    if name in PEAKS:
        return PEAKS[name]
    target = _norm_name(name)
    best: tuple[int, DevicePeaks] | None = None
    for p in PEAKS.values():
        for alias in (_norm_name(p.name), *p.aliases):
            if alias and alias in target and (best is None or len(alias) > best[0]):
                best = (len(alias), p)
    if best is None:
        raise KeyError(f"no peak table entry for device {name!r}; known: {sorted(PEAKS)}")
    return best[1]


def _device(device: str | DevicePeaks) -> DevicePeaks:
    return device if isinstance(device, DevicePeaks) else lookup(device)


def compute_rate(device: str | DevicePeaks, precision: str, kind: str = "gemm") -> float:
    """FLOP/s a component can reach: matmuls (``kind`` 'gemm' / 'attention') at the
    tensor-core rate of ``precision``; elementwise work on the FP32 pipes (CUDA cores do
    16-bit elementwise math at about the FP32 rate or 2x; FP32 is the safe floor)."""
    d = _device(device)
    if precision not in PRECISION_BYTES:
        raise ValueError(f"unknown precision {precision!r}")
    if kind in ("gemm", "attention"):
        return d.rate(precision)
    return d.rate("fp32")


def floor_time(flops: float, nbytes: float, device: str | DevicePeaks, precision: str, kind: str = "gemm") -> dict:
    """Roofline floor of one kernel: compute time, memory time, their max and which bounds."""
    d = _device(device)
    t_c = flops / compute_rate(d, precision, kind)
    t_m = nbytes / d.bandwidth
    return {"compute_s": t_c, "memory_s": t_m, "floor_s": max(t_c, t_m),
            "bound": "compute" if t_c >= t_m else "memory"}


def roofline(
    cfg: ModelConfig,
    B: int,
    T: int,
    device: str | DevicePeaks,
    precision: str = "fp32",
    which: str = "flops",
    **kw: Any,
) -> list[dict[str, Any]]:
    """The accounting rows of a step on ``device`` with per-row floor times added.

    The attention backend is the one expected on that device (its compute capability).
    ``which`` picks the FLOP column ('flops' as executed, 'flops_causal', 'flops_full').
    """
    d = _device(device)
    out = []
    for r in rows(cfg, B, T, precision=precision, capability=d.capability, **kw):
        ft = floor_time(r[which], r["bytes"], d, precision, r["kind"])
        out.append({**r, **ft})
    return out


def step_floor(
    cfg: ModelConfig, B: int, T: int, device: str | DevicePeaks, precision: str = "fp32", **kw: Any
) -> dict[str, float]:
    """Per-step floors: the sum of per-row floors, and the two whole-step bounds."""
    d = _device(device)
    rs = roofline(cfg, B, T, d, precision, **kw)
    flops = sum(r["flops"] for r in rs)
    nbytes = sum(r["bytes"] for r in rs)
    return {
        "flops": flops,
        "bytes": nbytes,
        "compute_s": sum(r["compute_s"] for r in rs),  # every row at its pipe's peak
        "memory_s": nbytes / d.bandwidth,
        "floor_s": sum(r["floor_s"] for r in rs),
        "compute_bound_share": sum(r["floor_s"] for r in rs if r["bound"] == "compute")
        / sum(r["floor_s"] for r in rs),
    }


def flops_floor(flops: float, device: str | DevicePeaks, precision: str = "fp32") -> float:
    """Seconds to do ``flops`` at the device's matmul peak for ``precision``."""
    return flops / _device(device).rate(precision)


def achieved(
    flops: float, nbytes: float, seconds: float, device: str | DevicePeaks, precision: str = "fp32"
) -> dict[str, float]:
    """Rates reached by a measured time: FLOP/s, bytes/s, MFU (model FLOPs over the
    matmul peak, PaLM app. B) and the fraction of DRAM bandwidth used."""
    d = _device(device)
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    return {
        "flop_per_s": flops / seconds,
        "tflop_per_s": flops / seconds / 1e12,
        "bytes_per_s": nbytes / seconds,
        "gb_per_s": nbytes / seconds / 1e9,
        "mfu": flops / seconds / d.rate(precision),
        "bandwidth_utilization": nbytes / seconds / d.bandwidth,
    }
