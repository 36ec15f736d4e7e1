"""The token and position embeddings, forward and backward: check then time.
``python -m benchmarks.kernels.embedding_sum_dev [--check-only]``.

Why: the step's input is x = wte[idx] + wpe[t] (B, T, C), and the backward adds dx's rows into both tables'
gradients, the engine's flat-gradient views, zeroed every step (engine option ``fuse_embedding`` puts both
ways in ``kernels/embedding_sum.py``'s two kernels). Each variant runs all of it for the FastTransformer's
tables in fp32 (the embeddings are fp32 parameters in every precision): x, and both gradients added into
zeroed buffers. v1 what the engine runs without the option: the position index, two gathers and an add; the
batch sum of dx for the position table, two zero-filled tables, two scatter-adds (``index_add_``, as
``kernels/embedding.py``) and autograd's two adds into the gradient buffers. v2 torch.compile of the same
lookups and sum, forward and backward. v3 the fused kernels on the launcher's batch runs (about two programs
per SM), v4 and v5 one batch row and the whole batch per program; v6 to v8 the same three with the backward's
atomic adds in relaxed memory order (engine option ``relaxed_atomics``) instead of Triton's acquire-release.
Bytes (the floor): x written and dx read once each (the tables stay in cache).
"""

from __future__ import annotations

from benchmarks.kernels._harness import Recorder, Variant, parse_args, run, setup


def main(argv: list[str] | None = None, recorder: Recorder | None = None) -> int:
    args = parse_args(__doc__, argv, recorder)
    device = setup(args)
    import torch
    import torch.nn.functional as F

    from ftlib.model.reference import embedding_sum_ref
    from kernels.embedding_sum import embedding_sum_bwd, embedding_sum_fwd

    cuda = device.type == "cuda"
    B, T, V, C = (32, 256, 65, 256) if cuda else (3, 7, 65, 24)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (B, T), generator=g).to(device)
    wte = torch.randn(V, C, generator=g).to(device)
    wpe = torch.randn(T, C, generator=g).to(device)
    dx = torch.randn(B, T, C, generator=g).to(device)
    g_te, g_pe = torch.zeros_like(wte), torch.zeros_like(wpe)  # the tables' views of the flat gradient

    def reference():
        te, pe = wte.double().requires_grad_(True), wpe.double().requires_grad_(True)
        x = embedding_sum_ref(idx, te, pe)
        return (x, *torch.autograd.grad(x, (te, pe), dx.double()))

    def unfused():
        pos = torch.arange(T, device=device)
        x = F.embedding(idx, wte) + F.embedding(pos, wpe)  # (B, T, C) + (T, C)
        g_te.zero_(), g_pe.zero_()  # the step's memset of the flat gradient
        dte = torch.zeros_like(wte).index_add_(0, idx.reshape(-1), dx.reshape(-1, C))  # (B T, C) rows into (V, C)
        dpe = torch.zeros_like(wpe).index_add_(0, pos, dx.sum(0))  # the broadcast's sum, then (T, C) rows
        return x, g_te.add_(dte), g_pe.add_(dpe)

    def torch_step(te, pe):
        te, pe = te.detach().requires_grad_(True), pe.detach().requires_grad_(True)
        x = embedding_sum_ref(idx, te, pe)
        return (x, *torch.autograd.grad(x, (te, pe), dx))

    compiled = torch.compile(torch_step) if cuda else torch_step

    def fused(b_run=None, sem="acq_rel"):
        x = embedding_sum_fwd(idx, wte, wpe)
        g_te.zero_(), g_pe.zero_()
        embedding_sum_bwd(idx, dx, g_te, g_pe, b_run=b_run, sem=sem)
        return x, g_te, g_pe

    tol = 1e-5  # fp32 sums in another order against fp64
    variants = [Variant("v1 gathers, add, index_add_ and autograd's adds", unfused, tol),
                Variant("v2 torch.compile", lambda: compiled(wte, wpe), tol, gpu_only=True),
                Variant("v3 fused kernels, the launcher's batch runs", fused, tol, impl="triton"),
                Variant("v4 fused kernels, one batch row per program", lambda: fused(1), tol, impl="triton"),
                Variant("v5 fused kernels, the whole batch per program", lambda: fused(B), tol, impl="triton"),
                Variant("v6 v3 with relaxed atomic adds", lambda: fused(sem="relaxed"), tol, impl="triton"),
                Variant("v7 v4 with relaxed atomic adds", lambda: fused(1, "relaxed"), tol, impl="triton"),
                Variant("v8 v5 with relaxed atomic adds", lambda: fused(B, "relaxed"), tol, impl="triton")]
    ok = run(f"embeddings ({B}, {T}) from ({V}, {C}) and ({T}, {C})", args, device, reference, variants,
             work=2 * B * T * C * dx.element_size(), unit="GB/s", op="embedding_sum",
             shape={"B": B, "T": T, "V": V, "C": C}, dtype=torch.float32)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
