"""Measured ceilings of this GPU: copy bandwidth and matmul rate. ``python -m benchmarks.kernels.ceilings``.

The kernel rows are judged against what the card reaches, not against its datasheet
(benchmarks/kernels/NOTES.md used the datasheet until these existed):

* ``copy``: a 1 GiB device-to-device copy (``dst.copy_(src)``); bytes = read + write (2 GiB).
* ``matmul fp32``, ``matmul tf32``, ``matmul bf16``: an 8192 x 8192 x 8192 ``torch.mm``
  (2 n^3 FLOPs) in strict fp32 (TF32 off), TF32 and bf16 storage.

Fresh random data each case, CUDA events around each call (one call is 0.4-20 ms, so launch
overhead is noise), median / p20 / p80 over the calls. Each result is checked first: the copy
must be exact; the first 64 rows of each product are compared with fp64, and the fp32 tolerance
is tight enough that a product silently run in TF32 fails it. Rows: ``op='ceiling'`` in
kernels.jsonl. On the CPU the same code runs at tiny sizes (wall clock) to exercise it.
"""

from __future__ import annotations

import time

import torch

from benchmarks.kernels._harness import Recorder, kernel_row_key, make_row, parse_args, quantiles_us, setup

# (variant, storage dtype, matmul precision, tolerance of max |C - C64| / max |C64|)
MATMULS = (("matmul fp32", torch.float32, "fp32", 1e-5), ("matmul tf32", torch.float32, "tf32", 5e-3),
           ("matmul bf16", torch.bfloat16, "bf16", 1e-2))


def _times_ms(fn, device: torch.device, reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _timed(times_ms: list[float], device: torch.device) -> dict:
    return {**quantiles_us(times_ms), "timer": "cuda events" if device.type == "cuda" else "perf-counter"}


def copy_ceiling(device: torch.device, nbytes: int, reps: int) -> dict:
    """Device-to-device copy of ``nbytes`` of fp32: GB/s counting the read and the write."""
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    err = 0.0 if torch.equal(dst, src) else 1.0
    t = _timed(_times_ms(lambda: dst.copy_(src), device, reps), device)
    return make_row(op="ceiling", variant="copy", impl="pytorch", case=f"device-to-device copy {nbytes / 2**20:g} MiB",
                    shape={"bytes": nbytes}, dtype="fp32", precision="fp32", timing="eager", device=device,
                    nbytes=2.0 * nbytes, flops=None, bound="memory", status="ok", timed=t, check_err=err,
                    check_tol=0.0, note="bytes = read + write")


def matmul_ceiling(device: torch.device, n: int, variant: str, dtype: torch.dtype, prec: str, tol: float,
                   reps: int) -> dict:
    """An n x n x n torch.mm at one precision: TFLOP/s of 2 n^3 FLOPs."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        torch.mm(a, b, out=c)
        rows = min(64, n)
        want = a[:rows].double() @ b.double()
        err = ((c[:rows].double() - want).abs().max() / want.abs().max()).item()
        common = dict(op="ceiling", variant=variant, impl="pytorch", case=f"torch.mm {n}x{n}x{n} {prec}",
                      shape={"M": n, "N": n, "K": n}, dtype={torch.bfloat16: "bf16"}.get(dtype, "fp32"),
                      precision=prec, timing="eager", device=device, nbytes=3.0 * n * n * a.element_size(),
                      flops=2.0 * n**3, bound="compute", check_err=err, check_tol=tol)
        if err > tol:
            return make_row(**common, status="check_failed", note="not timed: the check failed")
        t = _timed(_times_ms(lambda: torch.mm(a, b, out=c), device, reps), device)
        return make_row(**common, status="ok", timed=t, note="fresh randn operands; torch.mm (cuBLAS on a GPU)")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def measure(device: torch.device, recorder: Recorder) -> bool:
    """Every ceiling not yet stored; returns False if a check failed."""
    cuda = device.type == "cuda"
    nbytes, n = (2**30, 8192) if cuda else (2**22, 128)
    ok = True
    cases = [("copy", {"bytes": nbytes}, "fp32", lambda: copy_ceiling(device, nbytes, 50 if cuda else 5))]
    for variant, dtype, prec, tol in MATMULS:
        dname = {torch.bfloat16: "bf16"}.get(dtype, "fp32")
        cases.append((variant, {"M": n, "N": n, "K": n}, dname,
                      lambda v=variant, d=dtype, p=prec, t=tol: matmul_ceiling(device, n, v, d, p, t,
                                                                              20 if cuda else 3)))
    print(f"== ceilings on {torch.cuda.get_device_name() if cuda else 'CPU'}")
    for variant, shape, dname, go in cases:
        if recorder.has(kernel_row_key("ceiling", variant, shape, dname, "eager")):
            print(f"{variant:>24}: stored")
            continue
        if recorder.out_of_time():
            print(f"{variant:>24}: budget spent; stopping")
            return ok
        try:
            row = go()
        except Exception as e:  # an OOM on a smaller card is a row, not a crash
            row = make_row(op="ceiling", variant=variant, impl="pytorch", case=variant, shape=shape, dtype=dname,
                           precision=dname, timing="eager", device=device, nbytes=None, flops=None,
                           bound="memory" if variant == "copy" else "compute", status="error",
                           note=f"{type(e).__name__}: {e}"[:1000])
        ok &= row["status"] == "ok"
        rate = f"{row['gb_s']:.0f} GB/s" if row.get("gb_s") and variant == "copy" else (
            f"{row['tflop_s']:.1f} TFLOP/s" if row.get("tflop_s") else "")
        med = f"{row['median_us']:9.1f} us" if row.get("median_us") else ""
        print(f"{variant:>24}: {row['status']} err {row.get('check_err')} {med} {rate} "
              f"(frac of datasheet {row.get('frac_peak')}) {row.get('note', '')[:120]}")
        recorder.add(row)
        if cuda:
            torch.cuda.empty_cache()  # 1 GiB buffers and 800 MB operands: give them back between cases
    return ok


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    if args.check_only:
        return 0  # the ceilings check themselves as they are measured
    return 0 if measure(device, args.recorder or Recorder()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
