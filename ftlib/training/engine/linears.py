"""The Linear layers on the flat buffers: bf16 shadow weights, gradients written into the flat gradient.

These swaps need the flat buffers (:mod:`ftlib.training.engine.flat`), so they run after them and after
:func:`ftlib.training.engine.swaps.swap_kernels` (which may already have put a Linear on the bias kernel):

* :func:`shadow_linears`: plain Linears read their weight from one bf16 copy of the flat weights
  (``bf16_weights.py``; option ``bf16_weights``);
* :func:`grad_into_linears`: Linears write their weight gradient into the flat gradient (``grad_into.py``;
  option ``grad_into_buffer``), and, with options ``bias_into_buffer`` and ``bf16_bias_weights``, the Linears
  with a bias kernel (GPT-2's) also add their bias gradient there and read their weight and bias from the
  shadow;
* :func:`setup_linears`: which of these apply to an engine's model and precision, with a note for each
  option that does not.

Why the bias options: with the bias kernel alone, each of GPT-2's Linear biases costs a Triton column sum
into partial rows, a torch sum of the rows and autograd's add into the flat gradient, and under bf16 one
autocast cast of its weight and one of its bias per step: five kernels where one would do (the step's
profile in ``benchmarks/kernels/engine_probe.py`` counts them). The same arithmetic in every case: the
bias gradient is the column sum of dy in fp32 (added in no fixed order with ``bias_into_buffer``), and
bf16(W), bf16(b) are the values autocast's casts give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn as nn

from ftlib.model.gpt import GPT
from ftlib.training.engine.options import EngineOptions, StepPrecision
from ftlib.training.engine.swaps import kernels_runnable, replace_modules
from ftlib.training.engine.wgrad_stream import WGradStream, wgrad_stream_for
from kernels.mm_into import fp32_out_mm_available

Spans = dict[str, tuple[int, int]]  # parameter name -> (offset, numel) in the flat buffers


def shadow_linears(model: GPT, flat_param16: torch.Tensor, spans: Spans) -> int:
    """Every plain ``nn.Linear`` onto :class:`ShadowLinear`, its weight read from ``flat_param16`` (the
    bf16 copy of the decayed part of the flat buffer); returns how many."""
    from ftlib.training.engine.bf16_weights import ShadowLinear

    span_of = {id(p): spans[n] for n, p in model.named_parameters()}

    def shadow(lin: nn.Linear) -> nn.Module:
        off, size = span_of[id(lin.weight)]
        return ShadowLinear(lin, flat_param16[off : off + size].view_as(lin.weight))

    return replace_modules(model, nn.Linear, shadow, exact=True)  # not the Triton GEMM or bias-kernel Linears


def grad_into_linears(model: GPT, flat_grad: torch.Tensor, spans: Spans, fp32_out: bool,
                      add_wgrad: Callable | None = None, *, shadow16: torch.Tensor | None = None,
                      bias_into: bool = False, bias_elsewhere: frozenset[int] = frozenset(),
                      wgrad_stream: WGradStream | None = None) -> tuple[int, dict[str, str]]:
    """Every plain, bf16-shadow or bias-kernel Linear onto :class:`GradIntoLinear`, its weight gradient
    written into ``flat_grad``'s span of the weight; returns (how many, {Linear left on autograd: why}).

    For the bias-kernel Linears: ``shadow16``, a bf16 copy of the whole flat buffer, gives their weight
    and bias in bf16 (None: autocast's casts, one per step each); ``bias_into``, their bias gradient is
    added into ``flat_grad``'s span of the bias by the column sum's atomic adds; a bias whose id is in
    ``bias_elsewhere`` gets its gradient from the kernel that makes its dy (option branch_bias_into_norm).
    ``wgrad_stream``: the side stream of option wgrad_side_stream, given to every Linear but the tied head,
    whose gradient the embedding's backward adds to on the main stream after the head has written it.

    A weight held by another module too is taken only where it is ``GPT``'s tied head (the embedding
    adds its contribution after the head has written: ``grad_into.py``); any other sharing stays."""
    from ftlib.training.engine.bf16_weights import ShadowLinear
    from ftlib.training.engine.grad_into import GradIntoLinear

    bias_linear = None
    if kernels_runnable(flat_grad.device) is None:
        from kernels.bias_linear import BiasLinear, bias_grad

        bias_linear = BiasLinear
    span_of = {id(p): spans[n] for n, p in model.named_parameters()}
    holders: dict[int, list[str]] = {}
    for name, m in model.named_modules():
        for p in m.parameters(recurse=False):
            holders.setdefault(id(p), []).append(name)
    tied_head = getattr(model, "head", None) is not None and model.head.weight is model.wte.weight
    left: dict[str, str] = {}

    def takes(name: str, m: nn.Module) -> bool:
        if type(m) not in (nn.Linear, ShadowLinear, bias_linear):
            return False
        users = holders[id(m.weight)]
        if len(users) == 1 or (tied_head and m is model.head and sorted(users) == ["head", "wte"]):
            return True
        left[name] = f"its weight is shared with {[u for u in users if u != name]}"
        return False

    chosen = {id(m) for name, m in model.named_modules() if takes(name, m)}

    def view(flat: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        off, size = span_of[id(p)]
        return flat[off : off + size].view_as(p)  # (size,) -> p's shape

    def into(lin: nn.Module) -> nn.Module:
        kw = dict(w16=getattr(lin, "w16", None))
        if type(lin) is bias_linear:
            kw["bias_grad"] = partial(bias_grad, out_dtype=lin.bias.dtype)
            if shadow16 is not None:
                kw.update(w16=view(shadow16, lin.weight), b16=view(shadow16, lin.bias))
            if id(lin.bias) in bias_elsewhere:
                kw["db_elsewhere"] = True
            elif bias_into:
                kw["db_out"] = view(flat_grad, lin.bias)
        if not (tied_head and lin is model.head):
            kw["wgrad_stream"] = wgrad_stream
        return GradIntoLinear(lin, view(flat_grad, lin.weight), fp32_out=fp32_out, add_wgrad=add_wgrad, **kw)

    return replace_modules(model, nn.Module, into, when=lambda m: id(m) in chosen), left


def triton_gemm_why_not(device: torch.device, prec: StepPrecision) -> str | None:
    """Why an option that moves a GEMM onto Triton (``fuse_mlp_act``, ``wgrad_splitk``) cannot apply to this
    step, or None: no runnable kernels here, or strict fp32, whose products cuBLAS runs on the FMA units (a
    Triton GEMM would change them rather than fuse around them)."""
    return kernels_runnable(device) or (
        None if prec.base.autocast is not None or prec.base.tf32
        else "not applied: strict fp32 keeps cuBLAS's FMA products (bf16, fp16 and tf32 only)")


@dataclass
class LinearSetup:
    """What :func:`setup_linears` did: the bf16 shadow (None: none), how many Linears write their weight
    gradient into the flat gradient, and which options applied; ``notes``: option -> what or why not."""

    shadow16: torch.Tensor | None = None
    grad_into: int = 0
    wgrad_stream: WGradStream | None = None
    wgrad_splitk: bool = False
    bias_into_buffer: bool = False
    bf16_bias_weights: bool = False
    notes: dict[str, str] = field(default_factory=dict)


def _bias_options(model: GPT, options: EngineOptions, bf16_shadow: bool,
                  device: torch.device) -> tuple[bool, bool, dict[str, str]]:
    """(bias_into_buffer, bf16_bias_weights) as they apply, with a note for each one asked for."""
    notes: dict[str, str] = {}
    has = False
    if kernels_runnable(device) is None:  # else no Linear is on the bias kernel (and Triton may be missing)
        from kernels.bias_linear import BiasLinear

        has = any(type(m) is BiasLinear for m in model.modules())
    why = ("not applied: needs grad_into_buffer" if not options.grad_into_buffer else
           None if has else "not applicable: no Linear on the bias kernel (no biases, or bias_kernel off)")
    into = options.bias_into_buffer and why is None
    if options.bias_into_buffer:
        notes["bias_into_buffer"] = why or "bias gradients added into the flat gradient (kernels/bias_linear.py)"
    shadow = options.bf16_bias_weights and why is None and bf16_shadow
    if options.bf16_bias_weights:
        notes["bf16_bias_weights"] = (why or ("the bias-kernel Linears' weights and biases on the bf16 shadow"
                                              if bf16_shadow else "not applied: needs bf16 with bf16_weights"))
    return into, shadow, notes


def setup_linears(model: GPT, options: EngineOptions, prec: StepPrecision, flat_param: torch.Tensor,
                  flat_grad: torch.Tensor, spans: Spans, n_decay: int,
                  bias_elsewhere: frozenset[int] = frozenset()) -> LinearSetup:
    """The bf16 shadow (bf16 only: the decayed part of ``flat_param``, or all of it with
    ``bf16_bias_weights``), then the Linears onto the shadow and into the flat gradient where the options
    ask for it and apply; the engine refreshes the shadow from ``flat_param`` at the start of every step.
    ``bias_elsewhere``: the ids of the biases whose gradients another kernel adds (:func:`grad_into_linears`);
    each must be taken by a Linear that writes into the flat gradient, else a RuntimeError."""
    out = LinearSetup()
    o, device, low = options, flat_param.device, prec.base.autocast is not None
    bf16_shadow = o.bf16_weights and prec.low_dtype == torch.bfloat16 and o.linear_precision is None
    into, whole, out.notes = _bias_options(model, o, bf16_shadow, device)
    if o.bf16_weights and not bf16_shadow:
        out.notes["bf16_weights"] = ("not applied: the Linear layers run on the Triton GEMM" if prec.low_dtype
                                     else "not applied: needs precision='bf16'")
    elif o.bf16_weights:
        out.shadow16 = torch.empty(flat_param.numel() if whole else n_decay, dtype=torch.bfloat16, device=device)
        n = shadow_linears(model, out.shadow16, spans)
        out.notes["bf16_weights"] = f"{n} Linear layers on one bf16 shadow of the flat weights"
    out.wgrad_stream, note = wgrad_stream_for(device, o.wgrad_side_stream, o.grad_into_buffer, low)
    if note:
        out.notes["wgrad_side_stream"] = note
    if not o.grad_into_buffer:
        if bias_elsewhere:
            raise RuntimeError("bias gradients added by another kernel need grad_into_buffer")
        return out
    fp32_out = low and fp32_out_mm_available(device)
    add_wgrad = None
    if o.wgrad_splitk and (why := triton_gemm_why_not(device, prec)):
        out.notes["wgrad_splitk"] = why
    elif o.wgrad_splitk:
        from kernels.wgrad import wgrad_add_

        out.notes["wgrad_splitk"] = "weight gradients added by the split-K kernel (kernels/wgrad.py)"
        add_wgrad = partial(wgrad_add_, input_precision="ieee" if low else "tf32", sem=o.atomic_sem)
    n, left = grad_into_linears(model, flat_grad, spans, fp32_out, add_wgrad,
                                shadow16=out.shadow16 if whole else None, bias_into=into,
                                bias_elsewhere=bias_elsewhere, wgrad_stream=out.wgrad_stream)
    taken = {id(m.bias) for m in model.modules() if getattr(m, "db_elsewhere", False)}
    if taken != set(bias_elsewhere):
        raise RuntimeError(f"{len(set(bias_elsewhere) - taken)} bias(es) whose gradient another kernel adds are not "
                           "on a Linear that writes into the flat gradient: it would be added twice or not at all")
    out.grad_into, out.wgrad_splitk = n, add_wgrad is not None and n > 0
    out.bias_into_buffer, out.bf16_bias_weights = into and n > 0, whole and n > 0
    if n == 0:
        out.wgrad_stream = None
        if o.wgrad_side_stream:
            out.notes["wgrad_side_stream"] = "not applied: no Linear writes its weight gradient into the flat gradient"
        out.notes["grad_into_buffer"] = ("not applied: no plain, bf16-shadow or bias-kernel Linear "
                                         "(the Triton GEMM's Linears keep their own backward)")
        return out
    how = (" (one GEMM with an fp32 output)" if fp32_out else
           " (the low-precision GEMM copied in: no fp32-output GEMM here)" if low else "")
    kept = f"; left on autograd: {left}" if left else ""
    out.notes["grad_into_buffer"] = f"{n} Linear weight gradients written into the flat buffer{how}{kept}"
    return out
