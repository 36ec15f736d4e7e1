"""A rehearsal of another GPU's plan (``bash ci/t4-rehearsal``): its guards, its chapters, their estimates.

``FTLIB_CAPABILITY`` makes the chapters plan for the rehearsed GPU while the real one computes: the
rows they measure are the real GPU's under another GPU's plan, like no stored row. They go to a
scratch folder (``FTLIB_MY_RESULTS``), never among the stored results: :func:`check_scratch`
refuses a scratch folder inside them, :func:`snapshot` and :func:`changes` prove afterwards that no
stored file changed, and :func:`t4_claims` that no row names a T4 as the device that ran it (rows
record the real device; one that looked like a T4 row could be taken for one). :func:`scratch_lines`
and :func:`new_rows` give the rows one chapter added.

:func:`select_chapters`, :func:`parameter_names` and :func:`papermill_parameters` say which chapters
run and with what (``MEASURE=True``, ``SMOKE="t4"``, and ``DEVICE`` and ``CHECKPOINT`` where the
chapter's parameters cell has them); :func:`chapter_estimate` how long one is expected to take.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ftlib.core.repo import repo_root
from ftlib.harness.results import results_dir

# Row statuses that mean a case did not measure what it is labelled (``ftlib.harness.bench``,
# the studies, the kernel drivers); 'unsupported' is a path the device cannot take, said as such.
PROBLEM_STATUSES = ("error", "crashed", "check_failed", "oom", "timeout")
# First guesses (seconds on a GPU, the T4 profile) for chapters whose cost no catalogue gives:
# a kernel start, imports and the views, plus what each measures at small sizes.
GUESS_S = {"00": 40, "02": 30, "07": 30, "09": 90, "10": 30}  # the chapters that measure nothing (or DDP)
_DEVICE_FIELDS = ("device", "device_name", "device_slug", "gpu")
_ESTIMATE = re.compile(r"about \d+(?:\.\d+)? min")  # what a chapter prints before it measures (ChapterPlan.announce)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Refused(Exception):
    """A reason not to start; the message says what to change."""


def stored_results_dirs() -> list[Path]:
    """The folders of stored rows: the checkout's data/results, and ``results_dir()`` where it differs."""
    return list(dict.fromkeys(p.resolve() for p in (repo_root() / "data" / "results", results_dir())))


def check_scratch(scratch: Path, stored: list[Path]) -> None:
    """Refuse a scratch folder (``FTLIB_MY_RESULTS``) inside, or equal to, a folder of stored rows."""
    s = Path(scratch).resolve()
    for d in stored:
        d = Path(d).resolve()
        if s == d or d in s.parents:
            raise Refused(f"FTLIB_MY_RESULTS would be {s}, inside the stored results {d}: rehearsal rows "
                          "there would pass for measured ones. Give --out a folder outside it.")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (lock and temporary files too): relative path -> SHA-256."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two snapshots, one line per file."""
    out = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out


def t4_claims(scratch: Path) -> list[str]:
    """Rows (and results folders) under ``scratch`` that say a T4 measured them, one line each; a
    line that is not JSON is listed too, as it cannot be checked."""
    from ftlib.core.device import slug_of_name

    scratch = Path(scratch)
    out = [f"{p.relative_to(scratch).as_posix()}/: a results folder named t4"
           for p in sorted(scratch.rglob("t4")) if p.is_dir()]
    for path in sorted(scratch.rglob("*.jsonl")):
        rel = path.relative_to(scratch).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                out.append(f"{rel}:{n}: not a JSON row, so not checked")
                continue
            for field in _DEVICE_FIELDS if isinstance(row, dict) else ():
                if isinstance(row.get(field), str) and slug_of_name(row[field]) == "t4":
                    out.append(f"{rel}:{n}: {field}={row[field]!r}")
    return out


def scratch_lines(scratch: Path) -> dict[str, set[str]]:
    """Every row file under ``scratch``: relative path -> its lines."""
    scratch = Path(scratch)
    return {p.relative_to(scratch).as_posix(): set(p.read_text(encoding="utf-8", errors="replace").splitlines())
            for p in scratch.rglob("*.jsonl")}


