"""Colab: one repository address everywhere, a set-up cell that works against a clone, rows that outlast
the runtime and come back through ci/ingest-results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
URL = re.search(r'^Repository\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.py"))


def test_every_badge_and_set_up_cell_uses_the_one_address():
    repo = URL.removeprefix("https://github.com/")
    for py in CHAPTERS:
        text = py.read_text()
        assert f"colab.research.google.com/github/{repo}/blob/main/book/{py.stem}.ipynb" in text, py.name
        assert f'os.environ.get("FTLIB_REPO", "{URL}")' in text, py.name
        assert "github.com/" not in text.replace(f"github/{repo}", "").replace(URL, ""), py.name  # no other
    assert f"colab.research.google.com/github/{repo}/blob/main/book/00_setup.ipynb" in (ROOT / "README.md").read_text()
    r = subprocess.run([sys.executable, "ci/colab-cells", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _setup_cell(py: Path) -> str:
    import jupytext

    return next(c.source for c in jupytext.read(py).cells if c.source.startswith("# Colab set-up"))


def _snapshot_repo(dest: Path) -> Path:
    """A one-commit repository of the checkout as it stands (tracked and new files, .gitignore obeyed), so the
    cell is tested against this code, not against whatever was last committed."""
    import shutil

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run(git + cmd, cwd=dest, check=True, capture_output=True)
    return dest


def test_the_set_up_cell_clones_and_turns_on_the_t4_profile(tmp_path):
    """The cell, run as Colab would run it (a google.colab module present), against a local clone."""
    repo = _snapshot_repo(tmp_path / "origin")
    fake = tmp_path / "fake"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "__init__.py").write_text("")
    (fake / "google" / "colab" / "__init__.py").write_text("")
    clone_root = tmp_path / "content" / "book-clone"
    script = tmp_path / "cell.py"
    script.write_text("import google.colab, sys, os, json\n" + _setup_cell(CHAPTERS[3]) + "\n"
                      "print(json.dumps({'cwd': os.getcwd(), 'measure': MEASURE, 'smoke': SMOKE,\n"
                      "                  'path0': sys.path[0], 'mine': os.environ.get('FTLIB_MY_RESULTS')}))\n")
    keep = tmp_path / "kept-rows"
    text = script.read_text().replace('KEEP_ROWS_IN = ""', f'KEEP_ROWS_IN = "{keep}"')
    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(fake), "FTLIB_REPO": str(repo), "FTLIB_COLAB_ROOT": str(clone_root),
           "FTLIB_COLAB_PIP": "0"}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["cwd"] == str(clone_root / "book") and got["path0"] == str(clone_root)
    assert got["measure"] is True and got["smoke"] == "t4" and got["mine"] == str(keep) and keep.is_dir()
    assert (clone_root / "data" / "results" / "h200" / "baselines.jsonl").exists()  # the stored rows came along


def test_rows_kept_elsewhere_come_back_through_ingest(tmp_path, monkeypatch):
    from ftlib.harness.colab import pack_results
    from ftlib.harness.results import ResultStore

    mine = tmp_path / "mine"
    rows = [json.loads(line) for line in (ROOT / "data/results/h200/baselines.jsonl").read_text().splitlines()[:3]]
    for r in rows:  # rows as a T4 would have written them
        r.update(device="Tesla T4", device_slug="t4")
        ResultStore("baselines", "t4", mine).append(r)
    monkeypatch.setenv("FTLIB_MY_RESULTS", str(mine))
    zipped = pack_results(tmp_path / "rows.zip", "t4")
    with zipfile.ZipFile(zipped) as z:
        assert sorted(z.namelist()) == ["HOW-TO-ADD.txt", "t4/baselines.jsonl"]
        z.extractall(tmp_path / "unzipped")
    t4_folder = ROOT / "data" / "results" / "t4"
    existed = t4_folder.exists()
    r = subprocess.run([sys.executable, "ci/ingest-results", str(tmp_path / "unzipped" / "t4"), "--gpu", "t4",
                        "--dry-run"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert t4_folder.exists() == existed  # a dry run leaves the stored results as they were, lock files too
    with pytest.raises(ValueError, match="no result files"):
        pack_results(tmp_path / "none.zip", "a100")
