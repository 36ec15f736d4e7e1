"""Every Triton kernel the package launches, compiled to cubin for GPUs that are not here, on the CPU.

The CPU tests run the kernels in Triton's interpreter, which accepts code that a GPU compile rejects
(e.g. a ``@triton.jit`` function reading a module-level float that is not a ``tl.constexpr``). This
script finds those failures without a GPU, in two steps:

1. Capture: :func:`kernel_launches.drive` calls the public launchers on CPU tensors with a stand-in
   driver for the target (:class:`TargetDriver`), the launchers' device-dependent helpers answering
   for the target GPU (``GPU_ANSWERED``), and Triton's ``jit_cache_hook`` turning each launch
   into a record instead of a compile and a run. The record is Triton's own serialized
   specialization (argument types, the divisibility-by-16 and ==1 specializations, constexprs,
   launch options), exactly what that launch would compile on that GPU. Autotuned kernels
   (``triton.autotune``): their benchmark becomes one launch of each configuration
   (:func:`_record_launches` says which).
2. Compile: each distinct record is compiled for its target (``JITFunction.preload``: TTIR to
   cubin, ``ptxas`` included) in worker processes.

Run it in a process without ``TRITON_INTERPRET`` (under the interpreter ``@triton.jit`` gives
functions that cannot be compiled); ``tests/test_kernels_compile.py`` does:

    python tests/kernel_compile.py --cc 90,75 [--jobs N]

which prints one JSON list of rows {cc, kernel, label, autotuned, ok, error, shared (bytes per block),
seconds}; exit status 3
(``benchmarks.kernels.aot.EXIT_NO_TOOLCHAIN``) when this machine has no NVIDIA toolchain for Triton.
Importing this module imports neither torch nor Triton (:func:`jit_functions` reads the sources).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# @triton.jit functions that no launcher launches: each is called only from inside other kernels
# (inlined there), so it is compiled as part of them. jit_helpers_are_called() keeps this list honest.
JIT_HELPERS: dict[str, str] = {
    "kernels.attention_kernels._dot": "tl.dot or its fp32 upcast; inside the attention and GELU-GEMM kernels",
    "kernels.attention_kernels._query_program": "a query-block program's place and offsets; inside the attention "
                                                "kernels over query blocks",
    "kernels.attention_kernels._key_program": "a dK/dV program's key block and row of the grid; inside both "
                                              "dK/dV kernels",
    "kernels.attention_kernels._dkdv_block": "one key block's dK and dV; inside the dK/dV kernel (twice when "
                                             "it pairs key blocks)",
    "kernels.linear_cross_entropy._logits": "a block of rows' logits in registers; inside both fused head-and-loss "
                                            "kernels",
    "kernels.gelu_mlp._gelu_parts": "gelu(z) and gelu'(z); inside _gemm_gelu_tile_kernel's epilogues",
    "kernels.dropout_mask._keep": "the Philox keep mask; inside _keep_mask_kernel and the residual-norm kernels",
    "kernels.pdl._grid_dependency": "programmatic dependent launch's wait and signal; first in every kernel that "
                                    "takes PDL",
    "kernels.explicit_attention_kernels._add_col_sums": "a tile's column sums added into the qkv bias gradient; "
                                                        "inside the explicit attention's backward kernels",
    "kernels.residual_norm_kernels._add_norm_bwd_rows": "one row tile of the backward; inside both backward kernels",
    "kernels.rmsnorm._rms_norm_bwd_rows": "one row tile of the backward; inside both backward kernels",
}


# Launcher helpers whose answer depends on the device (grid sizes, splits: a CUDA device's SM count,
# stand-ins on the CPU). The capture calls them with a CUDA device of the target's SM count, so that
# their integer arguments, and Triton's specializations of them (== 1, divisible by 16), are the GPU's.
# kernels.limits.device_limits answers for the target through FTLIB_CAPABILITY instead.
# device_dependent_functions() finds every such function, so a new one cannot be missed here.
GPU_ANSWERED = ("kernels._common.num_programs", "kernels._common.persistent_grid", "kernels.attention._kv_split",
                "kernels.bias_linear._num_splits", "kernels.linear._split_k",
                "kernels.linear_cross_entropy._blocks")
BY_CAPABILITY = ("kernels.limits.device_limits",)
# Device-dependent helpers that choose only the stream a launch goes to, not the launches (the capture
# records the same launches in the same order on the CPU).
STREAMS_ONLY = ("kernels.attention._side_stream",)
# Device-dependent helpers asked only under kernels.pdl.programmatic_launch: kernel_launches.drive answers them for
# its sm_90 targets in a pass of its own.
PDL_ANSWERED = ("kernels.pdl.pdl_supported",)


def _is_jit(decorator: ast.expr) -> bool:
    """``@triton.jit``, ``@jit`` or either called with options."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "jit") or (
        isinstance(target, ast.Name) and target.id == "jit")


