"""Chapter 6's closing, computed from the stored rows: op for op, our Triton kernels against torch.compile's
generated kernels in a CUDA graph (kernels.jsonl), then the engine against the strongest compiled step of each
run (``ftlib.views.findings.engine_results``) and what the engine's own rows say its step gains from (the
ablations of ``engine``, the profiles of ``engine_probe`` and their ledger)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from ftlib.views import engine as ev
from ftlib.views import ledger as lv
from ftlib.views.bench import gpu_label, model_title
from ftlib.views.engine_config import TODAY
from ftlib.views.engine_findings import engine_results
from ftlib.views.kernels import GEMM_OPS, KERNEL_TABLE_OPS, OP_NAMES, case_label, row_impl, run_of
from ftlib.views.per_run import and_list, span_text
from ftlib.views.tables import table_view


def _fastest(rows: list[dict[str, Any]], impl: str) -> dict[str, Any] | None:
    mine = [r for r in rows if row_impl(r) == impl]
    return min(mine, key=lambda r: r["median_us"]) if mine else None


@table_view
def triton_vs_compile(kernel_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, op and case: the fastest Triton variant against the fastest torch.compile variant, both
    replayed in a CUDA graph, from the newest run that timed both (:func:`ftlib.views.kernels.run_of`). A case
    no run timed both ways has no line: rows of different runs are never set against each other.
    ``outcome``: 'Triton faster' or 'compile faster' where the p20-p80 ranges do not overlap, else 'tie'."""
    rows = [r for r in kernel_rows if r.get("op") in KERNEL_TABLE_OPS and r.get("timing") == "graph"
            and r.get("status") == "ok" and r.get("median_us")]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["device_slug"], r["op"], case_label(r)), []).append(r)
    out = []
    for (dev, op, case), mine in groups.items():
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in mine:
            runs.setdefault(run_of(r), []).append(r)
        both = [rs for rs in runs.values() if _fastest(rs, "triton") and _fastest(rs, "compile")]
        if not both:
            continue
        pool = max(both, key=lambda rs: max(str(r.get("date", "")) for r in rs))
        tri, com = _fastest(pool, "triton"), _fastest(pool, "compile")
        assert tri and com
        apart = tri.get("p80_us") and com.get("p20_us") and (
            tri["p80_us"] < com["p20_us"] or tri["p20_us"] > com["p80_us"])
        outcome = "tie" if not apart else "Triton faster" if tri["median_us"] < com["median_us"] else "compile faster"
        out.append({"device": dev, "op": op, "case": case, "run": run_of(tri) or None,
                    "triton variant": tri["variant"], "triton µs": tri["median_us"], "compile µs": com["median_us"],
                    "compile / triton": com["median_us"] / tri["median_us"], "outcome": outcome})
    order = {op: i for i, op in enumerate(KERNEL_TABLE_OPS)}
    return sorted(out, key=lambda d: (d["device"], order[d["op"]]))


def kernel_lines(kernel_rows: Iterable[dict[str, Any]]) -> list[str]:
    """One line per device and op of :func:`triton_vs_compile`: how many cases each side won, and the range
    of compile / Triton (above 1: Triton faster)."""
    table = triton_vs_compile.rows(kernel_rows)
    lines = []
    for dev, op in dict.fromkeys((d["device"], d["op"]) for d in table):
        mine = [d for d in table if (d["device"], d["op"]) == (dev, op)]
        count = {k: sum(d["outcome"] == k for d in mine) for k in ("Triton faster", "tie", "compile faster")}
        lo, hi = min(d["compile / triton"] for d in mine), max(d["compile / triton"] for d in mine)
        span = f"{span_text(lo, hi, '.2f')}×"
        lines.append(f"{OP_NAMES.get(op, op)}, {len(mine)} case{'s' * (len(mine) != 1)}: Triton faster "
                     f"in {count['Triton faster']}, tied in {count['tie']}, compile faster in "
                     f"{count['compile faster']}; compile's time over Triton's {span} (each case's two from one run).")
    return lines


