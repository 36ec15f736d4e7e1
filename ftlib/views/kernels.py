"""Reading the kernel micro-benchmark rows (kernels.jsonl) for chapter 6: ceilings, tables, figures.

The rows come from ``benchmarks/kernels`` (``python -m benchmarks.kernels.suite``, or the ``kernels`` suite
of ``ci/gpu_bench.py``): one row per (op, case, variant, timing), timing 'eager' (the call
with autograd, as a user makes it) or 'graph' (the same call replayed from a CUDA graph: the
kernels alone), plus ``op='ceiling'`` rows, the copy bandwidth and matmul rates measured on
the same card. Here every kernel row is read against those measured ceilings, not the
datasheet: floor = max(bytes / copy bandwidth, FLOPs / matmul rate at the row's precision),
and "of ceiling" = floor / measured time (1.0 = as fast as the card's own copy or cuBLAS).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ftlib.core.repo import repo_root
from ftlib.harness.results import load_rows
from ftlib.views.bench import gpu_label
from ftlib.views.plots import log_axis
from ftlib.views.tables import records, table_view

BENCH = "kernels"
# The kernel benchmark's ops the chapter's table shows, in its order.
KERNEL_TABLE_OPS = ("rmsnorm", "layernorm", "cross_entropy", "adamw", "attention", "residual_rmsnorm",
                    "residual_dropout_rmsnorm", "residual_layernorm", "bias_grad", "gelu_bias_grad", "causal_softmax",
                    "gelu_mlp", "wgrad", "head_loss", "embedding_sum", "explicit_attention")
# Our Triton GEMM kernels: the fused head (a default under bf16/fp16), the GELU MLP and the split-K weight
# gradients (options, off by default).
GEMM_OPS = ("gelu_mlp", "wgrad", "head_loss")
OP_NAMES = {"rmsnorm": "RMSNorm fwd+bwd", "layernorm": "LayerNorm fwd+bwd", "cross_entropy": "cross-entropy fwd+bwd",
            "adamw": "AdamW step", "attention": "causal attention fwd+bwd",
            "residual_rmsnorm": "residual add + RMSNorm fwd+bwd",
            "residual_dropout_rmsnorm": "residual dropout + add + RMSNorm fwd+bwd",
            "residual_layernorm": "residual add + LayerNorm fwd+bwd", "bias_grad": "bias gradient (column sum)",
            "gelu_bias_grad": "GELU backward + the up-projection's bias gradient",
            "causal_softmax": "GPT-2's scale, causal mask and softmax fwd+bwd",
            "gelu_mlp": "MLP fwd+bwd, GELU in the GEMM epilogues", "wgrad": "weight gradient dY^T X into fp32",
            "head_loss": "output head + cross-entropy fwd+bwd",
            "embedding_sum": "token + position embeddings fwd+bwd",
            "explicit_attention": "GPT-2's attention fwd+bwd, P written"}
CEILING_NAMES = {"copy": "bandwidth", "matmul fp32": "fp32", "matmul tf32": "tf32", "matmul bf16": "bf16"}
KERNELS_DIR = repo_root() / "kernels"


# The kernel table's columns as chapter 6 shows them (the rest are in its CSV).
KERNEL_TABLE_COLUMNS = ("device", "op", "case", "variant", "run", "eager µs", "graph µs", "rate", "unit", "floor µs",
                        "of ceiling", "vs PyTorch", "vs compile", "note")


# Variant names of our Triton kernels that do not say "triton": bias_grad_dev's tile variants ("v4 column sum
# 64x64, 4/SM"). The benchmark harness guesses a variant's impl from its name when the driver names none, and
# stored those rows as "pytorch"; the drivers name the impl of every Triton variant.
TRITON_VARIANTS = re.compile(r"triton|^v\d+ column sum ")


def row_impl(r: dict[str, Any]) -> str:
    """What a kernel row's variant runs: 'triton' where its name says so or names one of our kernels
    (TRITON_VARIANTS), else the row's ``impl`` ('pytorch', 'compile'), else a guess from its name."""
    name = str(r.get("variant", "")).lower()
    if TRITON_VARIANTS.search(name):
        return "triton"
    return r.get("impl") or ("compile" if "compile" in name else "pytorch")


