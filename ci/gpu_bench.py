"""The GPU runner's driver: the book's benchmark suites, run within a time budget, resumably.

    python3 ci/gpu_bench.py run --out OUT [--only fig1,precision] [--budget-s 540] [--notebooks 01,03]
    python3 ci/gpu_bench.py collect --out OUT [--only ...]   # copy results into OUT, print the summary

``run`` measures every case of the named suites whose key is not yet in
``data/results/<device_slug>/<suite>.jsonl`` (results committed from earlier runs are
skipped), stops starting new cases when the budget is nearly spent, and copies each
suite's file into OUT after every row, so a run killed by the machine's limit still
returns what it measured. ``collect`` keeps OUT at no more than 8 files and prints a
short table last. ``ci/gpu-run`` calls both.
"""

from __future__ import annotations

import argparse
import glob
import math
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ftlib.bench import Case, bench_cases, make_cases  # noqa: E402
from ftlib.config import preset  # noqa: E402
from ftlib.env import device_slug, pick_device  # noqa: E402
from ftlib.results import ResultStore, results_dir  # noqa: E402

MAX_OUT_FILES = 8  # what the device tool brings back
TOKENS_PER_STEP = 8192  # the original T sweep's fixed tokens per step
TSWEEP_T = (128, 256, 512, 1024, 2048, 4096)  # the original's 128..1024, then the post's "long context"
RESERVE_S = 25.0  # left for collecting files and the summary


def _fig1() -> list[Case]:
    """Figure 1: both presets at B=32, T=256, fp32, in the four execution modes.

    The FastTransformer twice: K/V expanded to (B, H, T, d) (ftlib's default, gets the
    memory-efficient kernel in fp32) and broadcast as (B, 1, T, d) as the original passes it.
    Modes ordered so the cheap and the headline numbers come first.
    """
    configs = {
        "gpt2": preset("gpt2"),
        "fasttransformer": preset("fasttransformer", kv_layout="expand"),
        "fasttransformer-broadcast": preset("fasttransformer", kv_layout="broadcast"),
    }
    cases: list[Case] = []
    for mode in ("eager", "compile-ro", "cudagraph", "compile"):
        cases += make_cases(configs, [(32, 256)], [mode], ["fp32"])
    return cases


def _precision() -> list[Case]:
    """Both presets in TF32 and bf16 autocast, compiled (reduce-overhead) first, then eager."""
    configs = {"gpt2": "gpt2", "fasttransformer": "fasttransformer"}
    return make_cases(configs, [(32, 256)], ["compile-ro"], ["tf32", "bf16"]) + make_cases(
        configs, [(32, 256)], ["eager"], ["tf32", "bf16"]
    )


