"""The data-parallel training step timed: a result row per (model, precision, mode, world size).

Communication time (the measurement). On CUDA: the durations of the NCCL all-reduce kernels
(``ncclDevKernel_AllReduce_*``) in a profiled window of steps; on CPU: the ``gloo:all_reduce``
events gloo's worker threads record. Both run from when the collective starts until every rank
has contributed, so they include waiting for the slowest rank, and they overlap backward
compute: the exposed cost is what step time at N ranks adds over 1 rank, not this sum.

``python -m ftlib.harness.ddp_bench`` (under torchrun) writes the rows, rank 0 only, to
``ResultStore('ddp', <device slug>)``, skipping keys already stored.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ftlib.analysis.allreduce import GRAD_BYTES, allreduce_volume
from ftlib.core.device import device_slug
from ftlib.core.precision import precision_region
from ftlib.core.timing import summarize_ms, time_calls
from ftlib.harness.bench.runners import COMPILE_MODES
from ftlib.harness.bench.step import resolve_config
from ftlib.harness.distributed import MULTICAST_ENV, grad_check, rank_and_world, rank_device, setup, teardown
from ftlib.harness.provenance import provenance
from ftlib.harness.results import ResultStore, row_key
from ftlib.model.config import ModelConfig, preset
from ftlib.model.gpt import build_model
from ftlib.training.data import synthetic_batch
from ftlib.training.step import make_optimizer, train_step

BENCH = "ddp"
DDP_MODES = ("eager", "compile", "compile-ro")


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
    rank, world = rank_and_world()
    cfg, preset_name = resolve_config(config)
    dev = torch.device(device) if device is not None else rank_device()
    if mode not in DDP_MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {DDP_MODES}")
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
            times, _ = time_calls(run, steps, dev, start=k)
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


# ---------------------------------------------------------------------------------------
# CLI: python -m ftlib.harness.ddp_bench ... under torchrun


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
    ap = argparse.ArgumentParser(prog="python -m ftlib.harness.ddp_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["gpt2"])
    ap.add_argument("--override", action="append", default=[], help="config fields, e.g. n_layer=1,n_embd=32")
    ap.add_argument("--B", type=int, default=32, help="sequences per rank")
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--precision", nargs="+", default=["fp32"])
    ap.add_argument("--mode", nargs="+", default=["eager"], choices=DDP_MODES)
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
