"""The package's kernel launches, made through its public launchers on CPU tensors, per GPU target.

``drive(cc)`` makes the launches of the engine's training step (``ftlib.training.engine``) on a GPU of
compute capability ``cc`` for the book's models (``ftlib.model.config.PRESETS``): with the engine's
default options in every step precision it runs there, and with its other options (the norms' weight
gradients as 'tile' / 'persistent' partials, the other dropout RNG, the 'heads' attention layout) in
the first. ``drive(cc, extended=True)`` takes every option in every precision, plus launches only the
launchers' own tests and benchmarks make (inputs stored in bf16 / fp16): minutes of compiling, not for CI.
:mod:`kernel_compile` runs it with every launch turned into a record, so nothing here computes (the
tensors are uninitialized): only the arguments' dtypes, values and the constexprs matter.

What runs where (``ftlib.training.engine.swaps``, ``fused_mlp``):

* sm_90 (H200): bf16, fp16, and fp32 with tl.dot products 'tf32' (a tf32 step) or, asked for in strict
  fp32, 'tf32x3' or 'ieee' (options attention_precision, linear_precision).
* sm_75 (Tesla T4): fp32 and fp16; no bf16 (the engine refuses bf16 and tf32 there). Triton's tl.dot
  is FMA code below sm_80, so the attention kernel and the Linear GEMM run only in strict fp32
  ('ieee', when asked for); SDPA and cuBLAS stay otherwise. The GELU-epilogue GEMM has no device
  gate: it runs under fp16 autocast.

Shapes are the step's, B = 32 sequences of T = 256: Triton specializes integer arguments on
divisibility by 16 and on the value 1, and the launchers pick blocks and warps from the widths, so
small odd test shapes would compile other variants than a GPU runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ftlib.model.config import ModelConfig, preset

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
B, T = 32, 256
M = B * T  # rows of the step's activations
B_PER_RANK = 4  # B over the 8 ranks of a DDP run (ftlib.harness.distributed): fewer programs per launch
GEMM_M = 256  # the GEMMs' rows: specialized like 8,192 (a multiple of 16), and cheap in CPU autograd
SMS = {90: 132, 75: 40}  # SMs of an H200 and a T4: the persistent grids' program counts are kernel arguments
NORM_BWD_GRID = "8 rows 4/SM"  # EngineOptions.norm_bwd_grid's default


def models() -> dict[str, ModelConfig]:
    """The book's presets; nanoGPT's without attention dropout, the one setting that keeps its
    head size 64 off the attention kernel (which has no attention dropout)."""
    return {"fasttransformer": preset("fasttransformer"), "gpt2": preset("gpt2"),
            "nanogpt-char": preset("nanogpt-char", attn_dropout=0.0)}


@dataclass(frozen=True)
class Step:
    """One engine step's precision on one target: the activations' dtype ``dt`` (the autocast dtype, or
    fp32) and, for fp32, the tl.dot precision ``prec`` of the Triton matmuls."""

    cc: int
    dt: torch.dtype
    prec: str = "ieee"
    options: bool = False  # also the engine's non-default options
    extended: bool = False  # also the launchers' uses outside the engine (module docstring)

    @property
    def low(self) -> torch.dtype | None:
        """What the fused norms and the softmax write under autocast (None: the input's dtype)."""
        return None if self.dt == F32 else self.dt

    @property
    def triton_dot(self) -> bool:
        """Whether the engine puts Triton's tl.dot matmuls (attention, the Linear GEMM) in this step:
        on sm_80+ always, below only for strict fp32 ('ieee')."""
        return self.cc >= 80 or (self.dt == F32 and self.prec == "ieee")


def steps(cc: int, extended: bool = False) -> list[Step]:
    """Every step precision the engine runs on sm_``cc``, its main one first (bf16; a T4's fp16), which
    also takes the engine's other options (module docstring) and every autotuner configuration."""
    if cc >= 80:
        kinds = [(BF16, "ieee"), (F16, "ieee"), (F32, "tf32"), (F32, "tf32x3"), (F32, "ieee")]
    else:
        kinds = [(F16, "ieee"), (F32, "ieee")]
    return [Step(cc, dt, prec, extended or i == 0, extended) for i, (dt, prec) in enumerate(kinds)]


def _t(*shape: int, dtype: torch.dtype = F32, grad: bool = False) -> torch.Tensor:
    """Uninitialized: no kernel reads it here, and filling 8,192-row tensors would cost seconds."""
    return torch.empty(*shape, dtype=dtype).requires_grad_(grad)


def _backward(*outs: torch.Tensor) -> None:
    """Gradients of ones into every input: runs the backward launchers."""
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def first_norm(cfg: ModelConfig, step: Step) -> None:
    """The first block's norm, on the embeddings (fp32 under autocast too): its backward on the fused
    residual-norm kernel, its gradients added into fp32 buffers (first_norm_into_buffer, a default,
    kernels.norm_into); on its own kernel (outside the step, and the option off): RMSNorm (option
    norm_dw_partials: 'tile', or 'persistent') or LayerNorm. Extended: inputs in the step's dtype."""
    from kernels._common import ATOMIC_SEMS, RowGrid
    from kernels.layernorm import layer_norm
    from kernels.norm_into import norm_into
    from kernels.rmsnorm import rms_norm

    C = cfg.n_embd
    for dt in (F32, step.dt) if step.extended else (F32,):
        x, w = _t(M, C, dtype=dt, grad=True), _t(C, dtype=dt, grad=True)
        if cfg.norm == "rmsnorm":
            for dw in ("tile", "persistent") if step.options else ("tile",):
                _backward(rms_norm(x, w, 1e-5, dw))
        else:
            _backward(layer_norm(x, w, _t(C, dtype=dt, grad=True) if cfg.bias else None))
    ln, bias = cfg.norm == "layernorm", cfg.norm == "layernorm" and cfg.bias
    x = _t(M, C, grad=True)
    grid = RowGrid.parse(NORM_BWD_GRID)  # the engine's: the fused residual-norm's grid (FirstNormInto)
    for sem in ATOMIC_SEMS if step.options else ATOMIC_SEMS[:1]:  # the adds' order (option relaxed_atomics)
        _backward(norm_into(x, _t(C), _t(C) if bias else None, 1e-5, ln, torch.zeros(C),
                            torch.zeros(C) if bias else None, rows=grid.rows, programs=grid.per_sm * SMS[step.cc],
                            sem=sem))


def embeddings(cfg: ModelConfig, step: Step) -> None:
    """The token and position embeddings summed by one kernel and both gradients added into fp32 buffers
    (option fuse_embedding, kernels.embedding_sum): the tables are fp32 parameters in every step precision."""
    from kernels._common import ATOMIC_SEMS
    from kernels.embedding_sum import embedding_sum

    V, C, P = cfg.vocab_size, cfg.n_embd, cfg.block_size
    for sem in ATOMIC_SEMS:  # Triton's default memory order for the adds, and option relaxed_atomics'
        _backward(embedding_sum(torch.zeros(B, T, dtype=torch.long), _t(V, C, grad=True), _t(P, C, grad=True),
                                torch.zeros(V, C), torch.zeros(P, C), check_ids=False, sem=sem))


def residual_norms(cfg: ModelConfig, step: Step) -> None:
    """Each residual add with the norm after it (kernels.residual_norm): fp32 stream, the branch and the
    norm's output in the step's dtype, the config's dropout inside, weight gradients added into the flat
    buffer on the default grid; the last add's s feeds nothing (no ds). The keep mask drawn alone (the
    backward when only s is used; tests); with biases, the branch bias's gradient added by the same backward
    (branch_bias_into_norm). Options: weight gradients as 'tile' / 'persistent' partials
    (norm_dw_into_buffer off), one Philox call per element (dropout_rng4 off), the backward's loop over its
    tiles pipelined (norm_bwd_grid's ' s2'), its atomic adds relaxed (relaxed_atomics). Extended: every input
    stored in the step's dtype."""
    from kernels._common import RowGrid
    from kernels.dropout_mask import keep_mask
    from kernels.residual_norm import add_layer_norm, add_rms_norm

    C, ln, p = cfg.n_embd, cfg.norm == "layernorm", cfg.dropout
    seed = torch.tensor([1234], dtype=torch.int64)
    grid = RowGrid.parse(NORM_BWD_GRID)

    def add_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, **kw) -> tuple:
        if ln:
            return add_layer_norm(x, r, w, b, 1e-5, step.low, p=p, seed=seed, salt=3, **kw)
        return add_rms_norm(x, r, w, 1e-5, step.low, p=p, seed=seed, salt=3, **kw)

    x, r, w = _t(M, C, grad=True), _t(M, C, dtype=step.dt, grad=True), _t(C, grad=True)
    b = _t(C, grad=True) if ln and cfg.bias else None
    into = dict(dw_partials="atomic", dw_out=torch.zeros(C), bwd_rows=grid.rows, programs=grid.per_sm * SMS[step.cc])
    if ln:
        into["db_out"] = torch.zeros(C) if b is not None else None
    _backward(*add_norm(x, r, w, b, **into))
    _backward(add_norm(x, r, w, b, **into)[1])  # the final norm: s unused, no ds
    if cfg.bias:  # branch_bias_into_norm (a default): the projection's bias gradient added too
        _backward(*add_norm(x, r, w, b, **into, drb_out=torch.zeros(C)))
    keep_mask(seed, (M, C), 0.1, salt=5)
    if step.options:
        for dw in ("tile", "persistent"):
            _backward(*add_norm(x, r, w, b, dw_partials=dw, rng4=False))
        keep_mask(seed, (M, C), 0.1, salt=5, rng4=False)
        _backward(*add_norm(x, r, w, b, **into, loop_stages=2))  # the grid's ' s2': the tile loop pipelined
        _backward(*add_norm(x, r, w, b, **into, sem="relaxed"))  # relaxed_atomics: the adds in relaxed order
    if step.extended:
        xs, ws = _t(M, C, dtype=step.dt, grad=True), _t(C, dtype=step.dt, grad=True)
        _backward(*add_norm(xs, r, ws, _t(C, dtype=step.dt, grad=True) if b is not None else None))


