"""How each execution mode runs a training step: one runner per mode, the optimizer placement,
and the compile caches a compiled mode uses.

A runner says how step k runs: ``prepare(k)`` (untimed: copy batch k into static buffers) then
``run(k)`` (timed). The modes (``STEP_MODES``) and optimizer placements (``OPTIMIZERS``) are
described in :mod:`ftlib.harness.bench.step`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ftlib.training.step import make_optimizer, train_step

if TYPE_CHECKING:
    from ftlib.training.engine import Engine

# A pool of (x, y) batches the timed calls cycle through.
BatchPool = Sequence[tuple[torch.Tensor, torch.Tensor]]

STEP_MODES = ("eager", "cudagraph", "compile", "compile-ro", "compile-max", "engine")
COMPILE_MODES: dict[str, str | None] = {
    "compile": None,
    "compile-ro": "reduce-overhead",
    "compile-max": "max-autotune-no-cudagraphs",
}
OPTIMIZERS = ("default", "fused", "whole-step", "whole-step-ca", "graphed")
# Placements that compile the optimizer into the step. 'whole-step' leaves the backward to the eager
# autograd engine, which runs AOTAutograd's compiled backward graph as one node (PyTorch's
# torch.compiler FAQ, "Does torch.compile support training?"); 'whole-step-ca' also turns on compiled
# autograd, which traces the backward at run time into one graph of its own (PyTorch's "Compiled
# Autograd" tutorial), so no autograd-engine work is left between the step's graphs.
WHOLE_STEP = ("whole-step", "whole-step-ca")
# 'graphed': the compiled model's step (forward, backward and the fused, capturable AdamW) captured by hand
# as one CUDA graph, as the cudagraph mode captures the eager step: the compiler's kernels with no host work
# between them. Not under reduce-overhead, whose own CUDA graphs cannot be captured inside another.
GRAPHED = "graphed"
GRAPHED_MODES = ("compile", "compile-max")


def captures_whole_step(mode: str, kind: str) -> bool:
    """Whether the step is captured by hand as one CUDA graph: the eager step (mode 'cudagraph') or the
    compiled one (placement 'graphed'). Such a step needs CUDA, the capturable AdamW and warm-up steps."""
    return mode == "cudagraph" or kind == GRAPHED


# Steps the cudagraph mode runs eagerly on a side stream before capture (PyTorch's recipe uses 3).
GRAPH_WARMUP = 3


@contextlib.contextmanager
def fresh_compile_cache() -> Iterator[None]:
    """Cold compile in this process: reset Dynamo, empty Inductor/Triton cache dirs, no FX/AOT caches.

    The knobs are those of PyTorch's compile-caching recipe (TORCHINDUCTOR_CACHE_DIR,
    TORCHINDUCTOR_FX_GRAPH_CACHE, TORCHINDUCTOR_AUTOGRAD_CACHE), set here through the
    config objects and ``torch._inductor.utils.fresh_cache`` (a temporary cache dir for
    Inductor and Triton). Python imports and the CUDA context stay warm: for a
    whole-process cold start use ``bench_step_isolated``.
    """
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch._inductor.utils as inductor_utils

    fresh = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch(fx_graph_cache=False))
        if hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        stack.enter_context(fresh())
        try:
            yield
        finally:
            torch._dynamo.reset()


@contextlib.contextmanager
def shared_compile_cache() -> Iterator[None]:
    """Compile against this machine's Inductor/Triton caches (possibly warm), Dynamo reset around it.

    For sweeps whose compile time is not the measurement: kernels another case already built
    come from the cache. The resets matter: without them a new model of the same class
    recompiles on guard failures, Dynamo gives up and runs eager after a few recompiles
    (its recompile limit), and a changed shape makes it compile dynamic shapes. Either would
    silently change what a 'compile' row measures.
    """
    import torch._dynamo

    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


def check_optimizer(mode: str, kind: str) -> None:
    """Refuse an optimizer placement the mode cannot have, with what to ask for instead."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; expected one of {OPTIMIZERS}")
    if kind in WHOLE_STEP and mode not in COMPILE_MODES:
        raise ValueError(f"optimizer={kind!r} compiles the step with torch.compile: it needs a compile mode "
                         f"({', '.join(COMPILE_MODES)}), not {mode!r}")
    if kind == GRAPHED and mode not in GRAPHED_MODES:
        raise ValueError(f"optimizer={kind!r} captures a compiled step in a CUDA graph: it needs one of "
                         f"{', '.join(GRAPHED_MODES)}, not {mode!r} (the manual graph of the eager step is mode "
                         "'cudagraph'; reduce-overhead's own graphs cannot be captured inside another)")


def autograd_context(kind: str) -> contextlib.AbstractContextManager:
    """Compiled autograd on for the 'whole-step-ca' placement while its step runs, off again after."""
    if kind != "whole-step-ca":
        return contextlib.nullcontext()
    import torch._dynamo

    return torch._dynamo.config.patch(compiled_autograd=True)


def make_step_optimizer(model: torch.nn.Module, kind: str, mode: str, device: torch.device) -> torch.optim.Optimizer:
    check_optimizer(mode, kind)
    if captures_whole_step(mode, kind):
        # Capture needs the step count on the device (capturable); fused is one kernel per group.
        return make_optimizer(model, fused=True, capturable=True), "adamw-fused-capturable"
    if kind == "fused":
        return make_optimizer(model, fused=True), "adamw-fused"
    if kind in WHOLE_STEP:
        # The default AdamW, traced by Dynamo inside the compiled step (it keeps the step count
        # on the device itself, so the compiled step can also be CUDA-graphed).
        return make_optimizer(model), "adamw-compiled-in-step"
    return make_optimizer(model), "adamw-foreach" if device.type == "cuda" else "adamw-default"


