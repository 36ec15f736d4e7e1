"""The claims audit (chapter 7): each quantitative claim of the post beside the book's own
measurement or derivation, with a verdict computed by a stated rule.

Verdicts:
* ``holds``               - the book's number agrees (within ``TOL`` relative, or the stated direction holds);
* ``holds on H200 only``  - a T4 timing claim whose H200 counterpart agrees; the T4 itself is untested;
* ``does not hold``       - the book's number disagrees;
* ``cannot test here``    - no stored measurement can answer it (yet).
"""

from __future__ import annotations

import math
from typing import Any

from ftlib.accounting import POST_CLAIMS, attention_matrix_traffic, attention_mlp_fractions, expected_backend
from ftlib.benchview import not_measured, ok_rows, pick, same_config
from ftlib.claims import POST_CLAIMED, POST_STEP_MS, POST_TOKENS_PER_STEP
from ftlib.codesignview import VARIANTS, backend_table
from ftlib.config import preset
from ftlib.convergence import suite_rows, summary
from ftlib.model import GPT
from ftlib.sweepview import compile_time_table, sweep_rows, sweep_table

TOL = 0.10  # the original's own runs of one config vary by +-10% between sessions (facts.md)


def _close(a: float, b: float, tol: float = TOL) -> bool:
    return abs(a - b) <= tol * abs(b)


def _row(claim: str, post: str, book: str, verdict: str, source: str) -> dict[str, Any]:
    return {"claim": claim, "post says": post, "book finds": book, "verdict": verdict, "from": source}


def _params() -> dict[str, int]:
    return {n: GPT(preset(n)).num_params() for n in ("gpt2", "fasttransformer")}


def _ceiling_rows(device: str) -> list[dict[str, Any]]:
    """The post's premise (sec. 1, Figure 1): a hand-written GPT-2 engine (107.21 ms) could not beat
    torch.compile reduce-overhead (101.30 ms) on the T4, "the compiler ceiling". Tested with chapter
    6's engine in fp32: as the model is written (explicit softmax), and with the attention kernel
    computing the same function (plus fp32-accurate 3xTF32 Linear layers), each against compile-ro
    from the same run (``ftlib.engineview.verdicts``)."""
    from ftlib.engineview import verdicts

    hand, ro = POST_STEP_MS[("gpt2", "hand-written CUDA")], POST_STEP_MS[("gpt2", "compile-ro")]
    post = f"hand-written engine {hand:.2f} ms vs compile-ro {ro:.2f} ms (T4): the compiler is a ceiling"
    got = [v for v in verdicts(ok_rows("engine")) if v["device"] == device and v["measured"]
           and v["target"] == "GPT-2 engine faster than compiled GPT-2, fp32"]
    if not got:
        return [_row("compiler ceiling: a hand-written GPT-2 engine does not beat torch.compile", post,
                     not_measured("engine"), "cannot test here", "engine suite")]
    out = []
    for v in got:
        how = "as written (explicit softmax)" if v["route"] == "engine" else f"with {v['route']} (same function)"
        beaten = v["measured"] > 1.0
        out.append(_row(f"compiler ceiling, GPT-2 fp32 engine {how}", post,
                        f"{v['engine ms']:.2f} ms vs compile-ro {v['compile-ro ms']:.2f} ms "
                        f"({v['measured']:.2f}x) on {device}",
                        "does not hold" if beaten else "holds on H200 only", "engine suite (chapter 6)"))
    return out


