"""ftlib.views.engine on synthetic rows (tests/synthetic_results.py): tables and figures."""

from __future__ import annotations

import pytest
from synthetic_results import ENGINE_MS, VARIANT_MS, write_all

from ftlib.views import engine as engineview
from ftlib.views import engine_check, option_trials
from ftlib.views import engine_config as ec
from ftlib.views.bench import ok_rows


@pytest.fixture()
def rows(tmp_path, monkeypatch):
    monkeypatch.setenv("FTLIB_RESULTS_DIR", str(tmp_path / "results"))
    write_all(tmp_path / "results")
    return {b: ok_rows(b) for b in ("engine", "engine_check")}


def test_probe_table_groups_kernel_time_by_category(tmp_path, monkeypatch, rows):
    table = engineview.probe_table.rows(ok_rows("engine_probe"))
    assert [t["precision"] for t in table] == ["tf32", "bf16"]
    t = table[0]
    assert t["case"] == engineview.case_name(ok_rows("engine_probe")[0])  # in words, as the figures name it
    assert (t["matmul"], t["attention"], t["norms"], t["reductions (sums)"], t["optimizer"], t["other"]) == (
        900.0, 250.0, 100.0, 200.0, 20.0, 30.0)
    assert t["largest"] == "matmul" and t["largest share"] == pytest.approx(900 / 1500)
    assert engineview.probe_category("fmha_cutlassB_f32_aligned_64x64") == "attention"
    assert engineview.probe_category("Memcpy DtoD (Device -> Device)") == "copies and casts"


def test_kernel_deltas_read_each_model_and_precision_from_its_newest_run_with_ablations():
    """Not the run holding the most cases: a newer run with the default engine and a variant comes first, and
    a newer run with the default engine alone (no variant) does not replace it."""
    def row(label, ms, run, date, prec="bf16"):
        return {"device_slug": "h200", "label": label, "preset": label.split()[0], "precision": prec,
                "mode": "engine", "median_ms": ms, "p20_ms": ms - 0.01, "p80_ms": ms + 0.01, "B": 32, "T": 256,
                "run_id": run, "date": date, "commit": f"c-{run}"}

    old = [row("gpt2", 5.8, "r1", "2026-01-01"), row("gpt2 -layernorm", 6.0, "r1", "2026-01-01"),
           row("gpt2 no-kernels", 7.0, "r1", "2026-01-01"), row("gpt2", 9.0, "r1", "2026-01-01", "fp32"),
           row("gpt2 -layernorm", 9.5, "r1", "2026-01-01", "fp32")]
    new = [row("gpt2", 3.2, "r2", "2026-02-01"), row("gpt2 -layernorm", 3.3, "r2", "2026-02-01")]
    alone = [row("gpt2", 3.0, "r3", "2026-03-01")]
    table = engineview.kernel_deltas.rows(old + new + alone)
    bf16 = [d for d in table if d["precision"] == "bf16"]
    assert [(d["variant"], d["engine ms"], d["delta ms"]) for d in bf16] == [("-layernorm", 3.2, 0.1)]
    assert bf16[0]["run"] == "2026-02-01, commit c-r2 (run r2)" and bf16[0]["p20–p80 ms"] == "3.29–3.31"
    assert [d["engine ms"] for d in table if d["precision"] == "fp32"] == [9.0]  # fp32's newest is r1
    note = engineview.deltas_note(old + new + alone)
    assert "run of 2026-02-01, commit c-r2 (run r2)" in note and "not measured yet" in note
    assert "(run r2): GPT-2 bf16 ran an engine whose options were not recorded." in note  # the book's model name


def test_kernel_deltas_are_variant_minus_full_engine(rows):
    d = {(r["model"], r["variant"]): r for r in engineview.kernel_deltas.rows(rows["engine"])}
    full = ENGINE_MS[("fasttransformer", "fp32")]["engine"]
    assert set(d) == {(m, v) for m, vs in VARIANT_MS.items() for v in vs}
    assert d[("fasttransformer", "-rmsnorm")]["delta ms"] == pytest.approx(VARIANT_MS["fasttransformer"]["-rmsnorm"]
                                                                           - full)
    assert d[("gpt2", "+flash-attn")]["delta ms"] < 0  # the fused attention makes GPT-2's engine faster


