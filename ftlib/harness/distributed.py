"""Data-parallel training with PyTorch DistributedDataParallel, launched by torchrun.

One process per GPU (``torchrun --nproc_per_node N``), NCCL on CUDA, gloo on CPU. Every rank
holds a full replica, takes its own ``B_per_rank`` sequences, and DDP all-reduces (averages)
the gradients during backward, bucket by bucket, overlapped with the rest of the backward
pass (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB). No communication here is home-made: DDP's reducer does all of it.

* :func:`setup` / :func:`teardown` - the process group from torchrun's environment.
* :func:`allreduce_volume` - bytes of gradient all-reduced per step, from the parameter count.
* :func:`ddp_bench` - the DDP training step timed (a result row, as ``ftlib.harness.bench.step`` rows are),
  with the all-reduce time and volume *measured* with ``torch.profiler`` beside the accounting.
* :func:`grad_check` / :func:`ddp_train` - correctness: with a global batch split across ranks,
  DDP gradients (and so losses) equal single-process ones on the full batch up to fp32 rounding.
* ``python -m ftlib.harness.distributed`` - the CLI (under torchrun) that writes rows, rank 0 only, to
  ``ResultStore('ddp', <device slug>)``, skipping keys already stored.

Volume (the accounting). Gradients are fp32 (parameters stay fp32 under autocast), so one
step all-reduces ``4 * n_params`` bytes. A ring all-reduce (reduce-scatter then all-gather)
makes every rank send, and receive, ``2 (n-1)/n`` of that (Patarasuk & Yuan 2009,
"Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2); the
same factor is NCCL's "bus bandwidth" correction for AllReduce, nccl-tests
doc/PERFORMANCE.md: ``busBw = algBw * 2(n-1)/n``). NCCL may pick a tree or NVLS algorithm
instead; the ring figure is the bandwidth-optimal reference, not what NCCL is known to run.

Communication time (the measurement). On CUDA: the durations of the NCCL all-reduce kernels
(``ncclDevKernel_AllReduce_*``) in a profiled window of steps; on CPU: the ``gloo:all_reduce``
events gloo's worker threads record. Both run from when the collective starts until every rank
has contributed, so they include waiting for the slowest rank, and they overlap backward
compute: the exposed cost is what step time at N ranks adds over 1 rank, not this sum.

FSDP (ZeRO-3 style sharding of parameters, gradients and optimizer state) applies when a
replica does not fit one GPU. The book's models have 2.6M-4.8M parameters (~20-80 MB with
AdamW state), far under one GPU's memory: FSDP would only add an all-gather of parameters in
forward and backward to the same gradient reduce-scatter, so it is not implemented here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ftlib.analysis.accounting import num_params
from ftlib.core.device import device_slug, pick_device
from ftlib.core.precision import precision_region
from ftlib.core.timing import summarize_ms
from ftlib.harness.bench.runners import COMPILE_MODES
from ftlib.harness.bench.step import preset_of
from ftlib.harness.provenance import provenance
from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.data import SequentialBatches, random_batch, synthetic_batch
from ftlib.training.step import make_optimizer, train_step

BENCH = "ddp"
MODES = ("eager", "compile", "compile-ro")
GRAD_BYTES = 4  # fp32 gradients, also under autocast (ftlib.analysis.accounting.PARAM_BYTES)
# Relative gradient difference DDP vs one process on the full batch: the two halves' sums are
# added in another order than one GEMM over the whole batch; fp32 rounding stays ~1e-7.
GRAD_RTOL = 1e-5
# NVLink multicast (NVLS) is forbidden on the shared machines; these switch it off in NCCL,
# PyTorch's symmetric memory and NVSHMEM. setdefault: a caller's explicit value wins.
MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Datasheet NVLink bandwidth per GPU, both directions together (a lead, not a reading):
# NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM "NVLink: 900GB/s".
NVLINK_GBS = {"NVIDIA H200": 900.0}


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(device: str = "auto", timeout_s: float = 600.0) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*).

    Without torchrun it becomes a group of one on a free local port, so the same code runs
    as a plain ``python -m``. CUDA -> NCCL on ``cuda:LOCAL_RANK`` (one GPU per process);
    CPU -> gloo.
    """
    for k, v in MULTICAST_ENV.items():
        os.environ.setdefault(k, v)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = pick_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        kw: dict[str, Any] = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=_dt.timedelta(seconds=timeout_s), **kw)
    return DistInfo(rank, world, local, backend, dev)