def _engine_lines(device: str) -> tuple[list[str], list[str], list[str], dict[tuple[str, str], float]]:
    """Lines of ``engine_results``: the engine against the strongest compiled step, baseline and runs named;
    the cases where the engine is faster (verdict 'faster'); those with a median above 1 on too few runs
    for a verdict; and the strongest compiled step's ms by (model, precision)."""
    tab = engine_results(device)
    lines, faster, tentative = [], [], []
    for _, e in tab.iterrows():
        engine = "the " + e["engine"] if e["engine"] == "current engine" else e["engine"]
        lines.append(f"{e['model']} {e['precision']} ({engine}): {e['engine speed-up']} against "
                     f"{e['strongest baseline of the same run']}, {e['runs']}; {e['verdict']}.")
        if e["verdict"] == "faster":
            faster.append(f"{e['model']} {e['precision']}")
        elif e["verdict"] == "too few runs" and float(str(e["engine speed-up"]).split("×")[0]) > 1:
            tentative.append(f"{e['model']} {e['precision']}")
    return lines, faster, tentative, compiled_ms(tab)


def compiled_ms(engine_table: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(model title, precision) -> the strongest compiled step's ms (its median over the runs of the line) of an
    :func:`ftlib.views.engine_findings.engine_results` table."""
    return {(e["model"], e["precision"]): float(e["its ms"]) for _, e in engine_table.iterrows()}


def _engine_sentence(faster: list[str], tentative: list[str]) -> str:
    """'… is faster for A, B; on too few runs for a verdict, its median is faster for C:'."""
    head = ("\nYet the whole engine against the strongest compiled step of the same run (speed-up: median over "
            "runs, min–max)")
    parts = [f"is faster for {', '.join(faster)}"] if faster else []
    if tentative:
        parts.append(("on too few runs for a verdict, its median is faster for " if faster else
                      "has too few runs for a verdict; its median is faster for ") + ", ".join(tentative))
    return f"{head} {'; '.join(parts) or 'is faster for no case'}:\n"


def _ablation_lines(engine_rows: list[dict[str, Any]], device: str,
                    compiled: dict[tuple[str, str], float] | None = None) -> list[str]:
    """What switching one piece off costs the engine of its own run: the graph, all our kernels, fused attention;
    beside each, where ``compiled`` has its model and precision (model title, precision -> ms), the step without
    the piece against the strongest compiled step (its median over the runs of the engine's table)."""
    compiled = compiled or {}

    def beside(d: dict[str, Any]) -> str:
        ms = compiled.get((model_title(d["model"]), d["precision"]))
        return f"; {d['ms']:.2f} ms against the compiled step's {ms:.2f} ms" if ms else ""

    deltas = [d for d in ev.kernel_deltas.rows(engine_rows) if d["device"] == device]
    what = {"uncaptured": "the whole step in one CUDA graph", "no-kernels": "all of our kernels together",
            "-fused-softmax": "GPT-2's fused softmax (and with it the products fused around it)",
            "-attention": "the fused attention kernel",
            "-rmsnorm": "the RMSNorm kernel (and with it the residual adds and weight-gradient sums fused into it)",
            "-layernorm": "the LayerNorm kernel (and with it the residual adds and gradient sums fused into it)"}
    cases = dict.fromkeys((d["model"], d["precision"]) for d in deltas)  # each default engine with ablations
    lines = []
    for variant, text in what.items():
        mine = [d for d in deltas if d["variant"] == variant]
        models = {d["model"] for d in mine}
        untimed = [f"{model_title(m)} {p}" for m, p in cases if m in models
                   and not any((d["model"], d["precision"]) == (m, p) for d in mine)]
        # A variant whose engine ran the default's step (the attention kernel switched off where strict fp32
        # keeps PyTorch's SDPA anyway) switched nothing off: its row measures only the noise, and is left
        # out, said so.
        kept = [d for d in mine if d["changes the step"] is not False]
        same = [f"{model_title(d['model'])} {d['precision']}" for d in mine if d["changes the step"] is False]
        if kept:
            by = ", ".join(f"{model_title(d['model'])} {d['precision']} {d['delta ms']:+.2f} ms "
                           f"({d['delta %']:+.0f}%{beside(d)})" for d in kept)
            lines.append(f"switching off {text} ({variant}) changes the step by {by}"
                         + (f" (left out: {', '.join(same)}, whose engine did not run it, so nothing was "
                            "switched off)" if same else "")
                         + (f" (not timed in {and_list(untimed)}, whose run had no such case)" if untimed else ""))
    runs = sorted({d["run"] for d in deltas if d["variant"] in what})
    if lines:
        lines[0] += (f" (the engine's ablations, from the run of {runs[0]}, each against the default engine of that "
                     "run)" if len(runs) == 1 else
                     f" (the engine's ablations, from {len(runs)} runs, each against the default engine of its own "
                     "run; the notes under the table of what each kernel buys name which)")
    return lines


# The pieces whose ablation says where the engine's lead sits (switching off the graph or every kernel at once
# says only that the whole is needed), in words for pages that do not define the variants.
PIECES = {"-attention": "the attention kernel", "-rmsnorm": "the fused RMSNorm kernel",
          "-layernorm": "the fused LayerNorm kernel", "-fused-softmax": "the fused softmax and its products"}


def lead_holder(engine_rows: Iterable[dict[str, Any]], device: str,
                compiled: dict[tuple[str, str], float] | None = None) -> str | None:
    """A sentence, per model and precision of the current engine's ablations on ``device``: the one piece
    (:data:`PIECES`) without which its step is slowest, that step against the strongest compiled step
    (``compiled``: (model title, precision) -> its median over the runs of the engine's table, read from the
    stored rows where not given). None where no case has both."""
    compiled = compiled_ms(engine_results(device)) if compiled is None else compiled
    deltas = [d for d in ev.kernel_deltas.rows(list(engine_rows)) if d["device"] == device and d["variant"] in PIECES
              and d["changes the step"] is not False and d["engine"] == TODAY]
    parts = []
    for model, prec in dict.fromkeys((d["model"], d["precision"]) for d in deltas):
        ms = compiled.get((model_title(model), prec))
        if ms:
            d = max((d for d in deltas if (d["model"], d["precision"]) == (model, prec)), key=lambda d: d["ms"])
            parts.append(f"{model_title(model)} {prec}, {PIECES[d['variant']]}: {d['ms']:.2f} ms without it, "
                         f"against {ms:.2f} ms")
    if not parts:
        return None
    return (f"Where the current engine's lead sits on the {gpu_label(device)}: switching off one piece at a time "
            "(chapter 6's ablations), the piece whose loss slows the step most, and the step without it against "
            "the strongest compiled step's median in the engine table above: " + "; ".join(parts) + ".")


def _buffer_lines(candidate_rows: list[dict[str, Any]], device: str) -> list[str]:
    """The options that write gradients straight into the flat buffers, against the default engine of their run."""
    from ftlib.views.option_trials import candidate_table

    table = [d for d in candidate_table.rows(candidate_rows) if d["device"] == device]
    lines = []
    for option, what in (("+grad-into-buffer", "the Linears' weight gradients written straight into the flat buffer"),
                         ("+norm-dw-into-buffer", "the norms' weight gradients added straight into the flat buffer")):
        mine = [d for d in table if d["option"] == option]
        if mine:
            lo, hi = min(d["delta µs"] for d in mine), max(d["delta µs"] for d in mine)
            lines.append(f"{option} ({what}) changes the step by "
                         f"{lo:+.0f} to {hi:+.0f} µs against the default engine of the same run, {len(mine)} cases "
                         f"in {len({d['run'] for d in mine})} run{'s' * (len({d['run'] for d in mine}) != 1)}")
    return lines


def _kernel_count_lines(probe_rows: list[dict[str, Any]], device: str) -> list[str]:
    """Profiled cases that differ from the default engine by options their names give: kernels per step and
    captured step, against the default engine of the same device and precision."""
    table = [t for t in lv.ledger_totals.rows(probe_rows) if t["device"] == device]
    lines = []
    for t in table:
        base = next((b for b in table if b is not t and t["case"].startswith(b["case"] + ", ")
                     and b["precision"] == t["precision"]), None)
        if base is None or not (t["captured step µs"] and base["captured step µs"]):
            continue
        lines.append(f"profiled as a variant of the default engine, {t['case']}: "
                     f"{round(t['kernels per step'] - base['kernels per step']):+d} kernels per step, "
                     f"{t['captured step µs'] - base['captured step µs']:+.0f} µs per captured step")
    for t in table:
        if "," not in t["case"] and t["step / sum of floors"]:
            between = (f"{t['measured gap per kernel µs']:.1f} µs between kernels"
                       if t["measured gap per kernel µs"] is not None
                       else f"its kernels overlapping by {t['overlap µs']:,.0f} µs on two streams")
            lines.append(f"the default engine profiled, {t['case']}: {round(t['kernels per step'])} kernels per "
                         f"step, the captured step {t['step / sum of floors']:.1f}× the sum of its class floors, "
                         + between)
    return lines


def _tally_split(table: list[dict[str, Any]]) -> str:
    """' (w of n among the GEMM kernels, w of n among the others)': the closing's tally split between our Triton
    GEMMs (weight gradients, the GELU MLP, the fused head: ``GEMM_OPS``), whose cases can be most of the ops a GPU
    timed, and the other kernels (norms, attention, embeddings, sums); '' where the cases are all of one kind.
    Whether the engine runs a kernel by default depends on the precision and the model, so neither part claims it."""
    parts = []
    for what, mine in (("the GEMM kernels", [d for d in table if d["op"] in GEMM_OPS]),
                       ("the others", [d for d in table if d["op"] not in GEMM_OPS])):
        if mine:
            parts.append(f"{sum(d['outcome'] == 'Triton faster' for d in mine)} of {len(mine)} among {what}")
    return f" ({', '.join(parts)})" if len(parts) == 2 else ""


def closing(kernel_rows: Iterable[dict[str, Any]], engine_rows: Iterable[dict[str, Any]],
            probe_rows: Iterable[dict[str, Any]], candidate_rows: Iterable[dict[str, Any]],
            devices: Iterable[str]) -> str:
    """The chapter's closing as Markdown, per device: the kernels op for op, the engine against the strongest
    compiled step, and what the engine's rows attribute its step to."""
    krows, erows, prows, crows = list(kernel_rows), list(engine_rows), list(probe_rows), list(candidate_rows)
    parts = []
    for dev in devices:
        table = [d for d in triton_vs_compile.rows(krows) if d["device"] == dev]
        text = [f"**{gpu_label(dev)}.**"]
        if table:
            wins = sum(d["outcome"] == "Triton faster" for d in table)
            text.append(f"Op for op, in isolation, our Triton kernels are faster than torch.compile's generated "
                        f"kernels beyond the spread in {wins} of {len(table)} cases{_tally_split(table)} and tie or "
                        f"lose in the other {len(table) - wins} (the fastest variant of each side, in a CUDA graph, "
                        f"both from one run; cases no run timed both ways are left out):\n")
            text += [f"- {line}" for line in kernel_lines([r for r in krows if r.get("device_slug") == dev])]
        eng, faster, tentative, compiled = _engine_lines(dev)
        if eng:
            text.append(_engine_sentence(faster, tentative))
            text += [f"- {line}" for line in eng]
        why = _ablation_lines(erows, dev, compiled) + _buffer_lines(crows, dev) + _kernel_count_lines(prows, dev)
        if why:
            text.append("\nWhere that gain comes from, by the engine's own rows: each piece switched off alone "
                        "against the default engine of the same run, and the step without it against the strongest "
                        "compiled step above (a piece without which the engine is no faster than the compiler holds "
                        "its whole lead); the options that write gradients into the flat buffers; the profiled "
                        "variants' kernel counts:\n")
            text += [f"- {line}." for line in why]
        parts.append("\n".join(text))
    return "\n\n".join(parts)


def devices_of(*row_sets: Iterable[dict[str, Any]] | pd.DataFrame) -> list[str]:
    """Every device with rows in any of ``row_sets`` (lists of rows or frames with ``device_slug``)."""
    out: set[str] = set()
    for rows in row_sets:
        if isinstance(rows, pd.DataFrame):
            out |= set(rows["device_slug"]) if "device_slug" in rows else set()
        else:
            out |= {r.get("device_slug") for r in rows if r.get("device_slug")}
    return sorted(out)
