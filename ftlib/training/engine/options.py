"""The engine's options, in one place: each with its default, its meaning, its check, and how it
enters a result key; and the precision name resolved once into what the engine's kernels take.

None of the options changes what the step computes, only how it is executed (up to the order of
float sums; ``fuse_dropout`` also changes the random stream of the dropout masks, not their
distribution; ``grad_into_buffer`` under bf16 on CUDA skips the rounding of the weight gradients
to bf16, and ``branch_bias_into_norm`` sums the projections' bias gradients before their dy is rounded
to bf16). The defaults are the measured winners (chapter 6 shows the variants against them).

Result keys. An option enters a key only where a benchmark case or a training recipe sets it (a
case's ``extra``, a recipe's ``engine_options``), exactly as given: a default never does, so a
new option leaves every stored key as it was. An option whose default changes what was executed
declares, as ``keyless``, the value that rows stored before it existed ran with: that value is
left out of keys (:func:`key_items`), so pinning it keeps those rows' keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ftlib.core.precision import Precision

# The ops a kernel can take over, each switchable on its own (``use_kernels``).
KERNEL_OPS = ("rmsnorm", "layernorm", "attention", "embedding", "cross_entropy", "adamw")
# tl.dot input precisions of the Triton matmuls for fp32 operands (kernels/linear.py, kernels/attention.py).
DOT_PRECISIONS = ("ieee", "tf32", "tf32x3")
# 'heads': q/k/v as (B, h, T, hs) views, the output transposed back with a copy; 'packed': the
# kernel reads the qkv projection's output and writes (B, T, C), d(qkv) into one buffer.
ATTENTION_LAYOUTS = ("heads", "packed")
# How the norm backwards form their weight-gradient partials (kernels._common.DW_PARTIALS, kept equal by
# tests/test_engine.py; not imported from there, which would import Triton): 'tile', one partial row per row
# tile; 'persistent', a few programs per SM, each looping over its tiles into one partial row.
NORM_DW_PARTIALS = ("tile", "persistent")
# Where each kernel launched with programmatic dependent launch lets the next one start (kernels.pdl.TRIGGERS, kept
# equal by tests/test_programmatic_launch_option.py): 'start', as soon as every program of it has waited for the
# kernel before; 'exit', only as its programs end.
PDL_TRIGGERS = ("start", "exit")

_NO_VALUE = object()


def _option(default: Any, doc: str, *, keyless: Any = _NO_VALUE, recipe: bool = True) -> Any:
    return field(default=default, metadata={"doc": doc, "keyless": keyless, "recipe": recipe})


@dataclass(frozen=True)
class EngineOptions:
    """How :class:`ftlib.training.engine.Engine` executes the step (module docstring)."""

    use_kernels: bool | Mapping[str, bool] = _option(
        True, "True: every kernel that applies; False: none (the PyTorch ops, still flat and captured); "
              "{op: bool} over KERNEL_OPS, the ops not named stay on")
    capture: bool | None = _option(
        None, "capture the step in one CUDA graph; None: on CUDA only", recipe=False)
    attention_for_explicit: bool = _option(
        False, "also put the attention kernel in place of an explicit materialized softmax (GPT-2): the "
               "same function, but that is one of the post's four changes, so off by default")
    linear_precision: str | None = _option(
        None, "None: the Linear layers on cuBLAS; one of DOT_PRECISIONS: on the Triton GEMM (fp32 storage "
              "only; 'tf32x3' is fp32-accurate on tensor cores)")
    attention_precision: str | None = _option(
        None, "the attention kernel's tl.dot precision for fp32 operands (default 'tf32' under tf32; in strict "
              "fp32 SDPA stays unless this is set)")
    attention_layout: str = _option("packed", "one of ATTENTION_LAYOUTS")
    attention_tiles: str | None = _option(
        None, "None: the attention kernels' tiles chosen from the device's shared memory (kernels/tiles.py); or "
              "'fwd <M>x<N> w<warps> s<stages>; bwd ...' (either pass, kernels.tiles.parse_tiles), with the "
              "packed layout: the flash kernels' tiles, or GPT-2's explicit-attention kernels' where they take "
              "its attention (fuse_softmax_matmuls)")
    fuse_residual_norm: bool = _option(
        True, "every residual add fused into the norm after it (kernels/residual_norm.py), both ways")
    bias_kernel: bool = _option(
        True, "Linear layers with a bias compute its gradient on the Triton column sum (GEMMs stay on cuBLAS)")
    bf16_norm_out: bool = _option(
        True, "under bf16, the fused norms write bf16: what the next Linear's autocast cast would give")
    bf16_weights: bool = _option(
        True, "under bf16, plain Linear layers read one bf16 copy of the flat weights made at the start of the "
              "step, instead of one autocast cast per weight")
    fuse_dropout: bool = _option(
        True, "with dropout > 0 and the fused residual-norm: each branch's residual dropout inside those "
              "kernels, its mask drawn from Philox and redrawn in the backward")
    dropout_rng4: bool = _option(
        True, "the fused dropout draws one Philox call per 4 columns (False: one per element)", keyless=False)
    fused_softmax: bool = _option(
        True, "for explicit attention kept as written: scale, causal mask and softmax in one kernel each way")
    attention_kv_split: int | None = _option(
        2, "with the attention kernel on an MQA/GQA model (packed layout): how many dK/dV programs share one "
           "K/V head's query heads, a power of two (kernels.attention.attention_bwd's kv_split); None: the "
           "launcher's choice, about two programs per SM; on the heads layout, or where it does not divide a "
           "model's query heads per K/V head (multi-head attention), the launcher's choice stays")
    fuse_softmax_matmuls: bool = _option(
        True, "with fused_softmax, for explicit attention kept as written (GPT-2): q k^T, the scale, mask and softmax, "
              "and P v in one kernel forward, the (B, nh, T, T) probabilities still written and read back by the "
              "backward's two kernels (kernels/explicit_attention.py), instead of cuBLAS batched GEMMs around the "
              "fused softmax with their layout copies; in strict fp32 only with attention_precision set",
        keyless=False)
    grad_into_buffer: bool = _option(
        True, "each Linear's backward writes its weight gradient into that weight's view of the flat gradient "
               "(one GEMM; under bf16/fp16 with an fp32 output where CUDA has it) instead of autograd adding a "
               "new tensor there (grad_into.py)", keyless=False)
    norm_dw_partials: str = _option(
        "tile", "one of NORM_DW_PARTIALS: the weight-gradient partials of the RMSNorm and fused residual-norm "
                "backwards, one row per row tile summed by torch ('tile'), or one row per program of a grid of "
                "a few programs per SM ('persistent')")
    attention_bwd_streams: bool = _option(
        True, "with the attention kernel (packed layout): its backward's dK/dV kernel forms D = rowsum(dO * O) "
              "itself, so that it and the dQ kernel share no data, and on CUDA runs on a side stream beside the dQ "
              "kernel (kernels.attention.attention_bwd's concurrent), instead of after it", keyless=False)
    attention_pack_heads: bool = _option(
        False, "with the attention kernel on an MQA/GQA model (packed layout): its forward and dQ kernels take all "
               "query heads of one K/V head in one tile (kernels.attention's pack_heads; where they are a power of "
               "two, at most 16), so each K/V block is loaded once for them all instead of once per head")
    attention_heavy_first: bool = _option(
        True, "with the attention kernel (packed layout): each of its grids launches the causal block with the most "
              "work first (kernels.attention's heavy_first: the forward's and dQ's last query block, the dK/dV "
              "kernel's first key block), so the light blocks fill the tail; the same programs and sums",
        keyless=False)
    fuse_kv_split_sum: bool = _option(
        True, "with the attention kernel on an MQA/GQA model: the dK/dV kernel's per-split fp32 partials summed, "
               "cast and written into dk/dv (the packed d(qkv) views) by one kernel per layer "
               "(kernels/kv_split_sum.py) instead of a torch sum, cast and copy for each of dK and dV", keyless=False)
    norm_dw_into_buffer: bool = _option(
        True, "with the fused residual-norm: its backward adds each norm's weight (and bias) gradient into that "
               "parameter's view of the flat gradient with atomic adds (kernels/residual_norm.py, "
               "dw_partials='atomic') instead of writing partial rows for a torch sum and autograd's add",
        keyless=False)
    norm_bwd_grid: str | None = _option(
        "8 rows 4/SM", "with norm_dw_into_buffer (ignored without it): '<rows> rows <programs>/SM', optionally "
                       "with ' s<k>' for each program's loop over its tiles pipelined over k tiles "
                       "(kernels._common.RowGrid), the grid the fused residual-norm backward and its atomic weight "
                       "gradients run on, or None for the launcher's own (4-row tiles, 4 programs per SM); "
                       "benchmarks/kernels/norm_bwd_grid_dev.py times the grids")
    fuse_mlp_act: bool = _option(
        False, "under bf16/fp16/tf32: each MLP's GELU in the epilogues of a Triton GEMM, forward after the "
               "up-projection, backward (GELU') after the product through the down-projection "
               "(kernels/gelu_mlp.py), instead of an elementwise GELU kernel each way")
    fuse_head_loss: bool = _option(
        True, "with the cross-entropy kernel and grad_into_buffer, under bf16/fp16: the head's GEMM and the "
              "cross-entropy as one Triton kernel that keeps each block of rows' logits in registers, and the "
              "head's backward (dx, and dW added into the flat gradient) as another that forms them again "
              "(kernels/linear_cross_entropy.py, head_loss.py), instead of cuBLAS's head GEMMs and the loss "
              "kernel. Not in tf32 or fp32, where its trial was mixed (chapter 6)")
    fuse_embedding: bool = _option(
        True, "with the embedding kernel: the token and position embeddings gathered and summed by one kernel, and "
               "both tables' gradients added into the flat gradient by another (kernels/embedding_sum.py, "
               "engine/embedding.py), instead of a position index, two gathers and an add forward, and two zeroed "
               "tables, two scatter-adds and autograd's two adds backward")
    programmatic_launch: bool = _option(
        False, "on CUDA devices of sm_90 or later: the step's Triton kernels launched with programmatic dependent "
               "launch (kernels/pdl.py, engine/launches.py), so each may start while the kernel before it in its "
               "stream still runs and waits on the GPU for that kernel's writes, instead of starting only after "
               "it ends; the same results bit for bit")
    programmatic_trigger: str = _option(
        "start", "with programmatic_launch, one of PDL_TRIGGERS: where each kernel lets the next one start, 'start' "
                 "(griddepcontrol.launch_dependents right after its own wait, so the next kernel's programs wait on "
                 "the SMs while it runs) or 'exit' (no signal: the next kernel starts as this one's programs end, "
                 "taking SMs only as they free)")
    relaxed_atomics: bool = _option(
        True, "the atomic adds of the engine's gradient kernels in relaxed memory order, as CUDA's atomicAdd and "
               "torch.compile's adds, instead of Triton's default acquire-release, whose fences make a loop's next "
               "loads wait for each add and a program's last add wait for its stores: the embeddings' gradients "
               "(fuse_embedding, kernels/embedding_sum.py), the norms' weight gradients (norm_dw_into_buffer, "
               "kernels/residual_norm.py), the fused head's dW (fuse_head_loss, kernels/linear_cross_entropy.py) and "
               "the split-K weight gradients (wgrad_splitk, kernels/wgrad.py)")
    wgrad_splitk: bool = _option(
        False, "with grad_into_buffer, under bf16/fp16/tf32: each Linear's weight gradient added into the flat "
               "gradient by one split-K Triton GEMM with atomic adds (kernels/wgrad.py) instead of cuBLAS's GEMM "
               "with an fp32 output, which at these skinny shapes splits the reduction and sums the slices' "
               "partials in a second kernel")
    wgrad_side_stream: bool = _option(
        True, "with grad_into_buffer, under bf16/fp16 on CUDA: each Linear's weight-gradient GEMM runs on a second "
              "stream, forked from the backward where dy is ready and joined before the gradients are read "
              "(clipping, the optimizer), so it overlaps the chain of input-gradient, attention and norm kernels "
              "that leads to the layers below (wgrad_stream.py); the tied head stays on the main stream. Not in "
              "tf32 or fp32, where its trial was mixed (chapter 6)", keyless=False)
    bias_into_buffer: bool = _option(
        True, "with grad_into_buffer and the bias kernel: each Linear's backward adds its bias gradient into the "
               "bias's view of the flat gradient with the column sum's atomic adds (kernels/bias_linear.py, "
               "bias_grad_add_) instead of partial rows, a torch sum and autograd's add (linears.py)", keyless=False)
    bf16_bias_weights: bool = _option(
        True, "under bf16 with bf16_weights and grad_into_buffer: the Linear layers on the bias kernel (GPT-2's) "
               "read their weight and bias from the step's bf16 shadow too, which then covers the whole flat "
               "buffer, instead of one autocast cast of each weight and bias per step (linears.py)", keyless=False)
    first_norm_into_buffer: bool = _option(
        True, "with the fused residual-norm and norm_dw_into_buffer: the first block's first norm (the one norm no "
               "residual add precedes) runs its backward on the fused residual-norm's kernel with its weight (and "
               "bias) gradients added into the flat gradient (kernels/norm_into.py), instead of its own norm "
               "kernel's backward with partial rows, torch sums and autograd's adds", keyless=False)
    branch_bias_into_norm: bool = _option(
        True, "with the fused residual-norm, norm_dw_into_buffer, grad_into_buffer and the bias kernel (GPT-2): the "
               "gradient of each residual branch's last bias (the attention's and the MLP's output projections) is "
               "added into the flat gradient by the norm backward that computes that branch's gradient "
               "(kernels/residual_norm.py, drb_out), instead of one column-sum kernel per projection", keyless=False)
    explicit_one_pass: bool = _option(
        False, "with fuse_softmax_matmuls (GPT-2), for sequences of up to 512 keys: the explicit attention's forward "
               "and dQ kernels take a whole row of keys in one tile and pass over it once, instead of twice over "
               "key tiles (kernels/explicit_attention.py, one_pass); attention_tiles may then name only 'bwd' "
               "tiles, which go to the dK/dV kernel")
    explicit_dq_one_pass: bool = _option(
        True, "with fuse_softmax_matmuls (GPT-2), for sequences of up to 512 keys on sm_80 or later: the explicit "
              "attention's dQ kernel alone takes a whole row of keys in one tile of 64 query rows on 4 warps and "
              "passes over it once (kernels/explicit_attention.py, dq_one_pass), the forward staying on two "
              "passes; attention_tiles' 'bwd' tiles then go to the dK/dV kernel only", keyless=False)
    explicit_heavy_first: bool = _option(
        True, "with fuse_softmax_matmuls (GPT-2), under bf16/fp16: each grid of the explicit attention's kernels "
              "launches the causal block with the most work first (kernels/explicit_attention.py, heavy_first: the "
              "forward's and dQ's last query block, the dK/dV kernel's first key block), so the light blocks fill "
              "the tail; the same programs and sums. Not in tf32 or fp32, where its trial was mixed (chapter 6)",
        keyless=False)
    qkv_bias_into_attention: bool = _option(
        False, "with fuse_softmax_matmuls, grad_into_buffer and the bias kernel (GPT-2): the qkv projection's bias "
               "gradient, the column sums of d(qkv), added into the flat gradient by the explicit attention's "
               "backward kernels as they write dq, dk and dv (kernels/explicit_attention.py, db_out), instead of "
               "one column-sum kernel per layer reading d(qkv) back")
    fc_bias_into_gelu: bool = _option(
        True, "with grad_into_buffer and the bias kernel, GELU MLPs with biases (GPT-2): GELU's backward runs on the "
              "column-sum kernel (kernels/bias_linear.py, gelu_bwd_bias_add_), which writes dz and adds its column "
              "sums, the up-projection's bias gradient, into the flat gradient, instead of an elementwise kernel "
              "and a column-sum kernel reading dz back; not with fuse_mlp_act", keyless=False)
    muon_grouped: bool = _option(
        False, "with Muon (a recipe's optimizer='muon'): the matrices of each shape orthogonalized in one batched "
               "Newton-Schulz, the rest as multi-tensor launches (ftlib.training.muon.muon_update_grouped_), "
               "instead of one update per matrix", keyless=False)

    def __post_init__(self) -> None:
        bad = []
        uk = self.use_kernels
        if isinstance(uk, Mapping):
            unknown = sorted(set(uk) - set(KERNEL_OPS))
            if unknown:
                bad.append(f"unknown kernel op(s) {unknown} in use_kernels; known ops: {list(KERNEL_OPS)}")
        elif not isinstance(uk, bool):
            bad.append(f"use_kernels={uk!r} must be True, False or a dict {{op: bool}}")
        if self.capture is not None and not isinstance(self.capture, bool):
            bad.append(f"capture={self.capture!r} must be True, False or None")
        for name in ("linear_precision", "attention_precision"):
            v = getattr(self, name)
            if v is not None and v not in DOT_PRECISIONS:
                bad.append(f"{name}={v!r}; expected None or one of {DOT_PRECISIONS}")
        if self.attention_layout not in ATTENTION_LAYOUTS:
            bad.append(f"attention_layout={self.attention_layout!r}; expected one of {ATTENTION_LAYOUTS}")
        if self.attention_tiles is not None:
            from kernels.tiles import parse_tiles  # here: the options import no Triton unless tiles are named

            try:
                named = parse_tiles(self.attention_tiles)
            except (ValueError, TypeError) as e:
                bad.append(str(e))
                named = {}
            if self.attention_layout != "packed":
                bad.append(f"attention_tiles={self.attention_tiles!r} needs attention_layout='packed'")
            if self.explicit_one_pass and "fwd" in named:
                bad.append(f"attention_tiles={self.attention_tiles!r} names 'fwd' tiles, which explicit_one_pass "
                           "replaces with a whole row (kernels.explicit_attention.one_pass_tiles): name 'bwd' only")
        kvs = self.attention_kv_split
        if kvs is not None:
            if isinstance(kvs, bool) or not isinstance(kvs, int) or kvs < 1 or kvs & (kvs - 1):
                bad.append(f"attention_kv_split={kvs!r} must be None or a power of two >= 1")
        if self.norm_bwd_grid is not None:
            from kernels._common import RowGrid  # here: the options import no Triton unless a grid is named

            try:
                RowGrid.parse(self.norm_bwd_grid)
            except (ValueError, TypeError) as e:
                bad.append(str(e))
        if self.programmatic_trigger not in PDL_TRIGGERS:
            bad.append(f"programmatic_trigger={self.programmatic_trigger!r}; expected one of {PDL_TRIGGERS}")
        if self.norm_dw_partials not in NORM_DW_PARTIALS:
            bad.append(f"norm_dw_partials={self.norm_dw_partials!r}; expected one of {NORM_DW_PARTIALS}")
        for f in dataclasses.fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                bad.append(f"{f.name}={getattr(self, f.name)!r} must be True or False")
        if bad:
            raise ValueError("invalid engine options: " + "; ".join(bad))

    @property
    def atomic_sem(self) -> str:
        """The memory order of the gradient kernels' atomic adds (``relaxed_atomics``; kernels._common.ATOMIC_SEMS)."""
        return "relaxed" if self.relaxed_atomics else "acq_rel"

    @classmethod
    def of(cls, values: Mapping[str, Any] | EngineOptions | None = None, **more: Any) -> EngineOptions:
        """Options from a mapping (and keywords), with a ValueError naming any unknown option."""
        given = dict(dataclasses.asdict(values) if isinstance(values, EngineOptions) else (values or {}), **more)
        unknown = sorted(set(given) - set(option_names()))
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; the options are {list(option_names())}")
        return cls(**given)

    def kernels(self) -> dict[str, bool]:
        """op -> requested, for every op of ``KERNEL_OPS``."""
        if isinstance(self.use_kernels, bool):
            return {op: self.use_kernels for op in KERNEL_OPS}
        return {op: bool(self.use_kernels.get(op, True)) for op in KERNEL_OPS}


