"""Rehearse a Colab T4's measuring plan on another GPU: the driver behind ``bash ci/t4-rehearsal``.

Every chosen chapter runs with papermill as a reader's Colab T4 runs it (``MEASURE=True``,
``SMOKE="t4"``), with ``FTLIB_CAPABILITY`` making ``ftlib.core.device.DeviceInfo`` describe the
rehearsed GPU, so precisions, kernels and tiles follow that GPU's plan while the real one computes.
The rows it measures record the real device: they are not T4 rows, and go to a scratch folder,
``OUT/rehearsal-rows-not-t4/`` (``FTLIB_MY_RESULTS``), packed at the end into a zip that
``ci/ingest-results`` does not read. Afterwards the stored results (``data/results/``) must be
byte for byte as before and no rehearsal row may name a T4 as its device; otherwise the command
fails loudly (exit 4).

A chapter starts only when the time left covers its estimate
(``ftlib.harness.rehearsal.chapter_estimate``: the chapter's own ``estimate_s`` where it measures
the baselines suite, else a first guess for a GPU); it is stopped when the budget is spent.
OUT receives the log ``t4-rehearsal.log``, the executed notebooks with each chapter's papermill
log in ``t4-notebooks.zip`` and the rows in ``rehearsal-rows-not-t4.zip``: three files, as a GPU
machine returns at most eight.

Exit status: 0 every chapter ran and passed; 1 a chapter failed (an error, a timeout, or rows
whose status is a failure); 2 refused to start; 3 none failed but some did not start (budget);
4 the stored results changed or a row claims a T4.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

from ftlib.harness.rehearsal import (
    PROBLEM_STATUSES,
    Refused,
    changes,
    chapter_estimate,
    check_scratch,
    describe_row,
    error_tail,
    new_rows,
    papermill_parameters,
    parameter_names,
    printed_estimates,
    scratch_lines,
    select_chapters,
    snapshot,
    stored_results_dirs,
    t4_claims,
)

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
SCRATCH_NAME = "rehearsal-rows-not-t4"
LOG_NAME = "t4-rehearsal.log"
NOTEBOOKS_ZIP, ROWS_ZIP = "t4-notebooks.zip", f"{SCRATCH_NAME}.zip"
MAX_OUT_FILES, MAX_FILE_BYTES = 8, 15 * 2**20  # what a GPU machine returns: 8 files, 16 MiB each
RESERVE_S = 20.0  # kept for the checks, the zips and the summary


def clock(s: float) -> str:
    m, s = divmod(int(s), 60)
    return f"{m}:{s:02d}"


# -- a chapter ------------------------------------------------------------------------------------

def run_chapter(nb: Path, dest: Path, params: list[str], chapter_log: Path, limit_s: float, env: dict,
                say) -> tuple[str, float]:
    """Execute ``nb`` into ``dest`` within ``limit_s``; ('ok' | 'error' | 'timeout', seconds).

    papermill's output goes through ci/book-progress, which keeps all of it in ``chapter_log`` and
    prints a line per section (one a minute in a long cell); those lines are passed to ``say``.
    """
    cmd = (f"set -o pipefail; {sys.executable} -m papermill --no-progress-bar --log-output -k python3 "
           f"--cwd {q(BOOK)} {q(nb)} {q(dest)} {' '.join(q(a) for a in params)} 2>&1 "
           f"| {sys.executable} -u {q(ROOT / 'ci' / 'book-progress')} {q(nb)} {q(chapter_log)}")
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def echo() -> None:
        for line in proc.stdout:
            say(line.rstrip())

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=max(1.0, limit_s))
    except subprocess.TimeoutExpired:
        stop(proc.pid)
        proc.wait()
        reader.join(timeout=5)
        return "timeout", time.monotonic() - t0
    reader.join(timeout=5)
    return ("ok" if rc == 0 else "error"), time.monotonic() - t0


def q(x) -> str:
    return shlex.quote(str(x))


def stop(pid: int) -> None:
    """End the process ``pid`` started and everything below it: papermill's kernel runs in a session of
    its own, so the process group alone would leave it (and what it started) running."""
    try:
        import psutil

        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except Exception:  # no psutil, or already gone: the group is what is left to end
        procs = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                p.send_signal(sig)
            except Exception:
                pass
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if not procs:  # nothing to wait on: give the group a moment
            time.sleep(5)
            continue
        _, procs = psutil.wait_procs(procs, timeout=10)
        if not procs:
            break


# -- the command ----------------------------------------------------------------------------------

class Log:
    """Print a line and keep it in the log file at once (a run stopped by a machine's limit keeps it)."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w", encoding="utf-8")

    def __call__(self, msg: str = "") -> None:
        print(msg, flush=True)
        self.file.write(msg + "\n")
        self.file.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bash ci/t4-rehearsal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path,
                    help=f"folder for {LOG_NAME}, {NOTEBOOKS_ZIP} and {ROWS_ZIP} (outside data/results)")
    ap.add_argument("--chapters", default="", help="comma-separated chapters, e.g. 01,03 (default: every "
                                                   "book/NN_*.py)")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="seconds for the whole call (default 540); a chapter starts only when the time left "
                         "covers its estimate")
    ap.add_argument("--capability", default=os.environ.get("FTLIB_CAPABILITY") or "7.5",
                    help="the compute capability rehearsed (default: $FTLIB_CAPABILITY, else 7.5, a T4)")
    ap.add_argument("--device", default="auto", help="the chapters' DEVICE parameter (default auto)")
    ap.add_argument("--estimate-scale", type=float, default=1.0,
                    help="multiply every chapter's estimate by this before comparing it with the time left "
                         "(the estimates are first guesses for a cold compile cache)")
    args = ap.parse_args(argv)
    if not args.budget_s > RESERVE_S:
        ap.error(f"--budget-s must be more than {RESERVE_S:.0f} seconds")
    if not args.estimate_scale > 0:
        ap.error("--estimate-scale must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    t_start = time.monotonic()
    note = ""
    if log := os.environ.pop("FTLIB_WHEELS_LOG", ""):  # pip's output, from ci/t4-rehearsal
        note = Path(log).read_text(errors="replace").strip() if Path(log).is_file() else ""
        Path(log).unlink(missing_ok=True)
    args = parse_args(argv)
    args.wheels_note = note
    out = args.out.resolve()
    scratch = out / SCRATCH_NAME
    try:
        check_scratch(scratch, stored_results_dirs())
        from kernels.limits import parse_capability

        cc = parse_capability(args.capability)
        chapters = select_chapters(args.chapters, BOOK)
    except (Refused, ValueError) as e:
        print(f"t4-rehearsal: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / NOTEBOOKS_ZIP, out / ROWS_ZIP):
        old.unlink(missing_ok=True)
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir()
    say = Log(out / LOG_NAME)
    if os.environ.get("FTLIB_MY_RESULTS") not in (None, "", str(scratch)):
        say(f"FTLIB_MY_RESULTS was {os.environ['FTLIB_MY_RESULTS']}: this run uses {scratch} instead")
    os.environ.update(FTLIB_CAPABILITY=f"{cc[0]}.{cc[1]}", FTLIB_MY_RESULTS=str(scratch), PYTHONUNBUFFERED="1")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(ROOT), *filter(None, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))]))
    try:
        device = preflight(args, chapters, say)
    except Refused as e:
        say(f"t4-rehearsal: {e}")
        return 2
    stored = stored_results_dirs()
    before = {d: snapshot(d) for d in stored}
    work = Path(tempfile.mkdtemp(prefix="ftlib-t4-rehearsal-"))
    results = []
    try:
        for i, py in enumerate(chapters, 1):
            results.append(one_chapter(i, len(chapters), py, args, device, work, scratch, t_start, say))
    except Exception as e:  # the checks below run whatever happened
        say(f"t4-rehearsal: stopped by {type(e).__name__}: {e}")
        results.append({"chapter": chapters[len(results)].stem, "estimate_s": 0.0, "status": "failed",
                        "seconds": 0.0, "printed": [], "rows": {}})
    problems = [f"data/results changed: {c}" for d in stored for c in changes(before[d], snapshot(d))]
    problems += [f"a rehearsal row claims a T4: {c}" for c in t4_claims(scratch)]
    pack(out, work, scratch, results, say)
    return summary(results, problems, out, time.monotonic() - t_start, say)