def test_loss_table_and_figure(rows):
    t = engine_check.loss_table.rows(rows["engine_check"])
    assert len(t) == 4 and all(r["ok"] for r in t)
    assert max(r["max rel err"] for r in t if r["precision"] == "fp32") < 1e-5
    fig = engine_check.loss_figure(rows["engine_check"], "h200")
    curves = [tr for tr in fig.data if tr.y is not None and len(tr.y) > 1]
    assert len(curves) == 12  # 2 precisions x 2 models x (engine, reference, relative difference)
    assert all(len(tr.y) == 100 for tr in curves)
    assert len(fig.data) - len(curves) == 2  # the key to the line styles (engine, reference)
    # one legend entry per model, and each model one colour in every panel
    assert sorted(tr.name for tr in curves if tr.showlegend is not False) == ["FastTransformer", "GPT-2"]
    assert len({tr.line.color for tr in curves if tr.legendgroup == "gpt2"}) == 1
    # the figure grows with its legend: long option names take more rows than the models' names
    long = [dict(r, label=f"{r['label']} {'an_engine_option=True ' * 3}".strip()) for r in rows["engine_check"]]
    assert engine_check.loss_figure(long, "h200").layout.height > fig.layout.height
    assert "faded" not in fig.layout.title.text  # no option variant here, so no word about them
    variant = [dict(r, label="fasttransformer some_option=True") for r in rows["engine_check"]
               if r["label"] == "fasttransformer"]
    assert "the faded entry is an option variant," in engine_check.loss_figure(
        rows["engine_check"] + variant, "h200").layout.title.text


def test_nothing_stored_gives_empty_tables():
    assert engineview.kernel_deltas.rows([]) == [] and engine_check.loss_table.rows([]) == []


def test_latest_run_keeps_each_files_newest_complete_run():
    from ftlib.views.engine import latest_run

    def row(bench, label, ms, date, **kw):
        return {"bench": bench, "label": label, "precision": "fp32", "mode": "engine", "median_ms": ms,
                "date": date, **kw}

    rows = [row("engine", "ft", 9.0, "2026-01-01", commit="a"), row("engine", "gpt2", 9.5, "2026-01-01", commit="a"),
            row("engine", "ft", 3.0, "2026-02-01", commit="b", extra={"round": 2}),
            row("engine", "gpt2", 3.5, "2026-02-01", commit="b", extra={"round": 2}),
            row("engine", "ft", 2.0, "2026-03-01", run_id="r3"),  # newest, but cut short: incomplete
            row("engine_check", "ft", 7.0, "2026-01-01", commit="a")]
    kept = latest_run(rows)
    assert sorted(r["median_ms"] for r in kept) == [3.0, 3.5, 7.0]
    rows.append(row("engine", "gpt2", 2.5, "2026-03-01", run_id="r3"))  # now the newest run is complete
    assert sorted(r["median_ms"] for r in latest_run(rows)) == [2.0, 2.5, 7.0]


def test_a_run_of_the_whole_suite_is_complete_even_when_older_runs_held_more_cases(monkeypatch):
    """A suite that lost cases must not leave an older, larger run in front of a newer complete one."""
    import dataclasses

    from ftlib.harness.suites import SUITES
    from ftlib.views.engine import latest_run

    two = [dataclasses.replace(c, label=lab) for c, lab in zip(SUITES["engine"].cases()[:2], ("ft", "gpt2"))]
    monkeypatch.setitem(SUITES, "engine", dataclasses.replace(SUITES["engine"], make=lambda: two))

    def row(label, ms, date, run, precision=two[0].precision):
        return {"bench": "engine", "label": label, "precision": precision, "mode": "engine", "median_ms": ms,
                "date": date, "run_id": run}

    old = [row("ft", 3.0, "2026-01-01", "r1", two[0].precision), row("gpt2", 3.5, "2026-01-01", "r1", two[1].precision),
           row("dropped", 4.0, "2026-01-01", "r1")]
    new = [row("ft", 2.0, "2026-02-01", "r2", two[0].precision), row("gpt2", 2.5, "2026-02-01", "r2", two[1].precision)]
    assert sorted(r["median_ms"] for r in latest_run(old + new)) == [2.0, 2.5]
    assert sorted(r["median_ms"] for r in latest_run(old + new[:1])) == [3.0, 3.5, 4.0]  # r2 cut short


@pytest.mark.parametrize("label, name", [("fasttransformer", "engine"), ("fasttransformer -rmsnorm", "-rmsnorm"),
                                         ("fasttransformer engine -rmsnorm", "-rmsnorm"),
                                         ("fasttransformer, 3xTF32 attention", "3xTF32 attention"),
                                         ("gpt2 +flash-attn persistent norm dw", "+flash-attn persistent norm dw")])