def teardown() -> None:
    """Leave the process group (all ranks together), if one is open."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()
        dist.destroy_process_group()


def _device() -> torch.device:
    """The device of this rank: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _world() -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("no process group: call ftlib.harness.distributed.setup() first (under torchrun)")
    return dist.get_rank(), dist.get_world_size()


def _resolve(config: ModelConfig | str) -> tuple[ModelConfig, str | None]:
    if isinstance(config, str):
        return preset(config), config
    return config, preset_of(config)


# ---------------------------------------------------------------------------------------
# The accounting


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


def scaling(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored DDP rows with their scaling over the same case at one rank (weak scaling: fixed
    ``B_per_rank``): ``speedup = tok/s(n) / tok/s(1)``, ``efficiency = speedup / n``."""
    def case(r: dict[str, Any]) -> tuple:
        return (r.get("device_slug"), r.get("label"), r.get("config_hash"), r.get("precision"), r.get("mode"),
                r.get("B_per_rank"), r.get("T"))

    ok = [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s")]
    base = {case(r): r for r in ok if r.get("world_size") == 1}
    out = []
    for r in sorted(ok, key=lambda r: (*map(str, case(r)), r["world_size"])):
        one = base.get(case(r))
        speedup = r["tokens_per_s"] / one["tokens_per_s"] if one else None
        out.append({**r, "speedup": speedup, "efficiency": speedup / r["world_size"] if speedup else None,
                    "step_overhead_ms": r["median_ms"] - one["median_ms"] if one else None})
    return out


# ---------------------------------------------------------------------------------------
# Correctness: DDP gradients equal full-batch gradients


def _global_batch(vocab: int, B_global: int, T: int, seed: int, device: torch.device):
    """The same global batch on every rank (same generator), to be sliced per rank."""
    g = torch.Generator().manual_seed(seed)
    return synthetic_batch(vocab, B_global, T, generator=g, device=device)


def grad_check(
    config: ModelConfig | str, B_per_rank: int, T: int, seed: int = 0, device: torch.device | str | None = None
) -> dict[str, Any]:
    """One backward in fp32: DDP on this rank's slice vs one process on the whole global batch.

    Every rank computes the full-batch reference itself (the models are small), then DDP's
    averaged gradients are compared tensor by tensor: ``max ||g_ddp - g_ref|| / ||g_ref||``,
    the maximum over tensors and ranks. Equal-size slices make the mean of the per-rank mean
    losses the full-batch mean loss, so the gradients agree up to fp32 rounding.
    """
    rank, world = _world()
    cfg, _ = _resolve(config)
    dev = torch.device(device) if device is not None else _device()
    x, y = _global_batch(cfg.vocab_size, B_per_rank * world, T, seed + 12345, dev)
    with precision_region("fp32", dev):
        ref = build_model(cfg, seed=seed).to(dev)
        _, loss_ref = ref(x, y)
        loss_ref.backward()
        model = build_model(cfg, seed=seed).to(dev)
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        sl = slice(rank * B_per_rank, (rank + 1) * B_per_rank)
        _, loss = ddp(x[sl], y[sl])
        loss.backward()
    worst = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        if q.grad is None:
            continue
        err = (p.grad - q.grad).norm().item() / max(q.grad.norm().item(), 1e-30)
        worst = max(worst, err)
    t = torch.tensor([worst], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    worst = float(t.item())
    return {"check_rel_err": worst, "check_rtol": GRAD_RTOL, "check_ok": bool(worst <= GRAD_RTOL),
            "check_note": f"fp32 grads, DDP over {world} ranks vs one process on all {B_per_rank * world} sequences"}


def _train_losses(model, step_model, rec, data, device, rank: int, world: int) -> list[float]:
    """Losses of the global batch per step; each rank trains on its slice of it."""
    B = rec.batch_size // world
    opt = make_optimizer(model, lr=rec.lr, betas=rec.betas, weight_decay=rec.weight_decay, scheme=rec.decay_scheme)
    g = torch.Generator().manual_seed(rec.seed)
    seq = SequentialBatches(data, rec.batch_size, rec.block_size) if (data is not None and
                                                                       rec.sampler == "sequential") else None
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rec.precision)
    sl = slice(rank * B, (rank + 1) * B)
    losses = []
    for step in range(rec.steps):
        if data is None:
            x, y = synthetic_batch(model.config.vocab_size, rec.batch_size, rec.block_size, generator=g)
        elif seq is not None:
            x, y = next(seq)
        else:
            x, y = random_batch(data, rec.batch_size, rec.block_size, generator=g)
        for group in opt.param_groups:
            group["lr"] = rec.lr_at(step)
        with precision_region("tf32" if rec.precision == "tf32" else "fp32", device):
            loss = train_step(step_model, opt, x[sl].to(device), y[sl].to(device),
                              grad_clip=rec.grad_clip, autocast_dtype=autocast)
        if world > 1:
            dist.all_reduce(loss)  # mean of equal-size slices' means = the global batch's mean
            loss = loss / world
        losses.append(float(loss))
    return losses


def ddp_train(
    config: ModelConfig | str, recipe: Any, data: torch.Tensor | None = None,
    device: torch.device | str | None = None, reference: bool = True,
) -> dict[str, Any]:
    """A short DDP training run with ``recipe`` (an ``ftlib.training.trainer.Recipe``; ``batch_size`` is
    the *global* batch, split evenly over the ranks), beside single-process training.

    ``data``: token ids to sample windows from (e.g. ``load_tinyshakespeare().train``), or
    None for synthetic tokens. With ``reference``, every rank also trains one process on the
    whole global batch from the same seed; the losses should agree to fp32 rounding (bf16
    autocast: to its rounding). Returns both loss curves and their largest relative gap.
    """
    rank, world = _world()
    cfg, _ = _resolve(config)
    dev = torch.device(device) if device is not None else _device()
    if recipe.batch_size % world:
        raise ValueError(f"global batch {recipe.batch_size} does not split evenly over {world} ranks")
    cfg.check_sequence(recipe.block_size)
    model = build_model(cfg, seed=recipe.seed).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    step_model = torch.compile(ddp, mode=recipe.compile) if recipe.compile else ddp
    out: dict[str, Any] = {"world_size": world, "losses": _train_losses(model, step_model, recipe, data, dev,
                                                                       rank, world)}
    if reference:
        ref = build_model(cfg, seed=recipe.seed).to(dev)
        out["reference_losses"] = _train_losses(ref, ref, recipe, data, dev, 0, 1)
        out["max_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12)
                                  for a, b in zip(out["losses"], out["reference_losses"]))
    return out


# ---------------------------------------------------------------------------------------
# The benchmark


def _is_comm_event(e, dev_type: str) -> bool:
    name = e.name.lower().replace("_", "")
    if "allreduce" not in name:
        return False
    if dev_type == "cuda":  # the NCCL kernels themselves, on the device timeline
        return "nccl" in name and "cuda" in str(e.device_type).lower()
    return name.startswith("gloo:")  # gloo's worker-thread event: start to completion


def _profile_comm(run_step, k0: int, n: int, dev: torch.device) -> dict[str, Any]:
    """All-reduce events in ``n`` profiled steps: time per step, calls, elements (from shapes)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    wall: list[float] = []
    with profile(activities=acts, record_shapes=True) as prof:
        for i in range(n):
            t0 = time.perf_counter()
            run_step(k0 + i)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            wall.append((time.perf_counter() - t0) * 1e3)
    events = list(prof.events())
    comm = [e for e in events if _is_comm_event(e, dev.type)]
    # Elements reduced: the input shapes of the host-side collective events (gloo:/nccl:all_reduce).
    host = [e for e in events if e.name.lower() in ("gloo:all_reduce", "nccl:all_reduce")]
    numel = sum(math.prod(s) for e in host for s in (e.input_shapes or []) if s)
    return {
        "comm_ms": sum(e.time_range.elapsed_us() for e in comm) / 1e3 / n if comm else None,
        "comm_calls_per_step": len(comm) / n,
        # the profiled steps are slower than the timed ones (tracing overhead): compare like with like
        "profiled_step_ms": summarize_ms(wall)["median_ms"],
        "comm_events": sorted({e.name for e in comm})[:4],
        "comm_numel_per_step": numel / n if numel else None,
        "comm_source": ("torch.profiler: NCCL AllReduce kernels (CUDA activity)" if dev.type == "cuda"
                        else "torch.profiler: gloo:all_reduce events (worker threads)"),
    }


def _bucket_bytes(ddp: DDP) -> list[int] | None:
    """Bucket sizes in bytes, from DDP's own logging data (private API: None if it changes)."""
    try:
        data = ddp._get_ddp_logging_data()
        sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
        return [int(s) for s in str(sizes).split(",") if s.strip()]
    except Exception:
        return None


def _allgather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def ddp_key(cfg: ModelConfig, B_per_rank: int, T: int, mode: str, precision: str, world_size: int) -> str:
    return row_key(BENCH, cfg.config_hash(), B_per_rank, T, mode, precision, {"world_size": int(world_size)})


def ddp_bench(
    config: ModelConfig | str,
    B_per_rank: int,
    T: int,
    steps: int = 50,
    warmup: int = 10,
    precision: str = "fp32",
    mode: str = "eager",
    device: torch.device | str | None = None,
    *,
    seed: int = 0,
    n_batches: int = 8,
    profile_steps: int = 5,
    check: bool = True,
    label: str | None = None,
) -> dict[str, Any]:
    """Time the DDP training step on every rank; returns the same row on every rank.

    The timed region is ``ftlib.training.step.train_step`` on the DDP-wrapped model: zero_grad +
    forward + loss + backward (with DDP's bucketed all-reduce) + AdamW, CUDA events on GPU,
    perf_counter on CPU, after ``warmup`` steps and a barrier. A step is as slow as its slowest
    rank, so per-step times are max-reduced over ranks before median/p20/p80. ``tokens_per_s``
    counts all ranks. Then ``profile_steps`` more steps run under torch.profiler for the
    all-reduce time and volume (``_profile_comm``). Failures become rows with a status.
    """
    t_start = time.perf_counter()
    rank, world = _world()
    cfg, preset_name = _resolve(config)
    dev = torch.device(device) if device is not None else _device()
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    vol = allreduce_volume(cfg, world)
    row: dict[str, Any] = dict(provenance(dev))
    row.update(
        key=ddp_key(cfg, B_per_rank, T, mode, precision, world), bench=BENCH,
        label=label or preset_name or cfg.config_hash(), preset=preset_name, config=cfg.to_dict(),
        config_hash=cfg.config_hash(), n_params=vol["n_params"], world_size=world,
        backend=dist.get_backend(), B=int(B_per_rank), B_per_rank=int(B_per_rank), B_global=int(B_per_rank * world),
        T=int(T), tokens=int(B_per_rank * world * T), mode=mode, precision=precision, device_slug=device_slug(dev),
        status="ok", error=None, n_warmup=warmup, n_iters=steps,
        timing="cuda-events" if dev.type == "cuda" else "perf-counter",
        grad_bytes=vol["grad_bytes"], ring_factor=vol["ring_factor"], ring_bytes_per_rank=vol["ring_bytes_per_rank"],
        env={k: os.environ.get(k) for k in MULTICAST_ENV},
    )
    model = ddp = step_model = opt = pool = None
    try:
        cfg.check_sequence(T)
        if check:
            row.update(grad_check(cfg, B_per_rank, T, seed, dev))
        with precision_region(precision, dev):
            g = torch.Generator().manual_seed(seed + 1 + 1000 * rank)  # each rank its own data
            pool = [synthetic_batch(cfg.vocab_size, B_per_rank, T, generator=g, device=dev) for _ in range(n_batches)]
            model = build_model(cfg, seed=seed).to(dev)
            ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
            opt = make_optimizer(model)
            step_model = torch.compile(ddp, mode=COMPILE_MODES[mode]) if mode in COMPILE_MODES else ddp

            def run(k: int) -> torch.Tensor:
                if mode == "compile-ro":
                    torch.compiler.cudagraph_mark_step_begin()
                return train_step(step_model, opt, *pool[k % n_batches])

            t0 = time.perf_counter()
            row["loss_first"] = run(0).item()
            row["first_step_s"] = time.perf_counter() - t0
            for k in range(1, max(warmup, 1)):
                run(k)
            k = max(warmup, 1)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dist.barrier()
            times = _time(run, k, steps, dev)
            k += steps
            t = torch.tensor(times, dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets each step
            slowest = t.tolist()
            row.update(summarize_ms(slowest))
            row["rank_median_ms"] = [summarize_ms(x)["median_ms"] for x in _allgather(times)]
            row["tokens_per_s"] = row["tokens"] / (row["median_ms"] / 1e3)
            loss = run(k).detach()
            k += 1
            dist.all_reduce(loss)
            row["loss_last"] = float(loss) / world
            row["loss_finite"] = math.isfinite(row["loss_last"])
            comm = _profile_comm(run, k, profile_steps, dev)
            ranks = _allgather(comm["comm_ms"])
            row.update(comm, comm_ms_ranks=ranks, profile_steps=profile_steps)
            row["bucket_bytes"] = _bucket_bytes(ddp)
            if comm["comm_numel_per_step"]:
                row["allreduce_bytes_measured"] = comm["comm_numel_per_step"] * GRAD_BYTES
            if comm["comm_ms"]:
                # nccl-tests' definitions: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
                s = comm["comm_ms"] / 1e3
                row["algbw_gbs"] = vol["grad_bytes"] / s / 1e9
                row["busbw_gbs"] = vol["ring_bytes_per_rank"] / s / 1e9
                row["comm_share"] = comm["comm_ms"] / comm["profiled_step_ms"]
            if dev.type == "cuda":
                row["peak_mem_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    except Exception as exc:  # a failure becomes a row (a rank that fails alone may leave others waiting)
        msg = str(exc).lower()
        oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in msg
        row.update(status="oom" if oom else "error", error=f"{type(exc).__name__}: {exc}"[:2000],
                   traceback=traceback.format_exc()[-3000:])
    finally:
        model = ddp = step_model = opt = pool = None  # free the replica before the next case
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        row["wall_s"] = time.perf_counter() - t_start
    return row


def _time(run, k0: int, n: int, dev: torch.device) -> list[float]:
    """Per-step milliseconds of ``run(k0) .. run(k0+n-1)`` on this rank."""
    if dev.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            run(k0 + i)
            ends[i].record()
        torch.cuda.synchronize(dev)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        run(k0 + i)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


# ---------------------------------------------------------------------------------------
# CLI: python -m ftlib.harness.distributed ... under torchrun


def _overrides(items: Sequence[str]) -> dict[str, Any]:
    """'n_layer=1' 'bias=false' -> {'n_layer': 1, 'bias': False} (values parsed as JSON where they parse)."""
    out: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            k, _, v = part.partition("=")
            try:
                out[k.strip()] = json.loads(v)
            except json.JSONDecodeError:
                out[k.strip()] = v
    return out


def cli_config(name: str, overrides: dict[str, Any]) -> ModelConfig:
    """``preset(name, **overrides)``; a multi-head preset's ``n_kv_head`` follows an overridden
    ``n_head`` unless given, so one override (``n_head=4``) fits both presets."""
    over = dict(overrides)
    base = preset(name)
    if "n_head" in over and "n_kv_head" not in over and base.n_kv_head == base.n_head:
        over["n_kv_head"] = over["n_head"]
    return preset(name, **over)


def _store_for(out: str | None, dev: torch.device) -> ResultStore:
    """``--out data/results/<slug>/ddp.jsonl`` -> ResultStore('ddp', slug, data/results)."""
    if not out:
        return ResultStore(BENCH, device_slug(dev))
    p = Path(out)
    return ResultStore(p.stem, p.parent.name, p.parent.parent)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ftlib.harness.distributed", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["gpt2"])
    ap.add_argument("--override", action="append", default=[], help="config fields, e.g. n_layer=1,n_embd=32")
    ap.add_argument("--B", type=int, default=32, help="sequences per rank")
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--precision", nargs="+", default=["fp32"])
    ap.add_argument("--mode", nargs="+", default=["eager"], choices=MODES)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--no-check", action="store_true", help="skip the DDP-vs-full-batch gradient check")
    ap.add_argument("--retry-errors", action="store_true", help="measure again keys stored with an error")
    ap.add_argument("--out", default=None, help="data/results/<slug>/ddp.jsonl (default: this device's slug)")
    args = ap.parse_args(argv)

    info = setup(args.device)
    try:
        store = _store_for(args.out, info.device)
        over = _overrides(args.override)
        for name in args.preset:
            cfg = cli_config(name, over)
            for prec in args.precision:
                for mode in args.mode:
                    key = ddp_key(cfg, args.B, args.T, mode, prec, info.world_size)
                    skip = [store.has(key, skip_status=("error",) if args.retry_errors else None)]
                    dist.broadcast_object_list(skip, src=0)  # rank 0's store decides for all
                    if skip[0]:
                        if info.rank == 0:
                            print(f"[ddp] stored: {name} {prec} {mode} n={info.world_size}", flush=True)
                        continue
                    row = ddp_bench(cfg, args.B, args.T, args.steps, args.warmup, prec, mode, info.device,
                                    seed=args.seed, profile_steps=args.profile_steps, check=not args.no_check,
                                    label=name)
                    if info.rank == 0:
                        store.append(row)
                        print(f"[ddp] {name} {prec} {mode} n={info.world_size} {row['backend']}: {row['status']} "
                              f"median {row.get('median_ms') or float('nan'):.2f} ms, "
                              f"{row.get('tokens_per_s') or float('nan'):,.0f} tok/s, "
                              f"all-reduce {row.get('comm_ms') or float('nan'):.3f} ms/step"
                              + (f" ({row['error'][:200]})" if row.get("error") else ""), flush=True)
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
