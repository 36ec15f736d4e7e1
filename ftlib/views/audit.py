"""The claims audit (chapter 7): each quantitative claim of the post beside the book's own
measurement or derivation, with a verdict computed by a stated rule.

Verdicts:
* ``holds``               - the book's number agrees (within ``TOL`` relative, or the stated direction holds);
* ``holds on H200 only``  - a T4 timing claim whose counterpart on the measured GPU (named in the verdict:
                            H200, H100 80GB HBM3, ...) agrees; the T4 itself is untested;
* ``does not hold``       - the book's number disagrees;
* ``too few runs``        - measured, but in fewer runs than a verdict needs (``ftlib.views.baselines``:
                            ``MIN_RUNS`` runs on ``MIN_MACHINES`` machine starts);
* ``not measured yet``    - a measurement on this GPU would answer it, and none is stored (the book cell names
                            the command);
* ``cannot test here``    - no measurement on this GPU can answer it (a T4 timing, for one).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ftlib.analysis.backends import attention_matrix_traffic, expected_backend
from ftlib.analysis.claims import POST_CLAIMED, POST_STEP_MS, POST_TOKENS_PER_STEP
from ftlib.analysis.totals import attention_mlp_fractions
from ftlib.model.config import preset
from ftlib.model.gpt import GPT
from ftlib.views.bench import gpu_of, model_title, not_measured, ok_rows, pick
from ftlib.views.codesign import backend_table
from ftlib.views.convergence import seed_table, suite_rows
from ftlib.views.engine_findings import short_name
from ftlib.views.sweep import COMPILE_SOURCE, compile_time_runs, run_ratios, sweep_rows, sweep_table
from ftlib.views.tables import table_view

# A timing claim was measured once, on another GPU: a book's number within 10% of it agrees. The
# post gives no spread, and the eager and default-compile steps of chapter 3 move by more than
# that between runs of the same code.
TOL = 0.10

NOT_MEASURED = "not measured yet"  # the verdict where a measurement on this GPU is missing


def _close(a: float, b: float, tol: float = TOL) -> bool:
    return abs(a - b) <= tol * abs(b)


def _row(claim: str, post: str, book: str, verdict: str, source: str) -> dict[str, Any]:
    return {"claim": claim, "post says": post, "book finds": book, "verdict": verdict, "from": source}


# A T4 timing claim that agrees on the measured GPU: a placeholder, which audit_table replaces with the
# verdict that names that GPU (:func:`holds_only_on`).
ELSEWHERE = "holds on the measured GPU only"


def holds_only_on(device: str) -> str:
    """The verdict of a T4 claim that holds on ``device``: 'holds on H100 80GB HBM3 only'."""
    return f"holds on {short_name(device)} only"


def _params() -> dict[str, int]:
    return {n: GPT(preset(n)).num_params() for n in ("gpt2", "fasttransformer")}


def _range_verdict(lo: float, hi: float, claimed: float, runs: int, machines: int) -> str:
    """A T4 ratio claim checked on another GPU: every run within ``TOL`` of it or above, or every run below."""
    from ftlib.views.baselines import enough_runs

    if not enough_runs(runs, machines):
        return "too few runs"
    if lo >= claimed * (1 - TOL):
        return ELSEWHERE
    if hi < claimed * (1 - TOL):
        return "does not hold"
    return "no verdict: the runs disagree"


def _runs_text(per_run: pd.DataFrame, digits: int = 2, between: str = "") -> str:
    """The median ratio over runs, ``between``, then its range and how many runs on how many machine starts."""
    r, n, m = per_run["ratio"], len(per_run), per_run["machine_id"].nunique()
    lo, hi = f"{r.min():.{digits}f}", f"{r.max():.{digits}f}"
    spread = "" if n == 1 else f"{lo}× in every one of " if lo == hi else f"{lo}–{hi}× over "
    return f"{r.median():.{digits}f}×{between} ({spread}{n} run{'s' * (n != 1)} on {m} machine start{'s' * (m != 1)})"


def _runs_verdict(per_run: pd.DataFrame, claimed: float) -> str:
    return _range_verdict(per_run["ratio"].min(), per_run["ratio"].max(), claimed, len(per_run),
                          per_run["machine_id"].nunique())


def _timing_rows(device: str) -> list[dict[str, Any]]:
    """The post's step-time claims against the repeated baselines runs of ``device`` (chapters 3, 5, 6).

    Every ratio pairs rows of one run; the book's number is the median over runs with the
    slowest and fastest run's ratio; a verdict needs every run on one side.
    """
    from ftlib.harness.suites import baselines
    from ftlib.views import baseline_report as br
    from ftlib.views import baselines as bv

    runs = bv.load(baselines())
    runs = runs[runs["device_slug"] == device]
    gpu = short_name(device, runs)
    if runs.empty:
        return [_row("step-time claims (Figure 1, +44.5%, eager inversion, compiler ceiling)", "see chapter 3",
                     not_measured("baselines"), NOT_MEASURED, "baselines suite")]
    def source(prec: str) -> str:
        """The suite and how many runs of this precision stand behind a claim (runs are per precision)."""
        mine = runs[runs["precision"] == prec]
        return f"baselines suite, {mine['run_id'].nunique()} runs on {mine['machine_id'].nunique()} machine starts"

    src = source("fp32")
    times = bv.placement_table(runs)
    times = times[times["precision"] == "fp32"].set_index(["label", "config"])["median_ms"]
    out = []
    book_mode = {"eager": ("eager", "default"), "compile-ro": bv.POST_CONFIG,
                 "hand-written CUDA": ("engine", "default")}
    for (model, mode), claimed in POST_STEP_MS.items():
        ms = times.get((model, bv.config_name(*book_mode[mode])))
        book = f"{ms:.2f} ms on the {gpu} ({bv.config_name(*book_mode[mode])})" if ms is not None else "not measured"
        out.append(_row(f"{model_title(model)} {mode} step time (T4, fp32)", f"{claimed:.2f} ms", book,
                        "cannot test here", f"T4 timing; the {gpu}'s in chapters 3 and 5"))
    per_run = bv.spread(bv.model_speedups(runs), ["precision", "config"]).set_index(["precision", "config"])
    claimed = POST_CLAIMED["speedup_compiled"]
    for config, what in ((bv.config_name(*bv.POST_CONFIG), "the post's setup: reduce-overhead, AdamW run eagerly"),
                         ("strongest baseline of each", "each model at its fastest compiled configuration")):
        if ("fp32", config) in per_run.index:
            r = per_run.loc[("fp32", config)]
            out.append(_row(f"FastTransformer over GPT-2, compiled, fp32 ({what})", f"{claimed:.3f}x (+44.5%)",
                            f"{bv.range_text(r['median'], r['min'], r['max'])} on the {gpu} "
                            f"({bv.runs_on_starts(int(r['runs']), int(r['machines']))})",
                            _range_verdict(r["min"], r["max"], claimed, int(r["runs"]), int(r["machines"])), src))
    # The +44.5% and its own numbers: 116,080 / 80,869 tok/s. Arithmetic on the post's numbers, not a
    # timing: it must agree to the rounding of the figures it comes from (0.2%), not within TOL.
    own = (POST_TOKENS_PER_STEP / POST_STEP_MS[("fasttransformer", "compile-ro")]) / (
        POST_TOKENS_PER_STEP / POST_STEP_MS[("gpt2", "compile-ro")])
    out.append(_row("+44.5% follows from the post's own throughputs (116,080 vs 80,869 tok/s)", "+44.5%",
                    f"+{100 * (own - 1):.1f}%", "holds" if _close(own, claimed, 0.002) else "does not hold",
                    "arithmetic on the post's numbers"))
    inv = br.eager_inversion(runs)
    r = None if inv.empty else inv[(inv["precision"] == "fp32")
                                   & (inv["GPT-2 compiled as"] == bv.config_name(*bv.POST_CONFIG))]
    if r is not None and not r.empty:
        r = r.iloc[0]
        verdict = {"holds": ELSEWHERE, "does not hold": "does not hold"}.get(r["inversion"],
                                                                                       r["inversion"])
        out.append(_row("eager inversion: FastTransformer eager beats compiled GPT-2", "98 ms vs 102 ms (T4)",
                        f"{r['FastTransformer eager ms']:.2f} ms vs {r['GPT-2 compiled ms']:.2f} ms on the {gpu} "
                        "(GPT-2 compiled / FastTransformer eager "
                        f"{r['GPT-2 compiled / FastTransformer eager (median, min–max)']})",
                        verdict, src))
    # The post's premise (sec. 1, Figure 1): a hand-written GPT-2 engine (107.21 ms) could not beat
    # torch.compile reduce-overhead (101.30 ms) on the T4, "the compiler ceiling". Tested with
    # chapter 6's engine, as the model is written, against the strongest compiled step of each run.
    hand, ro = POST_STEP_MS[("gpt2", "hand-written CUDA")], POST_STEP_MS[("gpt2", "compile-ro")]
    eng = bv.newest_engine(bv.engine_table(runs))
    for prec in ("fp32", "tf32", "bf16"):
        e = eng[(eng["label"] == "gpt2") & (eng["precision"] == prec)]
        if e.empty:
            continue
        e = e.iloc[0]
        verdict = {"faster": "does not hold", "slower": ELSEWHERE, "ties": ELSEWHERE}.get(
            e["verdict"], e["verdict"])
        out.append(_row(f"compiler ceiling: a hand-written GPT-2 engine does not beat torch.compile ({prec})",
                        f"engine {hand:.2f} ms vs reduce-overhead compile {ro:.2f} ms (T4, fp32"
                        + ("; the post measured fp32 only: the book extends its premise)" if prec != "fp32" else ")"),
                        f"the book's GPT-2 engine {e['engine_ms']:.2f} ms vs the strongest compiled step "
                        f"{e['baseline_ms']:.2f} ms: {bv.range_text(e['median'], e['min'], e['max'])} on the {gpu} "
                        f"({bv.runs_on_starts(int(e['runs']), int(e['machines']))})"
                        + bv.engine_note(e["engine_config"]),
                        verdict, f"baselines suite, the {bv.runs_on_starts(int(e['runs']), int(e['machines']))} "
                        "that measured this engine (chapter 6)"))
    return out


def _traced_elsewhere(device: str) -> tuple[str, str] | None:
    """(another GPU's name, the SDPA backend its profiler trace shows) for the original (B,1,T,d) K/V layout in
    fp32, the first device with such a trace; None where none has one. The backend follows the GPU's architecture
    and the PyTorch version, so another GPU's trace is a pointer, not this GPU's verdict."""
    profiles = ok_rows("profile")
    for dev in sorted({r["device_slug"] for r in profiles if r.get("sdpa_backend")} - {device}):
        kernels = {r["model"]: r for r in backend_table.rows(dev, precisions=("fp32",))}
        row = kernels.get("fasttransformer-broadcast")
        if row and row["step ms (profiler run)"] is not None:
            return gpu_of(profiles, dev), row["SDPA backend (from trace)"]
    return None


@table_view
def audit_table(device: str = "h200") -> list[dict[str, Any]]:
    g, f = preset("gpt2"), preset("fasttransformer")
    out: list[dict[str, Any]] = _timing_rows(device)
    from ftlib.harness.suites import baselines
    from ftlib.views import baselines as bv

    runs = bv.load(baselines())
    times = bv.placement_table(runs[runs["device_slug"] == device])
    times = times[times["precision"] == "fp32"].set_index(["label", "config"])["median_ms"]

    def ms(label, mode, prec="fp32"):
        if prec != "fp32":
            return None
        return times.get((label, bv.config_name(mode, "default")))

    # Figure 5's caption: the T=128 point of the sweep at 8,192 tokens per step, fp32, reduce-overhead.
    claimed = POST_CLAIMED["speedup_T128"]
    sweep = sweep_rows(device)
    gpu = gpu_of(sweep, device)
    at128 = next((r for r in sweep_table.rows(sweep) if r["T"] == 128 and r["speed-up"]), None)
    per_run = run_ratios(sweep, "median_ms", T=128, precision="fp32", mode="compile-ro")
    if at128 and len(per_run):
        out.append(_row("speed-up at T=128 (8,192 tokens/step, fp32, compiled reduce-overhead)",
                        f"{claimed}x ({POST_CLAIMED['tokens_per_s_T128']:,} tok/s)",
                        _runs_text(per_run, between=f", {at128['fasttransformer tokens/s']:,.0f} tok/s on the {gpu}"),
                        _runs_verdict(per_run, claimed), "tsweep suite"))
    else:
        out.append(_row("speed-up at T=128 (8,192 tokens/step, fp32, compiled reduce-overhead)", f"{claimed}x",
                        not_measured("tsweep"), NOT_MEASURED, "tsweep suite"))
    # Compile time: first-step wall time under reduce-overhead, a cold process per case (compile_time
    # suite), read through the same function as chapter 5's table.
    cs = POST_CLAIMED["compile_s"]
    r_post = cs["gpt2"] / cs["fasttransformer"]
    ct_runs = compile_time_runs(device, "compile-ro")
    if len(ct_runs):
        g_s, f_s = ct_runs["gpt2"].median(), ct_runs["fasttransformer"].median()
        out.append(_row("first step (compile) time GPT-2 -> FastTransformer", f"{cs['gpt2']} s -> "
                        f"{cs['fasttransformer']} s ({r_post:.1f}x)",
                        f"{g_s:.1f} s -> {f_s:.1f} s (medians over runs); GPT-2's over FastTransformer's in each "
                        f"run, the median: {_runs_text(ct_runs, 1)} on the {gpu}",
                        _runs_verdict(ct_runs, r_post), f"{COMPILE_SOURCE}, the first step's time"))
    else:
        out.append(_row("first step (compile) time GPT-2 -> FastTransformer", f"{cs['gpt2']} s -> "
                        f"{cs['fasttransformer']} s ({r_post:.1f}x)", not_measured("compile_time"),
                        NOT_MEASURED, "compile_time suite"))
    # -- derivations ----------------------------------------------------------------------
    p = _params()
    cut = 1 - p["fasttransformer"] / p["gpt2"]
    out.append(_row("47% fewer parameters (4.84M -> 2.56M)", "47%",
                    f"{100 * cut:.1f}% ({p['gpt2']:,} -> {p['fasttransformer']:,})",
                    "holds" if _close(cut, POST_CLAIMED["param_cut"], 0.02) else "does not hold", "ftlib.model.gpt"))
    qkv = 1 - (f.n_embd + 2 * f.n_kv_head * f.head_size) / (3 * g.n_embd)
    out.append(_row("58.3% fewer QKV projection weights", "58.3%", f"{100 * qkv:.1f}%",
                    "holds" if _close(qkv, POST_CLAIMED["qkv_weight_cut"], 0.002) else "does not hold", "config"))
    kv = 1 - f.n_kv_head / g.n_kv_head
    out.append(_row("87.5% fewer K/V parameter gradients", "87.5%", f"{100 * kv:.1f}%",
                    "holds" if _close(kv, POST_CLAIMED["kv_grad_cut"], 0.002) else "does not hold", "config"))
    fg, ff = attention_mlp_fractions(g, 32, 256), attention_mlp_fractions(f, 32, 256)
    out.append(_row("MLP FLOPs per layer 8.59 -> 4.30 GFLOP", "8.59 -> 4.30",
                    f"{fg['mlp_gflop']:.2f} -> {ff['mlp_gflop']:.3f}",
                    "holds" if _close(fg["mlp_gflop"], 8.59, 0.005) and _close(ff["mlp_gflop"], 4.30, 0.005)
                    else "does not hold", "ftlib.analysis.accounting"))
    fc = attention_mlp_fractions(g, 32, 256, causal=True)
    out.append(_row("attention (QKᵀ+AV) is 4% of block compute", "4.0%",
                    f"{100 * fg['attention']:.1f}% (full T×T), {100 * fc['attention']:.1f}% (causal)",
                    "holds" if _close(fc["attention"], 0.04, 0.25) else "does not hold", "ftlib.analysis.accounting"))
    out.append(_row("MLP is 64% of block compute", "64%",
                    f"{100 * fg['mlp']:.1f}% (full), {100 * fc['mlp']:.1f}% (causal)",
                    "holds" if _close(fc["mlp"], 0.64, 0.02) else "does not hold", "ftlib.analysis.accounting"))
    tt = attention_matrix_traffic(g, 32, 256, "fp32")
    mb_claim = POST_CLAIMED["attention_matrix_mb_per_step"]
    out.append(_row("(B,H,T,T) traffic is 805 MB per step", "805 MB",
                    f"{tt['write_once_read_once_per_step'] / 1e6:.0f} MB if written once and read once; "
                    f"{tt['bytes_per_step'] / 1e9:.2f} GB as eager GPT-2 really touches it",
                    "does not hold" if tt["bytes_per_step"] > 1.5 * mb_claim * 1e6 else "holds",
                    "ftlib.analysis.accounting"))
    # Which SDPA backend the original's (B,1,T,d) K/V gets in fp32: from its profiler trace where
    # stored, else from the kernel rules of ftlib.analysis.accounting. 'math' materializes (B,H,T,T).
    be = expected_backend(f.replace(kv_layout="broadcast"), "fp32", (9, 0))
    kernels = {r["model"]: r for r in backend_table.rows(device, precisions=("fp32",))}
    traced = kernels["fasttransformer-broadcast"]["step ms (profiler run)"] is not None
    seen = kernels["fasttransformer-broadcast"]["SDPA backend (from trace)"] if traced else be
    seen_x = kernels["fasttransformer"]["SDPA backend (from trace)"]
    fb, fx = ms("fasttransformer-broadcast", "eager"), ms("fasttransformer", "eager")
    how = "from its trace" if traced else f"expected by the kernel rules; trace {not_measured('profile')}"
    if not traced and (other := _traced_elsewhere(device)):
        how += f"; the {other[0]}'s trace shows '{other[1]}' (chapter 1)"
    out.append(_row("SDPA keeps (B,H,T,T) out of DRAM ('zero bytes')", "zero bytes",
                    f"original (B,1,T,d) K/V in fp32 -> '{seen}' ({how})"
                    + f"; expanded (B,H,T,d) view -> {seen_x}"
                    + (f"; the eager step {fb:.1f} ms with the original layout, {fx:.1f} ms with the expanded view"
                       if fb and fx else ""),
                    # Without a trace the backend is only the rules' expectation: no verdict from it.
                    NOT_MEASURED if not traced else "does not hold" if "math" in seen.split("+") else "holds",
                    "profile suite (trace)" if traced else "ftlib.analysis.accounting rules"))
    conv = [r for r in suite_rows("convergence-original", ok_rows("convergence-original"))
            if r["device_slug"] == device and r["seed"] == 42]
    cg, cf = pick(conv, model="gpt2"), pick(conv, model="fasttransformer")
    if cg and cf:
        pg, pf = (math.exp(c["history"][-1]["batch_loss"]) for c in (cg, cf))
        vg, vf = (math.exp(c["history"][-1]["val_loss"]) for c in (cg, cf))
        fair = {r["model"]: r for r in seed_table.rows([r for r in suite_rows("convergence", ok_rows("convergence"))
                                                if r["device_slug"] == device])}
        later = ""
        if "gpt2" in fair and "fasttransformer" in fair:
            a, b = fair["fasttransformer"], fair["gpt2"]
            later = (f"; with equal init and recipe, best validation loss {a['best val loss (mean)']:.3f} vs "
                     f"{b['best val loss (mean)']:.3f} over {a['seeds']} seeds (chapter 8)")
        out.append(_row("perplexity at step 200, FastTransformer vs GPT-2", "11.98 vs 12.45 (training batch)",
                        f"batch {pf:.2f} vs {pg:.2f}; validation {vf:.2f} vs {vg:.2f} (seed 42){later}",
                        "holds" if pf < pg and vf < vg else "does not hold", "convergence-original suite"))
    else:  # the claim stays in the table, unmeasured, rather than dropping out of it
        out.append(_row("perplexity at step 200, FastTransformer vs GPT-2", "11.98 vs 12.45 (training batch)",
                        "not measured yet: python ci/gpu_train.py --suites convergence-original,convergence",
                        NOT_MEASURED, "convergence-original suite"))
    here = holds_only_on(device)
    return [dict(r, verdict=here if r["verdict"] == ELSEWHERE else r["verdict"], **{"from": source_words(r["from"])})
            for r in out]


# Where a claim's numbers come from, in a reader's words: (the code's name for the source, the words), the
# first whose name starts the source applying; what follows the name (the runs behind it) is kept.
SOURCE_WORDS = (("ftlib.analysis.accounting rules", "the accounting's SDPA backend rules (chapter 2)"),
                ("ftlib.analysis.accounting", "the FLOP and byte accounting (chapter 2)"),
                ("ftlib.model.gpt", "the models' parameter counts (chapter 2)"),
                ("config", "the two models' configurations (chapter 2)"),
                ("baselines suite", "chapter 3's repeated runs"),
                ("tsweep suite", "the sequence sweep (chapter 5)"),
                ("compile_time suite", "the compile-time runs (chapter 5)"),
                (COMPILE_SOURCE, "the compile-time runs (chapter 5): a fresh process, empty compile caches"),
                ("profile suite (trace)", "the profiler trace (chapter 1)"),
                ("convergence-original suite", "the post's training recipe, rerun (chapter 8)"))


def source_words(source: str) -> str:
    """A claim's source (:data:`SOURCE_WORDS`) in words, with what followed the code's name kept."""
    for name, words in SOURCE_WORDS:
        rest = source[len(name):]
        if source.startswith(name) and rest[:1] in ("", ",", ":"):  # the whole name, not a longer word
            return words + rest
    return source


def verdict_counts(table: pd.DataFrame) -> pd.DataFrame:
    """How many claims got each verdict, most first."""
    return table["verdict"].value_counts().rename_axis("verdict").reset_index(name="claims")
