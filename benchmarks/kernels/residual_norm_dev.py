"""Residual add + the norm after it, forward + backward: check then time.
``python -m benchmarks.kernels.residual_norm_dev [--check-only]``.

Variants: v1 eager (``s = x + r`` then ``ftlib.model.norm``'s RMSNorm / LayerNorm: an add kernel, a
norm kernel, and backward autograd's add of the two gradients reaching s), v2 torch.compile of
the same, v3 the fused kernel of ``kernels/residual_norm.py`` (one kernel each way, 16 rows
per program), v4 the model's row-tile RMSNorm after an
eager add (the unfused engine, RMSNorm only), v5 and v6 the fused kernel on 4- and 8-row
tiles; v7-v9 the fused kernel with its backward's dweight (and dbias) partials on a persistent grid
(``dw_partials="persistent"``: a partial row per program, not per tile): v7 the default grid (4-row
tiles, 4 one-warp programs per SM), v8 one program per SM (Liger's grid), v9 16-row tiles (4 warps,
one program per SM). Shape: one FastTransformer / GPT-2 norm input, (B*T, C) =
(8192, 256), fp32 and bf16; both outputs s and h receive gradients, as in a block.
Bytes (the floor): forward reads x and r, writes s and h; backward reads ds, dh and s and
writes one gradient (dx = dr): 8 passes of M x N; weight, rstd and partials left out.

Residual dropout (p = 0.2, RMSNorm): v1 eager with the mask as a tensor
(``nn.Dropout``'s traffic: the masked multiply forward, its mask read backward, on top of
the add and the norm), v2 torch.compile of it, v3 the fused kernel drawing the mask itself
(Philox per element, redrawn in the backward), v4 the same kernel drawing one Philox4x32 call
per 4 columns (``rng4``; v3 made the speedrun step slower, its Philox work being the cost), v5 that
with the persistent dweight partials (the mask redrawn from the element's row and column on the
persistent grid). The check compares with
the same mask (``kernels.residual_norm.keep_mask``). The floor is 9 passes (dr is written apart
from dx: the mask scales it).
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import add_layer_norm_ref, add_rms_norm_ref
    from kernels._common import num_programs
    from kernels.residual_norm import add_layer_norm, add_rms_norm, keep_mask
    from kernels.rmsnorm import rms_norm

    M, N = (8192, 256) if device.type == "cuda" else (37, 256)
    sms = num_programs(device, M)  # one program per SM (a few in the interpreter): the one-per-SM grid
    ok = True

    # One function per case so the closures below bind its arguments, not loop variables.
    def case(kind: str, dtype, tol) -> bool:
        def mk(*shape):
            return torch.randn(*shape, device=device, dtype=dtype)

        x, r = mk(M, N).requires_grad_(True), mk(M, N).requires_grad_(True)
        w = (1 + 0.1 * mk(N)).requires_grad_(True)
        b = (0.1 * mk(N)).requires_grad_(True)
        ds, dh = mk(M, N), mk(M, N)
        ln = kind == "layernorm"
        params = (x, r, w, b) if ln else (x, r, w)
        ref = (lambda a, c, d, e: add_layer_norm_ref(a, c, d, e, 1e-5)) if ln else (
            lambda a, c, d, e: add_rms_norm_ref(a, c, d, 1e-5))

        def fwd_bwd(f):
            def go():
                s, h = f(x, r, w, b)
                return (s, h, *torch.autograd.grad((s, h), params, (ds, dh)))
            return go

        p64 = [t.detach().double().requires_grad_(True) for t in (x, r, w, b)]

        def reference():
            s, h = ref(*p64)
            return (s, h, *torch.autograd.grad((s, h), p64[: len(params)], (ds.double(), dh.double())))

        compiled = torch.compile(ref) if device.type == "cuda" else ref
        fused = (lambda a, c, d, e: add_layer_norm(a, c, d, e, 1e-5)) if ln else (
            lambda a, c, d, e: add_rms_norm(a, c, d, 1e-5))
        variants = [
            Variant("v1 eager", fwd_bwd(ref), tol),
            Variant("v2 torch.compile", fwd_bwd(compiled), tol, gpu_only=True),
            Variant("v3 triton fused", fwd_bwd(fused), tol),
        ]
        if not ln:
            def unfused(a, c, d, e):
                s = a + c
                return s, rms_norm(s, d, 1e-5)
            variants.append(Variant("v4 add + triton rmsnorm", fwd_bwd(unfused), tol))
        # v5, v6: the fused kernel on smaller row tiles (v3 takes 16 rows with 4 warps; the RMSNorm
        # kernel won with 4 rows and 1 warp, kernels.jsonl v5). Warps follow the tile size.
        for v, rows in (("v5", 4), ("v6", 8)):
            tiled = (lambda a, c, d, e, rows=rows: add_layer_norm(a, c, d, e, 1e-5, rows=rows)) if ln else (
                lambda a, c, d, e, rows=rows: add_rms_norm(a, c, d, 1e-5, rows=rows))
            variants.append(Variant(f"{v} triton fused {rows} rows", fwd_bwd(tiled), tol))
        # v7-v9: the persistent dweight partials (programs None: the default grid, a few per SM). No commas
        # in these names, so that --variants can pick them.
        for v, rows, programs, what in (("v7", 4, None, ""), ("v8", 4, sms, " 1 program per SM"),
                                        ("v9", 16, None, " 16 rows")):
            kw = dict(rows=rows, dw_partials="persistent", programs=programs)
            persistent = (lambda a, c, d, e, kw=kw: add_layer_norm(a, c, d, e, 1e-5, **kw)) if ln else (
                lambda a, c, d, e, kw=kw: add_rms_norm(a, c, d, 1e-5, **kw))
            variants.append(Variant(f"{v} triton fused persistent dw{what}", fwd_bwd(persistent), tol))
        return run(f"residual+{kind} fwd+bwd ({M}, {N}) {dtype}", args, device, reference, variants,
                   work=8 * M * N * x.element_size(), unit="GB/s", op=f"residual_{kind}",
                   shape={"M": M, "N": N}, dtype=dtype)

    def dropout_case(dtype, tol, p: float = 0.2, rng4: bool = False) -> bool:
        def mk(*shape):
            return torch.randn(*shape, device=device, dtype=dtype)

        x, r = mk(M, N).requires_grad_(True), mk(M, N).requires_grad_(True)
        w = (1 + 0.1 * mk(N)).requires_grad_(True)
        ds, dh = mk(M, N), mk(M, N)
        seed = torch.tensor([2024], dtype=torch.int64, device=device)
        keep = keep_mask(seed, (M, N), p, 3, rng4)
        params = (x, r, w)

        def fwd_bwd(f):
            def go():
                s, h = f(x, r, w)
                return (s, h, *torch.autograd.grad((s, h), params, (ds, dh)))
            return go

        def masked(a, c, d):
            return add_rms_norm_ref(a, c, d, 1e-5, keep, p)

        p64 = [t.detach().double().requires_grad_(True) for t in params]

        def reference():
            s, h = add_rms_norm_ref(*p64, 1e-5, keep.double(), p)
            return (s, h, *torch.autograd.grad((s, h), p64, (ds.double(), dh.double())))

        compiled = torch.compile(masked) if device.type == "cuda" else masked
        fused = Variant("v3 triton fused dropout" if not rng4 else "v4 triton fused dropout, Philox per 4 columns",
                        fwd_bwd(lambda a, c, d: add_rms_norm(a, c, d, 1e-5, p=p, seed=seed, salt=3, rng4=rng4)), tol)
        persistent = Variant("v5 triton fused dropout Philox per 4 columns persistent dw", fwd_bwd(
            lambda a, c, d: add_rms_norm(a, c, d, 1e-5, p=p, seed=seed, salt=3, rng4=rng4, dw_partials="persistent")),
            tol)
        variants = [fused, persistent] if rng4 else [  # v1, v2 against the per-element mask only (same cost)
            Variant("v1 eager masked dropout", fwd_bwd(masked), tol),
            Variant("v2 torch.compile", fwd_bwd(compiled), tol, gpu_only=True),
            fused,
        ]
        rng = ", Philox per 4 columns" if rng4 else ""
        return run(f"residual dropout {p}+rmsnorm fwd+bwd ({M}, {N}) {dtype}{rng}", args, device, reference, variants,
                   work=9 * M * N * x.element_size(), unit="GB/s", op="residual_dropout_rmsnorm",
                   shape={"M": M, "N": N}, dtype=dtype)

    for kind in ("rmsnorm", "layernorm"):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            ok &= case(kind, dtype, tol)
    for rng4 in (False, True):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            ok &= dropout_case(dtype, tol, rng4=rng4)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
