"""The GPU runner: the book's measuring suites within a time budget (``ci/gpu_bench.py`` is its CLI).

``run`` measures every case of the named suites in this process, one run (``run_id``): its rows
carry the run in their keys, so a second process measures them again as a repeat, and views pair
rows of one run only. It refuses to run from code that is not committed (``+dirty``, unknown
commit): such rows would feed the book; ``allow_dirty`` measures anyway into
``build/uncommitted-results/``, which nothing reads. It stops starting new cases when the budget
is nearly spent and copies each suite's file into OUT after every row, so a run killed by the
machine's limit still returns what it measured. ``warm`` fills the compile caches in parallel
processes first; ``collect`` keeps OUT at no more than ``MAX_OUT_FILES`` files and prints a short
table; ``list_suites`` and ``plan`` say what would run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ftlib.core.device import DeviceInfo, device_slug, pick_device
from ftlib.core.precision import PRECISIONS
from ftlib.core.repo import repo_root
from ftlib.harness.bench.cases import Case, bench_cases
from ftlib.harness.bench.runners import COMPILE_MODES, WHOLE_STEP
from ftlib.harness.custom_suites import CUSTOM, EXPLORATORY, FILES, parse_suites
from ftlib.harness.precision_plan import case_why_not, plan_cases
from ftlib.harness.provenance import git_commit, is_clean_commit, run_id
from ftlib.harness.results import ResultStore, results_dir
from ftlib.harness.suites import SUITES, with_run

ROOT = repo_root()
MAX_OUT_FILES = 8  # at most this many files come back from a GPU machine's OUT folder
RESERVE_S = 25.0  # left for collecting files and the summary
MIN_BUDGET_S = 60.0  # less than this measures nothing
UNCOMMITTED_DIR = ROOT / "build" / "uncommitted-results"


def _log_row(row: dict) -> None:
    ms = row.get("median_ms")
    timing = f"{ms:8.3f} ms [{row['p20_ms']:.3f}, {row['p80_ms']:.3f}]" if ms is not None else " " * 8 + " -"
    first = row.get("first_step_s")
    print(f"  {row['bench']:<12} {row['label'][:26]:<26} {row['mode']:<10} {str(row.get('optimizer_kind')):<10} "
          f"{row['precision']:<5} {row['status']:<11} {timing}"
          f"  first {first if first is None else round(first, 1)} s  check {row.get('check_ok')}"
          + (f"  {row['error'][:160]}" if row.get("error") else ""), flush=True)


def with_precisions(cases: list[Case], precisions: str | None) -> list[Case]:
    """The cases in the comma-separated ``precisions`` (all of them when None).

    A precision added to a suite later is measured in runs of its own: views judge a run complete
    per (model, precision), so such a run pairs and repeats like a run of the whole suite.
    """
    if not precisions:
        return cases
    want = {p.strip() for p in precisions.split(",") if p.strip()}
    unknown = want - set(PRECISIONS)
    if unknown or not want:
        raise ValueError(f"--precisions: unknown {', '.join(sorted(unknown)) or 'empty list'}; "
                         f"known: {', '.join(PRECISIONS)}")
    return [c for c in cases if c.precision in want]


def with_labels(cases: list[Case], labels: str | None) -> list[Case]:
    """The cases whose label is one of the comma-separated ``labels`` (all of them when None): a few cases of
    a long suite measured again in a run of their own, such as one ablation beside its default case."""
    if not labels:
        return cases
    want = {x.strip() for x in labels.split(",") if x.strip()}
    unknown = want - {c.label for c in cases}
    if unknown or not want:
        raise ValueError(f"--labels: no case is labelled {', '.join(sorted(unknown)) or '(empty list)'}")
    return [c for c in cases if c.label in want]


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
    os.environ.pop("FTLIB_MY_RESULTS", None)  # nor into a reader's own folder, which the views read
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
    for c in with_labels(with_precisions(suite.cases(), args.precisions), getattr(args, "labels", None)):
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

    cases = with_run(suite.in_measuring_order(cases), run_id())
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
             for c in with_precisions(SUITES[n].cases(), args.precisions) if c.mode in COMPILE_MODES]
    # The model alone compiles to the same graph whichever optimizer runs after it: one each (and one
    # per whole-step placement, which compiles the optimizer too).
    unique: dict[tuple, Case] = {}
    for c in cases:
        placement = c.optimizer if c.optimizer in WHOLE_STEP else ""
        unique.setdefault((c.config, c.B, c.T, c.mode, c.precision, placement), c)
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
                subprocess.run([sys.executable, "-m", "ftlib.harness.bench.isolated", str(spec_path), str(row_path)],
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