def preflight(args: argparse.Namespace, chapters: list[Path], say):
    """Say what runs where; refuse a real T4 (measure there instead) and a missing papermill."""
    import importlib.util

    import torch

    from ftlib.core.device import DeviceInfo, device_slug, pick_device
    from ftlib.training.data import data_dir

    try:
        device = pick_device(args.device)
    except ValueError as e:
        raise Refused(str(e)) from None
    if device.type == "cuda" and device_slug(device) == "t4":
        raise Refused("this GPU is a T4: measure for real (bash ci/gpu-run, or the chapters), not a rehearsal")
    info = DeviceInfo.detect(device)
    say(f"t4-rehearsal: {len(chapters)} chapter(s) ({', '.join(c.stem[:2] for c in chapters)}), "
        f"budget {args.budget_s:.0f} s")
    say(f"device: {info.actual or info.label()}, rehearsing {info.label()} (FTLIB_CAPABILITY="
        f"{os.environ['FTLIB_CAPABILITY']}): precisions {', '.join(info.precisions())}")
    say(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}")
    say(f"rows: {os.environ['FTLIB_MY_RESULTS']} (FTLIB_MY_RESULTS), packed into {ROWS_ZIP} at the end: "
        "rows of this GPU under the T4 plan, not T4 rows; never to be ingested")
    if args.wheels_note:
        say("wheel install: " + args.wheels_note[-2000:])
    if importlib.util.find_spec("papermill") is None:
        raise Refused("papermill is not importable: on a GPU machine carry the wheels (bash ci/fetch-wheels "
                      "in the checkout, then carry .whl)")
    if device.type != "cuda":
        say("no GPU here: the chapters measure on the CPU; a path that needs CUDA shows as unsupported rows "
            "or as an error naming CUDA")
    text = data_dir() / "tinyshakespeare" / "input.txt"
    needs = [c.stem for c in chapters if c.stem[:2] in ("00", "08")]
    if needs and not text.exists():
        say(f"warning: no TinyShakespeare at {text}: {', '.join(needs)} will try to download it "
            "(set FTLIB_DATA_DIR, or carry data/tinyshakespeare/input.txt)")
    return device


