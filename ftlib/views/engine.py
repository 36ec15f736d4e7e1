"""Reading the engine's own rows for chapter 6: what each piece buys, the 100-step check, the profile.

Sources (rows of ``ftlib.harness.bench.step`` or ``ci/gpu_bench.py``, read with :func:`ftlib.views.bench.ok_rows`):

* ``engine``: the engine (``mode='engine'``, label = the preset) and its variants, labelled
  ``'<preset> <change>'`` (``-rmsnorm``: that kernel off, ``no-kernels``, ``uncaptured``,
  ``+flash-attn``), all of one run.
* ``engine_check``: one row per (model, precision), the engine and the reference trained
  100 steps side by side (``losses_engine``, ``losses_ref``, ``max_rel_err``, ``ok``).
* ``engine_probe``: the engine's step under the profiler, kernel by kernel.

The engine against the compiler is ``ftlib.views.baselines``'s: it is measured in the baselines suite.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.harness.suites import SUITES
from ftlib.training.engine.options import EngineOptions
from ftlib.views.bench import pick, select
from ftlib.views.plots import MODEL_COLORS, PALETTE, legend_below
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


def _shape(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in latest_run(rows) if r.get("B") == SHAPE["B"] and r.get("T") == SHAPE["T"]]


def engine_devices(engine_rows: Iterable[dict[str, Any]]) -> list[str]:
    """Devices with at least one headline engine row."""
    return sorted({r["device_slug"] for r in _shape(engine_rows) if r.get("mode") == "engine"
                   and r.get("label") in MODELS})


def variant_name(r: dict[str, Any]) -> str:
    """'-rmsnorm' for label 'fasttransformer -rmsnorm' (or, as older rows are labelled,
    'fasttransformer engine -rmsnorm'); 'engine' for a headline row."""
    label, model = r.get("label", ""), r.get("preset") or ""
    if not model or label == model or not label.startswith(model):
        return "engine"
    rest = label[len(model):].lstrip(" ,")
    return rest[len("engine"):].strip() if rest.startswith("engine ") else rest


@table_view
def kernel_deltas(engine_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each kernel buys: every engine variant against the full engine of the same model and precision.

    ``delta ms`` = variant - full engine (positive: the variant is slower, i.e. what was
    switched off was worth that much per step).
    """
    rows = [r for r in _shape(engine_rows) if r.get("mode") == "engine"]
    out = []
    for dev in engine_devices(rows):
        for prec in ("fp32", "tf32", "bf16"):
            for model in MODELS:
                full = pick(rows, device_slug=dev, label=model, precision=prec)
                if full is None:
                    continue
                variants = [r for r in select(rows, device_slug=dev, precision=prec, preset=model)
                            if r.get("label") != model]
                for r in sorted(variants, key=lambda r: r["label"]):
                    out.append({"device": dev, "model": model, "precision": prec, "variant": variant_name(r),
                                "ms": r["median_ms"], "engine ms": full["median_ms"],
                                "delta ms": r["median_ms"] - full["median_ms"],
                                "delta %": 100 * (r["median_ms"] / full["median_ms"] - 1),
                                "kernels": ", ".join((r.get("engine") or {}).get("kernels", [])) or None,
                                "check ok": r.get("check_ok")})
    return out


