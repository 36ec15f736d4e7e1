"""The benchmarks/kernels check-then-time drivers pass their checks in --check-only mode, and the harness's
rows, deadline and suite behave.

The driver checks are kernel tests (tests/conftest.py): the drivers pick CUDA when it is there
(compiled, at their GPU sizes) and the Triton interpreter at tiny sizes otherwise. The harness
tests check the CPU path's rows (interpreter timing, graph rows skipped) and need the interpreter.
"""

import importlib

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "cross_entropy", "adamw", "attention", "residual_norm",
                                "bias_grad", "causal_softmax", "kv_split_sum", "wgrad",
                                "attention_kv_split", "explicit_attention", "head_loss",
                                "embedding_sum"])
@pytest.mark.kernels
def test_dev_driver_checks_pass(op, capsys):
    mod = importlib.import_module(f"benchmarks.kernels.{op}_dev")
    rc = mod.main(["--check-only"])
    out = capsys.readouterr().out
    # The driver's lines (each variant's error and tolerance) are the failure message: a run cut
    # short before pytest's captured-output sections still shows which variant failed and by how much.
    assert rc == 0 and "OK" in out and "FAIL" not in out and "ERROR" not in out, \
        f"{op} driver exited {rc}:\n{out}"


ROW_FIELDS = ("key", "bench", "op", "variant", "impl", "case", "shape", "dtype", "precision", "timing", "status",
              "note", "median_us", "p20_us", "p80_us", "n_reps", "timer", "bytes", "flops", "bound", "gb_s",
              "tflop_s", "peak", "frac_peak", "check_err", "check_tol", "check_ok", "device_slug", "device",
              "torch", "triton", "date", "commit")


@pytest.fixture()
def store(tmp_path, cpu_interpreter):
    from ftlib.harness.results import ResultStore

    return ResultStore("kernels", "cpu", tmp_path)


def test_driver_rows_are_tidy_and_resumable(store):
    from benchmarks.kernels._harness import Recorder
    from benchmarks.kernels.rmsnorm_dev import main

    rec = Recorder(store=store)
    assert main(["--reps", "1"], rec) == 0
    rows = store.rows()
    assert rows == rec.rows and len(rows) == 2 * 8 * 2  # 2 dtypes x 8 variants x (eager, graph)
    for r in rows:
        assert set(ROW_FIELDS) <= set(r), set(ROW_FIELDS) - set(r)
        assert r["op"] == "rmsnorm" and r["shape"] == {"M": 37, "N": 256} and r["bench"] == "kernels"
    assert len({r["key"] for r in rows}) == len(rows)
    by = {(r["variant"], r["dtype"], r["timing"]): r for r in rows}
    e = by[("v3 triton", "fp32", "eager")]
    assert e["status"] == "ok" and e["check_ok"] and e["check_err"] <= e["check_tol"] == 1e-5
    assert e["p20_us"] <= e["median_us"] <= e["p80_us"] and e["bytes"] == 5 * 37 * 256 * 4
    assert e["gb_s"] == pytest.approx(e["bytes"] / (e["median_us"] * 1e-6) / 1e9)
    assert e["bound"] == "memory" and e["timer"].startswith("perf-counter") and e["peak"] is None
    assert by[("v3 triton", "bf16", "eager")]["bytes"] == 5 * 37 * 256 * 2
    g = by[("v3 triton", "fp32", "graph")]
    assert g["status"] == "skipped" and "CUDA graphs need a GPU" in g["note"] and g["median_us"] is None
    assert by[("v2 torch.compile", "fp32", "eager")]["status"] == "skipped"
    # a second run finds every key stored and measures nothing
    rec2 = Recorder(store=store)
    assert main(["--reps", "1"], rec2) == 0
    assert rec2.rows == [] and len(store.rows()) == len(rows)