def kernel_rows(include_cpu: bool = False) -> list[dict[str, Any]]:
    """Every stored kernels.jsonl row (all statuses), from every device folder."""
    return load_rows(BENCH, include_cpu=include_cpu)


def _ok(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok" and r.get("median_us")]


def ceilings(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """device_slug -> {'bandwidth': GB/s, 'fp32' / 'tf32' / 'bf16': TFLOP/s} from the ceiling rows."""
    out: dict[str, dict[str, float]] = {}
    for r in _ok(rows):
        if r.get("op") != "ceiling" or r.get("variant") not in CEILING_NAMES:
            continue
        rate = r["gb_s"] if r["variant"] == "copy" else r["tflop_s"]
        out.setdefault(r["device_slug"], {})[CEILING_NAMES[r["variant"]]] = rate
    return out


@table_view
def ceiling_table(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per measured ceiling: the rate, the datasheet peak and the fraction of it reached."""
    table = []
    for r in sorted(_ok(rows), key=lambda r: (r["device_slug"], list(CEILING_NAMES).index(r["variant"])
                                               if r["variant"] in CEILING_NAMES else 99)):
        if r.get("op") != "ceiling":
            continue
        copy = r["variant"] == "copy"
        table.append({"device": r["device_slug"], "ceiling": r["case"], "median µs": r["median_us"],
                      "measured": r["gb_s"] if copy else r["tflop_s"], "unit": "GB/s" if copy else "TFLOP/s",
                      "datasheet": r.get("peak"), "of datasheet": r.get("frac_peak"),
                      "max rel. error vs reference": r.get("check_err")})
    return table


def case_label(r: dict[str, Any]) -> str:
    """A short name for a row's case: its shape and dtype, and for fp32 operands whose products ran in TF32 or
    3xTF32, that precision: those variants are another case than strict fp32's, never ranked against it."""
    s, dt = r.get("shape") or {}, r.get("dtype", "")
    if dt == "fp32":
        dt += {"tf32": " (TF32 products)", "tf32x3": " (3xTF32 products)"}.get(products_precision(r), "")
    if r.get("op") == "attention":
        return f"B={s.get('B')} nh={s.get('nh')} nkv={s.get('nkv')} T={s.get('T')} hs={s.get('hs')} {dt}"
    if r.get("op") == "explicit_attention":  # multi-head: no nkv
        return f"B={s.get('B')} nh={s.get('nh')} T={s.get('T')} hs={s.get('hs')} {dt}"
    if r.get("op") == "adamw":
        return f"{s.get('n_params', 0):,} params x{s.get('steps')} steps {dt}"
    if r.get("op") == "gelu_mlp":
        return f"M={s.get('M')} C={s.get('C')} F={s.get('F')}{' +bias' if s.get('bias') else ''} {dt}"
    if r.get("op") == "head_loss":  # rows x (M, C) under the head (V, C)
        return f"M={s.get('M')} C={s.get('C')} V={s.get('V')} {dt}"
    if r.get("op") == "embedding_sum":  # idx (B, T) into the tables (V, C) and (T, C)
        return f"B={s.get('B')} T={s.get('T')} V={s.get('V')} C={s.get('C')} {dt}"
    if r.get("op") == "wgrad":  # dW (N, K) = dY^T X for dY (M, N), X (M, K)
        return f"dW ({s.get('N')}, {s.get('K')}) over M={s.get('M')} {dt}"
    return f"({', '.join(str(v) for v in s.values())}) {dt}"


def products_precision(r: dict[str, Any]) -> str:
    """The precision of a row's matrix products: its ``precision``, except for the weight-gradient rows of fp32
    operands stored before the driver recorded it, which ran TF32 products (a tf32 step's; the driver sets
    the matmul flags so) and would otherwise be read against the strict fp32 rate, several times too slow."""
    if r.get("op") == "wgrad" and r.get("dtype") == "fp32" and r.get("precision") == "fp32":
        return "tf32"
    return r.get("precision", "")


def floor_us(r: dict[str, Any], ceil: dict[str, float] | None) -> float | None:
    """The row's floor on its own device: max(bytes / copy bandwidth, FLOPs / matmul rate), in µs."""
    if not ceil:
        return None
    parts = []
    if r.get("bytes") and ceil.get("bandwidth"):
        parts.append(r["bytes"] / (ceil["bandwidth"] * 1e9))
    prec = products_precision(r)
    # 3xTF32 issues three TF32 products per product: a third of the measured TF32 rate
    rate = ceil.get(prec) or (ceil["tf32"] / 3 if prec == "tf32x3" and ceil.get("tf32") else None)
    if r.get("flops") and rate:
        parts.append(r["flops"] / (rate * 1e12))
    return max(parts) * 1e6 if parts else None


def run_of(r: dict[str, Any]) -> str:
    """The run a row comes from: its ``run_id``, or for a row stored without one, its commit and day
    (one driver run); '' where the row has neither."""
    if r.get("run_id"):
        return str(r["run_id"])
    return " ".join(x for x in (str(r.get("commit") or "")[:12], str(r.get("date") or "")[:10]) if x)


@table_view
def kernel_table(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (device, op, case, variant, run): eager and in-graph median µs, the rate in the graph, the floor
    from the measured ceilings, the fraction of it reached, and the speed-up over the fastest PyTorch (eager
    ops) and torch.compile variant of the same case timed in the same run (:func:`run_of`), both in a graph;
    None where that run timed no such variant.

    Variants without an in-graph time (not capturable, skipped on the CPU) show their eager
    numbers where the graph's would be and say so in ``note``.
    """
    rows = list(rows)
    ceil = ceilings(rows)
    rows = [r for r in rows if r.get("op") in KERNEL_TABLE_OPS]
    by: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["device_slug"], r["op"], case_label(r), r["variant"], run_of(r)), {})[r["timing"]] = r
    best: dict[tuple, dict[str, float]] = {}  # (device, op, case, run) -> impl -> fastest in-graph µs
    for (dev, op, case, _, run), t in by.items():
        g = t.get("graph")
        if g and g.get("status") == "ok" and g.get("median_us"):
            b = best.setdefault((dev, op, case, run), {})
            b[row_impl(g)] = min(b.get(row_impl(g), float("inf")), g["median_us"])
    table = []
    first = {}  # cases in the order the drivers ran them (fp32 before bf16, nkv=1 before nkv=8)
    for i, r in enumerate(rows):
        first.setdefault((r["device_slug"], r["op"], case_label(r)), i)
    order = lambda k: (k[0], KERNEL_TABLE_OPS.index(k[1]), first[k[:3]], k[4], k[3])
    for (dev, op, case, variant, run), t in sorted(by.items(), key=lambda kv: order(kv[0])):
        e, g = t.get("eager"), t.get("graph")
        e_us = e["median_us"] if e and e.get("status") == "ok" else None
        g_us = g["median_us"] if g and g.get("status") == "ok" else None
        ref = g if g_us else (e if e_us else None)
        any_row = e or g
        notes = list(dict.fromkeys(f"{r['status']}: {r['note']}" if r.get("note") else r["status"]
                                   for r in (e, g) if r and r.get("status") != "ok"))
        fl = floor_us(any_row, ceil.get(dev))
        us = g_us or e_us
        memory = any_row.get("bound") == "memory"
        b = best.get((dev, op, case, run), {})
        table.append({
            "device": dev, "op": op, "case": case, "variant": variant, "impl": row_impl(any_row), "run": run or None,
            "date": str(any_row.get("date") or "")[:10] or None, "eager µs": e_us, "graph µs": g_us,
            "eager / graph": (e_us / g_us) if (e_us and g_us) else None,
            "rate": (ref.get("gb_s") if memory else ref.get("tflop_s")) if ref else None,
            "unit": "GB/s" if memory else "TFLOP/s",
            "floor µs": fl, "of ceiling": (fl / us) if (fl and us) else None,
            "vs PyTorch": (b["pytorch"] / g_us) if (g_us and "pytorch" in b) else None,
            "vs compile": (b["compile"] / g_us) if (g_us and "compile" in b) else None,
            "max rel. error vs reference": any_row.get("check_err"), "note": "; ".join(notes),
        })
    return table


def _records(table: pd.DataFrame | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return records(table) if isinstance(table, pd.DataFrame) else list(table)


def _case_runs(table: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """(device, op, case) -> the lines of :func:`kernel_table` timed in a graph in the one run the condensed
    view reads: the run that timed a Triton variant beside torch.compile and PyTorch (else the most of them),
    the newest such run by its date."""
    groups: dict[tuple, dict[str, list[dict[str, Any]]]] = {}
    for t in table:
        if t["graph µs"]:
            groups.setdefault((t["device"], t["op"], t["case"]), {}).setdefault(t["run"] or "", []).append(t)
    out = {}
    for key, runs in groups.items():
        def score(ts: list[dict[str, Any]]) -> tuple:
            impls = {t["impl"] for t in ts}
            return ("triton" in impls, "compile" in impls, "pytorch" in impls, max(str(t["date"]) for t in ts))
        out[key] = max(runs.values(), key=score)
    return out


@table_view
def kernel_summary(table: pd.DataFrame | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (device, op, case) of :func:`kernel_table`: PyTorch's ops, torch.compile and the fastest
    Triton variant, each the fastest of its kind in a CUDA graph, all from one run (:func:`_case_runs`), and
    Triton's speed-up over each. A kind that run did not time is None, and so is its ratio."""
    out = []
    for (dev, op, case), ts in _case_runs(_records(table)).items():
        best = {impl: min((t for t in ts if t["impl"] == impl), key=lambda t: t["graph µs"], default=None)
                for impl in ("pytorch", "compile", "triton")}
        tri = best["triton"]
        us = {impl: t["graph µs"] if t else None for impl, t in best.items()}
        out.append({"device": dev, "op": op, "case": case, "run": ts[0]["run"],
                    "PyTorch µs": us["pytorch"], "compile µs": us["compile"], "best Triton µs": us["triton"],
                    "Triton variant": tri["variant"] if tri else None,
                    "vs PyTorch": us["pytorch"] / us["triton"] if us["pytorch"] and us["triton"] else None,
                    "vs compile": us["compile"] / us["triton"] if us["compile"] and us["triton"] else None,
                    "of ceiling": tri["of ceiling"] if tri else None})
    return out


def fastest_variants(table: pd.DataFrame | Iterable[dict[str, Any]]) -> list[str]:
    """Per (device, op, case), in the run :func:`kernel_summary` reads: the fastest variant in a graph and by
    how much it beats each other kind's fastest of the same run."""
    lines = []
    for (dev, op, case), ts in _case_runs(_records(table)).items():
        ts = sorted(ts, key=lambda t: t["graph µs"])
        win = ts[0]
        rest = {t["impl"]: t for t in reversed(ts[1:]) if t["impl"] != win["impl"]}  # each impl's fastest
        vs = ", ".join(f"{r['graph µs'] / win['graph µs']:.2f}x faster than {impl} ({r['variant']})"
                       for impl, r in sorted(rest.items()))
        share = f"; {win['of ceiling']:.0%} of the measured ceiling" if win.get("of ceiling") else ""
        run = f" [run {win['run']}]" if win.get("run") else ""
        lines.append(f"{gpu_label(dev)} {OP_NAMES.get(op, op)} {case}{run}: fastest in a graph is {win['variant']} "
                     f"({win['graph µs']:.1f} µs{share})" + (f", {vs}" if vs else ""))
    return lines


def _common_prefix(cases: list[str]) -> tuple[str, list[str]]:
    """The words every case label shares, and each label without them (a panel's title and its row names); a
    label with no word of its own (a panel of one case) is named "as titled"."""
    words = [re.findall(r"\([^)]*\)|\S+", c) for c in cases]  # a shape "(8192, 256)" is one word
    common = [w for w in words[0] if all(w in ws for ws in words)] if words else []
    short = [" ".join(w for w in ws if w not in common) or "as titled" for ws in words]
    return " ".join(common), short


# The condensed table's columns the chapter shows first (the rest are under them).
SUMMARY_PREVIEW = ("device", "op", "case", "run", "PyTorch µs", "compile µs", "best Triton µs", "vs compile")
SUMMARY_STYLES = (("PyTorch µs", "PyTorch ops", dict(symbol="square-open", size=9, color="#7f7f7f",
                                                      line=dict(width=1.5))),
                  ("compile µs", "torch.compile", dict(symbol="diamond", size=9, color="#ff7f0e")),
                  ("best Triton µs", "fastest Triton variant", dict(symbol="circle", size=9, color="#1f77b4")))


def kernel_figure(table: pd.DataFrame | Iterable[dict[str, Any]], device: str) -> go.Figure:
    """The condensed view (:func:`kernel_summary`) for one device, one panel per op and one row per case: the
    time in a CUDA graph of PyTorch's ops, torch.compile and the fastest Triton variant, all of one run, on a
    log time axis. What every case of an op shares is in the panel's title."""
    rows = [t for t in kernel_summary.rows(table) if t["device"] == device]
    ops = [op for op in KERNEL_TABLE_OPS if any(t["op"] == op for t in rows)]
    per_op = {op: [t for t in rows if t["op"] == op] for op in ops}
    # A case whose run timed no such implementation has no marker for it (the table shows "–"): a subtitle says so.
    missing = any(t.get(col) is None for t in rows for col, _, _ in SUMMARY_STYLES)
    row_px, gap_px, top_px, legend_px = 21, 54, 90 + 16 * missing, 52 + 16 * missing
    heights = [max(2, len(per_op[op])) * row_px for op in ops] or [row_px]
    total = sum(heights) + gap_px * max(0, len(ops) - 1)
    titles = []
    for op in ops:
        common, _ = _common_prefix([t["case"] for t in per_op[op]])
        titles.append(f"<b>{OP_NAMES[op]}</b>" + (f"  {common}" if common else ""))
    fig = make_subplots(rows=max(1, len(ops)), cols=1, subplot_titles=titles or None,
                        row_heights=[h / sum(heights) for h in heights],
                        vertical_spacing=gap_px / total if len(ops) > 1 else 0.0)
    for i, op in enumerate(ops, start=1):
        pts = per_op[op]
        _, labels = _common_prefix([t["case"] for t in pts])
        for col, name, marker in SUMMARY_STYLES:
            fig.add_trace(go.Scatter(x=[t[col] for t in pts], y=labels, mode="markers", name=name, marker=marker,
                                     legendgroup=name, showlegend=i == 1,
                                     hovertemplate="%{y}: %{x:.3g} µs<extra>" + name + "</extra>"), row=i, col=1)
        fig.update_yaxes(autorange="reversed", tickfont_size=11, row=i, col=1)
        fig.update_xaxes(**log_axis([t[c] for t in pts for c, _, _ in SUMMARY_STYLES]), row=i, col=1)
    if ops:
        fig.update_xaxes(title_text="µs per call in a CUDA graph, median (log scale)", row=len(ops), col=1)
    fig.update_annotations(font_size=12, xanchor="left", x=0)
    height = int(total + top_px + 70)
    fig.update_layout(height=height, margin=dict(t=top_px, l=10, b=60),
                      legend=dict(orientation="h", yref="container", y=1 - legend_px / height, yanchor="top", x=0),
                      title=dict(text=f"Each op and case: PyTorch, torch.compile and our fastest Triton kernel, "
                                      f"one run each, {gpu_label(device)}"
                                      + ("<br><sup>no marker: that case's run timed no such implementation</sup>"
                                         if missing else ""),
                                 yref="container", y=1 - (12 + 16 * missing) / height, yanchor="top"))
    return fig


def kernel_figures(table: pd.DataFrame | Iterable[dict[str, Any]]) -> list[tuple[str, go.Figure]]:
    """(name, figure) per device of the table: :func:`kernel_figure`."""
    table = _records(table)
    return [(f"kernels-{dev}", kernel_figure(table, dev)) for dev in sorted({t["device"] for t in table})]


# Modules whose jit helpers an op's kernels call and whose math belongs with that op's.
KERNEL_MATH_ALSO = {"residual_norm": ("dropout_mask.py",)}


def kernel_math(op: str) -> str:
    """The docstrings of the ``@triton.jit`` kernels of ``kernels/<op>.py`` (and of
    ``kernels/<op>_kernels.py`` where an op keeps its kernels apart, and of the helper modules in
    KERNEL_MATH_ALSO): where the math is stated.

    Read from the source (ast), so nothing imports Triton; the chapter quotes them rather than
    restating formulas.
    """
    parts = []
    for name in (f"{op}.py", f"{op}_kernels.py", *KERNEL_MATH_ALSO.get(op, ())):
        path = KERNELS_DIR / name
        if not path.exists():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    "jit" in ast.unparse(d) for d in node.decorator_list) and ast.get_docstring(node):
                parts.append(f"`kernels/{name}::{node.name}`\n\n```text\n{ast.get_docstring(node)}\n```")
    return "\n\n".join(parts)
