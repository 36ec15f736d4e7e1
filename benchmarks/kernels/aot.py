"""Ahead-of-time compilation of every Triton kernel here for GPUs that are not here.

``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", cc, 32))`` runs
Triton's whole NVIDIA pipeline (TTIR -> TTGIR -> LLVM IR -> PTX -> cubin, the last step with
the ``ptxas`` Triton's wheel ships) on the CPU, for any compute capability: the same route as
Triton's own AOT tool (``triton/tools/compile.py``). The compiled kernel's metadata gives the
shared memory it needs per block (what the driver checks against the device's opt-in limit
when it loads the kernel) and its PTX shows whether ``tl.dot`` became tensor-core instructions
(``mma.sync`` on sm_80+, ``wgmma.mma_async`` on sm_90) or FMA.

``specs(info)`` lists each kernel at the tiles its launcher picks for that device description
(:class:`ftlib.core.device.DeviceInfo`), at the book's shapes; ``compile_spec(spec, cc)`` compiles
one and reports. CLI (what ``tests/test_aot.py`` runs, in a process without TRITON_INTERPRET):

    python -m benchmarks.kernels.aot --cc 75,80,90 [--json]

Needs a process where ``TRITON_INTERPRET`` is unset: under the interpreter ``@triton.jit``
returns interpreter objects that cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from ftlib.core.device import DeviceInfo
from kernels._common import dot_precision, interpret_mode

EXIT_NO_TOOLCHAIN = 3  # the CLI's exit status when Triton's NVIDIA backend or its ptxas is missing
_F32 = "fp32"
_DT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class AotSpec:
    """One kernel compilation: ``fn`` (a ``triton.jit`` function) with argument types
    ``types`` (pointer args '*fp32' etc., scalars 'i32' / 'fp32'; args not named are 'i32'),
    ``constexprs`` and launch options; ``dot``: the tl.dot input precision ('tf32', 'tf32x3',
    'ieee', 'fp16', 'bf16') or None for a kernel without dots."""

    label: str
    fn: Any
    types: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 3  # Triton's default (CUDAOptions) where a launcher passes none
    dot: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@triton.jit
def _dot_probe(A, B, C, PREC: tl.constexpr, N: tl.constexpr):
    """C = A @ B for one N x N tile: the smallest kernel that shows what ``tl.dot`` of these
    operands (A's and B's dtype, ``input_precision=PREC`` for fp32) compiles to."""
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * N + r[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])
    tl.store(C + r[:, None] * N + r[None, :], tl.dot(a, b, input_precision=PREC))


def _probe_specs() -> list[AotSpec]:
    """One tl.dot per operand kind: fp32 with 'ieee', 'tf32', 'tf32x3', and fp16, bf16."""
    out = []
    for dot, dt, prec in (("ieee", "fp32", "ieee"), ("tf32", "fp32", "tf32"), ("tf32x3", "fp32", "tf32x3"),
                          ("fp16", "fp16", "ieee"), ("bf16", "bf16", "ieee")):
        out.append(AotSpec(f"dot_probe {dot}", _dot_probe, {"A": "*" + dt, "B": "*" + dt, "C": "*fp32"},
                           dict(PREC=prec, N=32), 4, dot=dot))
    return out


def _signature(fn: Any, types: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    unknown = set(types) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no argument(s) {sorted(unknown)}")
    return {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}


def compile_spec(spec: AotSpec, cc: int) -> dict[str, Any]:
    """Compile ``spec`` for sm_``cc``; returns shared memory (bytes), registers where known,
    the tensor-core instructions in the PTX, the FMA count and the compile time."""
    from triton.backends.compiler import GPUTarget

    if interpret_mode():
        raise RuntimeError("benchmarks.kernels.aot needs TRITON_INTERPRET unset "
                           "(the interpreter's functions cannot compile)")
    # A constexpr parameter the spec leaves out takes its default, as at a launch (PDL=False: kernels/pdl.py); left
    # out of the constexprs it would compile as a runtime argument, both branches of its ifs included.
    constexprs = {p.name: p.default for p in spec.fn.params if p.is_constexpr and p.has_default} | spec.constexprs
    src = triton.compiler.ASTSource(fn=spec.fn, signature=_signature(spec.fn, spec.types, constexprs),
                                    constexprs=constexprs)
    t0 = time.perf_counter()
    ck = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                        options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    ptx = ck.asm["ptx"]
    mma = sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx)))
    return {
        "label": spec.label, "kernel": spec.fn.__name__, "cc": cc, "shared": int(ck.metadata.shared),
        "num_warps": spec.num_warps, "num_stages": spec.num_stages, "dot": spec.dot,
        "mma": mma, "fma": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
        "seconds": round(time.perf_counter() - t0, 2), **spec.meta,
    }


# -- the kernels, at the tiles their launchers choose --------------------------------------

def attention_specs(info: DeviceInfo, head_size: int, dtype: torch.dtype, input_precision: str, T: int
                    ) -> list[AotSpec]:
    """The three attention kernels at the tiles ``kernels.tiles.choose_tiles`` picks under ``info``'s limits."""
    from kernels import attention as A
    from kernels.tiles import choose_tiles

    dt = _DT[dtype]
    prec = dot_precision(dtype, input_precision)
    out = []
    for name, fn in (("fwd", A._attn_fwd_kernel), ("bwd_dq", A._attn_bwd_dq_kernel),
                     ("bwd_dkdv", A._attn_bwd_dkdv_kernel)):
        tiles = choose_tiles(name, head_size, dtype, T, info.limits())
        out.append(attention_spec(name, fn, head_size, dt, prec, tiles))
    return out