def option_names(recipe: bool = False) -> tuple[str, ...]:
    """Every option's name, or (``recipe``) those a training recipe may set: capture stays the trainer's."""
    return tuple(f.name for f in dataclasses.fields(EngineOptions) if not recipe or f.metadata["recipe"])


def option_docs() -> dict[str, str]:
    """Each option's default and meaning, for ``ci/gpu_bench.py`` and the book."""
    return {f.name: f"{f.default!r}: {f.metadata['doc']}" for f in dataclasses.fields(EngineOptions)}


def key_items(given: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    """The (name, value) pairs of ``given`` that enter a result key: all but an option at its
    ``keyless`` value (what rows stored before the option existed ran with)."""
    keyless = {f.name: f.metadata["keyless"] for f in dataclasses.fields(EngineOptions)}
    return tuple((k, v) for k, v in given if keyless.get(k, _NO_VALUE) is _NO_VALUE or v != keyless[k])


@dataclass(frozen=True)
class StepPrecision:
    """A precision name resolved once for the engine: the step's autocast and TF32
    (:class:`ftlib.core.precision.Precision`) and what the engine's kernels take from them."""

    base: Precision
    fp32_dot: str  # the attention kernel's tl.dot precision for fp32 operands
    attention_dot: str  # what its tl.dot multiplies: the autocast dtype's name, else fp32_dot
    low_dtype: torch.dtype | None  # bf16 under bf16 autocast: what fused norms and the softmax may write
    fp32_storage: bool  # fp32 and tf32: the Triton GEMM may take the Linear layers

    @classmethod
    def of(cls, precision: str, options: EngineOptions) -> StepPrecision:
        base = Precision.of(precision)
        # fp32 operands: strict IEEE dots, or TF32 tensor cores when the precision is tf32, unless set;
        # bf16/fp16 operands (autocast) go to the tensor cores' MMA directly.
        fp32_dot = options.attention_precision or ("tf32" if base.tf32 else "ieee")
        return cls(base, fp32_dot, precision if base.autocast is not None else fp32_dot,
                   torch.bfloat16 if precision == "bf16" else None, base.autocast is None)
