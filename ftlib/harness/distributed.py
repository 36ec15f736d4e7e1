"""Data-parallel training with PyTorch DistributedDataParallel, launched by torchrun.

One process per GPU (``torchrun --nproc_per_node N``), NCCL on CUDA, gloo on CPU. Every rank
holds a full replica, takes its own ``B_per_rank`` sequences, and DDP all-reduces (averages)
the gradients during backward, bucket by bucket, overlapped with the rest of the backward
pass (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB). No communication here is home-made: DDP's reducer does all of it.

* :func:`setup` / :func:`teardown` - the process group from torchrun's environment.
* :func:`grad_check` / :func:`ddp_train` - correctness: with a global batch split across ranks,
  DDP gradients (and so losses) equal single-process ones on the full batch up to fp32 rounding.
* :mod:`ftlib.harness.ddp_bench` - the DDP step timed, and its command line; the bytes it
  all-reduces on paper: :mod:`ftlib.analysis.allreduce`.

FSDP (ZeRO-3 style sharding of parameters, gradients and optimizer state) applies when a
replica does not fit one GPU. The book's models have 2.6M-4.8M parameters (~20-80 MB with
AdamW state), far under one GPU's memory: FSDP would only add an all-gather of parameters in
forward and backward to the same gradient reduce-scatter, so it is not implemented here.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ftlib.core.device import pick_device
from ftlib.core.precision import Precision, precision_region
from ftlib.harness.bench.step import resolve_config
from ftlib.model.config import ModelConfig
from ftlib.model.gpt import build_model
from ftlib.training.data import SequentialBatches, random_batch, synthetic_batch
from ftlib.training.step import make_optimizer, train_step

# Relative gradient difference DDP vs one process on the full batch: the two halves' sums are
# added in another order than one GEMM over the whole batch; fp32 rounding stays ~1e-7.
GRAD_RTOL = 1e-5
# NVLink multicast (NVLS) is not allowed on the GPU hosts the book measures on; these switch it off in NCCL,
# PyTorch's symmetric memory and NVSHMEM. setdefault: a caller's explicit value wins.
MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Datasheet NVLink bandwidth per GPU, both directions together (a lead, not a reading):


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


def rank_device() -> torch.device:
    """The device of this rank: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_and_world() -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("no process group: call ftlib.harness.distributed.setup() first (under torchrun)")
    return dist.get_rank(), dist.get_world_size()


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
    rank, world = rank_and_world()
    cfg, _ = resolve_config(config)
    dev = torch.device(device) if device is not None else rank_device()
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


def _train_losses(model: nn.Module, step_model: nn.Module, rec: Any, data: torch.Tensor | None,
                  device: torch.device, rank: int, world: int) -> list[float]:
    """Losses of the global batch per step; each rank trains on its slice of it."""
    B = rec.batch_size // world
    opt = make_optimizer(model, lr=rec.lr, betas=rec.betas, weight_decay=rec.weight_decay, scheme=rec.decay_scheme)
    g = torch.Generator().manual_seed(rec.seed)
    seq = SequentialBatches(data, rec.batch_size, rec.block_size) if (data is not None and
                                                                       rec.sampler == "sequential") else None
    prec = Precision.of(rec.precision)  # TF32 flags around the step, autocast in train_step
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
        with prec.matmul_flags():
            loss = train_step(step_model, opt, x[sl].to(device), y[sl].to(device),
                              grad_clip=rec.grad_clip, autocast_dtype=prec.autocast)
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
    rank, world = rank_and_world()
    cfg, _ = resolve_config(config)
    dev = torch.device(device) if device is not None else rank_device()
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