def audit_rows(device: str = "h200") -> list[dict[str, Any]]:
    g, f = preset("gpt2"), preset("fasttransformer")
    out: list[dict[str, Any]] = []
    # One device, the post's models at full size, B=32, T=256: a smoke run's rows never stand in for them.
    runs = [r for r in ok_rows(["fig1", "precision"]) if r["device_slug"] == device and (r.get("B"), r.get("T")) ==
            (32, 256) and r.get("label") in VARIANTS and same_config(r, VARIANTS[r["label"]])]

    def ms(label, mode, prec="fp32"):
        r = pick(runs, label=label, mode=mode, precision=prec)
        return r["median_ms"] if r else None

    # -- timing claims (T4) ------------------------------------------------------------
    for (model, mode), claimed in POST_STEP_MS.items():
        out.append(_row(f"{model} {mode} step time (T4, fp32)", f"{claimed:.2f} ms",
                        f"{ms(model, mode):.2f} ms on {device}" if ms(model, mode) else "no T4 here",
                        "cannot test here", "T4 timing; H200 numbers in chapters 3 and 5"))
    gro, fro = ms("gpt2", "compile-ro"), ms("fasttransformer", "compile-ro")
    claimed = POST_CLAIMED["speedup_compiled"]
    if gro and fro:
        sp = gro / fro
        out.append(_row("FastTransformer over GPT-2, compiled reduce-overhead, fp32", f"{claimed:.3f}x (+44.5%)",
                        f"{sp:.2f}x on {device}",
                        "holds on H200 only" if sp >= claimed * (1 - TOL) else "does not hold", "fig1 suite"))
    else:
        out.append(_row("FastTransformer over GPT-2, compiled", f"{claimed}x", "not measured", "cannot test here", ""))
    # The +44.5% and its own numbers: 116,080 / 80,869 tok/s.
    own = (POST_TOKENS_PER_STEP / POST_STEP_MS[("fasttransformer", "compile-ro")]) / (
        POST_TOKENS_PER_STEP / POST_STEP_MS[("gpt2", "compile-ro")])
    out.append(_row("+44.5% follows from the post's own throughputs (116,080 vs 80,869 tok/s)", "+44.5%",
                    f"+{100 * (own - 1):.1f}%", "holds" if _close(own, claimed, 0.002) else "does not hold",
                    "arithmetic on the post's numbers"))
    fe, gc = ms("fasttransformer", "eager"), gro
    out.append(_row("eager inversion: FastTransformer eager beats compiled GPT-2", "98 ms vs 102 ms (T4)",
                    f"{fe:.2f} ms vs {gc:.2f} ms on {device}" if fe and gc else "not measured",
                    ("holds on H200 only" if fe < gc else "does not hold") if fe and gc else "cannot test here",
                    "fig1 suite"))
    # Figure 5's caption: the T=128 point of the sweep at 8,192 tokens per step, fp32, reduce-overhead.
    claimed = POST_CLAIMED["speedup_T128"]
    at128 = next((r for r in sweep_table(sweep_rows(device)) if r["T"] == 128 and r["speed-up"]), None)
    if at128:
        sp = at128["speed-up"]
        out.append(_row("speed-up at T=128 (8,192 tokens/step, fp32, compiled reduce-overhead)",
                        f"{claimed}x ({POST_CLAIMED['tokens_per_s_T128']:,} tok/s)",
                        f"{sp:.2f}x ({at128['fasttransformer tokens/s']:,.0f} tok/s) on {device}",
                        "holds on H200 only" if sp >= claimed * (1 - TOL) else "does not hold", "tsweep suite"))
    else:
        out.append(_row("speed-up at T=128 (8,192 tokens/step, fp32, compiled reduce-overhead)", f"{claimed}x",
                        not_measured("fig5"), "cannot test here", "tsweep suite"))
    # Compile time: first-step wall time under reduce-overhead; a cold process (compile_time
    # suite) where measured, else Figure 1's fresh cache dir in a warm process.
    cs = POST_CLAIMED["compile_s"]
    r_post = cs["gpt2"] / cs["fasttransformer"]
    ct = next((r for r in compile_time_table(device) if r["device"] == device and r["mode"] == "compile-ro"
               and r["gpt2 / FT"]), None)
    if ct:
        g_s, f_s, r_book = ct["gpt2 first step s"], ct["fasttransformer first step s"], ct["gpt2 / FT"]
        out.append(_row("first step (compile) time GPT-2 -> FastTransformer", f"{cs['gpt2']} s -> "
                        f"{cs['fasttransformer']} s ({r_post:.1f}x)",
                        f"{g_s:.1f} s -> {f_s:.1f} s ({r_book:.1f}x) on {device}",
                        "holds on H200 only" if r_book >= r_post * (1 - TOL) else "does not hold",
                        ct["source"] + ", first_step_s"))
    else:
        out.append(_row("first step (compile) time GPT-2 -> FastTransformer", f"{cs['gpt2']} s -> "
                        f"{cs['fasttransformer']} s ({r_post:.1f}x)", not_measured("compile_time"),
                        "cannot test here", "compile_time suite"))
    out += _ceiling_rows(device)
    # -- derivations ----------------------------------------------------------------------
    p = _params()
    cut = 1 - p["fasttransformer"] / p["gpt2"]
    out.append(_row("47% fewer parameters (4.84M -> 2.56M)", "47%",
                    f"{100 * cut:.1f}% ({p['gpt2']:,} -> {p['fasttransformer']:,})",
                    "holds" if _close(cut, POST_CLAIMED["param_cut"], 0.02) else "does not hold", "ftlib.model"))
    qkv = 1 - (f.n_embd + 2 * f.n_kv_head * f.head_size) / (3 * g.n_embd)
    out.append(_row("58.3% fewer QKV projection weights", "58.3%", f"{100 * qkv:.1f}%",
                    "holds" if _close(qkv, POST_CLAIMS["qkv_weight_cut"], 0.002) else "does not hold", "config"))
    kv = 1 - f.n_kv_head / g.n_kv_head
    out.append(_row("87.5% fewer K/V parameter gradients", "87.5%", f"{100 * kv:.1f}%",
                    "holds" if _close(kv, POST_CLAIMS["kv_grad_cut"], 0.002) else "does not hold", "config"))
    fg, ff = attention_mlp_fractions(g, 32, 256), attention_mlp_fractions(f, 32, 256)
    out.append(_row("MLP FLOPs per layer 8.59 -> 4.30 GFLOP", "8.59 -> 4.30",
                    f"{fg['mlp_gflop']:.2f} -> {ff['mlp_gflop']:.3f}",
                    "holds" if _close(fg["mlp_gflop"], 8.59, 0.005) and _close(ff["mlp_gflop"], 4.30, 0.005)
                    else "does not hold", "ftlib.accounting"))
    fc = attention_mlp_fractions(g, 32, 256, causal=True)
    out.append(_row("attention (QKᵀ+AV) is 4% of block compute", "4.0%",
                    f"{100 * fg['attention']:.1f}% (full T×T), {100 * fc['attention']:.1f}% (causal)",
                    "holds" if _close(fc["attention"], 0.04, 0.25) else "does not hold", "ftlib.accounting"))
    out.append(_row("MLP is 64% of block compute", "64%",
                    f"{100 * fg['mlp']:.1f}% (full), {100 * fc['mlp']:.1f}% (causal)",
                    "holds" if _close(fc["mlp"], 0.64, 0.02) else "does not hold", "ftlib.accounting"))
    tt = attention_matrix_traffic(g, 32, 256, "fp32")
    mb_claim = POST_CLAIMS["attention_matrix_mb_per_step"]
    out.append(_row("(B,H,T,T) traffic is 805 MB per step", "805 MB",
                    f"{tt['write_once_read_once_per_step'] / 1e6:.0f} MB if written once and read once; "
                    f"{tt['bytes_per_step'] / 1e9:.2f} GB as eager GPT-2 really touches it",
                    "does not hold" if tt["bytes_per_step"] > 1.5 * mb_claim * 1e6 else "holds", "ftlib.accounting"))
    # Which SDPA backend the original's (B,1,T,d) K/V gets in fp32: from its profiler trace where
    # stored, else from the kernel rules of ftlib.accounting. 'math' materializes (B,H,T,T).
    be = expected_backend(f.replace(kv_layout="broadcast"), "fp32", (9, 0))
    kernels = {r["model"]: r for r in backend_table(device, precisions=("fp32",))}
    traced = kernels["fasttransformer-broadcast"]["step ms (profiler run)"] is not None
    seen = kernels["fasttransformer-broadcast"]["SDPA backend (from trace)"] if traced else be
    seen_x = kernels["fasttransformer"]["SDPA backend (from trace)"]
    fb, fx = ms("fasttransformer-broadcast", "eager"), ms("fasttransformer", "eager")
    how = "from its trace" if traced else f"expected by the kernel rules; trace {not_measured('profile')}"
    out.append(_row("SDPA keeps (B,H,T,T) out of DRAM ('zero bytes')", "zero bytes",
                    f"original (B,1,T,d) K/V in fp32 -> '{seen}' ({how})"
                    + f"; expanded (B,H,T,d) view -> {seen_x}"
                    + (f"; eager {fb:.1f} vs {fx:.1f} ms" if fb and fx else ""),
                    "does not hold" if "math" in seen.split("+") else "holds",
                    "profile suite (trace)" if traced else "ftlib.accounting rules"))
    conv = [r for r in suite_rows("convergence-original", ok_rows("convergence-original"))
            if r["device_slug"] == device and r["seed"] == 42]
    cg, cf = pick(conv, model="gpt2"), pick(conv, model="fasttransformer")
    if cg and cf:
        pg, pf = (math.exp(c["history"][-1]["batch_loss"]) for c in (cg, cf))
        vg, vf = (math.exp(c["history"][-1]["val_loss"]) for c in (cg, cf))
        fair = {r["model"]: r for r in summary([r for r in suite_rows("convergence", ok_rows("convergence"))
                                                if r["device_slug"] == device])}
        later = ""
        if "gpt2" in fair and "fasttransformer" in fair:
            a, b = fair["fasttransformer"], fair["gpt2"]
            later = (f"; with equal init and recipe, best validation loss {a['best val loss (mean)']:.3f} vs "
                     f"{b['best val loss (mean)']:.3f} over {a['seeds']} seeds (chapter 8)")
        out.append(_row("perplexity at step 200, FastTransformer vs GPT-2", "11.98 vs 12.45 (training batch)",
                        f"batch {pf:.2f} vs {pg:.2f}; validation {vf:.2f} vs {vg:.2f} (seed 42){later}",
                        "holds" if pf < pg and vf < vg else "does not hold", "convergence-original suite"))
    return out
