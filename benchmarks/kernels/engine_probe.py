"""Where the engine's step goes: its kernels by name, next to the captured step's time.

    python -m benchmarks.kernels.engine_probe --out DIR     (GPU only; writes DIR/engine_probe.jsonl)

Rows (one per case, ``bench='engine_probe'``) are committed as data/results/<gpu>/engine_probe.jsonl
and read by chapter 6 (``ftlib.views.engine.probe_table``).

Per case, the captured engine step is timed (median of 50 replays queued back to back), then an uncaptured engine
of the same configuration runs three steps under torch.profiler and the CUDA kernel time is
summed by kernel name: the graph replays exactly these kernels without the launch gaps, so
the table says which kernels are worth removing or speeding up next. (The
ceilings are measured by ``benchmarks/kernels/ceilings.py`` and the attention variants in a graph
by ``attention_dev.py``, both through ``benchmarks/kernels/suite.py``.)

It runs in a process of its own: a failed capture earlier in the same process (e.g. the
attention's) leaves the CUDA generator in capture state.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.kernels._harness import quantiles_us
from ftlib.core.timing import time_calls

STEP_TIMING = "back to back"  # how step_median_us was timed; rows without the field timed one synchronized step


def engine_profile(name: str, precision: str, cfg=None, B: int = 32, **engine_kw) -> dict:
    """Profile the engine step of preset ``name`` (or of ``cfg``, labelled ``name``) at (B, 256)."""
    from torch.profiler import ProfilerActivity, profile

    from ftlib.model.config import preset
    from ftlib.training.engine import Engine

    cfg = preset(name) if cfg is None else cfg
    x = torch.randint(cfg.vocab_size, (B, 256), device="cuda")
    y = torch.randint(cfg.vocab_size, (B, 256), device="cuda")
    eng = Engine(cfg, B, 256, precision, "cuda", capture=True, **engine_kw)
    for _ in range(5):
        eng.step(x, y)
    torch.cuda.synchronize()
    # Back to back, as the baselines suite times a step: each replay queued while the previous one runs, so the
    # host's launch of the next graph is hidden behind the GPU's work rather than counted in the step.
    st = quantiles_us(time_calls(lambda _: eng.step(x, y), 50, torch.device("cuda"))[0])
    eng_u = Engine(cfg, B, 256, precision, "cuda", capture=False, **engine_kw)
    for _ in range(3):
        eng_u.step(x, y)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            eng_u.step(x, y)
        torch.cuda.synchronize()
    kern: dict[str, list] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            d = kern.setdefault(ev.name, [0, 0.0])
            d[0] += 1
            d[1] += ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
    top = sorted(((n, c / 3, us / 3) for n, (c, us) in kern.items()), key=lambda t: -t[2])
    total = sum(t[2] for t in top)
    print(f"engine {name} {precision} {engine_kw}: captured step {st['median_us']:.0f} us; "
          f"kernel time {total:.0f} us in {sum(t[1] for t in top):.0f} kernels", flush=True)
    for n, c, us in top[:14]:
        print(f"    {us:8.1f} us  x{c:4.0f}  {n[:110]}", flush=True)
    from ftlib.harness.provenance import provenance

    label = name + "".join(f" {k}={v}" for k, v in engine_kw.items()) + (f" B={B}" if B != 32 else "")
    return {"key": f"engine_probe|{label}|{precision}|B{B}|T256", "bench": "engine_probe", "label": label,
            "status": "ok", "B": B, "T": 256, "config": cfg.to_dict(),
            "op": "engine", "preset": name, "precision": precision, **provenance(torch.device("cuda")),
            "engine_kw": {k: str(v) for k, v in engine_kw.items()},
            "describe": eng.describe(), **{f"step_{k}": v for k, v in st.items()}, "step_timing": STEP_TIMING,
            "kernel_us": total,
            "kernels": [{"name": n[:300], "count": c, "us": us} for n, c, us in top[:60]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    path = out / "engine_probe.jsonl"

    def save():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    t0 = time.time()
    from ftlib.harness.engine_suites import BIAS_OPTIONS_OFF

    # The engine's defaults (packed attention, fused residual-norm): the headline cases first.
    cases = [("fasttransformer", "tf32", {}), ("fasttransformer", "bf16", {}),
             # the norms' dweight partials on the persistent grid: the step's torch column sums shrink
             ("fasttransformer", "bf16", {"norm_dw_partials": "persistent"}),
             # the MQA dK/dV split sums back on torch (a sum, a cast and a copy each): 12 launches more
             ("fasttransformer", "bf16", {"fuse_kv_split_sum": False}),
             # the norms' weight gradients back on partial rows, torch column sums and autograd adds
             ("fasttransformer", "bf16", {"norm_dw_into_buffer": False}),
             ("gpt2", "tf32", {"attention_for_explicit": True}),
             ("gpt2", "tf32", {}),  # as written: explicit softmax (fused by default)
             ("fasttransformer", "fp32", {"linear_precision": "tf32x3", "attention_precision": "tf32x3"}),
             ("fasttransformer", "fp32", {}), ("gpt2", "fp32", {}),
             # the MLPs' GELU in the GEMM epilogues: two elementwise kernels per block go
             ("fasttransformer", "bf16", {"fuse_mlp_act": True}), ("gpt2", "tf32", {"fuse_mlp_act": True}),
             # GPT-2 as written in bf16 (its attention's products fused around the softmax by default, P still
             # written), and with them back on cuBLAS's batched GEMMs, their layout copies and the cat of d(qkv)
             ("gpt2", "bf16", {}), ("gpt2", "bf16", {"fuse_softmax_matmuls": False}),
             ("gpt2", "tf32", {"fuse_softmax_matmuls": False}),
             # GPT-2 without its bias and first-norm defaults (ftlib.harness.suites): the torch sums, adds and
             # casts of its bias gradients, its projections' column sums and the first norm's own kernel come back
             ("gpt2", "bf16", BIAS_OPTIONS_OFF), ("gpt2", "tf32", BIAS_OPTIONS_OFF),
             # GPT-2's dQ kernel back on two passes over each row's keys (one-pass by default)
             ("gpt2", "bf16", {"explicit_dq_one_pass": False}),
             # GPT-2's up-projection bias gradient back on its own column-sum kernel (GELU's backward sums it by
             # default), and the qkv bias gradient added by the attention's backward kernels (an option)
             ("gpt2", "tf32", {"fc_bias_into_gelu": False}), ("gpt2", "tf32", {"qkv_bias_into_attention": True})]
    # The speedrun's step (chapter 8): 256x6 FT-style, B=64, residual dropout 0.2 (fused), bf16.
    from ftlib.harness.studies import SPEEDRUN_PROBE, speedrun_candidates

    run_cfg, run_rec = speedrun_candidates()[SPEEDRUN_PROBE]
    run_kw = {"cfg": run_cfg, "B": run_rec.batch_size, **dict(run_rec.engine_options)}
    # With the fused dropout (Philox per element), without it, and with Philox per 4 columns.
    cases[2:2] = [("speedrun 256x6 dropout 0.2", run_rec.precision, run_kw),
                  ("speedrun 256x6 dropout 0.2", run_rec.precision, {**run_kw, "fuse_dropout": False}),
                  ("speedrun 256x6 dropout 0.2", run_rec.precision, {**run_kw, "dropout_rng4": True})]
    for name, prec, kw in cases:
        try:
            rows.append(engine_profile(name, prec, **kw))
        except Exception as e:
            rows.append({"key": f"engine_probe|{name}|{prec}|error", "bench": "engine_probe", "label": name,
                         "status": "error", "op": "engine",
                         "preset": name, "precision": prec,
                         "error": f"{type(e).__name__}: {e}"[:500]})
            print(rows[-1], flush=True)
        save()
    print(f"engine_probe done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
