"""What one data-parallel step all-reduces, on paper: the gradient bytes, what a ring moves per
rank, and the least time that takes over a link. Runs nothing.

Volume (the accounting). Gradients are fp32 (parameters stay fp32 under autocast), so one
step all-reduces ``4 * n_params`` bytes. A ring all-reduce (reduce-scatter then all-gather)
makes every rank send, and receive, ``2 (n-1)/n`` of that (Patarasuk & Yuan 2009,
"Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2); the
same factor is NCCL's "bus bandwidth" correction for AllReduce, nccl-tests
doc/PERFORMANCE.md: ``busBw = algBw * 2(n-1)/n``). NCCL may pick a tree or NVLS algorithm
instead; the ring figure is the bandwidth-optimal reference, not what NCCL is known to run.
"""

from __future__ import annotations

from typing import Any

from ftlib.analysis.accounting import num_params
from ftlib.model.config import ModelConfig

GRAD_BYTES = 4  # fp32 gradients, also under autocast (ftlib.analysis.accounting.PARAM_BYTES)
# Datasheet NVLink bandwidth per GPU, both directions together (a lead, not a reading):
# NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM "NVLink: 900GB/s".
NVLINK_GBS = {"NVIDIA H200": 900.0}


def allreduce_volume(config: ModelConfig | int, world_size: int, grad_bytes: int = GRAD_BYTES) -> dict[str, Any]:
    """Gradient bytes all-reduced per step and what a ring moves per rank (module docstring)."""
    n_params = config if isinstance(config, int) else num_params(config)
    total = grad_bytes * n_params
    factor = 2 * (world_size - 1) / world_size
    return {"n_params": n_params, "world_size": world_size, "grad_bytes": total,
            "ring_factor": factor, "ring_bytes_per_rank": factor * total}


def ring_floor_s(config: ModelConfig | int, world_size: int, link_gbs: float) -> float:
    """Least time a ring all-reduce of the gradients can take at ``link_gbs`` GB/s *per direction*:
    each rank sends (and at the same time receives) ``ring_bytes_per_rank``. A floor, not a reading."""
    return allreduce_volume(config, world_size)["ring_bytes_per_rank"] / (link_gbs * 1e9)


