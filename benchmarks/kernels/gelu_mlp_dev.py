"""The MLP forward + backward with GELU in the GEMM epilogues, against the unfused MLP: check then time.
``python -m benchmarks.kernels.gelu_mlp_dev [--check-only] [--record]``.

Why: in the engine's bf16 FastTransformer step the MLP's GELU runs as one elementwise kernel each way
(``benchmarks/kernels/engine_probe.py``): forward it reads the up-projection's output and writes the
activation, backward it reads that output and the gradient a GEMM wrote only to be read back.
``kernels/gelu_mlp.py`` puts both into the epilogues of a Triton tile GEMM. Whether its GEMMs keep up
with cuBLAS's at these skinny shapes is the question this answers before the engine's trial.

Variants: v1 eager (``F.linear``, ``F.gelu``, ``F.linear`` under autograd: cuBLAS and two elementwise
kernels), v2 torch.compile of the same, v3 ``kernels.gelu_mlp.gelu_mlp``. Each returns y and the
gradients of x, W1 and W2, checked against the fp64 reference (``ftlib.model.reference.gelu_mlp_ref``).
Shapes: x (8192, C) for FastTransformer (C = 256, F = 512, no biases) and GPT-2 (C = 768, F = 3072,
with biases), bf16, tanh-GELU. Work: the MLP's six GEMMs, 12 M C F FLOPs; bytes: x, y, dy and dx
(M x C each), z, a and dz (M x F each), moved twice.

Not part of the ``kernels`` suite: run it with ``--record`` to store its rows in ``kernels.jsonl``.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import gelu_mlp_ref
    from kernels.gelu_mlp import gelu_mlp

    cuda = device.type == "cuda"
    M = 8192 if cuda else 37
    shapes = [("fasttransformer", 256, 512, False), ("gpt2", 768, 3072, True)] if cuda else [("small", 24, 50, True)]
    dtype = torch.bfloat16
    ok = True

    # One function per case so the closures below bind its arguments, not loop variables.
    def case(name: str, C: int, F: int, bias: bool) -> bool:
        g = torch.Generator(device="cpu").manual_seed(0)
        mk = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g)).to(device, dtype)  # noqa: E731
        x = mk(M, C).requires_grad_(True)
        w1, w2 = mk(F, C, scale=C ** -0.5).requires_grad_(True), mk(C, F, scale=F ** -0.5).requires_grad_(True)
        b1, b2 = (mk(F, scale=0.1), mk(C, scale=0.1)) if bias else (None, None)
        b1, b2 = (t.requires_grad_(True) if t is not None else None for t in (b1, b2))
        dy = mk(M, C)
        leaves = [t for t in (x, w1, b1, w2, b2) if t is not None]

        def fwd_bwd(f):
            def go():
                y = f(x, w1, b1, w2, b2)
                return (y, *torch.autograd.grad(y, leaves, dy))
            return go

        p64 = [t.detach().double().requires_grad_(True) if t is not None else None for t in (x, w1, b1, w2, b2)]

        def reference():
            y = gelu_mlp_ref(*p64)
            return (y, *torch.autograd.grad(y, [t for t in p64 if t is not None], dy.double()))

        compiled = torch.compile(gelu_mlp_ref) if cuda else gelu_mlp_ref
        variants = [Variant("v1 eager", fwd_bwd(gelu_mlp_ref), 3e-2),
                    Variant("v2 torch.compile", fwd_bwd(compiled), 3e-2, gpu_only=True),
                    Variant("v3 triton GELU epilogues", fwd_bwd(gelu_mlp), 3e-2)]
        return run(f"MLP fwd+bwd {name} ({M}, {C}) -> {F} bf16", args, device, reference, variants,
                   unit="TFLOP/s", op="gelu_mlp", flops=12 * M * C * F,
                   nbytes=2 * M * (4 * C + 3 * F) * 2, shape={"M": M, "C": C, "F": F, "bias": bias}, dtype=dtype)

    for name, C, F, bias in shapes:
        ok &= case(name, C, F, bias)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
