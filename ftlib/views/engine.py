"""Reading the engine's own rows for chapter 6: what each piece buys, the 100-step check, the profile.

Sources (rows of ``ftlib.harness.bench.step`` or ``ci/gpu_bench.py``, read with :func:`ftlib.views.bench.ok_rows`):

* ``engine``: the engine (``mode='engine'``, label = the preset) and its variants, labelled
  ``'<preset> <change>'`` (``-rmsnorm``: that kernel off, ``no-kernels``, ``uncaptured``,
  ``+flash-attn``); each variant is set against the default engine of its own run. Options on trial
  (suite ``engine_candidates``) are read in ``ftlib.views.option_trials``.
* ``engine_check``: the 100-step check (read in ``ftlib.views.engine_check``).
* ``engine_probe``: the engine's step under the profiler, kernel by kernel.

The engine against the compiler is ``ftlib.views.baselines``'s: it is measured in the baselines suite.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from ftlib.harness.suites import SUITES
from ftlib.training.engine.options import EngineOptions
from ftlib.views.bench import gpu_label, model_title, select
from ftlib.views.engine_config import TRIAL_WINNERS, engine_config, engine_words, options_off
from ftlib.views.plots import PALETTE, legend_below
from ftlib.views.tables import table_view

MODELS = ("gpt2", "fasttransformer")
SHAPE = {"B": 32, "T": 256}
NOT_MEASURED = "not measured yet: run bash ci/gpu-run --only engine_check,engine"


def run_of(r: dict[str, Any]) -> tuple:
    """The run a row belongs to: its ``run_id``, or for rows stored before runs were recorded,
    its commit and the engine version it was keyed by."""
    if r.get("run_id"):
        return ("run", r["run_id"])
    return ("commit", r.get("commit"), (r.get("extra") or {}).get("round"))


def latest_run(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per results file (``bench``) and device, only the rows of its newest complete run.

    A run is complete when it holds every case its suite defines now (``ftlib.harness.suites``), or,
    where no run does or the file has no such suite, as many cases as the largest run of that file
    (a call cut short by its time limit leaves an incomplete one; a suite that lost cases must not
    leave its older, larger runs in front). Variants are compared with the full engine of their own
    run, never across runs.
    """
    rows = list(rows)
    groups: dict[tuple, dict[tuple, list[dict[str, Any]]]] = {}
    for r in rows:
        groups.setdefault((r.get("bench", ""), r.get("device_slug")), {}).setdefault(run_of(r), []).append(r)
    out = []
    for (bench, _), runs in groups.items():
        cases = {k: {(r.get("label"), r.get("mode"), r.get("precision")) for r in v} for k, v in runs.items()}
        want = _suite_cases(bench)
        full = [k for k in runs if want and want <= cases[k]]
        if not full:
            size = {k: len(c) for k, c in cases.items()}
            full = [k for k in runs if size[k] == max(size.values())]
        newest = max(full, key=lambda k: max(str(r.get("date", "")) for r in runs[k]))
        out += runs[newest]
    return out


def _suite_cases(bench: str) -> set[tuple[str, str, str]]:
    """(label, mode, precision) of every case of the suite that writes ``bench``'s rows; empty if none."""
    suite = SUITES.get(bench)
    return {(c.label, c.mode, c.precision) for c in suite.cases()} if suite else set()


def variant_name(r: dict[str, Any]) -> str:
    """'-rmsnorm' for label 'fasttransformer -rmsnorm' (or, as older rows are labelled,
    'fasttransformer engine -rmsnorm'); 'engine' for a headline row."""
    label, model = r.get("label", ""), r.get("preset") or ""
    if not model or label == model or not label.startswith(model):
        return "engine"
    rest = label[len(model):].lstrip(" ,")
    return rest[len("engine"):].strip() if rest.startswith("engine ") else rest


def _run_date(rows: list[dict[str, Any]]) -> str:
    return max(str(r.get("date", "")) for r in rows)