def test_variant_names_of_new_and_older_labels(label, name):
    preset = label.split()[0].rstrip(",")
    assert engineview.variant_name({"label": label, "preset": preset}) == name


def test_options_behind_names_rows_that_ran_without_todays_defaults():
    mqa, mha = {"n_head": 8, "n_kv_head": 1}, {"n_head": 8, "n_kv_head": 8}

    def row(run, cfg, extra=None, **ran):
        return {"mode": "engine", "device_slug": "h200", "run_id": run, "config": cfg, "extra": extra or {},
                "engine": {"grad_into_buffer": True, "fuse_kv_split_sum": True, "norm_dw_into_buffer": True,
                           "norm_bwd_grid": "8 rows 4/SM", "first_norm_into_buffer": True,
                           "attention_bwd_streams": True, "attention_kv_split": 2, "fuse_embedding": True,
                           "relaxed_atomics": True, "fuse_head_loss": True,
                           "attention_heavy_first": True, "explicit_heavy_first": True, **ran}}

    rows = [row("a", mqa, grad_into_buffer=False, fuse_kv_split_sum=False),
            row("b", mha, grad_into_buffer=False, fuse_kv_split_sum=False),  # MHA: no split to sum
            row("c", mqa),  # as the engine runs now
            row("d", mqa, {"grad_into_buffer": False}, grad_into_buffer=False),  # an ablation that set it off
            {**row("e", mqa), "engine": {}},  # stored before either option existed: ran without both
            {**row("f", mqa, grad_into_buffer=False), "mode": "compile-ro"},  # not an engine row
            # the residual-norm left unfused: the norms' atomic weight gradients have no kernel to live in
            row("g", mqa, fuse_residual_norm=False, norm_dw_into_buffer=False, norm_bwd_grid=None),
            row("h", mqa, norm_bwd_grid=None),  # the atomic adds on the launcher's grid, not the default's
            row("i", mqa, attention_kv_split=None),  # the dK/dV kernel on the launcher's split
            row("j", mha, attention_kv_split=None),  # MHA: one query head per K/V head, nothing to split
            row("k", mqa, fuse_embedding=False),  # the embeddings unfused
            row("l", mqa, fuse_embedding=False, kernels=[])]  # no embedding kernel: nothing to fuse
    (line,) = ec.options_behind(rows).splitlines()  # one device: one line, every option in it
    items = line.split("on lines of their own: ")[1].rstrip(".").split(", ")
    assert len(items) == 9
    # e; wgrad_side_stream, fuse_head_loss and explicit_heavy_first in none: these rows name no precision, and they
    # apply under bf16/fp16 only
    assert items[0] == "`attention_bwd_streams` in 1 run"
    assert items[1] == "`attention_heavy_first` in 1 run"  # e
    assert items[2] == "`attention_kv_split` in 2 runs"  # e, i; not j
    assert items[3] == "`first_norm_into_buffer` in 1 run"  # e; g had no fused norm for it
    assert items[4] == "`fuse_embedding` in 2 runs"  # e, k; not l
    assert items[5] == "`fuse_kv_split_sum` in 2 runs"  # a, e
    assert items[6] == "`grad_into_buffer` in 3 runs"  # a, b, e
    # h only: e and g had no atomic adds for a grid to run (they count under norm_dw_into_buffer)
    assert items[7] == "`norm_bwd_grid` in 1 run"
    assert items[8] == "`norm_dw_into_buffer` in 1 run"  # e, not g
    assert "`grad_into_buffer` in 1 run" in ec.options_behind(rows, run_ids={"b", "c"})
    assert ec.options_behind(rows, run_ids={"c", "d"}) == ""


def test_only_the_newest_profiled_commit_of_each_device_is_shown():
    def probe(dev, commit, date, label):
        return {"status": "ok", "device_slug": dev, "commit": commit, "date": date, "label": label}

    rows = [probe("h200", "old", "2026-12-03T06:00:00Z", "a"), probe("h200", "new", "2026-12-04T06:00:00Z", "b"),
            probe("h200", "new", "2026-12-04T06:01:00Z", "c"), probe("t4", "old", "2026-12-01T00:00:00Z", "d"),
            {**probe("h200", "newer", "2026-12-05T00:00:00Z", "e"), "status": "error"}]
    assert [r["label"] for r in engineview.latest_probes(rows)] == ["b", "c", "d"]