def test_a_fresh_run_times_stored_variants_again_under_its_own_keys(store, monkeypatch):
    from benchmarks.kernels._harness import Recorder
    from benchmarks.kernels.embedding_sum_dev import main
    from ftlib.harness import provenance

    assert main(["--reps", "1", "--variants", "v6 v3 with relaxed atomic adds"],
                Recorder(store=store)) == 0
    first = store.rows()
    assert len(first) == 2 and {r["keyed_run"] for r in first} == {None}
    for run in ("run-a", "run-b"):
        monkeypatch.setenv("FTLIB_RUN_ID", run)
        provenance.run_id.cache_clear()
        rec = Recorder(store=store)
        assert main(["--reps", "1", "--fresh"], rec) == 0
        # every variant again, the stored one too, each row keyed apart from the first run's
        assert {r["variant"] for r in rec.rows} == {r["variant"] for r in store.rows()} and len(rec.rows) == 16
        assert {r["run_id"] for r in rec.rows} == {r["keyed_run"] for r in rec.rows} == {run}
        assert not {r["key"] for r in rec.rows} & {r["key"] for r in first}
    provenance.run_id.cache_clear()
    assert len(store.rows()) == 2 + 2 * 16 and len({r["key"] for r in store.rows()}) == 34
    # the same fresh run resumed finds its own rows stored
    monkeypatch.setenv("FTLIB_RUN_ID", "run-b")
    rec = Recorder(store=store)
    assert main(["--reps", "1", "--fresh"], rec) == 0 and rec.rows == []
    provenance.run_id.cache_clear()


def test_no_variant_starts_after_the_deadline(store):
    from benchmarks.kernels._harness import Recorder
    from benchmarks.kernels.cross_entropy_dev import main

    rec = Recorder(store=store, deadline=0.0)  # time.monotonic() is already past it
    main(["--reps", "1"], rec)
    assert rec.stopped and rec.rows == [] and store.rows() == []


def test_a_failed_check_is_a_row_without_timing(store):
    import torch

    from benchmarks.kernels._harness import Recorder, Variant, parse_args, run

    args = parse_args("", ["--reps", "1"], Recorder(store=store))
    x = torch.ones(8)
    ok = run("fake op", args, torch.device("cpu"), lambda: x,
             [Variant("v1 right", lambda: x.clone(), 1e-6), Variant("v2 wrong", lambda: x * 1.01, 1e-6)],
             work=64.0, unit="GB/s", op="fake", shape={"n": 8}, dtype=torch.float32)
    assert not ok
    by = {(r["variant"], r["timing"]): r for r in store.rows()}
    assert by[("v1 right", "eager")]["status"] == "ok" and by[("v1 right", "eager")]["median_us"] > 0
    bad = by[("v2 wrong", "eager")]
    assert bad["status"] == "check_failed" and bad["median_us"] is None and bad["check_ok"] is False
    assert bad["check_err"] == pytest.approx(0.01, rel=1e-3)


def test_suite_measures_ceilings_and_drivers(store):
    from benchmarks.kernels.suite import run_suite

    rows = run_suite("cpu", store, ops=["ceilings", "cross_entropy"], cpu_reps=1)
    ceil = {r["variant"]: r for r in rows if r["op"] == "ceiling"}
    assert set(ceil) == {"copy", "matmul fp32", "matmul tf32", "matmul bf16"}
    assert all(r["status"] == "ok" and r["check_ok"] for r in ceil.values())
    assert ceil["copy"]["bytes"] == 2 * ceil["copy"]["shape"]["bytes"] and ceil["copy"]["gb_s"] > 0
    n = ceil["matmul fp32"]["shape"]["M"]
    assert ceil["matmul fp32"]["flops"] == 2 * n**3 and ceil["matmul bf16"]["precision"] == "bf16"
    assert {r["op"] for r in rows} == {"ceiling", "cross_entropy"}
    with pytest.raises(ValueError, match="unknown kernel suite driver"):
        run_suite("cpu", store, ops=["nope"])


@pytest.mark.kernels
def test_matmul_driver_checks_every_precision(capsys):
    """The GEMM driver runs kernels/linear.py's tile kernel at a fixed config against fp64."""
    from benchmarks.kernels.matmul_dev import main

    assert main(["--check-only"]) == 0
    out = capsys.readouterr().out
    for variant in ("v3 triton ieee", "v4 triton tf32x3", "v5 triton tf32"):
        assert variant in out
    assert "FAIL" not in out


@pytest.mark.kernels
def test_the_attention_tile_sweep_checks_each_tile_against_the_reference(capsys):
    """On the CPU every tile of the interpreter's grid; on a GPU the default tile of each pass (the
    full sweep is a measurement, run with --record)."""
    import torch

    from benchmarks.kernels import attention_tiles_dev as mod

    names = [f"{p} {mod.tile_name((64, 64, 4, 2))}" for p in ("fwd", "bwd")] if torch.cuda.is_available() else []
    rc = mod.main(["--check-only"] + (["--variants", ",".join(names)] if names else []))
    out = capsys.readouterr().out
    assert rc == 0 and "FAIL" not in out and "ERROR" not in out, out
    assert out.count(" OK") == (len(names) or 2 * len(mod.CPU_GRID)), out


