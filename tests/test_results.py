"""ftlib.harness.results: clear errors for damaged files, file permissions, and the store's promises under
concurrency and crashes (every file parses; no row lost or duplicated).

The multi-process tests load ftlib/harness/results.py by path in fresh interpreters (it imports only
the standard library), so a writer starts in a few milliseconds instead of importing torch.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlib.harness.results import ResultsFileError, ResultStore, load_rows

RESULTS_PY = Path(__file__).resolve().parent.parent / "ftlib" / "harness" / "results.py"
# A writer process: appends rows "<tag>-0", "<tag>-1", ... (n of them; forever when n < 0),
# each padded with `pad` bytes so that a rewrite takes long enough for writers to overlap
# and for a kill to land inside one.
WRITER = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("results_under_test", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    store = mod.ResultStore("prop", "cpu", sys.argv[2])
    tag, n, pad = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    i = 0
    while n < 0 or i < n:
        store.append({"key": f"{tag}-{i}", "writer": tag, "i": i, "pad": "x" * pad})
        i += 1
""")


def _writer(root: Path, tag: str, n: int, pad: int = 4000) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(RESULTS_PY), str(root), tag, str(n), str(pad)])


def _lines_parse(path: Path) -> list[dict]:
    """Every line of the file is a JSON object and the file ends with a newline."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the file does not end with a newline"
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


# --- damaged files and permissions ------------------------------------------------------------------------------

def test_a_damaged_line_names_the_file_and_the_line(tmp_path):
    store = ResultStore("fig1", "h200", tmp_path)
    for k in ("a", "b"):
        store.append({"key": k, "status": "ok"})
    with open(store.path, "a") as f:
        f.write('{"key": "c", "status": "o')  # a torn last line
    with pytest.raises(ResultsFileError) as e:
        store.rows()
    msg = str(e.value)
    assert str(store.path) in msg and "line 3" in msg and "git checkout" in msg
    assert e.value.lineno == 3 and e.value.path == store.path
    assert isinstance(e.value, ValueError)  # callers that catch ValueError still do
    with pytest.raises(ResultsFileError, match="line 3"):
        load_rows("fig1", root=tmp_path)
    store.path.write_text('{"key": "a"}\n[1, 2]\n')
    with pytest.raises(ResultsFileError, match="line 2: a JSON list, not an object"):
        store.rows()


def test_new_result_files_are_readable_by_others_and_keep_their_mode(tmp_path):
    store = ResultStore("fig1", "h200", tmp_path)
    store.append({"key": "a"})
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o644
    store.path.chmod(0o664)
    store.append({"key": "b"})
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o664


def test_a_last_line_without_its_newline_is_repaired_by_the_next_append(tmp_path):
    store = ResultStore("fig1", "h200", tmp_path)
    store.path.parent.mkdir(parents=True)
    store.path.write_text('{"key": "a", "v": 1}')  # written by hand or another tool: no newline
    store.append({"key": "b", "v": 2})
    assert [r["key"] for r in _lines_parse(store.path)] == ["a", "b"]
    assert [r["key"] for r in store.rows()] == ["a", "b"]


# --- random appends (hypothesis) ---------------------------------------------------------------------------------

def _stored(v):
    """What a value reads back as: JSON has no NaN or infinity (stored as null), tuples are lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _stored(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_stored(x) for x in v]
    return v


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
ROWS = st.lists(
    st.fixed_dictionaries({"key": st.text(min_size=1, max_size=12)},
                          optional={"status": st.sampled_from(["ok", "error"]), "x": VALUES, "y": VALUES}),
    min_size=1, max_size=8,
)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=ROWS)
def test_random_appends_read_back_in_order(rows):
    with tempfile.TemporaryDirectory() as root:
        store = ResultStore("prop", "cpu", root)
        for r in rows:
            store.append(r)
        back = _lines_parse(store.path)
        assert back == [_stored(r) for r in rows] == store.rows()
        assert store.latest() == {r["key"]: _stored(r) for r in rows}  # the last row of a key wins