def attention(cfg: ModelConfig, step: Step) -> None:
    """The attention core: the flash-attention kernels on the packed qkv (the engine's layout; MQA/GQA
    with the dK/dV split partials summed by kernels.kv_split_sum) where the engine applies them, else
    GPT-2's explicit softmax fused (kernels.causal_softmax) and, where tl.dot runs, fused with its products
    (kernels.explicit_attention, the default fuse_softmax_matmuls; in strict fp32 only when asked for).
    At B = 32 and at a DDP rank's batch: the dK/dV kernel is split over query heads (and kv_split_sum
    launched) only where the grid is small for the GPU, on a T4 only at the small batch. Options: a K/V head's
    query heads packed into each forward and dQ tile (attention_pack_heads) on MQA/GQA; every grid's blocks in
    causal order (attention_heavy_first off: by default the heaviest causal block first, and under bf16/fp16 in
    the explicit kernels too); the 'heads' layout, q, k, v as strided views of the qkv output
    (KernelCausalSelfAttention); on sm_75 only when extended, the costliest compile here (FMA code) for strides the
    packed layout's already have."""
    from ftlib.training.engine.swaps import dq_one_pass_tiles
    from kernels.attention import flash_attention
    from kernels.attention_packed import packed_attention
    from kernels.causal_softmax import causal_softmax
    from kernels.explicit_attention import explicit_attention_packed

    nh, nkv, hs = cfg.n_head, cfg.n_kv_head, cfg.head_size
    if cfg.attn_impl == "explicit":
        s = _t(B, nkv, nh // nkv, T, T, dtype=step.dt, grad=True)
        _backward(causal_softmax(s, hs ** -0.5, step.low))
        if cfg.attn_dropout_p == 0 and step.triton_dot:  # fuse_softmax_matmuls: the products fused too
            qkv = _t(B, T, (nh + 2 * nkv) * hs, dtype=step.dt, grad=True)
            _backward(explicit_attention_packed(qkv, nh, nkv, hs, step.low, step.prec))
            if step.options or step.cc < 80:  # the one-pass options (a T4 compiles its strict-fp32 step)
                # explicit_one_pass: the forward and dQ kernels at their default row tiles
                _backward(explicit_attention_packed(qkv, nh, nkv, hs, step.low, step.prec, fwd_one_pass=True,
                                                    dq_one_pass=True))
            dq = {}
            if step.cc >= 80:  # explicit_dq_one_pass, a default (not below sm_80, the engine's rule)
                # the engine's tile, and explicit_heavy_first, a default under bf16/fp16 (swaps.py)
                dq = {"dq_one_pass": dq_one_pass_tiles(T), "heavy_first": step.low is not None}
                _backward(explicit_attention_packed(qkv, nh, nkv, hs, step.low, step.prec, **dq))
            if step.options:  # qkv_bias_into_attention: the backward kernels add the qkv bias's gradient (HAS_DB)
                db = torch.zeros((nh + 2 * nkv) * hs)
                _backward(explicit_attention_packed(qkv, nh, nkv, hs, step.low, step.prec, db_out=db, **dq))
        return
    if cfg.attn_dropout_p > 0 or not step.triton_dot:
        return  # SDPA kept
    # The defaults: the dK/dV kernel forming D itself (attention_bwd_streams) and every grid's heaviest causal block
    # first (attention_heavy_first, the grids' axes swapped).
    defaults = {"fuse_kv_split_sum": True, "concurrent_bwd": True, "heavy_first": True}
    for batch in (B, B_PER_RANK):
        qkv = _t(batch, T, (nh + 2 * nkv) * hs, dtype=step.dt, grad=True)
        _backward(packed_attention(qkv, nh, nkv, hs, step.prec, **defaults))
    if step.options:  # attention_bwd_streams off: the dK/dV kernel reads the dQ kernel's D
        _backward(packed_attention(qkv, nh, nkv, hs, step.prec, **{**defaults, "concurrent_bwd": False}))
        group = nh // nkv
        if 1 < group <= 16 and group & (group - 1) == 0:  # attention_pack_heads: a K/V head's query heads a tile
            _backward(packed_attention(qkv, nh, nkv, hs, step.prec, **defaults, pack_heads=group))
        # attention_heavy_first off: every grid's blocks in causal order
        _backward(packed_attention(qkv, nh, nkv, hs, step.prec, **{**defaults, "heavy_first": False}))
    if step.extended or (step.options and step.cc >= 80):
        q, k, v = qkv.split([nh * hs, nkv * hs, nkv * hs], dim=-1)
        q, k, v = (t.view(B_PER_RANK, T, -1, hs).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hs) views
        _backward(flash_attention(q, k, v, None, step.prec, fuse_kv_split_sum=True))


def mlp(cfg: ModelConfig, step: Step) -> None:
    """The MLP with GELU in its GEMM epilogues (engine option fuse_mlp_act: bf16 / fp16 autocast and
    tf32), its weight gradients into fp32 buffers and, with biases, their column sums on the Triton kernel."""
    from kernels.bias_linear import bias_grad
    from kernels.gelu_mlp import gelu_mlp

    if step.dt == F32 and step.prec != "tf32":
        return  # strict fp32 keeps cuBLAS (fused_mlp.fuse_mlps)
    C, H, dt = cfg.n_embd, cfg.d_ff, step.dt
    w1, w2 = _t(H, C, grad=True), _t(C, H, grad=True)
    b1, b2 = (_t(H, grad=True), _t(C, grad=True)) if cfg.bias else (None, None)
    grads = dict(dw1_out=torch.zeros(H, C), dw2_out=torch.zeros(C, H), bias_grad=partial(bias_grad, out_dtype=F32))
    approximate = {"gelu": "none", "gelu_tanh": "tanh"}[cfg.activation]
    _backward(gelu_mlp(_t(GEMM_M, C, dtype=dt, grad=True), w1, b1, w2, b2, approximate, w1c=w1.to(dt), w2c=w2.to(dt),
                       input_precision=step.prec if dt == F32 else "ieee", **grads))


def linears(cfg: ModelConfig, step: Step) -> None:
    """The Linear layers' bias gradients on the Triton column sum (engine option bias_kernel, configs with
    biases: qkv, the attention's and the MLP's projections, the MLP's up-projection), also adding into the flat
    gradient (option bias_into_buffer), the up-projection's behind GELU's backward (option fc_bias_into_gelu);
    their weight gradients
    on the split-K kernel (engine option wgrad_splitk: autocast steps and tf32); in fp32 storage the
    Linear on the Triton GEMM (engine option linear_precision) instead, forward, dx and dW."""
    from kernels._common import ATOMIC_SEMS
    from kernels.bias_linear import bias_grad, bias_grad_add_, gelu_bwd_bias_add_
    from kernels.linear import linear
    from kernels.wgrad import wgrad_add_

    C = cfg.n_embd
    if cfg.bias:
        for N in (3 * C, C, cfg.d_ff):
            bias_grad(_t(M, N, dtype=step.dt), F32)
            # bias_into_buffer (a default): the column sums added into the flat gradient
            bias_grad_add_(_t(M, N, dtype=step.dt), torch.zeros(N))
        if step.options and cfg.activation in ("gelu", "gelu_tanh"):  # fc_bias_into_gelu: GELU's backward first
            approximate = "tanh" if cfg.activation == "gelu_tanh" else "none"
            gelu_bwd_bias_add_(_t(M, cfg.d_ff, dtype=step.dt), _t(M, cfg.d_ff, dtype=step.dt), torch.zeros(cfg.d_ff),
                               approximate)
    if step.dt != F32 or step.prec == "tf32":
        for sem in ATOMIC_SEMS:  # Triton's default memory order for the adds, and relaxed_atomics'
            wgrad_add_(torch.zeros(cfg.d_ff, C), _t(M, cfg.d_ff, dtype=step.dt), _t(M, C, dtype=step.dt),
                       "tf32" if step.dt == F32 else "ieee", sem)
    if step.dt == F32 and step.triton_dot:
        b = _t(cfg.d_ff, grad=True) if cfg.bias else None
        _backward(linear(_t(GEMM_M, C, grad=True), _t(cfg.d_ff, C, grad=True), b, step.prec))


def loss_and_optimizer(cfg: ModelConfig, step: Step) -> None:
    """The fused cross-entropy on the head's logits (and, with the engine's other options, the head and the
    loss fused), and the flat AdamW step (with fp16's loss-scaling inputs under fp16)."""
    from kernels._common import ATOMIC_SEMS
    from kernels.adamw import adamw_step_
    from kernels.cross_entropy import cross_entropy

    _backward(cross_entropy(_t(M, cfg.vocab_size, dtype=step.dt, grad=True), torch.randint(0, cfg.vocab_size, (M,))))
    if step.dt != F32 or step.prec == "tf32":  # the fused head and loss (option fuse_head_loss; not strict fp32)
        from kernels.linear_cross_entropy import linear_cross_entropy

        head = _t(cfg.vocab_size, cfg.n_embd, grad=True)
        for sem in ATOMIC_SEMS:  # Triton's default memory order for the dW adds, and relaxed_atomics'
            _backward(linear_cross_entropy(_t(M, cfg.n_embd, dtype=step.dt, grad=True), head,
                                           torch.randint(0, cfg.vocab_size, (M,)), w_compute=head.detach().to(step.dt),
                                           dw_out=torch.zeros(cfg.vocab_size, cfg.n_embd),
                                           input_precision="tf32" if step.prec == "tf32" else "ieee", sem=sem))
    n = 12 * cfg.n_layer * cfg.n_embd ** 2  # about the model's parameters
    bufs = [_t(n) for _ in range(4)]
    scaling = (torch.ones(1), torch.zeros(1)) if step.dt == F16 else None
    adamw_step_(*bufs, torch.ones(()), torch.tensor(3e-4), betas=(0.9, 0.95), weight_decay=0.1, n_decay=n // 2,
                grad_scaling=scaling)


# The step's launchers, in order; kernel_compile checks that together they launch every kernel in kernels/.
DRIVERS: tuple[Callable[[ModelConfig, Step], None], ...] = (
    embeddings, first_norm, residual_norms, attention, mlp, linears, loss_and_optimizer)


def drive(cc: int, extended: bool = False) -> None:
    """Every driver for every model and step precision of sm_``cc``, with the attention tiles a GPU of
    that capability gets (``FTLIB_CAPABILITY``, read by kernels.limits); on sm_90 and later the bf16 step of both
    headline models (with the engine's other options) once more with programmatic dependent launch (the engine option
    ``programmatic_launch``, off by default: its kernels take ``PDL=True``), the device's answer the target's."""
    os.environ["FTLIB_CAPABILITY"] = f"{cc // 10}.{cc % 10}"
    for step in steps(cc, extended):
        for cfg in models().values():
            for driver in DRIVERS:
                driver(cfg, step)
    if cc >= 90:
        from kernels import pdl

        supported, pdl.pdl_supported = pdl.pdl_supported, lambda device: True
        try:
            with pdl.programmatic_launch(True):
                for name in ("fasttransformer", "gpt2"):  # the wait compiles alike in every dtype: one step
                    for driver in DRIVERS:
                        driver(models()[name], Step(cc, BF16, options=True))
        finally:
            pdl.pdl_supported = supported