def new_rows(before: dict[str, set[str]], after: dict[str, set[str]]) -> list[dict]:
    """The rows in ``after`` that ``before`` lacks, each with its file as ``_file``."""
    rows = []
    for name, lines in sorted(after.items()):
        for line in sorted(lines - before.get(name, set())):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {"status": "error", "error": f"an unreadable line in {name}"}
            if isinstance(row, dict):
                rows.append({**row, "_file": name})
    return rows


# -- the chapters ---------------------------------------------------------------------------------

def select_chapters(spec: str | None, book: Path) -> list[Path]:
    """``01,3,05_benchmarks`` -> those chapters' .py files in ``book``, in book order; all for None/''."""
    chapters = sorted(Path(book).glob("[0-9][0-9]_*.py"))
    if not spec:
        return chapters
    chosen = set()
    for w in (w.strip() for w in spec.split(",") if w.strip()):
        w = Path(w).stem
        w = f"0{w}" if re.fullmatch(r"\d", w) else w
        match = [c for c in chapters if c.stem == w or c.stem.split("_")[0] == w]
        if not match:
            raise Refused(f"no chapter {w!r}; the chapters: {', '.join(c.stem for c in chapters)}")
        chosen.add(match[0])
    return [c for c in chapters if c in chosen]


def parameter_names(py: Path) -> list[str]:
    """The names the chapter's cell tagged ``parameters`` assigns (jupytext percent format)."""
    names, inside = [], False
    for line in py.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            if inside:
                break
            inside = '"parameters"' in line
        elif inside and (m := re.match(r"([A-Z_][A-Z0-9_]*)\s*=", line)):
            names.append(m.group(1))
    return names


def papermill_parameters(names: list[str], device: str, checkpoint: Path) -> list[str]:
    """papermill's -p/-r arguments for a chapter in measuring mode with the T4 profile."""
    missing = [n for n in ("MEASURE", "SMOKE") if n not in names]
    if missing:
        raise Refused(f"its parameters cell lacks {', '.join(missing)}")
    args = ["-p", "MEASURE", "True", "-r", "SMOKE", "t4"]
    if "DEVICE" in names:
        args += ["-r", "DEVICE", device]
    if "CHECKPOINT" in names:  # chapter 8 saves a model: not into the checkout
        args += ["-r", "CHECKPOINT", str(checkpoint)]
    return args


def chapter_estimate(num: str, device) -> tuple[float, str]:
    """(seconds, where the number comes from) for chapter ``num`` ('03') with the T4 profile on
    ``device`` (a ``torch.device``; ``FTLIB_CAPABILITY`` decides the plan): the chapter's own plan
    (``ftlib.harness.plans``) where it measures, at the pace of the GPU it plans for, else a guess."""
    from ftlib.core.device import DeviceInfo
    from ftlib.harness.plans import chapter_plan
    from ftlib.harness.profiles import PROFILES

    if num in PROFILES:
        plan = chapter_plan(num, "t4", DeviceInfo.detect(device), gpu=device.type == "cuda")
        return plan.estimate_s + 30, f"the chapter's plan ({plan.count} cases on {plan.device}) + 30 s"
    return float(GUESS_S.get(num, 120)), "a first guess"


# -- what a chapter's run said --------------------------------------------------------------------

def printed_estimates(text: str) -> list[str]:
    """The chapter's own estimates in its output ('measuring 20 cases on h200: about 14 min ...')."""
    return list(dict.fromkeys(ln.split("INFO:papermill:")[-1].strip()
                              for ln in text.splitlines() if _ESTIMATE.search(ln)))


def error_tail(text: str, n: int = 25) -> list[str]:
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    return [ln for ln in lines if ln.strip()][-n:]


def describe_row(r: dict) -> str:
    what = " ".join(str(r[k]) for k in ("label", "model", "mode", "precision") if r.get(k) is not None)
    why = str(r.get("error") or r.get("check_note") or "")[:200]
    return f"{r['_file']}: {what or r.get('key', '?')} -> {r.get('status')}" + (f": {why}" if why else "")
