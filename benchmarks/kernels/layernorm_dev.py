"""LayerNorm forward + backward: check then time. ``python -m benchmarks.kernels.layernorm_dev [--check-only]``.

Variants: v1 eager (F.layer_norm, PyTorch's own fused kernel), v2 torch.compile, v3 Triton.
Shape: the GPT-2 baseline's norm input (8192, 256) with bias. Bytes as in rmsnorm_dev.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import layer_norm_ref
    from kernels.layernorm import layer_norm

    M, N = (8192, 256) if device.type == "cuda" else (37, 256)
    ok = True
    # One function per case so the closures below bind its arguments, not loop variables.
    def case(dtype, tol) -> bool:
        mk = lambda *s, sd=1.0: (sd * torch.randn(*s, device=device)).to(dtype).requires_grad_(True)
        x, w, b = mk(M, N), mk(N, sd=0.1), mk(N, sd=0.1)
        with torch.no_grad():
            w += 1
        dy = torch.randn(M, N, device=device, dtype=dtype)
        ins = (x, w, b)

        def fwd_bwd(f):
            return lambda: (lambda y: (y, *torch.autograd.grad(y, ins, dy)))(f(x, w, b, 1e-5))

        ins64 = [t.detach().double().requires_grad_(True) for t in ins]

        def reference():
            y = layer_norm_ref(*ins64, 1e-5)
            return (y, *torch.autograd.grad(y, ins64, dy.double()))

        compiled = torch.compile(layer_norm_ref) if device.type == "cuda" else layer_norm_ref
        variants = [
            Variant("v1 eager F.layer_norm", fwd_bwd(layer_norm_ref), tol),
            Variant("v2 torch.compile", fwd_bwd(compiled), tol, gpu_only=True),
            Variant("v3 triton", fwd_bwd(layer_norm), tol),
        ]
        return run(f"layernorm fwd+bwd ({M}, {N}) {dtype}", args, device, reference, variants,
                  work=5 * M * N * x.element_size(), unit="GB/s", op="layernorm", shape={"M": M, "N": N},
                  dtype=dtype)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        ok &= case(dtype, tol)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
