"""One plain-PyTorch reference per hand-written kernel in ``kernels/``.

The kernel tests import every reference from here. Norms and attention are the model's
own implementations (re-exported from :mod:`ftlib.model.norm`, :mod:`ftlib.attention` and
:mod:`ftlib.model.gpt`, the embeddings' sum);
cross-entropy, the flat-buffer AdamW step and the tanh-GELU MLP epilogue are defined
below. These are the definitions the kernels must match, written for clarity, not speed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ftlib.model.attention import causal_attention_ref, causal_softmax_ref
from ftlib.model.gpt import embedding_sum_ref
from ftlib.model.norm import layer_norm_ref, rms_norm_ref

__all__ = [
    "adamw_step_ref",
    "add_layer_norm_ref",
    "add_rms_norm_ref",
    "causal_attention_ref",
    "causal_softmax_ref",
    "cross_entropy_ref",
    "dropout_ref",
    "embedding_sum_ref",
    "gelu_mlp_ref",
    "gelu_tanh_ref",
    "kv_split_sum_ref",
    "layer_norm_ref",
    "linear_cross_entropy_ref",
    "linear_ref",
    "mlp_epilogue_ref",
    "rms_norm_ref",
]


def cross_entropy_ref(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean softmax cross-entropy over the rows of ``logits`` (N, V) with ``targets`` (N,).

    loss = sum_i [logsumexp(z_i) - z_i[t_i]] / #{i : t_i != ignore_index}, i.e.
    ``F.cross_entropy(..., reduction='mean')`` as GPT.forward calls it. Computed in at
    least fp32 so that bf16/fp16 logits do not lose the log-sum-exp.
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return F.cross_entropy(z, targets, ignore_index=ignore_index, reduction="mean")


def linear_cross_entropy_ref(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             ignore_index: int = -100) -> torch.Tensor:
    """The output head and the loss as the model computes them: ``F.linear`` (no bias) then
    :func:`cross_entropy_ref`, what ``kernels.linear_cross_entropy`` fuses. Differentiable in both."""
    return cross_entropy_ref(F.linear(x, weight), targets, ignore_index)


@torch.no_grad()
def adamw_step_ref(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    n_decay: int | None = None,
) -> None:
    """One AdamW step (Loshchilov & Hutter 2019, Alg. 2) in place on flat buffers.

    Same operations, in the same order, as ``torch.optim.AdamW``'s single-tensor path
    (torch/optim/adamw.py, ``_single_tensor_adamw``, amsgrad=False, maximize=False):

        p  <- p * (1 - lr * wd)                      decoupled weight decay
        m  <- lerp(m, g, 1 - beta1)                  first moment
        v  <- v * beta2 + (1 - beta2) * g * g        second moment
        p  <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    ``step`` is t after the increment (1 for the first step). Weight decay applies to the
    first ``n_decay`` elements only (all when None): the flat buffer holds the decayed
    parameters first, then the undecayed ones (biases, norm gains), the two groups of
    :func:`ftlib.training.step.param_groups`.
    """
    beta1, beta2 = betas
    n = param.numel() if n_decay is None else n_decay
    if weight_decay != 0 and n > 0:
        param[:n].mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


def dropout_ref(r: torch.Tensor, keep: torch.Tensor | None, p: float) -> torch.Tensor:
    """Inverted dropout with a given keep mask (Srivastava et al. 2014; ``nn.Dropout``'s scaling):
    r keep / (1 - p); r itself when ``keep`` is None."""
    return r if keep is None else r * keep / (1.0 - p)


def add_rms_norm_ref(
    x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
    keep: torch.Tensor | None = None, p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's residual add and the RMSNorm after it: (s, rms_norm(s) * w), s = x + r
    (the branch r through dropout with mask ``keep`` first, when given)."""
    s = x + dropout_ref(r, keep, p)
    return s, rms_norm_ref(s, weight, eps)


def add_layer_norm_ref(
    x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5,
    keep: torch.Tensor | None = None, p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same for LayerNorm (GPT-2's pre-LN blocks): (s, layer_norm(s) * w + b), s = x + r."""
    s = x + dropout_ref(r, keep, p)
    return s, layer_norm_ref(s, weight, bias, eps)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b over the last dim of x (nn.Linear's definition): what ``kernels.linear``
    computes with three GEMMs (forward, dx, dW) on the Triton matmul."""
    return F.linear(x, weight, bias)


def gelu_tanh_ref(h: torch.Tensor) -> torch.Tensor:
    """tanh-GELU (Hendrycks & Gimpel 2016, sec. 2), written out:
    0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))). Equals F.gelu(h, approximate='tanh')."""
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))


def mlp_epilogue_ref(h: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The epilogue fused after the MLP's first matmul: gelu_tanh(h + bias), h (..., d_ff).

    GPT-2 has the bias (``MLP.fc``), FastTransformer does not. Computed in at least fp32,
    cast back to h's dtype, as a fused epilogue on the matmul's fp32 accumulator would.
    """
    hf = h.float() if h.dtype in (torch.float16, torch.bfloat16) else h
    if bias is not None:
        hf = hf + bias.to(hf.dtype)
    return F.gelu(hf, approximate="tanh").to(h.dtype)


def gelu_mlp_ref(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
                 b2: torch.Tensor | None, approximate: str = "tanh") -> torch.Tensor:
    """The model's MLP without dropout, gelu(x W1^T + b1) W2^T + b2 (``ftlib.model.mlp.MLP``): what
    ``kernels.gelu_mlp`` computes with the GELU in its GEMMs' epilogues."""
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate=approximate), w2, b2)


def gelu_bias_grad_ref(z: torch.Tensor, da: torch.Tensor,
                       approximate: str = "tanh") -> tuple[torch.Tensor, torch.Tensor]:
    """(dz, db) of GELU's backward and the preceding Linear's bias gradient, as autograd and a column sum give
    them: dz = F.gelu's backward of da at z (in z's dtype), db = the fp32 column sums of dz as stored over
    every leading dim. What ``kernels.bias_linear.gelu_bwd_bias_add_`` computes in one kernel."""
    zr = z.detach().requires_grad_(True)
    (dz,) = torch.autograd.grad(F.gelu(zr, approximate=approximate), zr, da)
    return dz, dz.reshape(-1, z.shape[-1]).to(torch.promote_types(z.dtype, torch.float32)).sum(0)


def kv_split_sum_ref(part: torch.Tensor, nkv: int, out: torch.Tensor) -> torch.Tensor:
    """The MQA dK (or dV) split sum as ``attention_bwd`` runs it without the fused kernel: the
    (B, nkv * n_split, T, hs) partials, split s of K/V head h at index h * n_split + s, summed over
    the splits, cast to ``out``'s dtype and copied into ``out`` (B, nkv, T, hs), which may be a view."""
    B, heads, T, hs = part.shape
    return out.copy_(part.view(B, nkv, heads // nkv, T, hs).sum(2).to(out.dtype))  # (B, nkv, T, hs)


def wgrad_ref(dy2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """A Linear's weight gradient dW = dY^T X (N, K) for dY (M, N), X (M, K), in fp64: what
    ``kernels.wgrad.wgrad_add_`` adds into its fp32 buffer."""
    return dy2.double().t() @ x2.double()