def attention_spec(name: str, fn: Any, head_size: int, dt: str, prec: str, tiles: Any) -> AotSpec:
    """One attention kernel at explicit tiles (``kernels.tiles.Tiles``)."""
    ptr = "*" + dt
    types = {n: ptr for n in ("Q", "K", "V", "Out", "DO", "DQ", "DK", "DV") if n in fn.arg_names}
    types.update({"LSE": "*fp32", "DELTA": "*fp32", "qk_scale": _F32})
    if "sm_scale" in fn.arg_names:
        types["sm_scale"] = _F32
    types = {k: v for k, v in types.items() if k in fn.arg_names}
    consts = dict(HS=head_size, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, PREC=prec, UPCAST=False,
                  CD=tl.float32)
    if "DELTA_HERE" in fn.arg_names:  # the dK/dV kernel as the launcher runs it by default: D read, not formed
        consts["DELTA_HERE"] = False
    if "PACK" in fn.arg_names:  # the forward and dQ kernels as the launcher runs them by default: one head a tile
        consts["PACK"] = 1
    dot = prec if dt == "fp32" else dt
    label = f"attention.{name} hs={head_size} {dt}/{dot} {tiles.block_m}x{tiles.block_n} s{tiles.num_stages}"
    return AotSpec(label, fn, types, consts, tiles.num_warps, tiles.num_stages, dot,
                   meta={"head_size": head_size, "dtype": dt, "block_m": tiles.block_m, "block_n": tiles.block_n})


def _adamw_specs() -> list[AotSpec]:
    from kernels.adamw import _adamw_kernel

    types = {n: "*fp32" for n in ("P", "G", "M", "V", "STEP", "LR", "GRAD_MUL", "FOUND_INF")}
    types.update({n: _F32 for n in ("beta1_hi", "beta1_lo", "beta2_hi", "beta2_lo", "wd_hi", "wd_lo",
                                    "one_minus_beta1", "beta2_f32", "one_minus_beta2", "eps")})
    return [AotSpec(f"adamw scaled={s}", _adamw_kernel, types, dict(BLOCK=1024, LERP_FROM_END=False, SCALED=s), 4)
            for s in (False, True)]