@pytest.mark.kernels
def test_the_explicit_attention_tile_sweep_checks_each_tile_against_the_reference(capsys):
    """GPT-2's explicit-attention kernels, bf16 and tf32: on the CPU every tile of the interpreter's grid; on a
    GPU the default tile of each pass (the full sweep is a measurement, run with --record)."""
    import torch

    from benchmarks.kernels import explicit_tiles_dev as mod

    names = []
    if torch.cuda.is_available():
        from kernels.explicit_attention import one_pass_tiles

        names = [f"{p} {t}" for p in ("fwd", "bwd") for t in (mod.tile_name((64, 64, 4, 2)),
                                                              f"one-pass {one_pass_tiles(256).name}")]
        names.append(mod.dkdv_variants()[2])  # the engine's dQ kernel with one other dK/dV tile
    rc = mod.main(["--check-only"] + (["--variants", ",".join(names)] if names else []))
    out = capsys.readouterr().out
    assert rc == 0 and "FAIL" not in out and "ERROR" not in out, out
    assert "one-pass" in out
    per_pass = len(mod.CPU_GRID) + len(mod.ONE_PASS_CPU)  # the two-pass tiles and the one-pass ones
    # backward also: the one-pass dQ kernel with the dK/dV kernel at each grid tile (none is the launcher's default)
    assert out.count(" OK") == 2 * (len(names) or 2 * per_pass + len(mod.CPU_GRID)), out  # two precisions
    assert (names[-1] if names else "+ dkdv 16x16 w4 s2") in out
    # ci/gpu-plan's explicit-dkdv step: the launcher's default, the engine's, and each other dK/dV tile of the grid
    gpu = mod.dkdv_variants()
    assert gpu[:2] == ["bwd 64x64 w4 s2", "bwd one-pass 64x256 w4 s1"] and len(set(gpu)) == len(mod.GPU_GRID) + 1
    assert "bwd one-pass 64x256 w4 s1 + dkdv 128x64 w8 s3" in gpu
    assert not any(n.endswith("+ dkdv 64x64 w4 s2") for n in gpu)


@pytest.mark.kernels
def test_the_norm_backward_grid_sweep_checks_each_grid_against_the_reference(capsys):
    """On the CPU every grid of the interpreter's lists (a pipelined loop among them); on a GPU the old tile
    partials, the default grid and the default grid pipelined (the full sweep is a measurement, run with
    --record)."""
    import torch

    from benchmarks.kernels import norm_bwd_grid_dev as mod

    names = ["tile partials + sum", "atomic 4 rows 4/SM", "atomic 8 rows 4/SM s2"] if torch.cuda.is_available() else []
    rc = mod.main(["--check-only"] + (["--variants", ",".join(names)] if names else []))
    out = capsys.readouterr().out
    assert rc == 0 and "FAIL" not in out and "ERROR" not in out, out
    assert out.count(" OK") == (len(names) or 1 + len(mod.CPU_GRID) + len(mod.CPU_PIPELINED)), out
    assert names or "atomic 8 rows 2/SM s2" in out


@pytest.mark.kernels
def test_the_gelu_mlp_driver_checks_the_fused_mlp_against_the_reference(capsys):
    from benchmarks.kernels.gelu_mlp_dev import main

    assert main(["--check-only"]) == 0
    out = capsys.readouterr().out
    assert "v3 triton GELU epilogues" in out and "FAIL" not in out and "ERROR" not in out, out


def test_the_bias_gradient_driver_labels_its_triton_variants_triton(store):
    """v3-v8 run kernels/bias_linear.py's Triton column sum, whatever their tiles and destination, and g3-g7 its
    GELU-backward form: each row says so."""
    from benchmarks.kernels._harness import Recorder
    from benchmarks.kernels.bias_grad_dev import main

    rec = Recorder(store=store)
    assert main(["--reps", "1"], rec) == 0
    impls = {r["variant"].split()[0]: r["impl"] for r in rec.rows}
    assert impls == {"v1": "pytorch", "v2": "compile", "v3": "triton", "v4": "triton", "v5": "triton",
                     "v6": "triton", "v7": "triton", "v8": "triton",
                     "g1": "pytorch", "g2": "compile", **{f"g{i}": "triton" for i in range(3, 8)}}
