"""GPT-2's explicit-attention kernels' tiles at its headline shape: check then time each.
``python -m benchmarks.kernels.explicit_tiles_dev [--check-only] [--record]``.

Shape: B=32, nh=8 (one K/V head per query head), T=256, hs=32: GPT-2 as written in the book's headline
step, whose attention the engine runs on ``kernels/explicit_attention.py`` (option ``fuse_softmax_matmuls``, a
default): the (B, nh, T, T) probabilities written forward and read back by the two backward kernels. In the
engine's step these kernels are GPT-2's largest class, several times their FLOP and byte floors (chapter 6's
ledger), and in tf32 they move P in fp32, twice the bytes of bf16. Their tiles are the flash kernels' default
(64 x 64, 4 warps, 2 stages, ``kernels.tiles``), chosen for shared memory, not for speed at this shape; the
flash kernels' own sweep (``attention_tiles_dev``) found that default near the best for the FastTransformer, but
these kernels store and load P, so their best tile is measured, not assumed.

Both precisions the engine runs GPT-2 in: bf16 (bf16 operands, P in bf16) and tf32 (fp32 operands, TF32
products, P in fp32). The forward and the backward (the dQ kernel, then the dK/dV kernel, at the same tiles)
are timed apart, at every tile of ``attention_tiles_dev``'s grid, in a CUDA graph and eagerly, each first
checked against the fp64 reference. Work: the causal half of 4 B nh T^2 hs FLOPs forward, 2.5x that backward;
bytes: P written once (forward) or read once (backward) in its dtype, with q, k, v (and dO) in and o (and dq,
dk, dv) out.

The one-pass kernels (option ``explicit_one_pass``: the forward and the dQ kernel take a whole row of keys
in one tile and pass over it once) are timed in the same runs, at every BLOCK_M and warp count of
``ONE_PASS_GRID``, named 'fwd one-pass 32x256 w4 s1'; their backward variants run the dK/dV kernel at the
default tiles, as the engine does.

The engine runs the dQ kernel in one pass by default (option ``explicit_dq_one_pass``, 64 query rows on 4
warps) and the dK/dV kernel at the launcher's tiles; the variants 'bwd one-pass 64x256 w4 s1 + dkdv 32x64 w4
s3' keep that dQ kernel and run the dK/dV kernel at each other tile of the grid (what ``attention_tiles``
naming 'bwd' tiles would do), the largest of GPT-2's attention kernels in tf32.

Not part of the ``kernels`` suite: run it with ``--record`` (rows already stored are skipped, so a cut-off run
resumes). A tile faster than the default beyond the spread can go on trial in the engine as the option
``attention_tiles``, which reaches these kernels where they take GPT-2's attention.
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup
from benchmarks.kernels.attention_tiles_dev import CPU_GRID, GPU_GRID, tile_name

# (BLOCK_M, warps) of the one-pass kernels; their key tile is the row, one stage (there is no loop).
ONE_PASS_GRID = [(m, w) for m in (16, 32, 64) for w in (2, 4, 8)]
ONE_PASS_CPU = [(16, 4)]
GPU_SHAPE, CPU_SHAPE = (32, 8, 256, 32), (1, 2, 37, 32)  # (B, nh, T, hs)


def dkdv_tiles(grid: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """The grid's tiles for the dK/dV kernel beside the one-pass dQ kernel, but the launcher's default (with it,
    the variant is 'bwd one-pass ...' itself)."""
    from kernels.tiles import TILE_CANDIDATES, Tiles

    return [t for t in grid if Tiles(*t) != TILE_CANDIDATES[0]]


def dkdv_name(dq_row, t: tuple[int, int, int, int]) -> str:
    """The name of the variant with the one-pass dQ kernel at ``dq_row`` and the dK/dV kernel at tiles ``t``."""
    return f"bwd one-pass {dq_row.name} + dkdv {tile_name(t)}"


def dkdv_variants() -> list[str]:
    """The GPU sweep's backward variants around the engine's one-pass dQ kernel (``ci/gpu-plan``'s step
    ``explicit-dkdv``): the launcher's two-pass default, the engine's default, and that dQ kernel with the
    dK/dV kernel at each other tile of the grid. Imports Triton: call it after the interpreter is chosen."""
    from ftlib.training.engine.swaps import dq_one_pass_tiles
    from kernels.tiles import TILE_CANDIDATES

    dq_row = dq_one_pass_tiles(GPU_SHAPE[2])
    return [f"bwd {TILE_CANDIDATES[0].name}", f"bwd one-pass {dq_row.name}",
            *(dkdv_name(dq_row, t) for t in dkdv_tiles(GPU_GRID))]


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import causal_attention_ref
    from ftlib.training.engine.swaps import dq_one_pass_tiles
    from kernels.explicit_attention import explicit_attention_bwd, explicit_attention_fwd, one_pass_tiles
    from kernels.tiles import Tiles

    cuda = device.type == "cuda"
    B, nh, T, hs = GPU_SHAPE if cuda else CPU_SHAPE
    grid = GPU_GRID if cuda else CPU_GRID
    rows = [one_pass_tiles(T, m, w) for m, w in (ONE_PASS_GRID if cuda else ONE_PASS_CPU)]
    dq_row = dq_one_pass_tiles(T) if cuda else rows[0]  # the interpreter's: its one one-pass tile
    flops_fwd = 4 * B * nh * T * T * hs / 2
    shape = {"B": B, "nh": nh, "nkv": nh, "T": T, "hs": hs}
    # One function per precision, so the closures below bind its tensors, not loop variables.
    def case(prec: str, dtype: torch.dtype, dot: str, tol: float) -> bool:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(B, nh, T, hs, generator=g).to(device, dtype) for _ in range(4))
        ins64 = [t.double().requires_grad_(True) for t in (q, k, v)]
        o64 = causal_attention_ref(*ins64)
        grads64 = torch.autograd.grad(o64, ins64, do.double())
        _, p = explicit_attention_fwd(q, k, v, input_precision=dot)  # the backward's input, at the default tiles
        p_bytes, io = p.numel() * p.element_size(), q.numel() * q.element_size()

        def fwd(t):
            return lambda: explicit_attention_fwd(q, k, v, input_precision=dot, tiles=Tiles(*t))[0]

        def bwd(t):
            return lambda: explicit_attention_bwd(do, q, k, v, p, dot, tiles=Tiles(*t))

        def fwd_one(t):
            return lambda: explicit_attention_fwd(q, k, v, input_precision=dot, one_pass=t)[0]

        def bwd_one(t):
            return lambda: explicit_attention_bwd(do, q, k, v, p, dot, one_pass=t)

        def bwd_dkdv(t):  # the engine's one-pass dQ kernel, the dK/dV kernel at tiles t
            return lambda: explicit_attention_bwd(do, q, k, v, p, dot, tiles=Tiles(*t), one_pass=dq_row)

        what = f"B={B} nh={nh} T={T} hs={hs} {prec}"
        ok = run(f"explicit attention forward tiles {what}", args, device, lambda: o64,
                 [Variant(f"fwd {tile_name(t)}", fwd(t), tol, impl="triton") for t in grid]
                 + [Variant(f"fwd one-pass {t.name}", fwd_one(t), tol, impl="triton") for t in rows],
                 unit="TFLOP/s", op="explicit_tiles", flops=flops_fwd, nbytes=p_bytes + 4 * io,
                 shape={**shape, "pass": f"fwd {prec}"}, dtype=dtype)
        return ok & run(f"explicit attention backward tiles {what}", args, device, lambda: grads64,
                        [Variant(f"bwd {tile_name(t)}", bwd(t), tol, impl="triton") for t in grid]
                        + [Variant(f"bwd one-pass {t.name}", bwd_one(t), tol, impl="triton") for t in rows]
                        + [Variant(dkdv_name(dq_row, t), bwd_dkdv(t), tol, impl="triton") for t in dkdv_tiles(grid)],
                        unit="TFLOP/s", op="explicit_tiles", flops=2.5 * flops_fwd, nbytes=p_bytes + 7 * io,
                        shape={**shape, "pass": f"bwd {prec}"}, dtype=dtype)

    # bf16: bf16 operands, P in bf16; tf32: fp32 operands, TF32 products, P in fp32 (tolerances against fp64).
    ok = case("bf16", torch.bfloat16, "ieee", 3e-2)
    ok &= case("tf32", torch.float32, "tf32", 1e-2)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
