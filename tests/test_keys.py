"""Result keys stay what they were: every committed row's key recomputed from its own fields, and
the catalogue (suites, convergence runs, profiles, DDP, engine checks) giving the keys it gave when
``tests/fixtures/catalogue_keys.json`` was written. A stored row is found again only by its key, so a
key that moved would make a runner measure it again and a view lose it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from ftlib.harness.bench.step import key_extra
from ftlib.harness.convergence import run_key
from ftlib.harness.ddp_bench import ddp_key
from ftlib.harness.engine_check import CHECKS, check_key
from ftlib.harness.profiling import PROFILE_MODES, profile_key
from ftlib.harness.results import device_folders, row_key
from ftlib.harness.studies import suites
from ftlib.harness.suites import SUITES, smoke_cases
from ftlib.model.config import ModelConfig, preset
from ftlib.training.trainer import Recipe

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = json.loads((ROOT / "tests" / "fixtures" / "catalogue_keys.json").read_text())
STEP_BENCHES = ("baselines", "engine", "engine_candidates", "grid", "grid_compile", "ladder", "tsweep", "compile_time",
                "compile_max")


def _stored() -> list[tuple[str, dict]]:
    out = []
    # The committed rows: device_folders leaves out a reader's own CPU rows (data/results/cpu, ignored by git).
    base = ROOT / "data" / "results"
    for path in sorted(p for dev in device_folders(base) for p in (base / dev).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append((path.stem, json.loads(line)))
    return out


def _recipe(d: dict) -> Recipe:
    d = dict(d)
    d["betas"] = tuple(d["betas"])
    d["engine_options"] = tuple(tuple(o) for o in d.get("engine_options", ()))
    return Recipe(**d)


def recomputed_key(stem: str, r: dict) -> str | None:
    """The key a row's own fields give, or None where they cannot (rows stored without ``extra``)."""
    if stem in STEP_BENCHES:
        assert ModelConfig(**r["config"]).config_hash() == r["config_hash"]
        return row_key(r["bench"], r["config_hash"], r["B"], r["T"], r["mode"], r["precision"],
                       key_extra(r.get("optimizer_kind") or "default", r.get("extra")))
    if stem == "engine_check":
        return None if "extra" not in r else row_key("engine_check", r["config_hash"], r["B"], r["T"], "engine",
                                                     r["precision"], r["extra"])
    if stem == "kernels":
        ident = {"bench": "kernels", "op": r["op"], "variant": r["variant"], "shape": r["shape"],
                 "dtype": r["dtype"], "timing": r["timing"], **({"run": r["keyed_run"]} if r.get("keyed_run") else {})}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    if stem == "engine_probe":
        return f"engine_probe|{r['label']}|{r['precision']}|B{r['B']}|T256" if r.get("status") == "ok" else None
    if stem == "profile":
        cfg = ModelConfig(**r["config"])
        assert cfg.config_hash() == r["config_hash"]
        return profile_key(cfg, r["B"], r["T"], r["precision"], r["mode"], r["preset"])
    if stem.startswith(("speedrun", "convergence")):
        cfg = ModelConfig(**r["config"])
        assert cfg.config_hash() == r["config_hash"]
        return run_key("speedrun" if stem == "speedrun-repeat" else stem, cfg, _recipe(r["recipe"]), r.get("target"))
    raise AssertionError(f"no key rule for {stem}.jsonl: add one here")


def test_every_stored_key_is_recomputed_from_its_row():
    checked = 0
    for stem, r in _stored():
        want = recomputed_key(stem, r)
        if want is None:
            continue
        # A repeat carries its first run's key plus '-repeat1' (older repeats: the first run's key).
        allowed = {want, want + "-repeat1"} if stem == "speedrun-repeat" else {want}
        assert r["key"] in allowed, (stem, r.get("label") or r.get("model"), r["key"], want)
        checked += 1
    assert checked > 700


def test_step_suites_keep_their_case_keys():
    for name, keys in SNAPSHOT["step_suites"].items():
        assert [c.key(name) for c in SUITES[name].cases()] == keys, name
    for dev, keys in SNAPSHOT["smoke_cases"].items():
        assert [c.key("smoke") for c in smoke_cases(SUITES["baselines"].cases(), torch.device(dev))] == keys


@pytest.mark.parametrize("smoke", [False, True])
def test_convergence_runs_keep_their_keys(smoke):
    for bench, s in suites(smoke).items():
        want = SNAPSHOT["convergence"].get(f"{bench}{' (smoke)' if smoke else ''}", {})  # a new suite: no rows yet
        for name, (cfg, rec) in s["runs"].items():
            if name not in want:
                continue  # a candidate added since: no stored row to keep a key for
            seeds = tuple(s["seeds"]) + tuple(s.get("more_seeds", ()))
            got = [run_key(s.get("repeat_of") or bench, cfg, rec.replace(seed=seed), s["target"]) for seed in seeds]
            assert got == want[name], (bench, name)


def test_profile_ddp_and_engine_check_keys():
    for name in ("gpt2", "fasttransformer"):
        for kv in (None, "broadcast"):
            cfg = preset(name) if kv is None else preset(name, kv_layout=kv)
            for mode in PROFILE_MODES:
                for prec in ("fp32", "tf32", "bf16", "fp16"):
                    want = SNAPSHOT["profile"][f"{name} {kv} {mode} {prec}"]
                    assert profile_key(cfg, 32, 256, prec, mode, name) == want
        for ws in (1, 2, 4, 8):
            for mode in ("eager", "compile", "compile-ro"):
                assert ddp_key(preset(name), 32, 256, mode, "fp32", ws) == SNAPSHOT["ddp"][f"{name} {ws} {mode}"]
    checks = {f"{name} {prec} {json.dumps(opts, sort_keys=True)}": check_key(name, prec, opts, "RUN")
              for prec, name, opts in CHECKS}
    assert checks == SNAPSHOT["engine_check"]
