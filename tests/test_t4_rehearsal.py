"""ci/t4-rehearsal: its help, its refusal to keep rows among the stored ones, and the checks after a
run: a changed stored file and a row that claims a T4 both fail it (ftlib.harness.rehearsal)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ftlib.harness.rehearsal import (
    Refused,
    changes,
    check_scratch,
    new_rows,
    papermill_parameters,
    parameter_names,
    printed_estimates,
    scratch_lines,
    select_chapters,
    snapshot,
    t4_claims,
)

ROOT = Path(__file__).resolve().parent.parent


def rehearsal(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(ROOT)),
            "PYTHON": sys.executable}
    return subprocess.run(["bash", "ci/t4-rehearsal", *args], cwd=ROOT, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def test_help_names_the_options_and_what_the_rows_are():
    r = rehearsal("--help")
    assert r.returncode == 0, r.stderr
    for word in ("--out", "--chapters", "--budget-s", "--capability", "FTLIB_CAPABILITY", "not T4 rows",
                 "rehearsal-rows-not-t4"):
        assert word in " ".join(r.stdout.split()), word


def test_every_chapter_runs_measuring_with_the_t4_profile_and_its_own_parameters(tmp_path):
    book = ROOT / "book"
    assert [c.stem[:2] for c in select_chapters("8,00_setup, 03", book)] == ["00", "03", "08"]
    assert len(select_chapters("", book)) == len(list(book.glob("[0-9][0-9]_*.py"))) >= 10
    with pytest.raises(Refused, match="no chapter '99'"):
        select_chapters("99", book)
    for py in select_chapters("", book):  # what the rehearsal passes, every chapter can take
        args = papermill_parameters(parameter_names(py), "auto", tmp_path / "c.pt")
        assert args[:6] == ["-p", "MEASURE", "True", "-r", "SMOKE", "t4"] and "DEVICE" in args, py.name
    assert str(tmp_path / "c.pt") in papermill_parameters(parameter_names(book / "08_convergence.py"), "auto",
                                                          tmp_path / "c.pt")
    (tmp_path / "00_x.py").write_text('# %% tags=["parameters"]\nSMOKE = True\n\n# %%\nMEASURE = 1\n')
    with pytest.raises(Refused, match="lacks MEASURE"):
        papermill_parameters(parameter_names(tmp_path / "00_x.py"), "auto", tmp_path / "c.pt")


def test_a_scratch_folder_among_the_stored_results_is_refused(tmp_path):
    stored = tmp_path / "data" / "results"
    stored.mkdir(parents=True)
    for inside in (stored, stored / "h200", stored / "x" / ".." / "rows"):
        with pytest.raises(Refused, match="inside the stored results"):
            check_scratch(inside, [stored])
    check_scratch(tmp_path / "out" / "rehearsal-rows-not-t4", [stored])  # beside it: fine
    check_scratch(tmp_path / "data" / "results-not", [stored])


def test_the_command_refuses_an_out_folder_in_data_results_and_writes_nothing():
    target = ROOT / "data" / "results" / "rehearsal-refused-by-test"
    try:
        r = rehearsal("--out", str(target), "--chapters", "00")
        assert r.returncode == 2
        assert "inside the stored results" in r.stderr and "FTLIB_MY_RESULTS" in r.stderr
        assert not target.exists()
    finally:  # a refusal that failed must not leave rows among the stored ones
        shutil.rmtree(target, ignore_errors=True)


def test_the_command_refuses_when_the_stored_results_are_elsewhere_too(tmp_path):
    stored = tmp_path / "stored"
    stored.mkdir()
    r = rehearsal("--out", str(stored / "t4"), "--chapters", "00", env={"FTLIB_RESULTS_DIR": str(stored)})
    assert r.returncode == 2 and "inside the stored results" in r.stderr
    assert list(stored.iterdir()) == []


def test_snapshots_catch_a_changed_an_added_and_a_removed_file(tmp_path):
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "baselines.jsonl").write_text('{"key": "a"}\n')
    (tmp_path / "h200" / "engine.jsonl").write_text('{"key": "e"}\n')
    before = snapshot(tmp_path)
    assert changes(before, snapshot(tmp_path)) == []
    (tmp_path / "h200" / "baselines.jsonl").write_text('{"key": "a"}\n{"key": "b"}\n')
    (tmp_path / "h200" / "engine.jsonl").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "profile.jsonl").write_text("{}\n")
    assert changes(before, snapshot(tmp_path)) == [
        "added cpu/profile.jsonl", "removed h200/engine.jsonl", "changed h200/baselines.jsonl"]


def test_a_row_that_claims_a_t4_is_caught(tmp_path):
    (tmp_path / "h200").mkdir()
    ok = {"key": "a", "device": "NVIDIA H200", "device_slug": "h200", "status": "ok"}
    (tmp_path / "h200" / "baselines.jsonl").write_text(json.dumps(ok) + "\n")
    assert t4_claims(tmp_path) == []
    lines = [ok, {"key": "b", "device": "Tesla T4"}, {"key": "c", "device": "NVIDIA H200", "device_slug": "t4"}]
    (tmp_path / "h200" / "baselines.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    (tmp_path / "t4").mkdir()
    claims = t4_claims(tmp_path)
    assert claims[0] == "t4/: a results folder named t4"
    assert any("baselines.jsonl:2: device='Tesla T4'" in c for c in claims)
    assert any("baselines.jsonl:3: device_slug='t4'" in c for c in claims)
    assert any("baselines.jsonl:4: not a JSON row" in c for c in claims)


def test_new_rows_are_those_a_chapter_added(tmp_path):
    (tmp_path / "cpu").mkdir()
    f = tmp_path / "cpu" / "grid.jsonl"
    f.write_text('{"key": "a", "status": "ok"}\n')
    before = scratch_lines(tmp_path)
    f.write_text('{"key": "a", "status": "ok"}\n{"key": "b", "status": "error", "error": "boom"}\n')
    assert [(r["key"], r["_file"]) for r in new_rows(before, scratch_lines(tmp_path))] == [("b", "cpu/grid.jsonl")]
    text = "INFO:papermill:measuring 20 cases on h200: about 14 min (a first guess; compiling takes most of it)\n"
    assert printed_estimates(text) == ["measuring 20 cases on h200: about 14 min (a first guess; compiling "
                                       "takes most of it)"]


def _chapter(book: Path, stem: str, code: str) -> None:
    """A one-cell chapter: its .py (parameters cell) and the paired .ipynb."""
    params = 'DEVICE = "auto"\nSMOKE = True\nMEASURE = False'
    (book / f"{stem}.py").write_text(f'# %% tags=["parameters"]\n{params}\n\n# %%\n{code}\n')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, book / f"{stem}.ipynb")


def test_a_run_that_writes_stored_rows_or_a_t4_row_fails_loudly(tmp_path):
    """End to end with one cheap chapter: it measures with the T4 profile and then breaks both rules."""
    pytest.importorskip("papermill")
    book, stored, out = tmp_path / "book", tmp_path / "stored", tmp_path / "out"
    book.mkdir()
    (stored / "h200").mkdir(parents=True)
    (stored / "h200" / "baselines.jsonl").write_text('{"key": "a"}\n')
    _chapter(book, "00_fake", "\n".join([
        "import json, os, pathlib",
        "assert MEASURE is True and SMOKE == 't4' and os.environ['FTLIB_CAPABILITY'] == '7.5'",
        "mine = pathlib.Path(os.environ['FTLIB_MY_RESULTS']) / 'h200'",
        "mine.mkdir(parents=True, exist_ok=True)",
        "(mine / 'baselines.jsonl').write_text(json.dumps({'key': 'r', 'device': 'Tesla T4', 'status': 'ok'}) + '\\n')",
        "stored = pathlib.Path(os.environ['FTLIB_RESULTS_DIR']) / 'h200' / 'baselines.jsonl'",
        "stored.write_text(stored.read_text() + '{\"key\": \"leak\"}\\n')",
        "print('measuring 1 cases on h200: about 1 min')"]))
    code = ("import runpy, sys; from pathlib import Path; m = runpy.run_path('ci/t4_rehearsal.py'); "
            "m['main'].__globals__['BOOK'] = Path(sys.argv[1]); sys.exit(m['main'](sys.argv[2:]))")
    env = {**os.environ, "FTLIB_RESULTS_DIR": str(stored), "PYTHONPATH": str(ROOT), "FTLIB_CAPABILITY": "7.5"}
    env.pop("FTLIB_MY_RESULTS", None)
    r = subprocess.run([sys.executable, "-c", code, str(book), "--out", str(out), "--device", "cpu"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    log = (out / "t4-rehearsal.log").read_text()
    assert r.returncode == 4, r.stdout + r.stderr
    assert "00_fake: ok" in log and "the chapter's own estimate: measuring 1 cases on h200: about 1 min" in log
    assert "data/results changed: changed h200/baselines.jsonl" in log
    assert "a rehearsal row claims a T4: h200/baselines.jsonl:1: device='Tesla T4'" in log
    assert sorted(p.name for p in out.iterdir()) == ["rehearsal-rows-not-t4.zip", "t4-notebooks.zip",
                                                     "t4-rehearsal.log"]