def test_probes_are_named_against_todays_defaults():
    """Profiled while norm_dw_into_buffer was on trial: the default case ran without it, the trial case set
    it. Now that it is a default, the trial case is the current engine and the old default case is the one
    without it."""
    mqa = {"n_head": 8, "n_kv_head": 1}
    ran = {"grad_into_buffer": True, "fuse_kv_split_sum": True, "fuse_residual_norm": True,
           "norm_bwd_grid": "8 rows 4/SM", "first_norm_into_buffer": True, "kernels": ["rmsnorm", "attention"],
           "attention_bwd_streams": True, "attention_kv_split": 2, "fuse_embedding": True,
           "relaxed_atomics": True, "fuse_head_loss": True,
           "attention_heavy_first": True, "explicit_heavy_first": True, "notes": {}}

    def probe(label, kw, **engine):
        return {"status": "ok", "device_slug": "h200", "commit": "c", "date": "d", "label": label, "config": mqa,
                "engine_kw": kw, "describe": {**ran, **engine}}

    rows = [probe("fasttransformer", {}, norm_dw_into_buffer=False),
            probe("fasttransformer norm_dw_into_buffer=True", {"norm_dw_into_buffer": "True"},
                  norm_dw_into_buffer=True),
            probe("fasttransformer fuse_kv_split_sum=False", {"fuse_kv_split_sum": "False"}, fuse_kv_split_sum=False,
                  norm_dw_into_buffer=True)]
    assert [r["label"] for r in engineview.latest_probes(rows)] == [
        "fasttransformer norm_dw_into_buffer=False", "fasttransformer", "fasttransformer fuse_kv_split_sum=False"]
    # A default the speedrun model's case ran without goes before its batch size, which case_name reads last.
    speedrun = probe("speedrun 256x6 dropout 0.2 fuse_dropout=True dropout_rng4=False B=64", {"fuse_dropout": "True"},
                     attention_heavy_first=False, norm_dw_into_buffer=True)
    [r] = engineview.latest_probes([speedrun])
    assert r["label"] == ("speedrun 256x6 dropout 0.2 fuse_dropout=True dropout_rng4=False attention_heavy_first=False"
                          " B=64")
    assert engineview.case_name(r) == ("speedrun model (256x6, B=64), fused dropout, one draw per element, attention "
                                       "blocks light first")
    # every option a probe case names is said in words, none left as a key=value pair
    words = [engineview.case_name({"label": x["label"]}) for x in engineview.latest_probes(rows)]
    assert words == ["FastTransformer norm gradients summed by torch", "FastTransformer",
                     "FastTransformer dK/dV splits summed by torch"]  # and the model as the book names it
    # GPT-2's default engine fuses its attention too: the variant on the flash kernel is named for what it swaps.
    assert engineview.case_name({"label": "gpt2 attention_for_explicit=True"}) == (
        "GPT-2 flash attention in place of its explicit softmax")


def test_an_option_that_could_not_apply_does_not_make_an_earlier_engine():
    mqa = {"n_head": 8, "n_kv_head": 1}
    with_attention = ["rmsnorm", "attention", "embedding", "cross_entropy", "adamw"]

    def row(kernels, notes=None, **ran):
        return {"mode": "engine", "device_slug": "h200", "run_id": "a", "config": mqa, "extra": {},
                "engine": {"kernels": kernels, "notes": notes or {}, "norm_dw_into_buffer": True,
                           "norm_bwd_grid": "8 rows 4/SM", "first_norm_into_buffer": True,
                           "attention_bwd_streams": True, "attention_kv_split": 2, "fuse_embedding": True,
                           "relaxed_atomics": True, "fuse_head_loss": True,
                           "attention_heavy_first": True, "explicit_heavy_first": True, **ran}}

    # Strict fp32 keeps SDPA: no dK/dV split to sum, so the current engine runs without the fused split sum.
    sdpa = row([k for k in with_attention if k != "attention"], grad_into_buffer=True, fuse_kv_split_sum=False)
    assert ec.engine_config(sdpa) == ec.TODAY
    assert ec.engine_config({**sdpa, "engine": {**sdpa["engine"], "grad_into_buffer": False}}) == (
        "without grad_into_buffer")
    # On the attention kernel the split sum applies: a row without it ran an earlier engine.
    assert ec.engine_config(row(with_attention, grad_into_buffer=True, fuse_kv_split_sum=False)) == (
        "without fuse_kv_split_sum")
    # Pages that do not define the options (all but chapter 6) count them instead of naming their keys.
    assert ec.engine_words(ec.TODAY) == "the current engine"
    assert ec.engine_words("without fuse_kv_split_sum") == (
        "an earlier engine: 1 of today's default option off; chapter 6 names them")
    assert ec.engine_words("without grad_into_buffer, fuse_kv_split_sum").startswith("an earlier engine: 2 of ")
    assert ec.engine_words("options not recorded") == "an engine whose options were not recorded"
    assert ec.engine_words("without a, b", named=True) == "an earlier engine, without a, b"
    # An option the engine noted as not applied to the step is not missing from it.
    none = row(with_attention, {"grad_into_buffer": "not applied: no plain, bf16-shadow or bias-kernel Linear"},
               grad_into_buffer=False, fuse_kv_split_sum=True)
    assert ec.engine_config(none) == ec.TODAY


