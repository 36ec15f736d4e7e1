"""GPT-2's materialized attention softmax (scale + causal mask + softmax), forward + backward:
check then time. ``python -m benchmarks.kernels.causal_softmax_dev [--check-only]``.

Variants: v1 eager (``ftlib.attention.causal_softmax_ref``: a scale kernel, a masked_fill, a
softmax, and their three backwards), v2 torch.compile of the same (one fused kernel each way,
what compile-ro runs inside GPT-2), v3 ``kernels/causal_softmax.py`` (16 rows of T = 256 per
program, 4 warps), v4 and v5 the same kernel on 4 and 8 rows per program (1 and 2 warps).
Shape: GPT-2's scores at B=32, nh=8, T=256: (32, 8, 256, 256), fp32 and bf16 (bf16 scores
in, fp32 math, bf16 probabilities out, as under autocast). Bytes (the floor): forward reads S
and writes P, backward reads P and dP and writes dS: 5 passes of B nh T T.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import causal_softmax_ref
    from kernels.causal_softmax import causal_softmax

    shape = (32, 8, 256, 256) if device.type == "cuda" else (2, 3, 13, 13)
    scale = 32 ** -0.5
    ok = True

    # One function per case so the closures below bind its arguments, not loop variables.
    def case(dtype, tol) -> bool:
        s = (3 * torch.randn(*shape, device=device, dtype=dtype)).requires_grad_(True)
        dp = torch.randn(*shape, device=device, dtype=dtype)

        def fwd_bwd(f):
            def go():
                p = f(s)
                return (p, *torch.autograd.grad(p, s, dp.to(p.dtype)))
            return go

        s64 = s.detach().double().requires_grad_(True)

        def reference():
            p = causal_softmax_ref(s64, scale)
            return (p, *torch.autograd.grad(p, s64, dp.double()))

        def eager(t):
            return causal_softmax_ref(t, scale).to(dtype)  # the cast: what autocast's fp32 softmax feeds a bf16 matmul

        compiled = torch.compile(eager) if device.type == "cuda" else eager
        variants = [
            Variant("v1 eager", fwd_bwd(eager), tol),
            Variant("v2 torch.compile", fwd_bwd(compiled), tol, gpu_only=True),
            Variant("v3 triton fused", fwd_bwd(lambda t: causal_softmax(t, scale, dtype)), tol),
        ]
        # v4, v5: fewer rows per program (more programs; warps follow the tile: 4 x 256 -> 1 warp,
        # the RMSNorm winner's shape), after v3 lost to Inductor by ~15% (kernels.jsonl).
        for v, rows in (("v4", 4), ("v5", 8)):
            variants.append(Variant(f"{v} triton fused, {rows} rows", fwd_bwd(
                lambda t, n=rows: causal_softmax(t, scale, dtype, n)), tol))
        n = s.numel() * s.element_size()
        return run(f"causal softmax {tuple(shape)} {dtype}", args, device, reference, variants,
                   work=5 * n, unit="GB/s", op="causal_softmax", shape=dict(zip("BHTS", shape)), dtype=dtype)

    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        ok &= case(dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
