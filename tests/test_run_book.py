"""ci/run-book for people: its help, its check of chapter names, and the progress it shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_book(*args: str) -> subprocess.CompletedProcess:
    # FTLIB_SKIP_SETUP: these calls must answer before anything is installed or executed.
    env = {"PATH": "/usr/bin:/bin", "FTLIB_SKIP_SETUP": "1", "HOME": str(ROOT)}
    return subprocess.run(["bash", "ci/run-book", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_help_explains_the_modes():
    r = run_book("--help")
    assert r.returncode == 0
    for word in ("--stored", "fast first look", "--full", "--inplace", "jupyter", "02"):
        assert word in r.stdout or word in r.stdout.lower(), word


def test_an_unknown_chapter_is_an_error_that_lists_the_chapters():
    r = run_book("99")
    assert r.returncode == 2 and "no chapter '99'" in r.stderr
    chapters = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.py"))
    assert all(c in r.stderr for c in chapters)
    assert run_book("--no-such-option").returncode == 2


def test_progress_names_cells_and_sections(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["# 7. A chapter\n", "text"]},
                    {"cell_type": "code", "source": "x = 1"},
                    {"cell_type": "markdown", "source": "## The second section"},
                    {"cell_type": "code", "source": "print(x)"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "07_chapter.ipynb"
    path.write_text(json.dumps(nb))
    log = "".join(f"Executing Cell {i}-----------\nsome output {i}\nEnding Cell {i}------\n" for i in range(1, 5))
    r = subprocess.run([sys.executable, str(ROOT / "ci" / "book-progress"), str(path), str(tmp_path / "log")],
                       input=log, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    # not a terminal: one line per new section, with the cell, its section and the time
    assert len(lines) == 2 and "07_chapter: cell 1/4 (7. A chapter), 0:0" in lines[0]
    assert "cell 3/4 (The second section)" in lines[1]
    assert (tmp_path / "log").read_text() == log  # the whole log is kept


def test_committed_notebooks_carry_no_path_of_the_machine_that_ran_them():
    for nb in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        pm = json.loads(nb.read_text(encoding="utf-8"))["metadata"].get("papermill", {})
        for k in ("input_path", "output_path"):
            assert not Path(pm.get(k) or "").is_absolute(), f"{nb.name}: papermill {k} {pm.get(k)}"
        # where the notebook lands, never the scratch file papermill wrote while the chapter ran
        assert pm.get("output_path") in (None, f"book/{nb.name}"), f"{nb.name}: papermill output_path"


def test_chapter_0_records_the_clean_commit_it_ran_from():
    """run-book --inplace writes each notebook beside the tree and moves it into place once run, so that the
    chapter's provenance reads the commit itself, not '+dirty' from its own half-written notebook."""
    text = (ROOT / "book" / "00_setup.ipynb").read_text(encoding="utf-8")
    commits = re.findall(r"\| commit \| ([^ |]+) \|", text)
    assert commits and all(re.fullmatch(r"[0-9a-f]{12}", c) for c in commits), commits
