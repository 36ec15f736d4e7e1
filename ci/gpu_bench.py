"""The GPU runner's driver: the book's measuring suites (``ftlib.harness.suites``), within a time budget.

    python3 ci/gpu_bench.py run --out OUT [--only baselines,tsweep] [--budget-s 540] [--notebooks 01,03]
    python3 ci/gpu_bench.py warm [--only baselines] [--jobs 8]   # fill the compile caches in parallel
    python3 ci/gpu_bench.py collect --out OUT [--only ...]       # copy results into OUT, print the summary
    python3 ci/gpu_bench.py list                                 # the suites and their sizes
    python3 ci/gpu_bench.py plan --capability 7.5 --json         # what would run on a T4, without a GPU

``run`` measures every case of the named suites in this process, one run (``run_id``): its rows
carry the run in their keys, so a second process measures them again as a repeat, and views pair
rows of one run only. It refuses to run from code that is not committed (``+dirty``, unknown
commit): such rows would feed the book; ``--allow-dirty`` measures anyway into
``build/uncommitted-results/``, which nothing reads. It stops starting new cases when the budget
is nearly spent and copies each suite's file into OUT after every row, so a run killed by the
machine's limit still returns what it measured. ``collect`` keeps OUT at no more than 8 files
and prints a short table last. ``ci/gpu-run`` calls them.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from any directory
    sys.path.insert(0, str(ROOT))

from ftlib.core.device import DeviceInfo, device_slug, pick_device  # noqa: E402
from ftlib.harness.bench import COMPILE_MODES, Case, bench_cases  # noqa: E402
from ftlib.harness.precision_plan import case_why_not, plan_cases  # noqa: E402
from ftlib.harness.provenance import git_commit, is_clean_commit, run_id  # noqa: E402
from ftlib.harness.results import ResultStore, results_dir  # noqa: E402
from ftlib.harness.suites import SUITES, with_run  # noqa: E402

MAX_OUT_FILES = 8  # what the device tool brings back
RESERVE_S = 25.0  # left for collecting files and the summary
MIN_BUDGET_S = 60.0  # less than this measures nothing
UNCOMMITTED_DIR = ROOT / "build" / "uncommitted-results"


def _profile(device, deadline: float) -> None:
    """Chapter 1: measured profiles, both presets, B=32 T=256; cheap modes first.

    First the FastTransformer as the original passes K/V, (B, 1, T, d) (kv_layout='broadcast'),
    eager fp32 and tf32: chapters 4 and 7 read from its trace which SDPA backend that layout gets.
    """
    from ftlib.harness.profiling import profile_suite

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
    """Chapter 8: convergence suites (ftlib.harness.convergence), resumable."""
    from ftlib.harness.convergence import describe_row, run_suites
    from ftlib.harness.studies import SUITE_ORDER

    for r in run_suites(SUITE_ORDER, device, budget_s=max(1.0, deadline - time.monotonic())):
        print(f"  train {describe_row(r)}", flush=True)  # failed runs too (stored with status 'error')


def _engine_check(device, deadline: float) -> None:
    """The engine vs reference training over 100 steps (ftlib.harness.engine_check)."""
    from ftlib.harness.engine_check import run_engine_checks

    run_engine_checks(device, deadline, log=lambda line: print(line, flush=True))


def _kernels(device, deadline: float) -> None:
    """The measured ceilings (1 GiB copy, 8192^2 matmuls) and every kernel driver, each variant timed
    eagerly and inside a CUDA graph; rows in kernels.jsonl, resumable. A program of its own
    (``python -m benchmarks.kernels.suite``): ftlib does not import the benchmarks.
    """
    # A torch.compile variant compiles for ~30 s before its timing starts: stop starting them earlier.
    budget = max(1.0, deadline - 45 - time.monotonic())
    rc = subprocess.run([sys.executable, "-m", "benchmarks.kernels.suite", "--device", str(device),
                         "--budget-s", f"{budget:.0f}"], cwd=str(ROOT), timeout=budget + 120).returncode
    print(f"[kernels] suite exited with {rc}", flush=True)


# Suites that are not lists of step-benchmark cases: name -> runner(device, deadline), and their files.
CUSTOM: dict[str, Callable] = {"profile": _profile, "train": _train, "engine_check": _engine_check,
                               "kernels": _kernels}
FILES = {"profile": ["profile"], "train": ["convergence-original", "convergence", "speedrun", "convergence-nanogpt",
                                            "speedrun-repeat"],
         "engine_check": ["engine_check"], "kernels": ["kernels"]}
# Suites that produce no result the book's headlines read; they may run from uncommitted code.
EXPLORATORY = ("kernels", "compile_max")


def known_suites() -> list[str]:
    return [*SUITES, *CUSTOM]


def parse_suites(only: str | None) -> list[str]:
    """The suites named in ``--only`` (the default ones when None); unknown names are an error."""
    if only is None:
        return [n for n, s in SUITES.items() if s.default]
    names = [s.strip() for s in only.split(",") if s.strip() and s.strip() != "none"]
    unknown = [n for n in names if n not in SUITES and n not in CUSTOM]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)}; known suites: {', '.join(known_suites())}")
    if not names:
        raise ValueError(f"--only names no suite; known suites: {', '.join(known_suites())}")
    return names


def _log_row(row: dict) -> None:
    ms = row.get("median_ms")
    timing = f"{ms:8.3f} ms [{row['p20_ms']:.3f}, {row['p80_ms']:.3f}]" if ms is not None else " " * 8 + " -"
    first = row.get("first_step_s")
    print(f"  {row['bench']:<12} {row['label'][:26]:<26} {row['mode']:<10} {str(row.get('optimizer_kind')):<10} "
          f"{row['precision']:<5} {row['status']:<11} {timing}"
          f"  first {first if first is None else round(first, 1)} s  check {row.get('check_ok')}"
          + (f"  {row['error'][:160]}" if row.get("error") else ""), flush=True)


def check_provenance(names: list[str], allow_dirty: bool) -> str:
    """The commit rows will record; refuses uncommitted code for suites the book reads.

    With ``allow_dirty`` rows go to ``build/uncommitted-results/`` instead (FTLIB_RESULTS_DIR).
    """
    commit = git_commit()
    if is_clean_commit(commit) or all(n in EXPLORATORY for n in names):
        return commit
    if not allow_dirty:
        raise ValueError(
            f"the code is not a clean commit ({commit}): rows from it would feed the book. Commit, then run "
            "from the checkout (or, on a machine without .git, `bash ci/stamp-tree` here and carry "
            ".ftlib-commit and .ftlib-tree); or pass --allow-dirty to measure into build/uncommitted-results/")
    os.environ["FTLIB_RESULTS_DIR"] = str(UNCOMMITTED_DIR)
    print(f"[provenance] {commit}: measuring into {UNCOMMITTED_DIR}/, which no chapter reads", flush=True)
    return commit


def run(args: argparse.Namespace) -> int:
    """Measure the named suites; returns the exit code (non-zero when nothing could be measured)."""
    start = time.monotonic()
    deadline = start + args.budget_s - RESERVE_S
    names = parse_suites(args.only)
    device = pick_device(args.device)
    commit = check_provenance(names, args.allow_dirty)
    slug = device_slug(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"device {device} ({slug}); commit {commit}; run {run_id()}; budget {args.budget_s:.0f} s; "
          f"results in {results_dir() / slug}/", flush=True)
    measured, failed = 0, []
    for name in names:
        if time.monotonic() > deadline:
            print(f"[{name}] skipped: budget spent", flush=True)
            continue
        if name in CUSTOM:
            stems = FILES[name]
            before = sum(len(ResultStore(stem, slug).rows()) for stem in stems if ResultStore(stem, slug).path.exists())
        try:
            if name in CUSTOM:
                CUSTOM[name](device, deadline)
                measured += sum(len(ResultStore(stem, slug).rows()) for stem in stems) - before
            else:
                measured += _run_suite(name, slug, device, deadline, out, args)
        except Exception as e:  # a broken suite (or its unreadable results file) must not stop the others
            failed.append(name)
            print(f"[{name}] failed, skipped: {type(e).__name__}: {e}", flush=True)
        for stem in FILES.get(name, [name]):
            p = ResultStore(stem, slug).path
            if p.exists():
                shutil.copyfile(p, out / p.name)
    if args.notebooks:
        run_notebooks(args.notebooks.split(","), out, deadline + RESERVE_S - 5)
    if failed:
        print(f"suites that failed: {', '.join(failed)}", flush=True)
    if measured == 0:
        print("nothing was measured: see the messages above (budget too small, or every suite failed)", flush=True)
        return 3
    return 1 if failed else 0


def _run_suite(name: str, slug: str, device, deadline: float, out: Path, args: argparse.Namespace) -> int:
    suite = SUITES[name]
    store = ResultStore(name, slug)
    store.rows()  # an unreadable file fails here, before anything is measured
    info = DeviceInfo.detect(device)
    cases, skipped = [], {}
    for c in suite.cases():
        why = case_why_not(info, c)
        if why is None:
            cases.append(c)
        else:
            skipped[why] = skipped.get(why, 0) + 1
    for why, n in skipped.items():  # rows under a label the device cannot honour would mislead
        print(f"[{name}] {n} cases not run: {why}", flush=True)

    def on_row(row: dict) -> None:
        _log_row(row)
        shutil.copyfile(store.path, out / store.path.name)  # so a killed run still returns it

    cases = with_run(cases, run_id())
    kw = {"warmup": args.warmup, "iters": args.iters, **suite.options}
    rows = bench_cases(cases, store, progress=sys.stderr.isatty(), device=device,
                       deadline=deadline, on_row=on_row, **kw)
    print(f"[{name}] run {run_id()}: {len(rows)}/{len(cases)} cases measured", flush=True)
    return len(rows)


def warm(args: argparse.Namespace) -> int:
    """Compile every compiled case of the named suites once, in parallel processes, untimed.

    Fills this machine's Inductor and Triton caches, so the measuring processes that follow
    spend seconds instead of minutes compiling. What they time is unchanged: a cached compile
    gives the same kernels. Compile-time suites (fresh caches of their own) are not affected.
    """
    names = parse_suites(args.only)
    device = pick_device(args.device)
    cases = [c for n in names if n in SUITES and "isolate_modes" not in SUITES[n].options
             for c in SUITES[n].cases() if c.mode in COMPILE_MODES]
    # The model alone compiles to the same graph whichever optimizer runs after it: one each.
    unique: dict[tuple, Case] = {}
    for c in cases:
        unique.setdefault((c.config, c.B, c.T, c.mode, c.precision, c.optimizer == "whole-step"), c)
    cases = list(unique.values())
    t0 = time.monotonic()

    def one(case: Case) -> str:
        spec = dict(config=case.config.to_dict(), B=case.B, T=case.T, mode=case.mode, precision=case.precision,
                    device=str(device), optimizer=case.optimizer, warmup=0, iters=1, check=False,
                    cold_compile=False, bench="warm", label=case.label)
        with tempfile.TemporaryDirectory(prefix="ftlib-warm-") as tmp:
            spec_path, row_path = Path(tmp) / "spec.json", Path(tmp) / "row.json"
            spec_path.write_text(json.dumps(spec))
            env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
            try:
                subprocess.run([sys.executable, "-m", "ftlib.harness.bench", str(spec_path), str(row_path)],
                               cwd=str(ROOT),
                               env=env, capture_output=True, timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                return f"{case.label} {case.mode} {case.optimizer} {case.precision}: timeout"
            row = json.loads(row_path.read_text()) if row_path.exists() else {"status": "crashed"}
        return f"{case.label} {case.mode} {case.optimizer} {case.precision}: {row.get('status')}"

    print(f"[warm] {len(cases)} compiled cases, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for i, msg in enumerate(pool.map(one, cases), 1):
            print(f"  [warm {i}/{len(cases)} {time.monotonic() - t0:5.0f} s] {msg}", flush=True)
    return 0


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


def collect(args: argparse.Namespace) -> int:
    """Copy this device's result files into OUT (few files), then print the summary table."""
    slug = device_slug(pick_device(args.device))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = ResultStore("x", slug).path.parent
    jsonl = sorted(src.glob("*.jsonl")) if src.exists() else []
    for p in jsonl:
        shutil.copyfile(p, out / p.name)
    _limit_files(out)
    names = [n for n in parse_suites(args.only) if n in SUITES]
    print(f"\n== summary of this process's runs: {src}/")
    print(f"{'suite':<12} {'label':<26} {'mode':<10} {'optimizer':<10} {'prec':<5} {'status':<11} "
          f"{'median ms':>9} {'p20-p80':>15} check")
    counts: dict[str, int] = {}
    for name in names:
        for r in ResultStore(name, slug).latest().values():
            if r.get("commit") != git_commit():
                continue  # rows measured before this checkout's commit are not this call's
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            ms = r.get("median_ms")
            spread = f"{r['p20_ms']:.2f}-{r['p80_ms']:.2f}" if ms is not None else ""
            print(f"{name:<12} {r['label'][:26]:<26} {r['mode']:<10} {str(r.get('optimizer_kind'))[:10]:<10} "
                  f"{r['precision']:<5} {r['status']:<11} {ms if ms is None else round(ms, 3)!s:>9} "
                  f"{spread:>15} {r.get('check_ok')}")
    print("rows by status: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    print("files in OUT: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


def _limit_files(out: Path) -> None:
    """The device tool returns at most 8 files: pack the jsonl (then notebooks, logs) into tars if needed."""
    for pattern, tar_name in (("*.jsonl", "results.tar"), ("*.ipynb", "notebooks.tar"), ("*.log", "logs.tar")):
        files = [p for p in out.iterdir() if p.is_file()]
        if len(files) <= MAX_OUT_FILES:
            return
        group = [p for p in sorted(out.glob(pattern)) if p.name != "run.log"]
        if not group:
            continue
        with tarfile.open(out / tar_name, "a" if (out / tar_name).exists() else "w") as tar:
            for p in group:
                tar.add(p, arcname=p.name)
        for p in group:
            p.unlink()


def list_suites(args: argparse.Namespace) -> int:
    for name, suite in SUITES.items():
        print(f"{name:<13} {len(suite.cases()):>3} cases" + ("" if suite.default else "  (not default)")
              + f"  {suite.about}")
    for name in CUSTOM:
        print(f"{name:<13}   -        rows in {', '.join(f + '.jsonl' for f in FILES[name])}")
    return 0


def plan(args: argparse.Namespace) -> int:
    """The cases the named suites would measure on a device (this one, or a capability), and why not the others."""
    info = (DeviceInfo.for_capability(args.capability) if args.capability
            else DeviceInfo.detect(pick_device(args.device)))
    names = [n for n in parse_suites(args.only) if n in SUITES]
    cases = plan_cases(info, {n: SUITES[n].cases() for n in names})
    if args.json:
        print(json.dumps([c for c in cases if c["skipped"] is None or args.all], indent=1))
        return 0
    print(f"{info.label()}: precisions {', '.join(info.precisions())}")
    for n in names:
        mine = [c for c in cases if c["suite"] == n]
        print(f"{n:<13} {sum(c['skipped'] is None for c in mine):>3} of {len(mine)} cases run")
    for why in dict.fromkeys(c["skipped"] for c in cases if c["skipped"]):
        print(f"  not run ({sum(c['skipped'] == why for c in cases)} cases): {why}")
    return 0


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _budget(text: str) -> float:
    v = float(text)
    if not math.isfinite(v) or v < MIN_BUDGET_S:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_BUDGET_S:.0f} seconds (the driver keeps "
                                         f"{RESERVE_S:.0f} s to collect results), got {text}")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "warm", "collect", "list", "plan"))
    ap.add_argument("--out", default="build/gpu-out", help="folder that receives the result files (run, collect)")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated suites (default: {','.join(n for n, s in SUITES.items() if s.default)}); "
                         f"known: {', '.join(known_suites())}")
    ap.add_argument("--budget-s", type=_budget, default=540.0, help="seconds this call may take (at least 60)")
    ap.add_argument("--notebooks", default="", help="chapters to execute with papermill, e.g. 01,03")
    ap.add_argument("--device", default="auto", help="auto, cuda, cuda:N or cpu")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before timing (at least 2 are run)")
    ap.add_argument("--iters", type=_positive_int, default=50, help="timed steps per case")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="measure uncommitted code into build/uncommitted-results/ (nothing reads it)")
    ap.add_argument("--jobs", type=_positive_int, default=12, help="parallel compile processes (warm)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="per-case limit for warm")
    ap.add_argument("--capability", default=None, help="plan: a GPU's compute capability (e.g. 7.5), no GPU needed")
    ap.add_argument("--json", action="store_true", help="plan: print the cases that would run as a JSON list")
    ap.add_argument("--all", action="store_true", help="plan --json: the skipped cases too, with their reason")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.command == "list":
        return list_suites(args)
    try:
        pick_device(args.device)
        parse_suites(args.only)
        if args.command == "run":
            return run(args)
        if args.command == "plan":
            return plan(args)
        return warm(args) if args.command == "warm" else collect(args)
    except ValueError as e:
        print(f"gpu_bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