def _row_kernel_specs(n_embd: int, T: int, dtype: torch.dtype) -> list[AotSpec]:
    """Norms, residual norms, causal softmax, cross-entropy and the bias column sum at the
    book's widths: their tiles follow the row length, not the device."""
    from kernels import bias_linear, causal_softmax, cross_entropy, layernorm, residual_norm, rmsnorm
    from kernels._common import row_tile_warps

    dt, cd = "*" + _DT[dtype], tl.float32
    bn = triton.next_power_of_2(n_embd)
    rows = rmsnorm.ROWS
    specs = [
        AotSpec("rmsnorm.fwd", rmsnorm._rms_norm_fwd_kernel, {"X": dt, "W": dt, "Y": dt, "RSTD": "*fp32", "eps": _F32},
                dict(ROWS=rows, BLOCK_N=bn, CD=cd), row_tile_warps(rows, bn)),
        AotSpec("rmsnorm.bwd", rmsnorm._rms_norm_bwd_kernel,
                {"DY": dt, "X": dt, "W": dt, "RSTD": "*fp32", "DX": dt, "DW_PARTIAL": "*fp32"},
                dict(ROWS=rows, BLOCK_N=bn, CD=cd), row_tile_warps(rows, bn)),
        AotSpec("rmsnorm.bwd_persistent", rmsnorm._rms_norm_bwd_persistent_kernel,
                {"DY": dt, "X": dt, "W": dt, "RSTD": "*fp32", "DX": dt, "DW_PARTIAL": "*fp32"},
                dict(ROWS=rows, BLOCK_N=bn, CD=cd), row_tile_warps(rows, bn)),
        AotSpec("layernorm.fwd", layernorm._layer_norm_fwd_kernel,
                {"X": dt, "W": dt, "B": dt, "Y": dt, "MEAN": "*fp32", "RSTD": "*fp32", "eps": _F32},
                dict(BLOCK_N=bn, HAS_BIAS=True, CD=cd), min(max(bn // 256, 1), 8)),
        AotSpec("layernorm.bwd", layernorm._layer_norm_bwd_kernel,
                {"DY": dt, "X": dt, "W": dt, "MEAN": "*fp32", "RSTD": "*fp32", "DX": dt, "DW_PARTIAL": "*fp32",
                 "DB_PARTIAL": "*fp32"}, dict(BLOCK_N=bn, HAS_BIAS=True, CD=cd), min(max(bn // 256, 1), 8)),
    ]
    rrows, rbn = residual_norm.ROWS, residual_norm._block_n(n_embd)
    fwd_types = {"X": "*fp32", "R": dt, "W": "*fp32", "B": "*fp32", "S": "*fp32", "H": dt, "RSTD": "*fp32",
                 "SEED": "*i64", "eps": _F32, "p": _F32, "scale": _F32}
    bwd_types = {"DS": "*fp32", "DH": dt, "S": "*fp32", "W": "*fp32", "RSTD": "*fp32", "G": "*fp32", "GR": dt,
                 "DWP": "*fp32", "DBP": "*fp32", "SEED": "*i64", "p": _F32, "scale": _F32}
    flags = dict(IS_LN=True, HAS_BIAS=True, HAS_DROP=True, RNG4=residual_norm.RNG4, ROWS=rrows, BLOCK_N=rbn, CD=cd)
    specs += [
        AotSpec("residual_norm.fwd", residual_norm._add_norm_fwd_kernel, fwd_types, flags,
                row_tile_warps(rrows, rbn)),
        AotSpec("residual_norm.bwd", residual_norm._add_norm_bwd_kernel, bwd_types,
                {**flags, "HAS_DS": True, "HAS_GR": True}, row_tile_warps(rrows, rbn)),
        AotSpec("residual_norm.bwd_persistent", residual_norm._add_norm_bwd_persistent_kernel,
                {**bwd_types, "DRB": "*fp32"}, {**flags, "HAS_DS": True, "HAS_GR": True, "ATOMIC": True,
                                                "HAS_DRB": False, "LOOP_STAGES": None, "SEM": "acq_rel"},
                row_tile_warps(rrows, rbn)),
    ]
    srows, sbt, swarps = causal_softmax._tiles(T)
    sm_types = {"S": dt, "P": dt, "scale": _F32}
    specs += [
        AotSpec(f"causal_softmax.fwd T={T}", causal_softmax._causal_softmax_fwd, sm_types,
                dict(ROWS=srows, BLOCK_T=sbt, CD=cd), swarps),
        AotSpec(f"causal_softmax.bwd T={T}", causal_softmax._causal_softmax_bwd, {"P": dt, "DP": dt, "DS": dt,
                "scale": _F32}, dict(ROWS=srows, BLOCK_T=sbt, CD=cd), swarps),
    ]
    bv = min(triton.next_power_of_2(65), cross_entropy.MAX_BLOCK_V)
    specs.append(AotSpec("cross_entropy", cross_entropy._cross_entropy_kernel,
                         {"Z": dt, "T": "*i64", "DZ": dt, "LOSS": "*fp32", "N_VALID": "*i64"},
                         dict(BLOCK_V=bv, CD=cd), 4 if bv >= 1024 else 1))
    for wide, (bm, bnn, w) in ((False, bias_linear._GPU_BLOCKS), (True, bias_linear._GPU_WIDE[0])):
        specs.append(AotSpec(f"bias_linear.col_sum{' wide' if wide else ''}", bias_linear._col_sum_kernel,
                             {"DY": dt, "P": "*fp32", "Z": dt, "DZ": dt}, dict(BLOCK_M=bm, BLOCK_N=bnn, CD=cd),
                             w))
    return specs


def _linear_specs() -> list[AotSpec]:
    """The Triton GEMM's autotune configurations (fp32 storage, 3xTF32). Triton's autotuner
    skips a configuration whose kernel does not load (``OutOfResources``), so on a device the
    GEMM runs with those that fit."""
    from kernels import linear

    types = {"A": "*fp32", "B": "*fp32", "C": "*fp32", "BIAS": "*fp32"}
    out = []
    for cfg in linear._GPU_CONFIGS:
        kw = cfg.kwargs
        out.append(AotSpec(f"linear {kw['BM']}x{kw['BN']}x{kw['BK']} s{cfg.num_stages}", linear._matmul_tile_kernel,
                           types, dict(HAS_BIAS=True, PREC="tf32x3", CD=tl.float32, GROUP_M=8, **kw),
                           cfg.num_warps, cfg.num_stages, "tf32x3"))
    return out


# Representative cases, to keep the run short (a compile takes 0.5-3 s, the attention kernels'
# FMA code for sm_75 5-12 s): head sizes 32 (the GPT-2 and FastTransformer presets) and 64
# (nanoGPT's), fp32 storage with the dot precision the engine uses (tf32, or ieee where Triton
# has no tensor cores) and fp16. Below sm_80 only the fp32 head-size-64 case, the one whose
# tiles shrink: the engine keeps SDPA there anyway, the dot probes show what fp16 and bf16 dots
# become, and benchmarks/kernels/attention_smem_sweep.jsonl has the other cases' shared memory.
ATTENTION_CASES = ((32, torch.float32), (64, torch.float32), (64, torch.float16))
PRE_SM80_ATTENTION_CASES = ((64, torch.float32),)


def specs(info: DeviceInfo, T: int = 256) -> list[AotSpec]:
    """Every kernel at the tiles its launcher picks on ``info``, at the book's shapes."""
    out = []
    for hs, dtype in ATTENTION_CASES if (info.sm or 0) >= 80 else PRE_SM80_ATTENTION_CASES:
        prec = "tf32" if info.triton_dot_uses_tensor_cores("tf32") else "ieee"
        out += attention_specs(info, hs, dtype, prec, T)
    out += _adamw_specs()
    out += _row_kernel_specs(256, T, torch.float32)
    out += _linear_specs()
    out += _probe_specs()
    return out


def toolchain_missing() -> str | None:
    """Why this machine cannot compile for NVIDIA GPUs ahead of time (None: it can): Triton's
    NVIDIA backend and the ptxas it ships (or TRITON_PTXAS_PATH) must be there."""
    try:
        from triton import knobs
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError as e:
        return f"Triton's NVIDIA backend is not importable ({e})"
    try:
        knobs.nvidia.ptxas.path  # noqa: B018  (resolves the binary, raising if there is none)
    except Exception as e:  # the knob raises RuntimeError or OSError depending on what is missing
        return f"no ptxas for Triton's NVIDIA backend ({e})"
    return None


def _compile_item(item: tuple[int, int, int]) -> dict[str, Any]:
    """Compile spec ``i`` of capability ``cc``'s list (a top-level function: worker processes
    rebuild the spec, since jit functions do not pickle)."""
    cc, i, T = item
    info = DeviceInfo.for_capability(f"{cc // 10}.{cc % 10}")
    row = compile_spec(specs(info, T)[i], cc)
    row.update(device=info.name, smem_limit=info.shared_memory_per_block,
               fits=row["shared"] <= (info.shared_memory_per_block or 0))
    return row


def run(ccs: list[int], T: int = 256, jobs: int = 1) -> list[dict[str, Any]]:
    """Compile ``specs`` of each capability's known GPU (``DeviceInfo.for_capability``), ``jobs``
    processes at a time; one report row per compilation, with the device's shared-memory limit
    beside the kernel's need, in (capability, spec) order."""
    items = []
    for cc in ccs:
        for i, spec in enumerate(specs(DeviceInfo.for_capability(f"{cc // 10}.{cc % 10}"), T)):
            slow = spec.label.startswith("attention") and cc < 80  # FMA code for big tiles: the longest
            items.append((not slow, cc, i))
    todo = [(cc, i, T) for _, cc, i in sorted(items)]  # longest first, for an even split over workers
    if jobs <= 1:
        rows = [_compile_item(t) for t in todo]
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            rows = list(ex.map(_compile_item, todo))
    order = {(cc, i): k for k, (cc, i, _) in enumerate(sorted(todo))}
    return [r for _, r in sorted(zip(todo, rows), key=lambda p: order[(p[0][0], p[0][1])])]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="75,80,90", help="compute capabilities, e.g. 75,80,90")
    ap.add_argument("--T", type=int, default=256, help="sequence length the tiles are chosen for")
    ap.add_argument("--jobs", type=int, default=1, help="capabilities compiled in parallel processes")
    ap.add_argument("--json", action="store_true", help="one JSON list on stdout instead of a table")
    args = ap.parse_args(argv)
    missing = toolchain_missing()
    if missing:
        print(f"benchmarks.kernels.aot: cannot compile ahead of time here: {missing}", file=sys.stderr)
        sys.exit(EXIT_NO_TOOLCHAIN)
    rows = run([int(c) for c in args.cc.split(",")], args.T, args.jobs)
    if args.json:
        json.dump(rows, sys.stdout)
        return
    for r in rows:
        tc = r["mma"][0] if r["mma"] else "-"
        print(f"sm_{r['cc']} {r['label']:<48} shared {r['shared'] / 1024:6.1f} KB / {r['smem_limit'] // 1024} KB "
              f"{'ok ' if r['fits'] else 'OVER'} mma {tc} ({r['seconds']} s)")


if __name__ == "__main__":
    main()
