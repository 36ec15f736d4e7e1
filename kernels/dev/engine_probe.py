"""Where the engine's step goes, and how fast each candidate kernel is inside a graph.

    python -m kernels.dev.engine_probe --out DIR     (GPU only; writes DIR/engine_probe.json)

1. Ceilings: a 1 GiB device-to-device copy (bytes read + written) and 8192^3 matmuls in
   strict fp32, TF32 and bf16, fresh random inputs, CUDA events.
2. Attention fwd+bwd at the FastTransformer's shape (B=32, nh=8, nkv=1, T=256, hs=32),
   each variant captured in a CUDA graph (the engine runs it in one): SDPA with expanded
   K/V (memory-efficient kernel; strict fp32 and under the TF32 flag) against the Triton
   kernel in 'ieee', 'tf32x3' and 'tf32', with 32/64 tiles and 4/8 warps. Checked against
   the fp64 reference first.
3. The engine's kernels: one uncaptured engine step under torch.profiler per case, kernel
   time summed by name (the graph replays the same kernels without the launch gaps), next
   to the captured step's median time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _events_us(fn, iters: int = 30) -> list[float]:
    out = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return out


def _stats(ts: list[float]) -> dict:
    q = statistics.quantiles(ts, n=5)
    return {"median_us": statistics.median(ts), "p20_us": q[0], "p80_us": q[3]}


def ceilings() -> list[dict]:
    rows = []
    n = (1 << 30) // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    st = _stats(_events_us(lambda: dst.copy_(src), 20))
    rows.append({"op": "ceiling", "variant": "d2d copy 1 GiB", **st,
                 "GBps": 2 * n * 4 / (st["median_us"] * 1e-6) / 1e9})
    src = dst = None  # free 2 GiB before the matmuls
    cases = (("fp32", torch.float32, False), ("tf32", torch.float32, True), ("bf16", torch.bfloat16, False))
    for name, dtype, tf32 in cases:
        a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
        b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            a @ b
            st = _stats(_events_us(lambda a=a, b=b: a @ b, 10))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        rows.append({"op": "ceiling", "variant": f"matmul 8192^3 {name}", **st,
                     "TFLOPs": 2 * 8192**3 / (st["median_us"] * 1e-6) / 1e12})
    for r in rows:
        print(f"ceiling {r['variant']:<22} {r['median_us']:9.1f} us  {r.get('GBps', r.get('TFLOPs')):8.1f}", flush=True)
    return rows


def attention_variants(B=32, nh=8, nkv=1, T=256, hs=32) -> list[dict]:
    from ftlib.attention import kv_for_sdpa
    from ftlib.reference import causal_attention_ref
    from kernels.attention import flash_attention
    from kernels.dev.matmul_dev import graph_time_us

    q = torch.randn(B, nh, T, hs, device="cuda", requires_grad=True)
    k = torch.randn(B, nkv, T, hs, device="cuda", requires_grad=True)
    v = torch.randn(B, nkv, T, hs, device="cuda", requires_grad=True)
    do = torch.randn(B, nh, T, hs, device="cuda")
    ins64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    o64 = causal_attention_ref(*ins64)
    want = (o64, *torch.autograd.grad(o64, ins64, do.double()))

    def sdpa(a, b, c):
        return F.scaled_dot_product_attention(a, kv_for_sdpa(b, nh, "expand")[0], kv_for_sdpa(c, nh, "expand")[0],
                                              is_causal=True)

    variants = [("sdpa expand fp32", sdpa, False, None), ("sdpa expand tf32-flag", sdpa, True, None)]
    for prec in ("ieee", "tf32x3", "tf32"):
        for blk in (32, 64):
            for warps in (4, 8):
                variants.append((f"triton {prec} {blk}x{blk} w{warps}",
                                 (lambda a, b, c, prec=prec, blk=blk, warps=warps: flash_attention(
                                     a, b, c, None, prec, blk, blk)) if warps == 4 else
                                 (lambda a, b, c, prec=prec, blk=blk, warps=warps:
                                  _fa_warps(a, b, c, prec, blk, warps)),
                                 False, prec))
    rows = []
    for name, f, tf32, _prec in variants:
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            def fb(f=f):
                o = f(q, k, v)
                return (o, *torch.autograd.grad(o, (q, k, v), do))
            got = fb()
            err = max(((g.double() - w).norm() / w.norm()).item() for g, w in zip(got, want))
            t = graph_time_us(fb, reps=5, replays=30)
            row = {"op": "attention", "variant": name, "median_us": t[0], "p20_us": t[1], "p80_us": t[2],
                   "rel_err": err}
        except Exception as e:  # a variant that fails to compile is a row, not a crash
            row = {"op": "attention", "variant": name, "error": f"{type(e).__name__}: {e}"[:300]}
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
        rows.append(row)
        print(f"attention {name:<28} {row.get('median_us', float('nan')):8.1f} us  rel err {row.get('rel_err')}"
              f" {row.get('error', '')}", flush=True)
    return rows


def _fa_warps(q, k, v, prec, blk, warps):
    """flash_attention with num_warps=warps (the autograd.Function fixes 4; a local Function here)."""
    from kernels.attention import attention_bwd, attention_fwd

    class _F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = attention_fwd(q, k, v, None, prec, blk, blk, num_warps=warps)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            return attention_bwd(do, q, k, v, o, lse, None, prec, blk, blk, num_warps=warps)

    return _F.apply(q, k, v)


def engine_profile(name: str, precision: str, **engine_kw) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from ftlib.config import preset
    from ftlib.engine import Engine

    cfg = preset(name)
    x = torch.randint(cfg.vocab_size, (32, 256), device="cuda")
    y = torch.randint(cfg.vocab_size, (32, 256), device="cuda")
    eng = Engine(cfg, 32, 256, precision, "cuda", capture=True, **engine_kw)
    for _ in range(5):
        eng.step(x, y)
    torch.cuda.synchronize()
    st = _stats(_events_us(lambda: eng.step(x, y), 50))
    eng_u = Engine(cfg, 32, 256, precision, "cuda", capture=False, **engine_kw)
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
    return {"op": "engine", "preset": name, "precision": precision,
            "engine_kw": {k: str(v) for k, v in engine_kw.items()},
            "describe": eng.describe(), **{f"step_{k}": v for k, v in st.items()}, "kernel_us": total,
            "kernels": [{"name": n[:300], "count": c, "us": us} for n, c, us in top[:60]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="ceilings,attention,engine")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    rows: list[dict] = []
    path = out / "engine_probe.json"

    def save():
        path.write_text(json.dumps(rows, indent=1))

    t0 = time.time()
    if "ceilings" in parts:
        rows += ceilings()
        save()
    if "attention" in parts:
        rows += attention_variants()
        save()
    if "engine" in parts:
        cases = [("fasttransformer", "fp32", {}), ("fasttransformer", "tf32", {}), ("gpt2", "fp32", {}),
                 ("fasttransformer", "fp32", {"linear_precision": "tf32x3", "attention_precision": "tf32x3"}),
                 ("gpt2", "fp32", {"linear_precision": "tf32x3"}),
                 ("fasttransformer", "tf32", {"linear_precision": "tf32"})]
        for name, prec, kw in cases:
            try:
                rows.append(engine_profile(name, prec, **kw))
            except Exception as e:
                rows.append({"op": "engine", "preset": name, "precision": prec,
                             "error": f"{type(e).__name__}: {e}"[:500]})
                print(rows[-1], flush=True)
            save()
    print(f"engine_probe done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
