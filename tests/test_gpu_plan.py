"""ci/gpu-plan's plan handling without a GPU: arguments checked, steps that do not fit the budget not
started, steps an earlier call finished skipped, and what ran packed in plan.tar.gz either way (compressed: a device
call returns files of at most 16 MiB), which ci/ingest-plan unpacks."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "ci/gpu-plan", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _log(out: Path) -> str:
    assert (out / "plan.tar.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic number
    with tarfile.open(out / "plan.tar.gz") as tar:
        return tar.extractfile("./plan.log").read().decode()


def test_steps_that_do_not_fit_are_not_started_and_finished_ones_are_skipped(tmp_path):
    state = tmp_path / "done"
    state.write_text("kv-split\n")
    r = _plan("--out", str(tmp_path / "o"), "--budget-s", "0", "--state", str(state), "kv-split", "probe")
    assert r.returncode == 3, r.stdout + r.stderr  # a step left out is not a success
    log = _log(tmp_path / "o")
    assert "kv-split: done in an earlier call, skipped" in log
    assert re.search(r"probe: not started \(-?\d+ s left, it takes about 120 s\)", log), log
    assert state.read_text() == "kv-split\n"  # nothing new marked done
    assert not list((tmp_path / "o").glob("*.part"))  # the pack was finished and renamed


def test_ingest_plan_unpacks_the_compressed_plan(tmp_path):
    r = _plan("--out", str(tmp_path / "o"), "--budget-s", "0", "--state", str(tmp_path / "done"), "probe")
    assert r.returncode == 3, r.stdout + r.stderr
    r = subprocess.run(["bash", "ci/ingest-plan", str(tmp_path / "o"), "--keep", str(tmp_path / "u")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "probe: not started" in (tmp_path / "u" / "plan.log").read_text()
    assert "probe: not started" in r.stdout  # the plan log's tail is shown


def test_bad_plans_say_what_is_wrong(tmp_path):
    r = _plan("--out", str(tmp_path), "kv-split", "warp-speed")
    assert r.returncode == 2 and "unknown step warp-speed" in r.stderr
    r = _plan("kv-split")
    assert r.returncode == 2 and "--out DIR is required" in r.stderr
    r = _plan("--out", str(tmp_path), "--budget-s", "soon", "kv-split")
    assert r.returncode == 2 and "whole seconds" in r.stderr
    r = _plan("--out", str(tmp_path), "--repeats", "0", "baselines-bf16")
    assert r.returncode == 2 and "--repeats must be a positive integer, got 0" in r.stderr
    r = subprocess.run(["bash", "ci/ingest-plan", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "no plan.tar.gz or plan.tar" in r.stderr


def test_every_listed_step_has_an_estimate_and_a_command():
    text = (ROOT / "ci" / "gpu-plan").read_text()
    usage = text[text.index("Steps (estimated seconds"):text.index("Take the results in")]
    listed = dict(re.findall(r"^  ([a-z0-9-]+) .*?(\d+)$", usage, re.M))
    est = dict(re.findall(r"\[([a-z0-9-]+)\]=(\d+)", text))
    cases = text[text.index("run_step() {"):text.index("rc=0")]
    commands = {n for pat in re.findall(r"^    ([a-z0-9|-]+)\)", cases, re.M) for n in pat.split("|")}
    assert "profiles" in listed
    assert listed == est, (listed, est)
    assert set(listed) == commands, (set(listed) ^ commands)
