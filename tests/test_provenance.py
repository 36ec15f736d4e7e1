"""Provenance of result rows: the commit of a copied tree is checked file by file against its manifest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import ftlib.harness.provenance as env


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path):
    """A tiny git repository with code under ftlib/ and a results file under data/."""
    repo = tmp_path / "repo"
    (repo / "ftlib").mkdir(parents=True)
    (repo / "data" / "results").mkdir(parents=True)
    (repo / "ftlib" / "a.py").write_text("x = 1\n")
    (repo / "README.md").write_text("hello\n")
    (repo / "data" / "results" / "r.jsonl").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    return repo


def _copied(checkout: Path, tmp_path: Path, manifest: bool = True) -> Path:
    """The checkout as a GPU machine receives it: files, no .git, the stamp files beside them."""
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(checkout), str(dst)], check=True)
    commit = _git(checkout, "rev-parse", "--short=12", "HEAD").strip()
    (dst / env.COMMIT_FILE).write_text(commit + "\n")
    if manifest:
        (dst / env.TREE_FILE).write_text(_git(checkout, "ls-files", "-s"))
    subprocess.run(["rm", "-rf", str(dst / ".git")], check=True)
    return dst


@pytest.fixture
def at(monkeypatch):
    def use(root: Path) -> None:
        monkeypatch.setattr(env, "repo_root", lambda: root)
        monkeypatch.delenv("FTLIB_COMMIT", raising=False)
        env._copied_tree_state.cache_clear()
    yield use
    env._copied_tree_state.cache_clear()


def test_a_git_checkout_reports_its_commit_and_changes_to_code(checkout, at):
    at(checkout)
    commit = env.git_commit()
    assert len(commit) == 12 and env.is_clean_commit(commit)
    (checkout / "data" / "results" / "r.jsonl").write_text("{}\n{}\n")  # new results are not code
    assert env.git_commit() == commit
    (checkout / "ftlib" / "a.py").write_text("x = 2\n")
    assert env.git_commit() == commit + "+dirty" and not env.is_clean_commit(env.git_commit())


def test_a_copied_tree_is_clean_only_when_every_file_matches(checkout, tmp_path, at):
    copy = _copied(checkout, tmp_path)
    at(copy)
    commit = _git(checkout, "rev-parse", "--short=12", "HEAD").strip()
    assert env.git_commit() == commit
    (copy / "data" / "results" / "r.jsonl").write_text("{}\n{}\n")
    env._copied_tree_state.cache_clear()
    assert env.git_commit() == commit
    (copy / "ftlib" / "a.py").write_text("x = 2\n")
    env._copied_tree_state.cache_clear()
    assert env.git_commit() == commit + "+dirty"


def test_a_stamped_copy_with_a_stale_git_folder_is_its_stamp(checkout, tmp_path, at):
    """A GPU machine may receive the files with an old .git beside them: the stamp wins when it matches."""
    copy = _copied(checkout, tmp_path)
    _git(copy, "init", "-q")  # a .git that knows nothing of this commit
    at(copy)
    commit = _git(checkout, "rev-parse", "--short=12", "HEAD").strip()
    assert env.git_commit() == commit
    (copy / "ftlib" / "a.py").write_text("x = 2\n")  # now the stamp does not match: git decides
    env._copied_tree_state.cache_clear()
    assert env.git_commit() != commit and not env.is_clean_commit(env.git_commit())


def test_a_copied_tree_with_new_code_or_a_missing_file_is_dirty(checkout, tmp_path, at):
    copy = _copied(checkout, tmp_path)
    (copy / "ftlib" / "b.py").write_text("y = 1\n")
    assert env.tree_matches_manifest(copy, (copy / env.TREE_FILE).read_text()) == ["ftlib/b.py"]
    (copy / "ftlib" / "b.py").unlink()
    (copy / "README.md").unlink()
    assert env.tree_matches_manifest(copy, (copy / env.TREE_FILE).read_text()) == ["README.md"]


def test_a_copied_tree_without_manifest_is_unverified(checkout, tmp_path, at):
    at(_copied(checkout, tmp_path, manifest=False))
    assert env.git_commit().endswith("+unverified") and not env.is_clean_commit(env.git_commit())


def test_no_commit_at_all_is_unknown(tmp_path, at):
    at(tmp_path)
    assert env.git_commit() == "unknown" and not env.is_clean_commit("unknown")


@pytest.mark.parametrize("commit,clean", [("0123456789ab", True), ("0123456789ab+dirty", False),
                                          ("6448491b675b+wip", False), (None, False), ("None", False), ("", False)])
def test_is_clean_commit(commit, clean):
    assert env.is_clean_commit(commit) is clean


def test_stamp_tree_refuses_uncommitted_changes(checkout, tmp_path):
    script = Path(__file__).resolve().parent.parent / "ci" / "stamp-tree"
    (checkout / "ci").mkdir()
    (checkout / "ci" / "stamp-tree").write_bytes(script.read_bytes())
    (checkout / ".gitignore").write_text(".ftlib-commit\n.ftlib-tree\n")
    _git(checkout, "-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    _git(checkout, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "stamp")
    ok = subprocess.run(["bash", "ci/stamp-tree"], cwd=checkout, capture_output=True, text=True)
    assert ok.returncode == 0 and (checkout / ".ftlib-tree").read_text() == _git(checkout, "ls-files", "-s")
    (checkout / "ftlib" / "a.py").write_text("x = 3\n")
    bad = subprocess.run(["bash", "ci/stamp-tree"], cwd=checkout, capture_output=True, text=True)
    assert bad.returncode == 1 and "uncommitted changes" in bad.stderr


def test_run_and_machine_ids_are_stable_within_a_process():
    assert env.run_id() == env.run_id() and env.machine_id() == env.machine_id()


def test_host_cpu_names_the_processor_and_counts_its_cores(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9454 48-Core Processor\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9454 48-Core Processor\n")
    assert env.host_cpu.__wrapped__(info) == "AMD EPYC 9454 48-Core Processor x2"
    missing = env.host_cpu.__wrapped__(tmp_path / "none")
    assert missing == "" or missing.endswith(f" x{env.os.cpu_count() or 1}")
    assert env.provenance()["host_cpu"] == env.host_cpu()