def test_the_bias_and_first_norm_defaults_count_only_where_they_could_apply():
    """GPT-2's bias options need its biases and the pieces they live in; the first norm's, the fused
    residual-norm with its atomic adds. A row that predates them ran without them where they apply."""
    gpt2, ft = {"n_head": 12, "n_kv_head": 12, "bias": True}, {"n_head": 8, "n_kv_head": 1, "bias": False}
    base = {"grad_into_buffer": True, "norm_dw_into_buffer": True, "norm_bwd_grid": "8 rows 4/SM",
            "fuse_residual_norm": True, "bias_kernel": True, "bf16_weights": True, "kernels": [], "notes": {},
            "wgrad_side_stream": True, "relaxed_atomics": True, "fuse_head_loss": True,
            "attention_heavy_first": True, "explicit_heavy_first": True}

    def row(cfg, prec, extra=None, **ran):
        return {"mode": "engine", "device_slug": "h200", "run_id": "a", "config": cfg, "precision": prec,
                "extra": extra or {}, "engine": {**base, **ran}}

    bias = ["bias_into_buffer", "bf16_bias_weights", "branch_bias_into_norm", "first_norm_into_buffer",
            "fc_bias_into_gelu"]
    assert ec.options_off(row(gpt2, "bf16")) == bias  # stored before the five existed
    assert ec.options_off(row(gpt2, "tf32")) == [n for n in bias if n != "bf16_bias_weights"]  # the shadow is bf16's
    assert ec.options_off(row(ft, "bf16")) == ["first_norm_into_buffer"]  # no biases
    assert ec.options_off(row(gpt2, "bf16", **dict.fromkeys(bias, True))) == []
    # Without the bias kernel none of GPT-2's bias options could apply; without the fused residual-norm
    # (and its atomic adds) neither the branch biases nor the first norm; the GELU-epilogue GEMM sums its own.
    assert ec.options_off(row(gpt2, "bf16", {"bias_kernel": False}, bias_kernel=False)) == ["first_norm_into_buffer"]
    assert ec.options_off(row(gpt2, "tf32", fuse_residual_norm=False, norm_dw_into_buffer=False)) == [
        "bias_into_buffer", "fc_bias_into_gelu"]
    mlp_act = ec.options_off(row(gpt2, "tf32", fuse_mlp_act=True))
    assert "branch_bias_into_norm" not in mlp_act and "fc_bias_into_gelu" not in mlp_act
    # GELU's backward sums the up-projection's bias gradient: not in an MLP of another activation.
    assert "fc_bias_into_gelu" not in ec.options_off(row({**gpt2, "activation": "relu2"}, "tf32"))
    # An ablation that set an option off on purpose is not an earlier engine.
    ran = {**dict.fromkeys(bias, True), "bias_into_buffer": False}
    ablation = row(gpt2, "bf16", {"bias_into_buffer": False}, **ran)
    assert ec.engine_config(ablation) == ec.TODAY


