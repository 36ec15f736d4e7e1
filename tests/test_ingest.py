"""ci/ingest-results: returned device rows replace the committed ones only if nothing is lost, every
line is a keyed JSON row of the right device in a known file, and then through the store's lock and
atomic replace. Any refusal writes nothing (checked with file hashes)."""

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import tarfile
import threading
import time
from pathlib import Path

import pytest

from ftlib.harness.results import ResultStore

ROOT = Path(__file__).resolve().parent.parent


def _module():
    loader = importlib.machinery.SourceFileLoader("ingest_results", str(ROOT / "ci" / "ingest-results"))
    spec = importlib.util.spec_from_loader("ingest_results", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mod():
    return _module()


def _rows(*keys, device="NVIDIA H200"):
    return "".join(json.dumps({"key": k, "v": i, "device": device}) + "\n" for i, k in enumerate(keys))


def _keys(path: Path) -> list[str]:
    return [json.loads(x)["key"] for x in path.read_text().splitlines()]


def _hashes(folder: Path) -> dict[str, str]:
    """Every results file in the folder, byte for byte (lock files are not results)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.jsonl"))}


@pytest.fixture()
def repo(tmp_path, monkeypatch, mod):
    """A repository whose data/results/h200/ holds four files, and an empty returned folder."""
    store = tmp_path / "repo" / "data" / "results" / "h200"
    store.mkdir(parents=True)
    (store / "speedrun.jsonl").write_text(_rows("a", "b"))
    (store / "engine.jsonl").write_text(_rows("x", "y"))
    (store / "engine_probe.jsonl").write_text(_rows("p", "q"))
    (store / "baselines.jsonl").write_text(_run_rows("r1", "a", "b"))
    monkeypatch.setattr(mod, "ROOT", tmp_path / "repo")
    back = tmp_path / "back"
    back.mkdir()
    return store, back


def test_appended_rows_from_nested_tars_are_taken(repo, mod, tmp_path, capsys):
    store, back = repo
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "speedrun.jsonl").write_text(_rows("a", "b", "c"))  # two stored rows, one new
    (inner / "engine.jsonl").write_text(_rows("x", "y"))  # unchanged
    with tarfile.open(tmp_path / "results.tar", "w") as t:
        for p in inner.iterdir():
            t.add(p, arcname=p.name)
    with tarfile.open(back / "res.tar", "w") as t:
        t.add(tmp_path / "results.tar", arcname="results.tar")
    probe_rows = [{"key": "q", "v": 9, "device": "NVIDIA H200"}, {"key": "r", "device_slug": "h200"}]
    (back / "engine_probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in probe_rows))
    assert mod.main([str(back)]) == 0
    assert _keys(store / "speedrun.jsonl") == ["a", "b", "c"]
    assert (store / "engine.jsonl").read_text() == _rows("x", "y")
    probe = [json.loads(x) for x in (store / "engine_probe.jsonl").read_text().splitlines()]
    assert [r["key"] for r in probe] == ["p", "q", "r"] and probe[1]["v"] == 9
    assert "speedrun.jsonl: 2 -> 3 rows" in capsys.readouterr().out


def test_a_file_returned_twice_resolves_to_its_longest_copy(repo, mod, tmp_path, capsys):
    # kernels.jsonl copied next to results.tar, which packs the older copy: the longer one wins
    # whichever is unpacked last; copies that disagree stop the ingest with a clear message.
    store, back = repo
    (store / "kernels.jsonl").write_text(_rows("a"))
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "kernels.jsonl").write_text(_rows("a"))
    with tarfile.open(back / "results.tar", "w") as t:
        t.add(inner / "kernels.jsonl", arcname="kernels.jsonl")
    (back / "kernels.jsonl").write_text(_rows("a", "b", "c"))
    assert mod.main([str(back)]) == 0
    assert _keys(store / "kernels.jsonl") == ["a", "b", "c"]
    (back / "kernels.jsonl").write_text(_rows("z", "b", "c"))
    before = _hashes(store)
    assert mod.main([str(back)]) == 1  # a message, not a traceback
    err = capsys.readouterr().err
    assert "kernels.jsonl: 2 returned copies disagree" in err and "nothing written" in err
    assert _hashes(store) == before


def _run_rows(run, *keys, device="NVIDIA H200", v=0):
    """Rows of a suite whose key carries its run (ci/gpu_bench.py puts the run in ``extra``)."""
    return "".join(json.dumps({"key": f"{run}-{k}", "v": v, "device": device, "extra": {"run": run}}) + "\n"
                   for k in keys)


def _committed_baselines(tmp_path, monkeypatch, mod, runs_stored):
    """A repository holding the first ``runs_stored`` runs of the committed baselines.jsonl, the
    committed file's lines, and an empty returned folder."""
    lines = (ROOT / "data" / "results" / "h200" / "baselines.jsonl").read_text().splitlines(keepends=True)
    runs = list(dict.fromkeys(json.loads(x)["extra"]["run"] for x in lines))
    assert len(runs) >= 2, "the test splits the committed file by run"
    stored = [x for x in lines if json.loads(x)["extra"]["run"] in runs[:runs_stored]]
    assert lines[: len(stored)] == stored  # the runs follow each other in the file
    store = tmp_path / "repo" / "data" / "results" / "h200"
    store.mkdir(parents=True)
    (store / "baselines.jsonl").write_text("".join(stored))
    monkeypatch.setattr(mod, "ROOT", tmp_path / "repo")
    back = tmp_path / "back"
    back.mkdir()
    return store, back, lines, len(stored)


def test_baselines_with_the_stored_rows_and_new_runs_are_taken(mod, tmp_path, monkeypatch, capsys):
    store, back, lines, n = _committed_baselines(tmp_path, monkeypatch, mod, runs_stored=1)
    (back / "baselines.jsonl").write_text("".join(lines))  # a call that started from the stored file
    assert mod.main([str(back)]) == 0
    assert (store / "baselines.jsonl").read_text() == "".join(lines)
    assert f"baselines.jsonl: {n} -> {len(lines)} rows\n" in capsys.readouterr().out


def test_baselines_with_only_new_runs_are_merged_after_the_stored_rows(mod, tmp_path, monkeypatch, capsys):
    # A second GPU run that started from a tree without the first call's rows returns only
    # its own runs: they are appended, and every stored row stays as it was.
    store, back, lines, n = _committed_baselines(tmp_path, monkeypatch, mod, runs_stored=2)
    (back / "baselines.jsonl").write_text("".join(lines[n:]))
    assert mod.main([str(back)]) == 0
    assert (store / "baselines.jsonl").read_text() == "".join(lines)
    assert (f"baselines.jsonl: {n} -> {len(lines)} rows (merged: the stored rows, then {len(lines) - n} returned "
            "rows not stored)") in capsys.readouterr().out


def test_a_call_that_missed_another_calls_runs_keeps_both(repo, mod):
    # Stored: runs r1 (committed) and r2 (a first call). Returned by a second call that started
    # from the commit: r1 again, then its own r3. Result: r1, r2, r3, nothing lost or doubled.
    store, back = repo
    (store / "baselines.jsonl").write_text(_run_rows("r1", "a", "b") + _run_rows("r2", "a", "b"))
    (back / "baselines.jsonl").write_text(_run_rows("r1", "a", "b") + _run_rows("r3", "a", "b"))
    assert mod.main([str(back)]) == 0
    assert _keys(store / "baselines.jsonl") == ["r1-a", "r1-b", "r2-a", "r2-b", "r3-a", "r3-b"]
    # ingesting the same folder again adds nothing
    before = _hashes(store)
    assert mod.main([str(back)]) == 0 and _hashes(store) == before


def test_a_returned_copy_that_lacks_stored_rows_keeps_them(repo, mod, capsys):
    # engine.jsonl's rows carry no run: a copy from an older tree holding one stored row and a
    # new key keeps both stored rows and adds the new one; nothing is lost.
    store, back = repo
    new_row = json.dumps({"key": "w", "v": 7, "device": "NVIDIA H200"}) + "\n"
    (back / "engine.jsonl").write_text(_rows("x") + new_row)
    assert mod.main([str(back)]) == 0
    assert (store / "engine.jsonl").read_text() == _rows("x", "y") + new_row
    assert "engine.jsonl: 2 -> 3 rows (merged" in capsys.readouterr().out


# Each way a returned folder can be wrong: (what to put in it, a phrase the error must contain).
def _torn(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b", "c") + '{"key": "d", "device": "NVIDIA H')


def _t4_row(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b") + _rows("t", device="Tesla T4"))


def _slug_row(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b") + json.dumps({"key": "s", "device_slug": "t4"}) + "\n")


def _no_device(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b") + json.dumps({"key": "n"}) + "\n")


def _no_key(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b") + json.dumps({"device": "NVIDIA H200"}) + "\n")


def _not_an_object(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b") + "[1, 2]\n")


def _unknown_name(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b", "c"))
    (back / "speedrun_old.jsonl").write_text(_rows("a"))


def _stored_row_measured_again(back):
    (back / "speedrun.jsonl").write_text(_rows("a", "b", "c"))  # fine on its own
    (back / "engine.jsonl").write_text(_rows("y", "z"))  # 'y' with v=0, stored with v=1: the whole ingest is refused


def _stored_run_row_changed(back):
    (back / "baselines.jsonl").write_text(_run_rows("r1", "a", v=5) + _run_rows("r3", "a"))


def _empty(back):
    (back / "run.log").write_text("no results\n")


def _bad_tar(back):
    (back / "results.tar").write_bytes(b"not a tar")


CASES = {
    "torn-last-line": (_torn, "returned speedrun.jsonl, line 4: not valid JSON"),
    "tesla-t4-row": (_t4_row, "line 3: a row measured on 'Tesla T4'"),
    "t4-device-slug": (_slug_row, "does not belong in h200/"),
    "row-without-device": (_no_device, "line 3: the row names no device"),
    "row-without-key": (_no_key, "line 3: the row has no 'key'"),
    "line-not-an-object": (_not_an_object, "line 3: a JSON list, not an object"),
    "unknown-file-name": (_unknown_name, "speedrun_old.jsonl: not a known results file"),
    "stored-row-measured-again": (_stored_row_measured_again,
                                  "engine.jsonl: the returned file does not start with the 2 stored rows, and its "
                                  "line 1 has the key of a stored row with other values"),
    "stored-run-row-changed": (_stored_run_row_changed, "baselines.jsonl: the returned file does not start with the "
                               "2 stored rows, and its line 1 has the key"),
    "no-jsonl-files": (_empty, "no .jsonl files under"),
    "unreadable-tar": (_bad_tar, "cannot unpack"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_names_the_problem_and_writes_nothing(case, repo, mod, capsys):
    store, back = repo
    make, phrase = CASES[case]
    make(back)
    before = _hashes(store)
    assert mod.main([str(back)]) == 1
    err = capsys.readouterr().err
    assert phrase in err and "REFUSED, nothing written" in err, err
    assert _hashes(store) == before  # byte for byte, every stored file


def test_a_missing_source_folder_is_an_error(repo, mod, tmp_path, capsys):
    store, _ = repo
    before = _hashes(store)
    assert mod.main([str(tmp_path / "nowhere")]) == 1
    assert "is not a folder" in capsys.readouterr().err
    assert _hashes(store) == before


def test_the_write_waits_for_the_stores_lock(repo, mod):
    # A runner holding speedrun.jsonl's lock (mid-append) delays the ingest; it writes after.
    store, back = repo
    (back / "speedrun.jsonl").write_text(_rows("a", "b", "c"))
    before = _hashes(store)
    result = {}
    with ResultStore("speedrun", "h200", store.parent).locked():
        t = threading.Thread(target=lambda: result.setdefault("rc", mod.main([str(back)])))
        t.start()
        time.sleep(0.5)
        assert t.is_alive() and _hashes(store) == before, "the ingest wrote while another writer held the lock"
    t.join(timeout=30)
    assert result["rc"] == 0 and _keys(store / "speedrun.jsonl") == ["a", "b", "c"]


def test_a_failed_replace_leaves_the_stored_file(repo, mod, monkeypatch):
    store, back = repo
    (back / "speedrun.jsonl").write_text(_rows("a", "b", "c"))
    before = _hashes(store)

    def crash(src, dst):
        raise OSError("disk full while replacing")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        mod.main([str(back)])
    monkeypatch.undo()
    assert _hashes(store) == before and not list(store.glob(".*.tmp"))


def test_dry_run_checks_and_writes_nothing(repo, mod, capsys):
    store, back = repo
    (back / "speedrun.jsonl").write_text(_rows("a", "b", "c"))
    before = _hashes(store)
    assert mod.main([str(back), "--dry-run"]) == 0
    assert "speedrun.jsonl: 2 -> 3 rows" in capsys.readouterr().out and _hashes(store) == before


def test_the_committed_results_pass_every_check(mod, tmp_path, monkeypatch):
    # Every committed file is a known suite file of valid, keyed rows of its folder's device:
    # ingesting a folder onto a copy of itself changes nothing.
    for folder in sorted((ROOT / "data" / "results").iterdir()):
        if not folder.is_dir() or folder.name == "cpu":
            continue
        repo = tmp_path / folder.name / "repo"
        shutil.copytree(folder, repo / "data" / "results" / folder.name)
        monkeypatch.setattr(mod, "ROOT", repo)
        before = _hashes(repo / "data" / "results" / folder.name)
        assert mod.main([str(folder), "--gpu", folder.name]) == 0
        assert _hashes(repo / "data" / "results" / folder.name) == before


def test_known_files_come_from_the_runner_and_the_convergence_suites(mod):
    from ftlib.harness.studies import SUITE_ORDER
    from ftlib.harness.suites import SUITES

    assert set(SUITE_ORDER) <= mod.KNOWN_STEMS and "speedrun-repeat" in mod.KNOWN_STEMS
    assert set(SUITES) - {"fig5"} <= mod.KNOWN_STEMS and "fig5" not in mod.KNOWN_STEMS  # fig5 -> tsweep
    assert {"kernels", "engine_check", "profile", "ddp", "engine_probe"} <= mod.KNOWN_STEMS


@pytest.mark.parametrize("name", ["NVIDIA H200", "Tesla T4", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"])
def test_device_names_map_to_folders_as_device_slug_does(name, mod, monkeypatch):
    import ftlib.core.device as device

    monkeypatch.setattr(device, "device_name", lambda dev: name)
    assert mod.slug_of_name is device.slug_of_name  # one rule, in ftlib.core.device
    assert mod.slug_of_name(name) == device.device_slug("cuda")


def test_tars_unpack_safely_where_python_has_no_data_filter(repo, mod, tmp_path, monkeypatch):
    # Pythons before PEP 706's filters (3.11.0-3.11.3, 3.10.0-3.10.11) take the same path: plain files in,
    # a link or a path out of the archive refused.
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    store, back = repo
    (tmp_path / "speedrun.jsonl").write_text(_rows("a", "b", "c"))
    with tarfile.open(back / "results.tar", "w") as t:
        t.add(tmp_path / "speedrun.jsonl", arcname="speedrun.jsonl")
    assert mod.main([str(back), "--dry-run"]) == 0
    evil = tmp_path / "evil"
    evil.mkdir()
    with tarfile.open(evil / "results.tar", "w") as t:
        t.add(tmp_path / "speedrun.jsonl", arcname="../speedrun.jsonl")
    assert mod.main([str(evil)]) != 0
    link = tarfile.TarInfo("kernels.jsonl")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with tarfile.open(evil / "results.tar", "w") as t:
        t.addfile(link)
    assert mod.main([str(evil)]) != 0


def test_an_older_copy_of_the_probe_file_does_not_undo_newer_rows(repo, mod):
    # A GPU runner's results.tar packs the tree's engine_probe.jsonl as it was when the run started; the
    # probe rows ingested since then are newer and stay.
    store, back = repo
    new = [{"key": "p", "v": 2, "device": "NVIDIA H200", "date": "2026-12-04T16:45:00Z"}]
    (store / "engine_probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new))
    old = [{"key": "p", "v": 1, "device": "NVIDIA H200", "date": "2026-12-04T14:47:00Z"},
           {"key": "s", "v": 5, "device": "NVIDIA H200", "date": "2026-12-04T14:47:00Z"}]
    (back / "engine_probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    assert mod.main([str(back)]) == 0
    probe = {r["key"]: r["v"] for r in map(json.loads, (store / "engine_probe.jsonl").read_text().splitlines())}
    assert probe == {"p": 2, "s": 5}
