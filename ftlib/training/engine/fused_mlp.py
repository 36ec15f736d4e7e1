"""The engine's MLPs with GELU in their GEMM epilogues (``kernels/gelu_mlp.py``; engine option ``fuse_mlp_act``),
or with the up-projection's bias gradient summed by GELU's backward (:class:`GeluBiasMLP`; ``fc_bias_into_gelu``).

Each block's ``MLP`` (fc -> GELU -> proj -> dropout) runs as one :func:`kernels.gelu_mlp.gelu_mlp` call: the
up-projection's GEMM writes the pre-activation and its GELU, the backward's GEMM through the
down-projection multiplies by GELU' before it stores, so the two elementwise GELU kernels go. Everything
else the engine did to the two Linears stays: their bf16 shadow weights are read (``bf16_weights``) and
their weight gradients are written into the flat fp32 gradient (``grad_into_buffer``).

Applied under bf16 / fp16 autocast (the fused GEMMs multiply on the tensor cores in the operands'
dtype, as cuBLAS does there) and in tf32 (TF32 products, as cuBLAS's there); not in strict fp32, whose
products cuBLAS runs on the FMA units, a route the Triton GEMM would change rather than fuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ftlib.model.gpt import GPT
from ftlib.model.mlp import MLP
from ftlib.training.engine.grad_into import GradIntoLinear, bias_sum_why_not, grad_views

if TYPE_CHECKING:
    from ftlib.training.engine.options import EngineOptions

APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}  # the model's activation -> F.gelu's name


class FusedMLP(MLP):
    """Takes over an ``MLP`` whose two Linears the engine has set up (plain, bf16-shadow or grad-into:
    the same modules, under the same names, so parameter names do not change) and, in training mode
    with gradients on, runs fc, GELU and proj as :func:`kernels.gelu_mlp.gelu_mlp`; elsewhere
    (evaluation, sampling) the MLP's own forward."""

    def __init__(self, mlp: MLP, input_precision: str = "ieee") -> None:
        nn.Module.__init__(self)  # not MLP.__init__: the Linears are the given MLP's, not new ones
        self.fc, self.proj, self.dropout = mlp.fc, mlp.proj, mlp.dropout
        self.activation, self.approximate = mlp.activation, APPROXIMATE[mlp.activation]
        self.input_precision = input_precision  # the fused GEMMs' products for fp32 operands (tf32 steps)
        fc, proj = mlp.fc, mlp.proj
        self.w1c, self.w2c = getattr(fc, "w16", None), getattr(proj, "w16", None)  # bf16 shadows, if any
        into = isinstance(fc, GradIntoLinear) and isinstance(proj, GradIntoLinear)
        self.dw1_out, self.dw2_out = (fc.grad, proj.grad) if into else (None, None)  # flat-gradient views
        self.bias_grad: Callable[[torch.Tensor], torch.Tensor] | None = fc.bias_grad if into else None
        self.fp32_out = fc.fp32_out if into else False  # the engine's probe, as the Linears write theirs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(x)
        from kernels.gelu_mlp import gelu_mlp

        y = gelu_mlp(x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias, self.approximate,
                     w1c=self.w1c, w2c=self.w2c, dw1_out=self.dw1_out, dw2_out=self.dw2_out,
                     bias_grad=self.bias_grad, fp32_out=self.fp32_out, input_precision=self.input_precision)
        return self.dropout(y)

    def extra_repr(self) -> str:
        return (f"GELU ({self.approximate}) in the GEMM epilogues"
                + (", bf16 shadows" if self.w1c is not None else "")
                + (", dW into the flat gradient" if self.dw1_out is not None else ""))


def fuse_mlps(model: GPT, low_precision: bool, tf32: bool, why_not: str | None) -> tuple[int, str]:
    """Every block's MLP onto :class:`FusedMLP` (``low_precision``: bf16 / fp16 autocast; ``tf32``: fp32
    storage with TF32 products); returns (how many, a note saying so). ``why_not``: why the step cannot
    take a Triton GEMM at all (no kernels here, strict fp32: ``linears.triton_gemm_why_not``)."""
    if why_not:
        return 0, why_not
    act = model.config.activation
    if act not in APPROXIMATE:
        return 0, f"not applicable: the MLP's activation is {act!r}, not GELU"
    n = 0
    for blk in model.blocks:
        if type(blk.mlp) is MLP:
            blk.mlp = FusedMLP(blk.mlp, "tf32" if tf32 and not low_precision else "ieee")
            n += 1
    return n, f"{n} MLPs with GELU in their GEMM epilogues (kernels/gelu_mlp.py)"


class GeluBiasMLP(MLP):
    """Takes over an ``MLP`` (its Linears, under the same names) and, in training mode with gradients on, runs
    its GELU as :func:`kernels.bias_linear.gelu_bias_grad`: F.gelu forward, and a backward that also adds the
    up-projection's bias gradient (the column sums of dz) into that bias's ``.grad``, the engine's flat-gradient
    view, so the up-projection's own column sum goes (its Linear is told so: ``setup_linears``'
    ``bias_elsewhere``). Elsewhere (evaluation, sampling) the MLP's own forward."""

    def __init__(self, mlp: MLP) -> None:
        nn.Module.__init__(self)  # not MLP.__init__: the Linears are the given MLP's, not new ones
        self.fc, self.proj, self.dropout = mlp.fc, mlp.proj, mlp.dropout
        self.activation, self.approximate = mlp.activation, APPROXIMATE[mlp.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(x)
        from kernels.bias_linear import gelu_bias_grad

        (db,) = grad_views("GeluBiasMLP", self.fc.bias)
        return self.dropout(self.proj(gelu_bias_grad(self.fc(x), self.approximate, db)))


def fc_biases_into_gelu(model: GPT, options: EngineOptions, notes: dict[str, str]) -> frozenset[int]:
    """With ``fc_bias_into_gelu`` where it applies: every block's MLP onto :class:`GeluBiasMLP`; returns the ids of
    the up-projections' biases, whose Linears then sum none. Else an empty set, with a note saying why."""
    if not options.fc_bias_into_gelu:
        return frozenset()
    cfg = model.config
    why = ("not applicable: the config has no biases" if not cfg.bias
           else f"not applicable: the MLP's activation is {cfg.activation!r}, not GELU"
           if cfg.activation not in APPROXIMATE
           else "not applied: fuse_mlp_act sums the up-projection's bias gradient itself" if options.fuse_mlp_act
           else bias_sum_why_not(options, notes))
    if why:
        notes["fc_bias_into_gelu"] = why
        return frozenset()
    for blk in model.blocks:
        blk.mlp = GeluBiasMLP(blk.mlp)
    notes["fc_bias_into_gelu"] = (f"{len(model.blocks)} up-projection biases' gradients added by GELU's backward "
                                  "(kernels/bias_linear.py, gelu_bwd_bias_add_)")
    return frozenset(id(blk.mlp.fc.bias) for blk in model.blocks)