def test_the_one_pass_dq_default_counts_only_where_its_kernel_could_run():
    """GPT-2's dQ kernel in one pass needs the explicit-attention kernel, rows of at most 512 keys and sm_80
    or later (its tile's shared memory). A row that predates the option ran without it where it applies."""
    gpt2 = {"n_embd": 768, "n_head": 12, "n_kv_head": 12, "bias": True, "block_size": 256}
    base = {"grad_into_buffer": True, "norm_dw_into_buffer": True, "norm_bwd_grid": "8 rows 4/SM",
            "fuse_residual_norm": True, "bias_kernel": True, "bf16_weights": True, "kernels": [], "fused_softmax": True,
            "fuse_softmax_matmuls": True, "bias_into_buffer": True, "bf16_bias_weights": True,
            "branch_bias_into_norm": True, "first_norm_into_buffer": True, "fc_bias_into_gelu": True,
            "wgrad_side_stream": True, "relaxed_atomics": True, "fuse_head_loss": True,
            "attention_heavy_first": True, "explicit_heavy_first": True,
            "notes": {"softmax": "scale + causal mask + softmax fused with the products around it"}}

    def row(cap="9.0", cfg=None, extra=None, **ran):
        return {"mode": "engine", "device_slug": "h200", "run_id": "a", "config": {**gpt2, **(cfg or {})},
                "precision": "bf16", "capability": cap, "extra": extra or {}, "engine": {**base, **ran}}

    assert ec.options_off(row()) == ["explicit_dq_one_pass"]  # stored before the option existed
    assert ec.engine_config(row(explicit_dq_one_pass=True)) == ec.TODAY
    assert ec.options_off(row("7.5")) == []  # a T4: the 64-row tile does not fit its shared memory
    assert ec.options_off(row(cfg={"block_size": 1024})) == []  # rows longer than the one-pass kernels take
    # cuBLAS's products around the softmax: an earlier engine, but no dQ kernel of ours to run in one pass
    assert ec.options_off(row(fuse_softmax_matmuls=False)) == ["fuse_softmax_matmuls"]
    # A row from before that option existed ran without it, and so without the one-pass dQ kernel too.
    older = row()
    del older["engine"]["fuse_softmax_matmuls"]
    assert ec.options_off(older) == ["fuse_softmax_matmuls"]
    assert ec.options_off(row(cfg={"n_head": 12, "n_kv_head": 12, "n_embd": 12 * 48})) == []  # head size 48
    # The ablation that switched it off on purpose is not an earlier engine.
    assert ec.engine_config(row(extra={"explicit_dq_one_pass": False}, explicit_dq_one_pass=False)) == ec.TODAY


def test_options_on_trial_without_rows_are_listed_once_with_their_widest_options(monkeypatch):

    monkeypatch.setattr(option_trials, "CANDIDATES", (
        (" +a", {"a": True}, ("gpt2",), ("bf16", "tf32")),
        (" +all", {"a": True, "b": True}, ("gpt2",), ("bf16",)),
        (" +all", {"a": True}, ("gpt2",), ("tf32",))))
    assert option_trials.unmeasured([]) == [("+a", "a"), ("+all", "a, b")]
    assert option_trials.unmeasured([{"label": "gpt2 +a"}]) == [("+all", "a, b")]
    assert option_trials.unmeasured_text([{"label": "gpt2 +a"}, {"label": "gpt2 +all"}]) == ""


def test_failed_checks_of_the_newest_run_are_named_with_their_cause():
    def row(run, date, label="fasttransformer", status="ok", ok=True, **more):
        return {"device_slug": "h100", "run_id": run, "date": date, "commit": f"c{run}", "label": label,
                "precision": "tf32", "status": status, "check_ok": ok, **more}

    old = [row("r1", "2026-01-01"), row("r1", "2026-01-01", label="gpt2")]
    assert engine_check.failures(old) == ""  # every check passed
    trace = ("Traceback ...\ntorch.AcceleratorError: CUDA error: dependency created on uncaptured work in another "
             "stream\n...\ntorch.AcceleratorError: CUDA error: operation failed due to a previous error")
    new = [row("r2", "2026-02-01", status="error", ok=False, error="AcceleratorError: CUDA error: operation failed",
               traceback=trace), row("r2", "2026-02-01", label="gpt2", ok=False)]
    text = engine_check.failures(old + new)
    assert text == ("* On the H100, 2 of the 2 checks of the newest run (commit cr2) did not pass: "
                    "`fasttransformer` in tf32: dependency created on uncaptured work in another stream (it passed at "
                    "commit cr1); `gpt2` in tf32: the losses disagreed (it passed at commit cr1).")
    assert engine_check.failures(new[1:]) == ("* On the H100, 1 of the 1 checks of the newest run (commit cr2) did not "
                                              "pass: `gpt2` in tf32: the losses disagreed.")