def _tsweep() -> list[Case]:
    """T from 128 to 4096 at 8,192 tokens per step (B = 8192 // T); block_size = T so T fits.

    In the order the book needs them, since a bounded session may stop part-way: fp32
    compile-ro first (the post's Figure 5 and its T=128 claim), then tf32 compile-ro, then
    eager fp32 and tf32; T ascending within each, both models at each T.
    """
    cases: list[Case] = []
    for mode, prec in (("compile-ro", "fp32"), ("compile-ro", "tf32"), ("eager", "fp32"), ("eager", "tf32")):
        for T in TSWEEP_T:
            configs = {name: preset(name, block_size=T) for name in ("gpt2", "fasttransformer")}
            cases += make_cases(configs, [(TOKENS_PER_STEP // T, T)], [mode], [prec])
    return cases


def _fig5() -> list[Case]:
    """The post's Figure 5 alone: tsweep's fp32 compile-ro cases (stored in tsweep.jsonl, same keys)."""
    return [c for c in _tsweep() if c.mode == "compile-ro" and c.precision == "fp32"]


def _compile_time() -> list[Case]:
    """First step from a cold process and empty compile caches (fp32), the post's claim first.

    compile-ro (the claim: 4.31 -> 1.22 s), then compile default, then the manual CUDA graph
    (no compiler: what a first step costs without one). Each case is a fresh process: about
    its first step plus ~8 s of process start, imports and the eager reference.
    """
    models = {"gpt2": "gpt2", "fasttransformer": "fasttransformer"}
    return [c for mode in ("compile-ro", "compile", "cudagraph") for c in make_cases(models, [(32, 256)], [mode],
                                                                                    ["fp32"])]


def _compile_max() -> list[Case]:
    """max-autotune (no CUDA graphs): may not finish; isolated with a time limit. Not run by default."""
    return make_cases({"gpt2": "gpt2", "fasttransformer": "fasttransformer"}, [(32, 256)],
                      ["compile-max"], ["fp32"])


def _grid() -> list[Case]:
    """Chapter 4: the 2^4 grid of the four switches, then the K/V-head and MLP-ratio sweeps.

    Eager and manual CUDA graph only (no compile: 16+ compiles would not fit a session);
    fp32 first, then tf32.
    """
    from ftlib.ablations import grid, kv_head_sweep, mlp_ratio_sweep

    cases: list[Case] = []
    for prec in ("fp32", "tf32"):
        cases += make_cases(grid(), [(32, 256)], ["eager", "cudagraph"], [prec])
        cases += make_cases({**kv_head_sweep(), **mlp_ratio_sweep()}, [(32, 256)], ["eager", "cudagraph"], [prec])
    return cases


def _ladder() -> list[Case]:
    """Chapter 4: the cumulative ladder GPT-2 -> FastTransformer under torch.compile(reduce-overhead)."""
    from ftlib.ablations import ladder

    return make_cases(ladder(), [(32, 256)], ["compile-ro"], ["fp32"])


def _grid_compile() -> list[Case]:
    """Chapter 4: the 16 grid cells compiled (reduce-overhead, fp32), beside the eager/cudagraph grid.

    Five cells are also ladder rungs (ladder.jsonl); chapter 4 reads each cell from either
    suite (ftlib.codesignview). With shared caches, cells reuse the kernels others built.
    """
    from ftlib.ablations import grid

    return make_cases(grid(), [(32, 256)], ["compile-ro"], ["fp32"])


# Bump when the engine changes: its rows get new keys, older rounds stay stored. Round 3:
# strict fp32 keeps SDPA's attention (the 'ieee' kernel lost in round 2); packed-qkv attention
# and the fused residual-norm measured as variants. Round 4: both became the defaults (they
# won in round 3), the residual add is fused into LayerNorm too (GPT-2), and RMSNorm runs on
# 4-row tiles (kernels.jsonl v5). Round 5: the levers measured as round-4 variants became the
# defaults (bias gradients on the Triton column sum; under bf16 the fused norms write bf16 and
# the Linear layers read one bf16 shadow of the weights); the fused residual-norm runs on
# 4-row tiles and the column sum on 128-column tiles for N >= 512 (kernels.jsonl v5 of each).
ENGINE_ROUND = 6


def _engine() -> list[Case]:
    """Issue 6: the engine (ftlib.engine) beside compile-ro and the manual CUDA graph, same run.

    Both presets at B=32, T=256. Every case carries ``extra['round']`` (ENGINE_ROUND), so a
    changed engine is measured again, with its baselines, in one run. First the headline
    comparison per precision (engine, then the two baselines), fp32, tf32, bf16; then GPT-2
    with the attention kernel replacing its explicit softmax (the same function), and GPT-2 as
    written with its scale, mask and softmax unfused (the default fuses them, round 6); then the
    fp32-accurate tensor-core options (3xTF32 attention and/or Linear layers, labelled as
    such); then what each piece buys (under bf16 each bf16 lever and the bias kernel off; in
    tf32 and fp32 the engine with one kernel switched off, with none, uncaptured, with the
    heads layout, with the residual add unfused, with PyTorch's bias gradients). Variants carry their
    engine options in ``extra`` and a label saying what changed.
    """
    configs = {"gpt2": preset("gpt2"), "fasttransformer": preset("fasttransformer")}
    rnd = {"round": ENGINE_ROUND}
    cases: list[Case] = []
    for prec in ("fp32", "tf32", "bf16"):
        for mode in ("engine", "compile-ro", "cudagraph"):
            cases += [Case(name, cfg, 32, 256, mode, prec, dict(rnd)) for name, cfg in configs.items()]
    flash = {"attention_for_explicit": True}
    x3 = {"attention_precision": "tf32x3"}
    lin = {"linear_precision": "tf32x3"}
    cases += [Case("gpt2 engine +flash-attn", configs["gpt2"], 32, 256, "engine", prec, {**rnd, **flash})
              for prec in ("tf32", "bf16")]
    # GPT-2 as written with its scale + mask + softmax back on three PyTorch ops (the default
    # fuses them from round 6; a round-5 variant "+fused-softmax" measured the fusion first).
    cases += [Case("gpt2 engine -fused-softmax", configs["gpt2"], 32, 256, "engine", prec,
                   {**rnd, "fused_softmax": False}) for prec in ("tf32", "bf16", "fp32")]
    cases += [
        Case("fasttransformer engine, 3xTF32 attention", configs["fasttransformer"], 32, 256, "engine", "fp32",
             {**rnd, **x3}),
        Case("fasttransformer engine, 3xTF32 attention+linear", configs["fasttransformer"], 32, 256, "engine",
             "fp32", {**rnd, **x3, **lin}),
        Case("gpt2 engine +flash-attn 3xTF32", configs["gpt2"], 32, 256, "engine", "fp32", {**rnd, **x3, **flash}),
        Case("gpt2 engine +flash-attn 3xTF32 +linear", configs["gpt2"], 32, 256, "engine", "fp32",
             {**rnd, **x3, **lin, **flash}),
    ]
    # What the round-5 defaults buy under bf16, each switched off on its own.
    bf16_off = [("fasttransformer", " -bf16 norm out", {"bf16_norm_out": False}),
                ("fasttransformer", " -bf16 weights", {"bf16_weights": False}),
                ("gpt2", " +flash-attn -bf16 norm out", {**flash, "bf16_norm_out": False}),
                ("gpt2", " +flash-attn -bias-kernel", {**flash, "bias_kernel": False})]
    cases += [Case(f"{name} engine{suffix}", configs[name], 32, 256, "engine", "bf16", {**rnd, **extra})
              for name, suffix, extra in bf16_off]
    cases.append(Case("gpt2 engine +flash-attn -bias-kernel", configs["gpt2"], 32, 256, "engine", "tf32",
                      {**rnd, **flash, "bias_kernel": False}))
    for prec in ("tf32", "fp32"):
        for name, cfg in configs.items():
            ops = [cfg.norm] + (["attention"] if cfg.attn_impl == "sdpa" else []) + [
                "embedding", "cross_entropy", "adamw"]
            variants = [(f" -{op}", {"use_kernels": {op: False}}) for op in ops]
            variants += [(" no-kernels", {"use_kernels": False}), (" uncaptured", {"capture": False}),
                         (" unfused residual-norm", {"fuse_residual_norm": False})]
            if cfg.bias:  # GPT-2: its bias gradients back on PyTorch's dy.sum(0)
                variants.append((" -bias-kernel", {"bias_kernel": False}))
            if prec == "tf32":  # (in strict fp32 the layout does not apply: SDPA, or GPT-2's softmax)
                variants.append((" +flash-attn heads layout", {**flash, "attention_layout": "heads"})
                                if cfg.attn_impl == "explicit" else (" heads layout", {"attention_layout": "heads"}))
            cases += [Case(f"{name} engine{suffix}", cfg, 32, 256, "engine", prec, {**rnd, **extra})
                      for suffix, extra in variants]
    return cases


# Suites whose compile time is not what they measure compile against shared caches
# (ftlib.bench: cold_compile=False): kernels an earlier case built are not built again.
SHARED_CACHE = {"cold_compile": False}
# name -> (cases, options for bench_cases); in the order they run by default. The option
# "store" names the results file when it is not the suite's own (a suite that is part of another).
SUITES: dict[str, tuple[Callable[[], list[Case]], dict]] = {
    "fig1": (_fig1, {}),
    "precision": (_precision, {}),
    "tsweep": (_tsweep, SHARED_CACHE),
    "fig5": (_fig5, {"store": "tsweep", **SHARED_CACHE}),
    "compile_time": (_compile_time, {"isolate_modes": ("compile", "compile-ro", "cudagraph"),
                                     "warmup": 3, "iters": 10}),
    "compile_max": (_compile_max, {"isolate_modes": ("compile-max",), "timeout_s": 420.0}),
    "grid": (_grid, {}),
    "ladder": (_ladder, SHARED_CACHE),
    "grid_compile": (_grid_compile, SHARED_CACHE),
    "engine": (_engine, {}),
}


def _profile(device, deadline: float) -> None:
    """Chapter 1: measured profiles, both presets, B=32 T=256; cheap modes first.

    First the FastTransformer as the original passes K/V, (B, 1, T, d) (kv_layout='broadcast'),
    eager fp32 and tf32: chapters 4 and 7 read from its trace which SDPA backend that layout gets.
    """
    from ftlib.profiling import profile_suite

    for r in profile_suite(["fasttransformer"], ["eager"], ["fp32", "tf32"], 32, 256, device, kv_layout="broadcast"):
        print(f"  profile fasttransformer kv=broadcast {r.get('mode'):<10} {r.get('precision'):<5} {r.get('status')} "
              f"step {r.get('step_ms')} ms sdpa {r.get('sdpa_backend')} {str(r.get('error', ''))[:120]}", flush=True)
    for modes, precs in ((["eager", "cudagraph"], ["fp32", "tf32"]), (["compile-ro"], ["fp32"]),
                         (["eager", "cudagraph"], ["bf16"])):
        for name in ("gpt2", "fasttransformer"):
            if time.monotonic() > deadline - 60:
                print("[profile] budget spent", flush=True)
                return
            for r in profile_suite([name], modes, precs, 32, 256, device):
                print(f"  profile {name:<16} {r.get('mode'):<10} {r.get('precision'):<5} {r.get('status')} "
                      f"step {r.get('step_ms')} ms sdpa {r.get('sdpa_backend')} {str(r.get('error', ''))[:120]}",
                      flush=True)


def _train(device, deadline: float) -> None:
    """Chapter 8: convergence suites (ftlib.convergence), resumable."""
    from ftlib.convergence import SUITE_ORDER, describe_row, run_suites

    for r in run_suites(SUITE_ORDER, device, budget_s=max(1.0, deadline - time.monotonic())):
        print(f"  train {describe_row(r)}", flush=True)  # failed runs too (stored with status 'error')


def _engine_check(device, deadline: float) -> None:
    """Issue 6: engine vs reference training over 100 steps (ftlib.engine.check_against_reference).

    Both presets at B=32, T=256, fp32 first (the issue's check), then tf32 and bf16, then GPT-2
    with the attention kernel in place of its explicit softmax; one row per run in
    engine_check.jsonl, keyed by the engine round, skipped when its key is already stored.
    """
    import traceback

    from ftlib.engine import check_against_reference
    from ftlib.env import provenance
    from ftlib.results import row_key

    steps, B, T = 100, 32, 256
    store = ResultStore("engine_check", device_slug(device))
    runs = [(prec, name, {}) for prec in ("fp32", "tf32", "bf16") for name in ("gpt2", "fasttransformer")]
    runs += [(prec, "gpt2", {"attention_for_explicit": True}) for prec in ("tf32", "bf16")]
    for prec, name, options in runs:
        cfg = preset(name)
        extra = {"steps": steps, "round": ENGINE_ROUND, **options}  # a new engine round checks again
        key = row_key("engine_check", cfg.config_hash(), B, T, "engine", prec, extra)
        if store.has(key, skip_status=("error",)):
            continue
        if time.monotonic() > deadline - 30:
            print("[engine_check] budget spent", flush=True)
            return
        label = name + (" +flash-attn" if options.get("attention_for_explicit") else "") + (
            " +bias-kernel" if options.get("bias_kernel") else "")
        row = {"key": key, "bench": "engine_check", "label": label, "preset": name, "config": cfg.to_dict(),
               "config_hash": cfg.config_hash(), "B": B, "T": T, "mode": "engine", "precision": prec,
               "extra": extra, **provenance(device)}
        t0 = time.perf_counter()
        try:
            r = check_against_reference(cfg, steps, device, prec, B, T, **options)
            row.update(status="ok", check_ok=r["ok"], **r)
        except Exception as e:  # a failure is a row, so the other checks still run
            row.update(status="error", check_ok=False, error=f"{type(e).__name__}: {e}"[:2000],
                       traceback=traceback.format_exc()[-3000:])
        row["wall_s"] = time.perf_counter() - t0
        store.append(row)
        print(f"  engine_check {label:<28} {prec:<5} {row['status']:<6} ok {row.get('check_ok')} "
              f"max rel err {row.get('max_rel_err')} param rel err {row.get('param_rel_err')} "
              f"loss {row.get('losses_ref', [None])[0]} -> {row.get('losses_ref', [None])[-1]} "
              f"kernels {row.get('kernels')} {row.get('error', '')[:160]}", flush=True)


def _kernels(device, deadline: float) -> None:
    """Issue 6: the measured ceilings (1 GiB copy, 8192^2 matmuls) and every kernels/dev driver, each
    variant timed eagerly and inside a CUDA graph; rows in kernels.jsonl, resumable (kernels.dev.suite).
    """
    from kernels.dev.suite import run_suite

    # A torch.compile variant compiles for ~30 s before its timing starts: stop starting them earlier.
    rows = run_suite(device, ResultStore("kernels", device_slug(device)), deadline=deadline - 45)
    print(f"[kernels] measured {len(rows)} rows now", flush=True)


# Suites that are not lists of step-benchmark cases: name -> runner(device, deadline).
CUSTOM: dict[str, Callable] = {"profile": _profile, "train": _train, "engine_check": _engine_check,
                               "kernels": _kernels}
FILES = {"profile": ["profile"], "train": ["convergence-original", "convergence", "speedrun", "convergence-nanogpt"],
         "engine_check": ["engine_check"], "kernels": ["kernels"]}
DEFAULT_SUITES = ("fig1", "precision", "tsweep", "compile_time")


def _suites(only: str | None) -> list[str]:
    if only is None:
        return list(DEFAULT_SUITES)
    names = [s.strip() for s in only.split(",") if s.strip() and s.strip() != "none"]
    unknown = [n for n in names if n not in SUITES and n not in CUSTOM]
    if unknown:
        sys.exit(f"unknown suite(s) {unknown}; known: {list(SUITES)}")
    return names


def _log_row(row: dict) -> None:
    ms = row.get("median_ms")
    timing = f"{ms:8.3f} ms [{row['p20_ms']:.3f}, {row['p80_ms']:.3f}]" if ms is not None else " " * 8 + " -"
    first = row.get("first_step_s")
    print(f"  {row['bench']:<12} {row['label']:<26} B={row['B']:<4} T={row['T']:<5} {row['mode']:<10} "
          f"{row['precision']:<5} {row['status']:<11} {timing}"
          f"  first {first if first is None else round(first, 1)} s  check {row.get('check_ok')}"
          + (f"  {row['error'][:160]}" if row.get("error") else ""), flush=True)


def run(args: argparse.Namespace) -> None:
    start = time.monotonic()
    deadline = start + args.budget_s - RESERVE_S
    device = pick_device(args.device)
    slug = device_slug(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"device {device} ({slug}); budget {args.budget_s:.0f} s; results in {results_dir() / slug}/", flush=True)
    for name in _suites(args.only):
        if name in CUSTOM:
            if time.monotonic() > deadline:
                print(f"[{name}] skipped: budget spent", flush=True)
                continue
            try:
                CUSTOM[name](device, deadline)
            except Exception as e:  # a broken suite must not lose the others' results
                print(f"[{name}] failed: {type(e).__name__}: {e}", flush=True)
            for stem in FILES[name]:
                p = ResultStore(stem, slug).path
                if p.exists():
                    shutil.copyfile(p, out / p.name)
            continue
        make, opts = SUITES[name]
        opts = dict(opts)
        store = ResultStore(opts.pop("store", name), slug)

        def on_row(row: dict, store: ResultStore = store) -> None:
            _log_row(row)
            shutil.copyfile(store.path, out / store.path.name)  # so a killed run still returns it

        if time.monotonic() > deadline:
            print(f"[{name}] skipped: budget spent", flush=True)
            continue
        cases = make()
        kw = {"warmup": args.warmup, "iters": args.iters, **opts}
        rows = bench_cases(cases, store, progress=sys.stderr.isatty(), device=device,
                           deadline=deadline, on_row=on_row, **kw)
        missing = sum(1 for c in cases if not store.has(c.key(store.bench), skip_status=("error",)))
        print(f"[{name}] measured {len(rows)} now; {len(cases) - missing}/{len(cases)} done", flush=True)
    if args.notebooks:
        run_notebooks(args.notebooks.split(","), out, deadline + RESERVE_S - 5)


def run_notebooks(chapters: list[str], out: Path, deadline: float) -> None:
    """Execute book chapters in measuring mode with papermill, each within the time left."""
    try:
        import papermill  # noqa: F401
    except ImportError:
        print("notebooks: papermill is not importable here; skipped", flush=True)
        return
    for ch in (c.strip() for c in chapters if c.strip()):
        found = sorted(glob.glob(str(ROOT / "book" / f"{ch}*.ipynb")))
        if not found:
            print(f"notebooks: no book/{ch}*.ipynb; skipped", flush=True)
            continue
        nb = Path(found[0])
        left = deadline - time.monotonic()
        if left < 30:
            print(f"notebooks: {nb.name} skipped, {left:.0f} s left", flush=True)
            continue
        cmd = [sys.executable, "-m", "papermill", "--no-progress-bar", "-k", "python3", "--cwd",
               str(nb.parent), str(nb), str(out / nb.name), "-p", "MEASURE", "True", "-p", "SMOKE", "False"]
        print(f"notebooks: {nb.name} ({left:.0f} s left)", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, cwd=str(ROOT), timeout=left).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"notebooks: {nb.name} -> rc {rc} in {time.monotonic() - t0:.0f} s", flush=True)


def collect(args: argparse.Namespace) -> None:
    """Copy this device's result files into OUT (few files), then print the summary table."""
    slug = device_slug(pick_device(args.device))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = ResultStore("x", slug).path.parent
    jsonl = sorted(src.glob("*.jsonl")) if src.exists() else []
    for p in jsonl:
        shutil.copyfile(p, out / p.name)
    _limit_files(out)
    names = _suites(args.only)
    print(f"\n== summary: {src}/ ({', '.join(p.name for p in jsonl) or 'no files'})")
    print(f"{'suite':<12} {'label':<26} {'B':>4} {'T':>5} {'mode':<10} {'prec':<5} {'status':<11} "
          f"{'median ms':>9} {'p20-p80':>15} {'tok/s':>9} {'first s':>7} check")
    counts: dict[str, int] = {}
    stems = dict.fromkeys(SUITES[n][1].get("store", n) for n in names if n not in CUSTOM)  # fig5 is tsweep
    for name in stems:
        for r in ResultStore(name, slug).latest().values():
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            ms = r.get("median_ms")
            spread = f"{r['p20_ms']:.2f}-{r['p80_ms']:.2f}" if ms is not None else ""
            tps = f"{r['tokens_per_s']:.3g}" if r.get("tokens_per_s") else ""
            first = r.get("first_step_s")
            print(f"{name:<12} {r['label'][:26]:<26} {r['B']:>4} {r['T']:>5} {r['mode']:<10} "
                  f"{r['precision']:<5} {r['status']:<11} {ms if ms is None else round(ms, 3)!s:>9} "
                  f"{spread:>15} {tps:>9} {'' if first is None else round(first, 1)!s:>7} {r.get('check_ok')}")
    print("rows by status: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    print("files in OUT: " + ", ".join(sorted(p.name for p in out.iterdir())))


def _limit_files(out: Path) -> None:
    """The device tool returns at most 8 files: pack the jsonl (then notebooks) into tars if needed."""
    for pattern, tar_name in (("*.jsonl", "results.tar"), ("*.ipynb", "notebooks.tar")):
        files = [p for p in out.iterdir() if p.is_file()]
        if len(files) <= MAX_OUT_FILES:
            return
        group = sorted(out.glob(pattern))
        if not group:
            continue
        with tarfile.open(out / tar_name, "w") as tar:
            for p in group:
                tar.add(p, arcname=p.name)
        for p in group:
            p.unlink()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "collect", "list"))
    ap.add_argument("--out", default="build/gpu-out")
    ap.add_argument("--only", default=None, help=f"comma-separated suites (default {','.join(DEFAULT_SUITES)})")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--notebooks", default="", help="chapters to execute with papermill, e.g. 01,03")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args(argv)
    if not math.isfinite(args.budget_s) or args.budget_s <= 0:
        ap.error("--budget-s must be a positive number of seconds")
    if args.command == "run":
        run(args)
    elif args.command == "collect":
        collect(args)
    else:
        for name in SUITES:
            cases = SUITES[name][0]()
            store = SUITES[name][1].get("store")
            print(f"{name:<13} {len(cases):>3} cases" + ("" if name in DEFAULT_SUITES else "  (not default)")
                  + (f"  (part of {store}, rows in {store}.jsonl)" if store else ""))


if __name__ == "__main__":
    main()