def ablation_runs(engine_rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """(device, model, precision) -> the engine rows of the newest run (by date) that measured that model's
    default engine and at least one of its variants in that precision, at the headline shape. Each model and
    precision takes its own newest such run; a variant is only ever set against the engine of its own run."""
    rows = [r for r in engine_rows if r.get("mode") == "engine" and r.get("median_ms") is not None
            and r.get("B") == SHAPE["B"] and r.get("T") == SHAPE["T"]]
    runs: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault((r.get("device_slug"), run_of(r)), []).append(r)
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for (dev, _), run in sorted(runs.items(), key=lambda kv: _run_date(kv[1])):  # newer runs replace older
        for model in MODELS:
            for prec in {r.get("precision") for r in run}:
                mine = select(run, preset=model, precision=prec)
                if any(r["label"] == model for r in mine) and any(r["label"] != model for r in mine):
                    out[(dev, model, prec)] = mine
    return out


def run_name(rows: list[dict[str, Any]]) -> str:
    """'2026-12-03, commit b7e5eb5e1b6c (run a0b14f12dc34)': the date and commit a run's rows were measured at."""
    r = max(rows, key=lambda r: str(r.get("date", "")))
    ids = {r.get("run_id") for r in rows} - {None}
    return f"{str(r.get('date', ''))[:10]}, commit {r.get('commit')}" + (f" (run {min(ids)})" if ids else "")


def _spread(r: dict[str, Any]) -> str | None:
    return f"{r['p20_ms']:.2f}–{r['p80_ms']:.2f}" if r.get("p20_ms") and r.get("p80_ms") else None


# Fields of an engine's ``describe()`` that say what was asked of it, not what its step ran.
_NOT_THE_STEP = ("requested_off", "notes")
# Case settings that are no engine option: the run's id, and the kernels asked off (``requested_off``).
_ASKED_OFF = ("run", "use_kernels")


def changes_the_step(default: dict[str, Any], variant: dict[str, Any]) -> bool | None:
    """Whether a variant's engine ran another step than its run's default engine, by their stored
    ``describe()``: False where the two differ only in what was asked (switching off a kernel the default
    did not run, such as the attention kernel where strict fp32 keeps PyTorch's SDPA), so the variant's
    delta measures only noise; None where either row does not describe its engine, or where the variant set an
    option its engine's description does not report."""
    a, b = default.get("engine"), variant.get("engine")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    if any(a.get(k) != b.get(k) for k in set(a) | set(b) if k not in _NOT_THE_STEP):
        return True
    # Equal descriptions say nothing of an option the engine did not describe yet (rows stored before it did).
    asked = set(variant.get("extra") or {}) - set(_ASKED_OFF)
    return None if asked - set(b) else False


@table_view
def kernel_deltas(engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each kernel buys: every engine variant against the default engine of the same run, model and
    precision, from the newest run that measured both (:func:`ablation_runs`), named in ``run``.

    ``delta ms`` = variant - default engine (positive: the variant is slower, i.e. what was switched off was
    worth that much per step); ``beyond spread``: the two rows' p20-p80 ranges do not overlap. Times are
    rounded to 10 µs, the order of their p20-p80 spread. ``engine`` says which engine the run's default was
    against the current defaults (:func:`engine_config`); ``changes the step`` is False where the variant ran
    the default's step (:func:`changes_the_step`): there was nothing to switch off.
    """
    out = []
    order = ("fp32", "tf32", "bf16", "fp16")
    for (dev, model, prec), run in sorted(ablation_runs(engine_rows).items(), key=lambda kv: (
            kv[0][0], order.index(kv[0][2]) if kv[0][2] in order else 9, MODELS.index(kv[0][1]))):
        full = max((r for r in run if r["label"] == model), key=lambda r: str(r.get("date", "")))
        for r in sorted((r for r in run if r["label"] != model), key=lambda r: r["label"]):
            both = r.get("p20_ms") and full.get("p20_ms")
            out.append({"device": dev, "model": model, "precision": prec, "variant": variant_name(r),
                        "ms": round(r["median_ms"], 2), "p20–p80 ms": _spread(r),
                        "engine ms": round(full["median_ms"], 2), "engine p20–p80 ms": _spread(full),
                        "delta ms": round(r["median_ms"] - full["median_ms"], 2),
                        "delta %": round(100 * (r["median_ms"] / full["median_ms"] - 1), 1),
                        "beyond spread": bool(r["p80_ms"] < full["p20_ms"] or r["p20_ms"] > full["p80_ms"])
                        if both else None,
                        "changes the step": changes_the_step(full, r),
                        "run": run_name(run), "engine": engine_config(full),
                        "kernels": ", ".join((r.get("engine") or {}).get("kernels", [])) or None,
                        "check ok": r.get("check_ok")})
    return out


def deltas_note(engine_rows: Iterable[dict[str, Any]]) -> str:
    """Markdown under :func:`kernel_deltas`: per device, the run each model and precision comes from, which
    engine its default was against the current defaults, and the variants of the ``engine`` suite that no such
    run measured."""
    runs = ablation_runs(engine_rows)
    lines = []
    for dev in sorted({k[0] for k in runs}):
        by_run: dict[str, dict[str, list[str]]] = {}
        for (d, model, prec), run in sorted(runs.items()):
            if d == dev:
                full = next(r for r in run if r["label"] == model)
                case = f"{model_title(model)} {prec}"
                by_run.setdefault(run_name(run), {}).setdefault(engine_config(full), []).append(case)
        for run, configs in by_run.items():
            engines = "; ".join(f"{', '.join(cases)} ran {engine_words(config, named=True)}"
                                for config, cases in configs.items())
            lines.append(f"* {gpu_label(dev)}: the rows come from the run of {run}: {engines}.")
        shown = {variant_name(r) for run in runs.values() for r in run if r.get("device_slug") == dev}
        suite = SUITES["engine"].cases() if "engine" in SUITES else []
        names = {variant_name({"label": c.label, "preset": c.label.split()[0].rstrip(",")}) for c in suite}
        if missing := sorted(names - shown):
            lines.append(f"* {gpu_label(dev)}: not measured yet, so not in the table: "
                         + ", ".join(f"`{n}`" for n in missing) + ".")
    return "\n".join(lines)


# Kernel-name patterns -> category, first match wins (benchmarks/kernels/engine_probe.py's names:
# cuBLAS/CUTLASS GEMMs, our Triton kernels by function name, PyTorch's native kernels). The causal
# mask's triu/tril counts as attention; the bias gradients' column sum (kernels/bias_linear.py) as a
# reduction, beside the norms' partial sums. The head's GEMM and the loss in one kernel each way
# (kernels/linear_cross_entropy.py, engine option fuse_head_loss) are a class of their own: neither a
# matmul nor the loss alone.
PROBE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("_attn_", "fmha", "softmax", "attention", "triu_tril", "_kv_split_sum")),
    ("matmul", ("gemm", "xmma", "nvjet", "_matmul_tile", "splitkreduce")),
    ("head and loss (fused)", ("_lce_",)),
    ("norms", ("_add_norm", "_rms_norm", "_layer_norm", "layer_norm")),
    ("optimizer", ("_adamw", "adam")),
    ("loss", ("_cross_entropy", "_ce_", "nll_loss", "log_softmax")),
    ("embedding", ("_embedding", "index", "gather", "scatter", "embedding")),
    ("reductions (sums)", ("reduce_kernel", "_col_sum")),
    ("copies and casts", ("copy", "memcpy", "memset")),
    ("other elementwise", ("elementwise", "gelu", "functor", "dropout")),
)


def probe_category(kernel_name: str) -> str:
    n = kernel_name.lower()
    return next((cat for cat, pats in PROBE_CATEGORIES if any(p in n for p in pats)), "other")


def latest_probes(probe_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The profiles of each device's newest profiled commit: cases profiled on older code (another engine)
    are left out rather than shown beside the current engine's. Each is named against the current defaults
    (:func:`probe_label`)."""
    rows = [r for r in probe_rows if r.get("status") == "ok"]
    newest: dict[str, tuple[str, str]] = {}
    for r in rows:
        dev, mark = r.get("device_slug"), (str(r.get("date")), str(r.get("commit")))
        newest[dev] = max(newest.get(dev, mark), mark)
    return [{**r, "label": probe_label(r)} for r in rows if str(r.get("commit")) == newest[r.get("device_slug")][1]]


# A profiled case's label and its trailing batch size (' B=64', the speedrun model's), apart.
_LABEL_BATCH = re.compile(r"(.*?)((?: B=\d+)?)")


def probe_label(r: dict[str, Any]) -> str:
    """A profiled case's name against the current engine defaults: an option the case set that is a default
    leaves the name, and a default the case ran without (an engine without that option) enters it as
    ``<option>=False``. So the case named by its model alone is the current engine."""
    label, kw = r["label"], r.get("engine_kw") or {}
    now = dataclasses.asdict(EngineOptions())
    for k, v in kw.items():
        if k in TRIAL_WINNERS and str(now.get(k)) == str(v):
            label = label.replace(f" {k}={v}", "")
    off = options_off({"mode": "engine", "engine": r.get("describe"), "extra": kw, "config": r.get("config"),
                       "precision": r.get("precision")})
    label, batch = _LABEL_BATCH.fullmatch(label).groups()  # a batch size stays last (case_name)
    return label + "".join(f" {k}={'False' if isinstance(now[k], bool) else None}" for k in off or []) + batch


@table_view
def probe_table(probe_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiled engine case: the captured step, the CUDA kernel time by category (µs) and each
    category's share of the kernel time (``benchmarks/kernels/engine_probe.py``, an uncaptured step
    under torch.profiler, averaged over 3 steps)."""
    out = []
    for r in probe_rows:
        if r.get("status") != "ok":
            continue
        by: dict[str, float] = {}
        for k in r.get("kernels", []):
            cat = probe_category(k["name"])
            by[cat] = by.get(cat, 0.0) + k["us"]
        total = r.get("kernel_us") or sum(by.values())
        line = {"device": r.get("device_slug"), "case": case_name(r), "precision": r["precision"],
                "captured step µs": r.get("step_median_us"), "kernel µs": total,
                "kernels per step": round(sum(k.get("count", 0) for k in r.get("kernels", [])))}
        for cat, _ in PROBE_CATEGORIES + (("other", ()),):
            line[cat] = by.get(cat, 0.0)
        line["largest"] = max(by, key=by.get) if by else None
        line["largest share"] = (by[line["largest"]] / total) if by and total else None
        out.append(line)
    return out


# Short names for the options a profiled case's label spells out (the probe's labels are key=value lists).
SHORT_OPTIONS = (("bf16_norm_out=True bf16_weights=True", ""), ("fuse_dropout=True dropout_rng4=True", "fused dropout"),
                 ("fuse_dropout=True dropout_rng4=False", "fused dropout, one draw per element"),
                 ("fuse_dropout=False dropout_rng4=False", "unfused dropout"),
                 ("linear_precision=tf32x3 attention_precision=tf32x3", "3xTF32"),
                 ("attention_for_explicit=True", "flash attention in place of its explicit softmax"),
                 ("bias_into_buffer=False bf16_bias_weights=False branch_bias_into_norm=False "
                  "first_norm_into_buffer=False", "without the bias and first-norm options"),
                 ("bias_into_buffer=False branch_bias_into_norm=False first_norm_into_buffer=False",
                  "without the bias and first-norm options"),
                 ("explicit_dq_one_pass=True", "one-pass dQ"),
                 ("explicit_dq_one_pass=False", "two-pass dQ"),
                 ("qkv_bias_into_attention=True fc_bias_into_gelu=True", "bias sums in attention and GELU"),
                 ("qkv_bias_into_attention=True", "qkv bias summed in the attention"),
                 ("fc_bias_into_gelu=True", "up-projection bias summed in GELU"),
                 ("fc_bias_into_gelu=False", "up-projection bias summed apart"),
                 ("wgrad_side_stream=False attention_bwd_streams=False", "one stream"),
                 ("wgrad_side_stream=False", "weight gradients on the main stream"),
                 ("attention_bwd_streams=False", "attention backward on one stream"),
                 ("attention_kv_split=None", "launcher's dK/dV split"),
                 ("fuse_embedding=False", "embeddings unfused"),
                 ("relaxed_atomics=True", "relaxed atomic adds"),
                 ("relaxed_atomics=False", "acquire-release atomic adds"),
                 ("fuse_head_loss=False", "head and loss unfused"),
                 ("attention_pack_heads=True", "heads packed in the attention tiles"),
                 ("attention_heavy_first=True", "heaviest attention blocks first"),
                 ("explicit_heavy_first=True", "heaviest explicit-attention blocks first"),
                 ("attention_heavy_first=False", "attention blocks light first"),
                 ("explicit_heavy_first=False", "explicit-attention blocks light first"),
                 ("programmatic_launch=True programmatic_trigger=exit", "programmatic dependent launch at exit"),
                 ("programmatic_launch=True", "programmatic dependent launch"),
                 ("first_norm_into_buffer=False", "first norm on its own kernel"),
                 ("norm_dw_partials=persistent", "norm partials per program"),
                 ("fuse_kv_split_sum=False", "dK/dV splits summed by torch"),
                 ("norm_dw_into_buffer=False", "norm gradients summed by torch"),
                 ("fuse_mlp_act=True", "GELU in the GEMM epilogues"),
                 ("fuse_softmax_matmuls=False", "attention products on cuBLAS"),
                 ("bias_into_buffer=False", "bias gradients summed by torch"),
                 ("grad_into_buffer=False", "weight gradients added into the buffer by torch"),
                 ("norm_bwd_grid=None", "launcher's norm-backward grid"),
                 ("bf16_bias_weights=False", "biases cast by autocast"),
                 ("branch_bias_into_norm=False", "branch biases summed apart"))


def case_name(r: dict[str, Any]) -> str:
    """A profiled case's short name without its precision: the model as the book names it ('GPT-2'), the
    speedrun's as 'speedrun model (256x6, B=64)', the options in a few words (:data:`SHORT_OPTIONS`)."""
    text, batch = _LABEL_BATCH.fullmatch(r["label"]).groups()
    for long, short in SHORT_OPTIONS:
        text = text.replace(long, f"\0{short}\0")
    parts = [p for p in (" ".join(p.split()) for p in text.split("\0")) if p] or [""]
    text = " ".join([parts[0], ", ".join(parts[1:])]) + batch  # the case, then its options' phrases
    m = re.match(r"speedrun (\d+x\d+) dropout [\d.]+(.*?)(?: B=(\d+))?$", text)
    if m:
        opts = " ".join(m.group(2).split())
        text = f"speedrun model ({m.group(1)}, B={m.group(3) or r.get('B')})" + (f", {opts}" if opts else "")
    return model_title(" ".join(text.split()))


def _case_label(r: dict[str, Any]) -> str:
    """:func:`case_name` with the precision in brackets, wrapped for an axis."""
    return "<br>".join(textwrap.wrap(f"{case_name(r)} ({r['precision']})", 52))


def probe_launch_figure(probe_rows: Iterable[dict[str, Any]], device: str) -> go.Figure:
    """Kernels launched per step by category, one bar per profiled case of ``device``: inside a CUDA
    graph each kernel boundary still costs its own start and drain, so the count is a cost of its own."""
    rows = [r for r in probe_rows if r.get("status") == "ok" and r.get("device_slug") == device]
    cats = [c for c, _ in PROBE_CATEGORIES] + ["other"]
    fig = go.Figure()
    labels = [_case_label(r) for r in rows]
    lines = max((label.count("<br>") + 1 for label in labels), default=1)  # bars evenly spaced: the tallest label
    for i, cat in enumerate(cats):
        counts = [sum(k.get("count", 0) for k in r.get("kernels", []) if probe_category(k["name"]) == cat)
                  for r in rows]
        if any(counts):
            fig.add_trace(go.Bar(name=cat, y=labels, x=counts, orientation="h", marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(barmode="stack", height=max(340, 160 + max(44, 16 * lines + 12) * len(rows)), margin=dict(l=340),
                      title=f"Kernels per training step, by category, {gpu_label(device)} "
                            "(engine step, profiled uncaptured)",
                      xaxis_title="kernels launched per step", yaxis=dict(autorange="reversed"))
    return legend_below(fig)