@dataclass
class Runner:
    """How a mode runs step k: ``prepare`` (untimed) then ``run`` (timed); ``first_k`` = first real step."""

    prepare: Callable[[int], None]
    run: Callable[[int], torch.Tensor]
    first_k: int = 0


def _eager_runner(model, opt, pool, scaler=None) -> Runner:
    n = len(pool)
    return Runner(lambda k: None, lambda k: train_step(model, opt, *pool[k % n], scaler=scaler))


def _forward_backward_update(model, opt, x, y) -> torch.Tensor:
    """The step without zero_grad: what ``optimizer='whole-step'`` compiles as one function.

    zero_grad stays outside: Dynamo does not trace ``Optimizer.zero_grad`` (a graph break),
    and setting grads to None costs nothing on the device.
    """
    _, loss = model(x, y)
    loss.backward()
    opt.step()
    return loss.detach()


def _compile_runner(model, opt, pool, mode: str, whole_step: bool = False, scaler=None) -> Runner:
    n = len(pool)
    if whole_step and scaler is not None:
        # GradScaler's step reads its found-inf flag between the backward and the update; this
        # harness does not compile it into the step.
        raise NotImplementedError("optimizer='whole-step' with fp16 loss scaling is not measured: "
                                  "GradScaler is not compiled into the step here")
    if whole_step:
        body = torch.compile(_forward_backward_update, mode=COMPILE_MODES[mode])

        def step(k: int) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            return body(model, opt, *pool[k % n])
    else:
        compiled = torch.compile(model, mode=COMPILE_MODES[mode])

        def step(k: int) -> torch.Tensor:
            return train_step(compiled, opt, *pool[k % n], scaler=scaler)
    if mode == "compile-ro":
        def run(k: int) -> torch.Tensor:
            # Tell CUDA-graph trees a new iteration starts, so last step's outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
            return step(k)
        return Runner(lambda k: None, run)
    return Runner(lambda k: None, step)


def _cudagraph_runner(model, opt, pool, scaler=None) -> Runner:
    """Whole-step capture, as in PyTorch's CUDA-graphs notes ("whole-network capture"). ``model`` may be a
    ``torch.compile``d module (the 'graphed' placement): the side-stream warm-up then also compiles it, so
    the capture records the compiled kernels and no compilation."""
    n = len(pool)
    static_x, static_y = pool[0][0].clone(), pool[0][1].clone()

    def prepare(k: int) -> None:
        static_x.copy_(pool[k % n][0])
        static_y.copy_(pool[k % n][1])

    # Warm up on a side stream so lazy initializations (cuBLAS handles, optimizer state,
    # autograd's stream bookkeeping) happen outside the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for k in range(GRAPH_WARMUP):  # with a scaler, this also creates its state tensors
            prepare(k)
            train_step(model, opt, static_x, static_y, scaler=scaler)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    # Grads set to None before capture: backward inside the capture allocates .grad from
    # the graph's private pool and every replay overwrites them in place, which is what
    # zero_grad(set_to_none=True) + backward does in eager mode. No zero_grad inside.
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        _, static_loss = model(static_x, static_y)
        if scaler is None:
            static_loss.backward()
            opt.step()
        else:  # the fused AdamW takes the scaler's found-inf on the device: nothing syncs
            scaler.scale(static_loss).backward()
            scaler.step(opt)
            scaler.update()
    loss_out = static_loss.detach()

    def run(k: int) -> torch.Tensor:
        graph.replay()
        return loss_out

    # Keep the graph alive as long as the runner (the closure holds it).
    return Runner(prepare, run, first_k=GRAPH_WARMUP)


def engine_runner(engine: Engine, pool: BatchPool) -> Runner:
    """Like the cudagraph mode: copy the batch into the engine's static buffers untimed, replay timed."""
    n = len(pool)

    def prepare(k: int) -> None:
        engine.static_x.copy_(pool[k % n][0])
        engine.static_y.copy_(pool[k % n][1])

    # Handing the engine its own static buffers makes its copies no-ops (copy_ of a tensor onto itself).
    return Runner(prepare, lambda k: engine.step(engine.static_x, engine.static_y))


def make_runner(mode: str, model: torch.nn.Module, opt: torch.optim.Optimizer, pool: BatchPool,
                optimizer: str = "default", scaler: Any = None) -> Runner:
    """The timed step of ``mode`` (one of :data:`STEP_MODES` but the engine), cycling through ``pool``."""
    if mode == "eager":
        return _eager_runner(model, opt, pool, scaler)
    if mode == "cudagraph":
        return _cudagraph_runner(model, opt, pool, scaler)
    if optimizer == GRAPHED:
        return _cudagraph_runner(torch.compile(model, mode=COMPILE_MODES[mode]), opt, pool, scaler)
    return _compile_runner(model, opt, pool, mode, whole_step=optimizer in WHOLE_STEP, scaler=scaler)


def compile_counters() -> dict[str, Any]:
    """Dynamo's counters (graph breaks, recompiles, ...), read by :func:`compile_report`."""
    import torch._dynamo.utils

    return torch._dynamo.utils.counters


def compile_report() -> dict[str, int]:
    """What the compiler made of the step: graphs compiled, graph breaks, graphs left out of CUDA graphs.

    A reduce-overhead row whose graphs were skipped by CUDA-graph trees launches from Python
    like the default mode: the count says so next to the time.
    """
    c = compile_counters()
    return {"compiled_graphs": int(c["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(c["graph_break"].values())),
            "cudagraph_skips": int(c["inductor"].get("cudagraph_skips", 0))}


