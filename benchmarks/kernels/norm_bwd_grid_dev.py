"""The fused residual-norm backward's grid at the FastTransformer's shape: check then time each.
``python -m benchmarks.kernels.norm_bwd_grid_dev [--check-only] [--record]``.

The engine's default (``norm_dw_into_buffer``) runs ``kernels.residual_norm.add_norm_bwd`` with
``dw_partials="atomic"``: a persistent grid whose programs each loop over a contiguous run of
4-row tiles, accumulate their share of dweight in registers and add it into the weight's
gradient with one atomic add per column. Its default grid (``kernels._common.persistent_grid``) is
a few one-warp programs per SM: with 4 warps per SM in flight, a memory-bound kernel may hold too
few loads in flight to reach the bandwidth floor; more programs hide more latency but add
more atomic adds into the same N addresses. Which grid is fastest is measured, not assumed.

Shape: one RMSNorm after a residual add in the headline bf16 step: (B*T, C) = (8192, 256), s and
ds in fp32 (the residual stream), dh in bf16 (``bf16_norm_out``). Variants: "tile partials + sum"
(a partial row per 4-row tile, then one torch sum: the engine before ``norm_dw_into_buffer``),
and "atomic R rows P/SM" for R rows per tile and P programs per SM; "atomic R rows P/SM sK" the same grid
with each program's loop over its tiles software-pipelined over K tiles (``tl.range``'s num_stages: the
kernel has no ``tl.dot``, so its own num_stages pipelines none of its loads). Each zeroes the (N,) buffer
and runs the backward; checked against the fp64 reference (dx and dweight). Bytes (the floor):
ds, dh and s read, dx written, once each.

Not part of the ``kernels`` suite: run it with ``--record`` to store its rows in ``kernels.jsonl``;
a winning grid can then be tried in ``engine_candidates`` through the engine's ``norm_bwd_grid``
option ('R rows P/SM' or 'R rows P/SM sK', the variant's name without 'atomic ').
"""

from __future__ import annotations

import itertools

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup

# (rows per tile, programs per SM) on a GPU; the interpreter checks two small grids.
GPU_GRID = list(itertools.product((4, 8, 16), (4, 8, 16, 32)))
CPU_GRID = [(4, 1), (8, 2)]
# (rows per tile, programs per SM, tiles in flight per program) of the pipelined loop, around the default grid.
GPU_PIPELINED = [(8, 4, 2), (8, 4, 3), (8, 2, 2), (8, 8, 2), (4, 4, 2), (16, 4, 2)]
CPU_PIPELINED = [(8, 2, 2)]


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import add_rms_norm_ref
    from kernels._common import RowGrid
    from kernels.residual_norm import add_norm_bwd, add_norm_fwd

    cuda = device.type == "cuda"
    M, N = (8192, 256) if cuda else (37, 256)
    grid = GPU_GRID if cuda else CPU_GRID
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda dtype=torch.float32: torch.randn(M, N, generator=g).to(device, dtype)  # noqa: E731
    x, r, ds, dh = mk(), mk(), mk(), mk(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(N, generator=g)).to(device)
    eps = 1e-5
    s, _, rstd = add_norm_fwd(x, r, w, None, eps, layer_norm=False, out_dtype=torch.bfloat16)
    dw_buf = torch.zeros(N, device=device)

    p64 = [t.double().requires_grad_(True) for t in (x, r, w)]
    s64, h64 = add_rms_norm_ref(*p64, eps)
    dx64, _, dw64 = torch.autograd.grad((s64, h64), p64, (ds.double(), dh.double()))

    def tile_partials():
        dx, _, dw, _ = add_norm_bwd(ds, dh, s, w, rstd, layer_norm=False, has_bias=False)
        return dx, dw

    def atomic(spec: RowGrid):
        def go():
            dw_buf.zero_()
            dx, _, _, _ = add_norm_bwd(ds, dh, s, w, rstd, layer_norm=False, has_bias=False,
                                       dw_partials="atomic", dw_out=dw_buf, **spec.launch(device))
            return dx, dw_buf
        return go

    variants = [Variant("tile partials + sum", tile_partials, 1e-4, impl="triton")]
    for spec in [RowGrid(rows, per_sm) for rows, per_sm in grid] + [
            RowGrid(*g) for g in (GPU_PIPELINED if cuda else CPU_PIPELINED)]:
        variants.append(Variant(f"atomic {spec.name}", atomic(spec), 1e-4, impl="triton"))
    return 0 if run(f"residual rmsnorm backward grid ({M}, {N}) ds fp32, dh bf16", args, device,
                    lambda: (dx64, dw64), variants, unit="GB/s", op="norm_bwd_grid",
                    nbytes=M * N * (4 + 2 + 4 + 4), shape={"M": M, "N": N}, dtype=torch.float32) else 1


if __name__ == "__main__":
    raise SystemExit(main())