def one_chapter(i: int, n: int, py: Path, args: argparse.Namespace, device, work: Path, scratch: Path,
                t_start: float, say) -> dict:
    """Run one chapter if its estimate fits the time left; log and return what happened."""
    stem = py.stem
    elapsed = time.monotonic() - t_start
    left = args.budget_s - elapsed - RESERVE_S
    est, how = chapter_estimate(stem[:2], device)
    est *= args.estimate_scale
    scale = f" x {args.estimate_scale:g}" if args.estimate_scale != 1 else ""
    res = {"chapter": stem, "estimate_s": est, "status": "not started", "seconds": 0.0, "printed": [], "rows": {}}
    say(f"== [{i}/{n}] {stem}: estimate {est:.0f} s ({how}{scale}); {left:.0f} s left; {clock(elapsed)} elapsed")
    if est > left:
        usable = args.budget_s - RESERVE_S
        hint = (f"; it would not fit the whole budget either ({usable:.0f} s): a --budget-s of {est + RESERVE_S:.0f}, "
                f"or an --estimate-scale under {args.estimate_scale * usable / est:.2f} if the estimate is known "
                "to be high here" if est > usable else "")
        say(f"   not started: its estimate ({est:.0f} s) is more than the time left ({left:.0f} s){hint}")
        return res
    nb = py.with_suffix(".ipynb")
    try:
        if not nb.exists():
            raise Refused(f"no {nb.name} beside {py.name} (jupytext --sync {py.name})")
        params = papermill_parameters(parameter_names(py), args.device, work / "checkpoints" / f"{stem}.pt")
    except Refused as e:
        say(f"   FAILED before starting: {e}")
        return {**res, "status": "failed"}
    seen = scratch_lines(scratch)
    chapter_log = work / f"{stem}.log"
    status, secs = run_chapter(nb, work / nb.name, params, chapter_log, left, dict(os.environ),
                               lambda line: say("   " + line.strip()))
    text = chapter_log.read_text(encoding="utf-8", errors="replace") if chapter_log.exists() else ""
    rows = new_rows(seen, scratch_lines(scratch))
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    bad = [r for r in rows if r.get("status") in PROBLEM_STATUSES]
    status = {"ok": "rows failed" if bad else "ok", "error": "failed"}.get(status, status)
    res.update(status=status, seconds=secs, printed=printed_estimates(text), rows=counts)
    say(f"   {stem}: {status.upper() if status != 'ok' else 'ok'} in {clock(secs)} (estimate {est:.0f} s); "
        f"the chapter's own estimate: {'; '.join(res['printed']) or 'none printed'}")
    say("   rows: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    for r in bad[:8]:
        say(f"   ! {describe_row(r)}")
    unsupported = [r for r in rows if r.get("status") == "unsupported"]
    for why in dict.fromkeys(str(r.get("error"))[:200] for r in unsupported):
        say(f"   not measurable on this device ({sum(str(r.get('error'))[:200] == why for r in unsupported)} "
            f"rows): {why}")
    if status in ("failed", "timeout"):
        say(f"   the end of its output ({'stopped at the time left' if status == 'timeout' else 'the error'}):")
        tail = error_tail(text)
        for line in tail:
            say("   | " + line)
        if device.type != "cuda" and any("cuda" in line.lower() for line in tail):
            say("   (no GPU here and the error names CUDA: this path needs a GPU; the GPU rehearsal decides)")
    return res


def _zip(dest: Path, files: list[Path], base: Path, note: str | None = None) -> None:
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for p in files:
            z.write(p, arcname=p.relative_to(base).as_posix())
        if note:
            z.writestr("NOT-T4-ROWS.txt", note)


def pack(out: Path, work: Path, scratch: Path, results: list[dict], say) -> None:
    """Executed notebooks and chapter logs into one zip, the rows into another; the folders go."""
    failed = {r["chapter"] for r in results if r["status"] not in ("ok", "not started")}
    files = sorted(p for p in work.iterdir() if p.is_file() and p.suffix in (".ipynb", ".log"))
    if files:
        _zip(out / NOTEBOOKS_ZIP, files, work)
        if (out / NOTEBOOKS_ZIP).stat().st_size > MAX_FILE_BYTES:
            _zip(out / NOTEBOOKS_ZIP, [p for p in files if p.suffix == ".log" or p.stem in failed], work)
            say(f"{NOTEBOOKS_ZIP}: over {MAX_FILE_BYTES >> 20} MiB with every notebook; it keeps the failed "
                "chapters' notebooks and every chapter's log")
    rows = sorted(p for p in scratch.rglob("*") if p.is_file() and p.suffix == ".jsonl")
    if rows:
        _zip(out / ROWS_ZIP, rows, out, note="Rows measured in a T4 rehearsal (bash ci/t4-rehearsal): the GPU "
             "named in each row ran the T4's plan (FTLIB_CAPABILITY). They are not T4 rows, nor that GPU's own "
             "plan: do not ingest them.\n")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def summary(results: list[dict], problems: list[str], out: Path, total: float, say) -> int:
    ran = [r for r in results if r["status"] != "not started"]
    say("")
    say(f"== t4-rehearsal: {len(ran)} of {len(results)} chapter(s) run in {clock(total)}")
    for r in results:
        rows = ", ".join(f"{k} {v}" for k, v in sorted(r["rows"].items())) or "-"
        say(f"   {r['chapter']:<24} {r['status']:<12} {clock(r['seconds']):>6}  estimate {r['estimate_s']:4.0f} s"
            f"  rows: {rows}")
    waiting = [r["chapter"][:2] for r in results if r["status"] == "not started"]
    if waiting:
        say(f"not started (budget): {', '.join(waiting)}; run them next with --chapters {','.join(waiting)}")
    files = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
    say(f"in {out}: {', '.join(files)} ({len(files)} of at most {MAX_OUT_FILES} a GPU machine returns)")
    if len(files) > MAX_OUT_FILES:
        say(f"warning: more than {MAX_OUT_FILES} entries in {out}; give --out a folder of its own")
    if problems:
        say("!! THE REHEARSAL BROKE ITS GUARD: the stored results must stay as they were and no rehearsal row "
            "may claim a T4")
        for p in problems:
            say(f"!!   {p}")
        return 4
    failed = [r["chapter"] for r in results if r["status"] not in ("ok", "not started")]
    if failed:
        say(f"FAILED: {', '.join(failed)}")
        return 1
    say("the stored results are unchanged; no rehearsal row claims a T4")
    return 3 if waiting else 0


if __name__ == "__main__":
    sys.exit(main())