@table_view
def candidate_table(candidate_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Engine options on trial (suite ``engine_candidates``), each against the default engine
    case of the same run, model and precision: the base is the case whose label the option's label
    extends (a case that another extends is a default case). ``beyond spread``: the two cases' p20-p80
    ranges do not overlap; only a win beyond the spread, with a passing 100-step check, makes an
    option a default.
    """
    rows = [r for r in candidate_rows if r.get("mode") == "engine" and r.get("median_ms") is not None]

    def group(r: dict[str, Any]) -> tuple:
        return r.get("device_slug"), r.get("run_id"), r.get("precision")

    out = []
    for r in rows:
        peers = [b for b in rows if b is not r and group(b) == group(r)]
        same = [b for b in peers if r["label"].startswith(b["label"])]
        if not same or any(b["label"].startswith(r["label"]) for b in peers):
            continue  # a default case (GPT-2 with the attention kernel is one too: options extend it)
        base = max(same, key=lambda b: len(b["label"]))
        # The engine options the case sets beyond its base's: what a 100-step check of it must set too.
        own, base_extra = r.get("extra") or {}, base.get("extra") or {}
        options = {k: v for k, v in own.items() if k != "run" and base_extra.get(k) != v}
        out.append({"device": r["device_slug"], "precision": r["precision"], "engine": base["label"],
                    "option": r["label"][len(base["label"]):].strip(), "default ms": base["median_ms"],
                    "option ms": r["median_ms"], "delta us": 1e3 * (r["median_ms"] - base["median_ms"]),
                    "speed-up": base["median_ms"] / r["median_ms"],
                    "beyond spread": bool(r["p80_ms"] < base["p20_ms"] or r["p20_ms"] > base["p80_ms"]),
                    "check ok": r.get("check_ok"), "run": r.get("run_id"), "options": options})
    return sorted(out, key=lambda d: (d["device"], d["precision"], d["engine"], d["option"]))


def candidate_summary(candidate_rows: Iterable[dict[str, Any]], check_rows: Iterable[dict[str, Any]]) -> str:
    """One line per device and option of :func:`candidate_table`: how often it won beyond the spread,
    by how much, whether a 100-step check of it is stored (rows of ``engine_check`` that set the
    option as its cases do) and passed, and whether the engine's defaults now set it so."""
    table = candidate_table.rows(candidate_rows)
    checks = list(check_rows)
    now = EngineOptions()
    lines = []
    for (dev, option) in dict.fromkeys((d["device"], d["option"]) for d in table):
        mine = [d for d in table if (d["device"], d["option"]) == (dev, option)]
        wins = [d for d in mine if d["beyond spread"] and d["delta us"] < 0]
        options = mine[0]["options"]
        checked = [c for c in checks if c.get("device_slug") == dev and options
                   and all((c.get("extra") or {}).get(k) == v for k, v in options.items())]
        check = ("no 100-step check of it is stored yet" if not checked else
                 "its 100-step check passed" if all(c.get("ok", c.get("check_ok")) for c in checked) else
                 "its 100-step check failed")
        lo, hi = min(d["delta us"] for d in mine), max(d["delta us"] for d in mine)
        default = ("a default now" if options and all(getattr(now, k, None) == v for k, v in options.items())
                   else "not a default")
        lines.append(f"* **{option}** on {dev}: faster than the default engine of the same run beyond the "
                     f"spread in {len(wins)} of {len(mine)} cases; the step changed by {lo:+.0f} to {hi:+.0f} µs "
                     f"({min(d['speed-up'] for d in mine):.3f}x to {max(d['speed-up'] for d in mine):.3f}x); {check}; "
                     f"{default}.")
    return "\n".join(lines) or "No engine option is waiting to be measured."


@table_view
def loss_table(check_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, model, precision: the 100-step check's agreement (max relative loss error vs rtol),
    the newest run only."""
    out = []
    order = ("fp32", "tf32", "bf16")
    for r in sorted(latest_run(check_rows), key=lambda r: (
            r["device_slug"], order.index(r["precision"]) if r["precision"] in order else 9, r["label"])):
        ref = r.get("losses_ref") or []
        out.append({"device": r["device_slug"], "model": r["label"], "precision": r["precision"],
                    "steps": r.get("steps"), "ref loss first": ref[0] if ref else None,
                    "ref loss last": ref[-1] if ref else None, "max rel err": r.get("max_rel_err"),
                    "rtol": r.get("rtol"), "param rel err": r.get("param_rel_err"),
                    "ok": r.get("ok", r.get("check_ok")), "kernels": ", ".join(r.get("kernels") or []) or None})
    return out


def loss_figure(check_rows: Iterable[dict[str, Any]], device: str) -> go.Figure:
    """Per precision (columns): engine (solid) and reference (dotted) loss per step, and below it
    the relative difference |engine - reference| / reference per step (log scale).

    One colour per checked case, the same in every panel; the largest relative error of each
    case is in :func:`loss_table`.
    """
    rows = [r for r in latest_run(check_rows) if r["device_slug"] == device and r.get("losses_engine")]
    precs = [p for p in ("fp32", "tf32", "bf16") if any(r["precision"] == p for r in rows)]
    labels = list(dict.fromkeys(r["label"] for r in sorted(rows, key=lambda r: (r["label"] not in MODELS, r["label"]))))
    others = [c for c in PALETTE if c not in MODEL_COLORS.values()]
    colors = {lab: MODEL_COLORS.get(lab) or others[i % len(others)] for i, lab in enumerate(labels)}
    n = max(1, len(precs))
    fig = make_subplots(rows=2, cols=n, subplot_titles=precs + [""] * n, shared_xaxes=True,
                        row_heights=[0.6, 0.4], vertical_spacing=0.08, horizontal_spacing=0.06)
    shown: set[str] = set()
    for i, p in enumerate(precs, start=1):
        for r in (r for r in rows if r["precision"] == p):
            c, first = colors[r["label"]], r["label"] not in shown
            shown.add(r["label"])
            steps = list(range(1, len(r["losses_engine"]) + 1))
            fig.add_trace(go.Scatter(x=steps, y=r["losses_engine"], mode="lines", name=r["label"],
                                     line=dict(color=c), legendgroup=r["label"], showlegend=first),
                          row=1, col=i)
            fig.add_trace(go.Scatter(x=steps, y=r["losses_ref"], mode="lines", name=f"{r['label']} reference",
                                     line=dict(color=c, dash="dot"), legendgroup=r["label"], showlegend=False),
                          row=1, col=i)
            rel = [abs(e - f) / abs(f) if (f and e != f) else None for e, f in zip(r["losses_engine"], r["losses_ref"])]
            fig.add_trace(go.Scatter(x=steps, y=rel, mode="lines", name=f"{r['label']} |engine - ref| / ref",
                                     line=dict(color=c, width=1), legendgroup=r["label"], showlegend=False),
                          row=2, col=i)
        fig.update_xaxes(title_text="step", row=2, col=i)
        fig.update_yaxes(type="log", dtick=1, tickformat=".0e", row=2, col=i)
    for dash, what in (("solid", "engine"), ("dot", "reference (train_step + torch.optim.AdamW)")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=what, line=dict(color="#555", dash=dash),
                                 legendgroup="style", legendgrouptitle_text="line"))
    fig.update_yaxes(title_text="training loss", row=1, col=1)
    fig.update_yaxes(title_text="|engine − ref| / ref", row=2, col=1)
    fig.update_layout(height=620, title=f"Engine vs reference training, {device}: loss per step")
    return legend_below(fig)


# Kernel-name patterns -> category, first match wins (benchmarks/kernels/engine_probe.py's names:
# cuBLAS/CUTLASS GEMMs, our Triton kernels by function name, PyTorch's native kernels). The causal
# mask's triu/tril counts as attention; the bias gradients' column sum (kernels/bias_linear.py) as a
# reduction, beside the norms' partial sums.
PROBE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("_attn_", "fmha", "softmax", "attention", "triu_tril", "_kv_split_sum")),
    ("matmul", ("gemm", "xmma", "nvjet", "_matmul_tile", "splitkreduce")),
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
    are left out rather than shown beside today's. Each is named against today's defaults
    (:func:`probe_label`)."""
    rows = [r for r in probe_rows if r.get("status") == "ok"]
    newest: dict[str, tuple[str, str]] = {}
    for r in rows:
        dev, mark = r.get("device_slug"), (str(r.get("date")), str(r.get("commit")))
        newest[dev] = max(newest.get(dev, mark), mark)
    return [{**r, "label": probe_label(r)} for r in rows if str(r.get("commit")) == newest[r.get("device_slug")][1]]


def probe_label(r: dict[str, Any]) -> str:
    """A profiled case's name against today's engine defaults: an option the case set that is a default
    now leaves the name, and a default the case ran without (it was profiled before the option won its
    trial) enters it as ``<option>=False``. So the case named by its model alone is today's engine."""
    label, kw = r["label"], r.get("engine_kw") or {}
    now = dataclasses.asdict(EngineOptions())
    for k, v in kw.items():
        if k in TRIAL_WINNERS and str(now.get(k)) == str(v):
            label = label.replace(f" {k}={v}", "")
    off = options_off({"mode": "engine", "engine": r.get("describe"), "extra": kw, "config": r.get("config")})
    return label + "".join(f" {k}={'False' if isinstance(now[k], bool) else None}" for k in off or [])


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
        line = {"device": r.get("device_slug"), "case": r["label"], "precision": r["precision"],
                "captured step µs": r.get("step_median_us"), "kernel µs": total,
                "kernels per step": round(sum(k.get("count", 0) for k in r.get("kernels", [])))}
        for cat, _ in PROBE_CATEGORIES + (("other", ()),):
            line[cat] = by.get(cat, 0.0)
        line["largest"] = max(by, key=by.get) if by else None
        line["largest share"] = (by[line["largest"]] / total) if by and total else None
        out.append(line)
    return out


def _case_label(r: dict[str, Any]) -> str:
    """A profiled case's name, shortened where the options repeat and wrapped for an axis."""
    text = f"{r['label']} ({r['precision']})".replace("bf16_norm_out=True bf16_weights=True", "bf16 weights and norms")
    return "<br>".join(textwrap.wrap(text, 44))


def probe_launch_figure(probe_rows: Iterable[dict[str, Any]], device: str) -> go.Figure:
    """Kernels launched per step by category, one bar per profiled case of ``device``: inside a CUDA
    graph each kernel boundary still costs its own start and drain, so the count is a cost of its own."""
    rows = [r for r in probe_rows if r.get("status") == "ok" and r.get("device_slug") == device]
    cats = [c for c, _ in PROBE_CATEGORIES] + ["other"]
    fig = go.Figure()
    labels = [_case_label(r) for r in rows]
    for i, cat in enumerate(cats):
        counts = [sum(k.get("count", 0) for k in r.get("kernels", []) if probe_category(k["name"]) == cat)
                  for r in rows]
        if any(counts):
            fig.add_trace(go.Bar(name=cat, y=labels, x=counts, orientation="h", marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(barmode="stack", height=max(340, 160 + 52 * len(rows)), margin=dict(l=330),
                      title=f"Kernels per training step, by category, {device} (engine step, profiled uncaptured)",
                      xaxis_title="kernels launched per step", yaxis=dict(autorange="reversed"))
    return legend_below(fig)


# Options that became defaults after winning their trial (suite engine_candidates): rows stored before
# ran without them. Their engine is another engine: its ratios are never pooled with today's.
TRIAL_WINNERS = ("grad_into_buffer", "fuse_kv_split_sum", "norm_dw_into_buffer", "norm_bwd_grid")
TODAY = "today's defaults"


def options_off(row: dict[str, Any], names: Iterable[str] = TRIAL_WINNERS) -> list[str] | None:
    """The options of ``names`` that are on by default now but were off in an engine row's step; None where
    the row does not say (stored before the engine described itself). Each row's ``engine`` field is the
    engine's ``describe()``, which reports an option as applied, so an option the row's model cannot use
    (the split sum on multi-head attention) is not counted, and a row from before an option existed ran
    without it. An option the row's case set on purpose (an ablation's ``extra``) is not counted either."""
    ran = row.get("engine")
    if not isinstance(ran, dict):
        return None
    now = dataclasses.asdict(EngineOptions())  # a default that is True, or a named grid, against False/None
    return [n for n in names if n not in (row.get("extra") or {}) and now.get(n) not in (None, False)
            and ran.get(n) in (None, False) and _applies(n, row)]


def engine_config(row: dict[str, Any]) -> str:
    """Which engine an engine row ran, against today's defaults: ``TODAY``, 'without <options>', or
    'options not recorded'; '' for a row of another mode."""
    if row.get("mode") != "engine":
        return ""
    off = options_off(row)
    return "options not recorded" if off is None else "without " + ", ".join(off) if off else TODAY


def options_behind(engine_rows: Iterable[dict[str, Any]], run_ids: Iterable[str] | None = None,
                   names: Iterable[str] = TRIAL_WINNERS) -> str:
    """Where stored engine rows (of ``run_ids``, if given) ran with one of ``names`` off that is on by
    default now (:func:`options_off`): one line per device and option, with the number of runs, whose
    ratios the engine tables keep apart from today's engine (:func:`engine_config`). Empty when none did."""
    wanted = None if run_ids is None else set(run_ids)
    seen: dict[tuple[str, str], set[str]] = {}
    for r in engine_rows:
        if r.get("mode") != "engine" or (wanted is not None and r.get("run_id") not in wanted):
            continue
        for name in options_off(r, names) or []:
            seen.setdefault((r["device_slug"], name), set()).add(str(r.get("run_id")))
    return "\n".join(
        f"* On {dev}, the engine rows of {len(ids)} of these runs ran with `{name}` off; it is on by default "
        f"now (its trial is in the section on engine options below), so those runs' ratios are an earlier "
        f"engine's, on lines of their own."
        for (dev, name), ids in sorted(seen.items()))


def _applies(name: str, row: dict[str, Any]) -> bool:
    """Whether option ``name`` could change ``row``'s step, by what its engine reported: not where the engine
    noted it as not applied or not applicable; the split sum needs multi-query attention on the attention
    kernel (strict fp32 keeps SDPA, which has no split to sum); the norms' atomic weight gradients need the
    fused residual-norm, their grid those adds. Where the row does not say which kernels ran, it applies."""
    ran = row.get("engine") if isinstance(row.get("engine"), dict) else {}
    if str((ran.get("notes") or {}).get(name, "")).startswith(("not applied", "not applicable")):
        return False
    if name == "fuse_kv_split_sum":
        cfg, kernels = row.get("config") or {}, ran.get("kernels")
        return (cfg.get("n_kv_head", cfg.get("n_head")) != cfg.get("n_head")
                and (kernels is None or "attention" in kernels))
    if name == "norm_dw_into_buffer":  # the atomic adds live in the fused residual-norm's backward
        return ran.get("fuse_residual_norm", True) is not False
    return name != "norm_bwd_grid" or ran.get("norm_dw_into_buffer") is True  # the grid those adds run on
