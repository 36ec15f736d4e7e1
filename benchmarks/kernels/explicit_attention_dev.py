"""GPT-2's explicit attention, forward + backward, on each path the engine can take: check then time.
``python -m benchmarks.kernels.explicit_attention_dev [--check-only] [--record]``.

Why: GPT-2 as written materializes its (B, nh, T, T) probabilities, and the engine keeps them. Its
default runs the scale, mask and softmax as one kernel each way (``kernels/causal_softmax.py``) between
cuBLAS batched GEMMs, which need q, k, v and the output in head-major layout: in the engine's GPT-2 step
the layout copies and the ``cat`` of d(qkv) are a tenth of the time (``engine_probe``).
``kernels/explicit_attention.py`` fuses the products with the softmax and still writes P (engine option
``fuse_softmax_matmuls``); this measures it against the default before the engine's trial.

Each variant maps the packed qkv projection's output (B, T, 3C) to the attention's output (B, T, C) and
back, the engine's own modules with identity projections: v1 the model's explicit attention eager
(``CausalSelfAttention``), v2 torch.compile of it, v3 the engine's fused softmax
(``FusedSoftmaxSelfAttention``), v4 the fused products (``FusedExplicitSelfAttention``), v5 the same launched
heaviest causal block first (``heavy_first``), v6 with the dQ kernel in one pass (the engine's default,
``explicit_dq_one_pass``) and v7 that heaviest block first. Shape: GPT-2's at
the book's headline (B=32, nh=8, T=256, hs=32), in bf16 and in fp32 with TF32 products. Checked
against the fp64 reference (``ftlib.model.reference.causal_attention_ref``). Work: the causal half of
the four products forward (4 B nh T^2 hs / 2) and 2.5x that backward; bytes: P written once and read
once, and qkv, y, dy, d(qkv) moved once (the floor of any path that materializes P).

Not part of the ``kernels`` suite: run it with ``--record`` to store its rows in ``kernels.jsonl``.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch
    import torch.nn as nn

    from ftlib.core.precision import Precision
    from ftlib.model.attention import CausalSelfAttention
    from ftlib.model.config import preset
    from ftlib.model.reference import causal_attention_ref
    from ftlib.training.engine.attention import FusedExplicitSelfAttention, FusedSoftmaxSelfAttention
    from ftlib.training.engine.swaps import dq_one_pass_tiles

    cuda = device.type == "cuda"
    B, T = (32, 256) if cuda else (1, 37)
    cfg = preset("gpt2", block_size=T)
    nh, hs, C = cfg.n_head, cfg.head_size, cfg.n_embd
    ok = True

    class Given(nn.Module):
        """In place of the qkv projection: returns the packed qkv the case drew (the block's input, a
        (B, T, C) placeholder, gives the modules only their shapes)."""

        def __init__(self, t: torch.Tensor) -> None:
            super().__init__()
            self.t = t

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.t

    def core(module: nn.Module, qkv: torch.Tensor) -> nn.Module:
        """The attention block with the projections taken out: packed qkv (B, T, 3C) -> (B, T, C)."""
        module.qkv, module.proj, module.resid_dropout = Given(qkv), nn.Identity(), nn.Identity()
        return module.to(device)

    # One function per case so the closures below bind its arguments, not loop variables.
    def case(dtype: torch.dtype, tf32: bool) -> bool:
        g = torch.Generator(device="cpu").manual_seed(0)
        qkv = torch.randn(B, T, 3 * C, generator=g).to(device, dtype).requires_grad_(True)
        dy = torch.randn(B, T, C, generator=g).to(device, dtype)
        low = dtype if dtype != torch.float32 else None
        prec = "tf32" if tf32 else "ieee"
        x = torch.zeros(B, T, C, device=device, dtype=dtype)
        eager = core(CausalSelfAttention(cfg), qkv)

        def fused(**kw) -> nn.Module:
            return core(FusedExplicitSelfAttention(CausalSelfAttention(cfg), low, prec, **kw), qkv)

        one_pass = dq_one_pass_tiles(T)  # the engine's dQ tile
        paths = [("v1 eager", eager, "pytorch"),
                 ("v2 torch.compile", torch.compile(eager) if cuda else eager, "compile"),
                 ("v3 triton fused softmax", core(FusedSoftmaxSelfAttention(CausalSelfAttention(cfg), low), qkv),
                  "triton"),
                 ("v4 triton fused products", fused(), "triton"),
                 ("v5 triton fused products, heavy first", fused(heavy_first=True), "triton"),
                 ("v6 triton fused products, dQ one pass", fused(dq_one_pass=one_pass), "triton"),
                 ("v7 triton fused products, dQ one pass, heavy first", fused(dq_one_pass=one_pass,
                                                                              heavy_first=True), "triton")]

        def fwd_bwd(m: nn.Module):
            def go():
                y = m(x)
                return (y, *torch.autograd.grad(y, qkv, dy))
            return go

        def reference():
            x64 = qkv.detach().double().requires_grad_(True)
            q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in x64.split(C, dim=-1))  # (B, nh, T, hs)
            y = causal_attention_ref(q, k, v).transpose(1, 2).reshape(B, T, C)
            return (y, *torch.autograd.grad(y, x64, dy.double()))

        tol = 3e-2 if dtype != torch.float32 else (5e-3 if tf32 else 1e-5)
        name = "tf32" if tf32 else {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
        variants = [Variant(n, fwd_bwd(m), tol, gpu_only=(impl == "compile"), impl=impl,
                            precision="tf32" if tf32 else "") for n, m, impl in paths]
        n_p = B * nh * T * T
        with Precision.of("tf32" if tf32 else "fp32").matmul_flags():  # cuBLAS's fp32 products as the step's
            return run(f"GPT-2 explicit attention fwd+bwd B={B} nh={nh} T={T} hs={hs} {name}", args, device,
                       reference, variants, unit="GB/s", op="explicit_attention",
                       flops=4 * B * nh * T * T * hs / 2 * (1 + 2.5),
                       nbytes=2 * n_p * (low or dtype).itemsize + 2 * B * T * (3 * C + C) * qkv.element_size(),
                       shape={"B": B, "nh": nh, "T": T, "hs": hs}, dtype=dtype)

    for dtype, tf32 in ((torch.bfloat16, False), (torch.float32, True)):
        ok &= case(dtype, tf32)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