# --- concurrent writers and a killed writer -----------------------------------------------------------------------

def test_concurrent_writers_lose_and_duplicate_no_row(tmp_path):
    n_writers, n_rows = 4, 25
    procs = [_writer(tmp_path, f"w{j}", n_rows) for j in range(n_writers)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    rows = _lines_parse(ResultStore("prop", "cpu", tmp_path).path)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)) == n_writers * n_rows, f"{n_writers * n_rows - len(set(keys))} rows lost"
    for j in range(n_writers):  # each writer's rows in its own order
        assert [r["i"] for r in rows if r["writer"] == f"w{j}"] == list(range(n_rows))


def test_a_writer_killed_mid_write_leaves_a_readable_file_and_the_lock_free(tmp_path):
    # Large rows (the file grows by 200 kB a row), so that most kills land inside a rewrite;
    # each kill at a random moment once the victim has written a row.
    rng = random.Random(0)
    store = ResultStore("prop", "cpu", tmp_path)
    kills = 5
    for attempt in range(kills):
        victim, other = _writer(tmp_path, f"k{attempt}", -1, pad=200_000), _writer(tmp_path, f"o{attempt}", 10)
        deadline = time.monotonic() + 60
        while not store.path.exists() or f'"k{attempt}-0"'.encode() not in store.path.read_bytes():
            assert time.monotonic() < deadline, "the writer wrote nothing"
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        assert other.wait(timeout=120) == 0  # the killed writer's lock died with it
    store.append({"key": "after", "i": 0, "writer": "main"})
    rows = _lines_parse(store.path)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)), "a row was written twice"
    for attempt in range(kills):
        killed = [r["i"] for r in rows if r["writer"] == f"k{attempt}"]
        assert killed == list(range(len(killed))) and len(killed) >= 1  # a prefix, no gap
        assert [r["i"] for r in rows if r["writer"] == f"o{attempt}"] == list(range(10))
    assert keys[-1] == "after"


def test_my_results_are_added_to_the_stored_ones(tmp_path, monkeypatch):
    """FTLIB_MY_RESULTS receives new rows and the views read it beside the stored results; a key in
    both counts once. FTLIB_RESULTS_DIR still replaces the stored results."""
    from ftlib.harness.results import ResultStore, device_folders, load_rows

    stored, mine = tmp_path / "stored", tmp_path / "mine"
    ResultStore("baselines", "h200", stored).append({"key": "a", "v": 1})
    ResultStore("baselines", "h200", stored).append({"key": "b", "v": 1})
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(stored))
    monkeypatch.setenv("FTLIB_MY_RESULTS", str(mine))
    ResultStore("baselines", "t4").append({"key": "c", "v": 2})  # a new row goes to the reader's folder
    ResultStore("baselines", "h200").append({"key": "b", "v": 3})
    assert (mine / "t4" / "baselines.jsonl").exists() and not (stored / "t4").exists()
    got = {(r["device_slug"], r["key"]): r["v"] for r in load_rows("baselines")}
    assert got == {("h200", "a"): 1, ("h200", "b"): 3, ("t4", "c"): 2}
    assert device_folders() == ["h200", "t4"]
    (mine / "a100").mkdir()
    (mine / "a100" / "baselines.lock").touch()  # a folder with only a lock left behind holds no results
    assert device_folders() == ["h200", "t4"]
    ResultStore("baselines", "cpu").append({"key": "d", "v": 4})  # a reader's CPU smoke run (ci/run-book)
    assert device_folders() == ["h200", "t4"] and device_folders(include_cpu=True) == ["cpu", "h200", "t4"]
    assert ("cpu", "d") in {(r["device_slug"], r["key"]) for r in load_rows("baselines", include_cpu=True)}
    monkeypatch.delenv("FTLIB_MY_RESULTS")
    assert {r["key"] for r in load_rows("baselines")} == {"a", "b"}
