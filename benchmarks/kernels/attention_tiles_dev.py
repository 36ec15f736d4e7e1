"""The attention kernels' tiles at the FastTransformer's shape: check then time each.
``python -m benchmarks.kernels.attention_tiles_dev [--check-only]``.

Shape: B=32, nh=8, nkv=1 (MQA), T=256, hs=32, bf16: the engine's attention in the book's headline
step. The launchers default to 64 x 64 tiles, 4 warps, 2 stages (``kernels.tiles.TILE_CANDIDATES``),
chosen for shared memory on every device rather than for speed at one head size. At hs=32 a
64 x 64 tile holds little work per program (the QK^T product is 64 x 64 x 32), so larger query
or key tiles, more warps or a deeper pipeline may pay; which does is measured, not assumed.

The forward and the backward (the dQ kernel, then the dK/dV kernel, both at the same tiles, with
the split partials summed in one kernel as the engine does) are timed apart, each at every tile
of the grid below, in a CUDA graph (the kernels alone) and eagerly. Each variant is first checked
against the fp64 reference. Counting as ``attention_dev`` does: the causal half of 4 B nh T^2 hs
FLOPs forward, 2.5x that backward; bytes, each tensor moved once (forward: q, k, v in and o out;
backward: q, k, v, o and dO in, dq, dk, dv out).

Not part of the ``kernels`` suite (30 tiles per pass, each compiled: minutes): run it
with ``--record`` to store its rows in ``kernels.jsonl``; an option for the engine's tiles can then be
tried in ``engine_candidates`` with the winner.
"""

from __future__ import annotations

import itertools

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup

# (block_m, block_n, num_warps, num_stages) on a GPU; the interpreter checks one small tile.
GPU_GRID = [t for t in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3))
            if not (t[0] * t[1] <= 32 * 64 and t[2] == 8)]  # 8 warps on a tile that small idle
CPU_GRID = [(16, 16, 4, 2), (32, 16, 4, 2)]


def tile_name(t: tuple[int, int, int, int]) -> str:
    """The tiles as the engine's ``attention_tiles`` option names them (``kernels.tiles.Tiles.name``), so a
    winning variant's name, 'fwd 128x64 w4 s2', is the option's value for its pass."""
    from kernels.tiles import Tiles  # after setup(): the interpreter must be chosen before Triton loads

    return Tiles(*t).name


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch

    from ftlib.model.reference import causal_attention_ref
    from kernels.attention import attention_bwd, attention_fwd

    cuda = device.type == "cuda"
    B, nh, nkv, T, hs = (32, 8, 1, 256, 32) if cuda else (1, 4, 1, 37, 32)
    grid = GPU_GRID if cuda else CPU_GRID
    dtype = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda h: torch.randn(B, h, T, hs, generator=g).to(device, dtype)  # noqa: E731
    q, k, v, do = mk(nh), mk(nkv), mk(nkv), mk(nh)
    ins64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    o64 = causal_attention_ref(*ins64)
    grads64 = torch.autograd.grad(o64, ins64, do.double())
    o, lse = attention_fwd(q, k, v)  # the backward's inputs, at the default tiles

    def tiles(t):
        return dict(block_m=t[0], block_n=t[1], num_warps=t[2], num_stages=t[3])

    def fwd(t):
        return lambda: attention_fwd(q, k, v, **tiles(t))[0]

    def bwd(t):
        return lambda: attention_bwd(do, q, k, v, o, lse, fuse_kv_split_sum=True, **tiles(t))

    flops_fwd = 4 * B * nh * T * T * hs / 2
    shape = {"B": B, "nh": nh, "nkv": nkv, "T": T, "hs": hs}
    ok = run(f"attention forward tiles B={B} nh={nh} nkv={nkv} T={T} hs={hs} bf16", args, device,
             lambda: o64, [Variant(f"fwd {tile_name(t)}", fwd(t), 3e-2, impl="triton") for t in grid],
             unit="TFLOP/s", op="attention_tiles", flops=flops_fwd,
             nbytes=2 * (q.numel() + k.numel()) * q.element_size(), shape={**shape, "pass": "fwd"}, dtype=dtype)
    ok &= run(f"attention backward tiles B={B} nh={nh} nkv={nkv} T={T} hs={hs} bf16", args, device,
              lambda: grads64, [Variant(f"bwd {tile_name(t)}", bwd(t), 3e-2, impl="triton") for t in grid],
              unit="TFLOP/s", op="attention_tiles", flops=2.5 * flops_fwd,
              nbytes=4 * (q.numel() + k.numel()) * q.element_size(), shape={**shape, "pass": "bwd"},
              dtype=dtype)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