def _jit_defs(root: Path = ROOT) -> dict[str, ast.FunctionDef]:
    """'kernels.<module>.<function>' -> its definition, for every @triton.jit function in kernels/*.py."""
    out = {}
    for path in sorted((root / "kernels").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
                out[f"kernels.{path.stem}.{node.name}"] = node
    return out


def jit_functions(root: Path = ROOT) -> list[str]:
    """Every @triton.jit function in kernels/*.py, as 'kernels.<module>.<function>'."""
    return sorted(_jit_defs(root))


def jit_helpers_are_called(root: Path = ROOT) -> dict[str, bool]:
    """For each of JIT_HELPERS: whether another @triton.jit function of kernels/ calls it by name."""
    defs = _jit_defs(root)
    called: set[str] = set()
    for node in defs.values():
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                f = sub.func
                called.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return {name: name in defs and name.rsplit(".", 1)[1] in called for name in JIT_HELPERS}


def _asks_the_device(node: ast.FunctionDef) -> bool:
    """Whether a function compares something with "cuda" (a device type) or reads the CUDA device's properties."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == "cuda"
                                                for c in (sub.left, *sub.comparators)):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "get_device_properties":
            return True
    return False


def device_dependent_functions(root: Path = ROOT) -> list[str]:
    """Every module-level function in kernels/*.py whose result depends on the device's type or properties."""
    out = []
    for path in sorted((root / "kernels").glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and _asks_the_device(node):
                out.append(f"kernels.{path.stem}.{node.name}")
    return out


class TargetDriver:
    """The part of Triton's driver a launch asks (device, stream, target), for a GPU that is not here.
    The device id is the capability, so each target keeps its own per-device caches in a JITFunction."""

    def __init__(self, cc: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.cc = cc
        self.target = GPUTarget("cuda", cc, 32)

    def get_current_device(self) -> int:
        return self.cc

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def _allow_cpu_tensors() -> None:
    """Let the launchers take CPU tensors outside the interpreter: their device check is the only
    thing that refuses them, and the capture never runs a kernel. Every module of kernels/ is imported
    first, so that the check is replaced in each one that imported it by name."""
    import importlib

    import kernels._common as common

    for path in sorted((ROOT / "kernels").glob("*.py")):
        importlib.import_module(f"kernels.{path.stem}")
    _replace_everywhere(common.check_device, lambda name, t: None)


def _replace_everywhere(original: Callable, new: Callable) -> None:
    """``new`` in place of ``original`` in every module of kernels/ that holds it (imported by name too)."""
    for name, module in list(sys.modules.items()):
        if name == "kernels" or name.startswith("kernels."):
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, new)


def _on_cuda(fn: Callable) -> Callable:
    """``fn`` called with every torch.device argument replaced by the CUDA device."""
    import torch

    cuda = torch.device("cuda")

    def swap(v: Any) -> Any:
        return cuda if isinstance(v, torch.device) else v

    @functools.wraps(fn)
    def on_cuda(*args: Any, **kwargs: Any) -> Any:
        return fn(*map(swap, args), **{k: swap(v) for k, v in kwargs.items()})

    return on_cuda


def _answer_as_target_gpu(cc: int) -> None:
    """GPU_ANSWERED called with a CUDA device whose properties are the target's (its SM count)."""
    import torch
    from kernel_launches import SMS

    props = SimpleNamespace(multi_processor_count=SMS[cc])
    torch.cuda.get_device_properties = lambda device=None: props
    for qualname in GPU_ANSWERED:
        module, name = qualname.rsplit(".", 1)
        current = getattr(sys.modules[module], name)
        original = getattr(current, "__wrapped__", current)  # a capture before this one wrapped it already
        wrapped = _on_cuda(original)
        _replace_everywhere(current, wrapped)
        if current is not original:
            _replace_everywhere(original, wrapped)


def _record_launches(records: list[dict[str, Any]], cc: int) -> None:
    """Triton's jit_cache_hook: called before each compile a launch needs; returning True skips the
    compile and the launch.

    Autotuned kernels: the first launch of each kernel tries every configuration (one launch each in
    place of the benchmark; kernel_launches.steps puts the engine's main precision first), later
    launches (other dtypes, flags, shapes) the first configuration only: every configuration in every
    variant would double this test's time. The autotuners' choices are cached per shape, not per
    device: they are forgotten for each target."""
    from triton import knobs
    from triton.runtime.autotuner import Autotuner

    tuners = [v for name, module in list(sys.modules.items()) if name.startswith("kernels.")
              for v in vars(module).values() if isinstance(v, Autotuner)]
    for tuner in tuners:
        tuner.cache.clear()
    tuned = {id(tuner.fn) for tuner in tuners}
    tried: set[str] = set()
    prune = Autotuner.prune_configs

    def configs_to_try(self: Autotuner, kwargs: dict[str, Any]) -> list[Any]:
        configs = prune(self, kwargs)
        if self.base_fn.__name__ in tried:
            return configs[:1]  # one configuration: the autotuner launches it without a benchmark
        tried.add(self.base_fn.__name__)
        return configs

    def hook(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        records.append({"cc": cc, "kernel": f"{fn.module}.{fn.name}", "spec": compile["specialization_data"],
                        "autotuned": id(fn.jit_function) in tuned})
        return True

    def bench_once(kernel_call: Any, quantiles: Any = None) -> list[float]:
        kernel_call()
        return [1.0, 1.0, 1.0]

    knobs.runtime.jit_cache_hook = hook
    Autotuner.prune_configs = configs_to_try
    Autotuner.do_bench = property(lambda self: bench_once)


def capture(cc: int, extended: bool = False) -> list[dict[str, Any]]:
    """The distinct launches :func:`kernel_launches.drive` makes for sm_``cc``, in first-launch order."""
    import kernel_launches
    from triton import knobs
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver

    _allow_cpu_tensors()
    _answer_as_target_gpu(cc)
    records: list[dict[str, Any]] = []
    driver.set_active(TargetDriver(cc))  # left set: with no GPU here there is no driver to go back to
    prune, bench = Autotuner.prune_configs, Autotuner.do_bench
    _record_launches(records, cc)
    try:
        kernel_launches.drive(cc, extended)
    finally:
        knobs.runtime.jit_cache_hook = None
        Autotuner.prune_configs, Autotuner.do_bench = prune, bench
    seen: set[str] = set()
    return [r for r in records if not (r["spec"] in seen or seen.add(r["spec"]))]


def label(spec: str) -> str:
    """A specialization in words: pointer dtypes, constexprs (the launch's and Triton's ==1 ones), warps, stages."""
    d = json.loads(spec)
    names = list(d["signature"])
    ptrs = " ".join(f"{n}:{t}" for n, t in d["signature"].items() if t.startswith("*"))
    consts = " ".join(f"{names[k[0]]}={v['constexpr'] if isinstance(v, dict) else v}"
                      for k, v in zip(d["constant_keys"], d["constant_vals"]))
    opts = d["options"]
    return f"{ptrs} | {consts} | warps={opts['num_warps']} stages={opts['num_stages']}"


def describe(error: BaseException, tail: int = 1200) -> str:
    """The error and its causes, each as its type and the end of its message: Triton wraps an error in a
    @triton.jit helper in one CompilationError per call site, the cause (e.g. the NameError) innermost."""
    links = []
    while error is not None and len(links) < 8:
        links.append(f"{type(error).__name__}: {str(error)[-tail:]}")
        error = error.__cause__ or error.__context__
    return "\ncaused by\n".join(links)


def compile_record(record: dict[str, Any]) -> dict[str, Any]:
    """Compile one captured launch for its target down to cubin; the row says whether it compiled and
    if not, why (Triton's error, which names the kernel's source line)."""
    import importlib

    from triton.runtime.driver import driver

    module, name = record["kernel"].rsplit(".", 1)
    row = {"cc": record["cc"], "kernel": record["kernel"], "label": label(record["spec"]),
           "autotuned": record["autotuned"], "ok": False, "error": None, "shared": None}
    t0 = time.perf_counter()
    driver.set_active(TargetDriver(record["cc"]))
    try:
        compiled = getattr(importlib.import_module(module), name).preload(record["spec"])
        row["ok"] = "cubin" in compiled.asm
        row["shared"] = int(compiled.metadata.shared)  # bytes per block, what the driver checks at load
        if not row["ok"]:
            row["error"] = f"no cubin among the compiled stages {sorted(compiled.asm)}"
    except Exception as e:  # any compile error is the finding: report it, compile the rest
        row["error"] = describe(e)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _cost_guess(record: dict[str, Any]) -> float:
    """Rough compile seconds, to start the longest first and have the workers finish together: tl.dot
    kernels take longest, most of all below sm_80 where they become FMA code."""
    k, fma = record["kernel"], record["cc"] < 80
    dots = "_attn_" in k or "gemm" in k or "matmul" in k
    return (8.0 if fma else 2.0) if dots else 0.5


def run(ccs: list[int], extended: bool = False, jobs: int = 1) -> list[dict[str, Any]]:
    """Capture each target's launches (one process per target), then compile them all, ``jobs``
    spawned processes at a time; one row per distinct launch, sorted by target, kernel and label."""
    if jobs <= 1:
        rows = [compile_record(r) for cc in ccs for r in capture(cc, extended)]
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            records = [r for f in [ex.submit(capture, cc, extended) for cc in ccs] for r in f.result()]
            todo = sorted(records, key=_cost_guess, reverse=True)
            rows = list(ex.map(compile_record, todo))
    return sorted(rows, key=lambda r: (ccs.index(r["cc"]), r["kernel"], r["label"]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="90,75", help="compute capabilities to compile for, e.g. 90,75")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiling processes")
    ap.add_argument("--extended", action="store_true", help="also the launchers' options the engine does not use")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # this checkout's kernels/, not a copy installed elsewhere
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("tests/kernel_compile.py: unset TRITON_INTERPRET (the interpreter's functions cannot be compiled)")
    from benchmarks.kernels.aot import EXIT_NO_TOOLCHAIN, toolchain_missing

    missing = toolchain_missing()
    if missing:
        print(f"tests/kernel_compile.py: cannot compile for NVIDIA GPUs here: {missing}", file=sys.stderr)
        sys.exit(EXIT_NO_TOOLCHAIN)
    json.dump(run([int(c) for c in args.cc.split(",")], args.extended, args.jobs), sys.stdout)


if __name__ == "__main__":
    main()
