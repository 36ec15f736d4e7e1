"""ci/ingest-results: returned device rows replace the committed ones only if nothing is lost."""

import importlib.machinery
import importlib.util
import json
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    loader = importlib.machinery.SourceFileLoader("ingest_results", str(ROOT / "ci" / "ingest-results"))
    spec = importlib.util.spec_from_loader("ingest_results", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _rows(*keys):
    return "".join(json.dumps({"key": k, "v": i}) + "\n" for i, k in enumerate(keys))


def test_appended_rows_from_nested_tars_are_taken_and_rewrites_refused(tmp_path, monkeypatch):
    mod = _module()
    repo = tmp_path / "repo"
    store = repo / "data" / "results" / "h200"
    store.mkdir(parents=True)
    (store / "speedrun.jsonl").write_text(_rows("a", "b"))
    (store / "engine.jsonl").write_text(_rows("x", "y"))
    (store / "engine_probe.jsonl").write_text(_rows("p", "q"))
    monkeypatch.setattr(mod, "ROOT", repo)
    back = tmp_path / "back"
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "speedrun.jsonl").write_text(_rows("a", "b", "c"))  # two stored rows, one new
    (inner / "engine.jsonl").write_text(_rows("x"))  # lost a row: refused
    with tarfile.open(tmp_path / "results.tar", "w") as t:
        for p in inner.iterdir():
            t.add(p, arcname=p.name)
    back.mkdir()
    with tarfile.open(back / "res.tar", "w") as t:
        t.add(tmp_path / "results.tar", arcname="results.tar")
    (back / "engine_probe.jsonl").write_text(json.dumps({"key": "q", "v": 9}) + "\n" + json.dumps({"key": "r"}) + "\n")
    assert mod.main([str(back)]) == 1  # the engine file was refused
    assert [json.loads(x)["key"] for x in (store / "speedrun.jsonl").read_text().splitlines()] == ["a", "b", "c"]
    assert (store / "engine.jsonl").read_text() == _rows("x", "y")
    probe = [json.loads(x) for x in (store / "engine_probe.jsonl").read_text().splitlines()]
    assert [r["key"] for r in probe] == ["p", "q", "r"] and probe[1]["v"] == 9


def test_a_file_returned_twice_resolves_to_its_longest_copy(tmp_path, monkeypatch):
    # kernels.jsonl copied next to results.tar, which packs the older copy: the longer one wins
    # whichever is unpacked last; copies that disagree stop the ingest.
    mod = _module()
    repo = tmp_path / "repo"
    store = repo / "data" / "results" / "h200"
    store.mkdir(parents=True)
    (store / "kernels.jsonl").write_text(_rows("a"))
    monkeypatch.setattr(mod, "ROOT", repo)
    back, inner = tmp_path / "back", tmp_path / "inner"
    back.mkdir()
    inner.mkdir()
    (inner / "kernels.jsonl").write_text(_rows("a"))
    with tarfile.open(back / "results.tar", "w") as t:
        t.add(inner / "kernels.jsonl", arcname="kernels.jsonl")
    (back / "kernels.jsonl").write_text(_rows("a", "b", "c"))
    assert mod.main([str(back)]) == 0
    assert [json.loads(x)["key"] for x in (store / "kernels.jsonl").read_text().splitlines()] == ["a", "b", "c"]
    (back / "kernels.jsonl").write_text(_rows("z", "b", "c"))
    try:
        mod.main([str(back)])
    except ValueError as e:
        assert "disagree" in str(e)
    else:
        raise AssertionError("disagreeing copies were ingested")
