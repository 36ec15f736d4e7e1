"""One model config, validated on construction, with presets by name.

The four co-design switches of the post are independent fields:

* ``n_kv_head``  - K/V heads: ``n_head`` = multi-head, 1 = multi-query, a divisor = grouped-query
* ``attn_impl``  - 'explicit' materialized softmax, or 'sdpa' (``F.scaled_dot_product_attention``)
* ``mlp_ratio``  - hidden width of the MLP over ``n_embd`` (4 for GPT-2, 2 for FastTransformer)
* ``norm``       - 'layernorm' or 'rmsnorm'

Everything else (bias, width, depth, heads, context, vocabulary, dropout, init,
weight tying) is a field too, so an ablation is ``preset('gpt2', norm='rmsnorm')``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

NORMS = ("layernorm", "rmsnorm")
INT_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd")
BOOL_FIELDS = ("bias", "tie_weights", "qk_norm")
REAL_FIELDS = ("mlp_ratio", "norm_eps", "dropout", "attn_dropout", "logit_softcap")
OPTIONAL_FIELDS = ("attn_dropout", "logit_softcap")
# Fields whose neutral value is left out of to_dict(), so configs from before they existed keep
# their config_hash() (stored results are keyed by it).
NEUTRAL = {"attn_dropout": None, "qk_norm": False, "logit_softcap": None}
STR_FIELDS = ("attn_impl", "kv_layout", "norm", "activation", "init")
ATTN_IMPLS = ("explicit", "sdpa")
# How K/V with fewer heads than Q reach SDPA (ftlib.model.attention.kv_for_sdpa says what each does).
KV_LAYOUTS = ("expand", "broadcast", "repeat", "gqa")
INITS = ("torch", "normal", "gpt2")
# 'relu2': ReLU(x)^2 (So et al. 2021, "Primer", sec. 4; the public nanoGPT speedruns' MLP).
ACTIVATIONS = ("gelu_tanh", "gelu", "relu2")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 65
    block_size: int = 256  # context length: the longest sequence the model accepts
    n_layer: int = 6
    n_head: int = 8
    n_kv_head: int = 8
    n_embd: int = 256
    mlp_ratio: float = 4.0
    attn_impl: str = "explicit"
    kv_layout: str = "expand"  # how K/V with fewer heads are handed to SDPA (KV_LAYOUTS)
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    bias: bool = True  # biases in every Linear and in LayerNorm
    activation: str = "gelu_tanh"
    dropout: float = 0.0
    # Dropout on the attention probabilities; None: the same as ``dropout`` (nanoGPT's choice).
    # 0 with dropout > 0 keeps the residual/embedding dropout and lets a fused attention kernel
    # without dropout (kernels/attention.py) run; the speedrun uses it (ftlib.harness.speedrun).
    attn_dropout: float | None = None
    # 'torch': PyTorch's default init (the original GPT-2 baseline);
    # 'normal': every Linear/Embedding weight N(0, 0.02), biases 0 (the original FastTransformer);
    # 'gpt2': 'normal' plus residual projections N(0, 0.02/sqrt(2 n_layer)) (GPT-2 paper sec. 2.3, nanoGPT).
    init: str = "torch"
    tie_weights: bool = False
    # RMS-normalize each head's queries and keys before attention (Dehghani et al. 2023, "Scaling
    # Vision Transformers to 22B", sec. 3.1: it keeps attention logits bounded at high learning rates).
    qk_norm: bool = False
    # Soft-cap the output logits: cap * tanh(logits / cap) (Gemma 2 report, sec. 2; the nanoGPT
    # speedruns), None for none.
    logit_softcap: float | None = None

    def __post_init__(self) -> None:
        # Types first: a wrong type would otherwise slip through (bias='False' is truthy and
        # builds biases) or fail later in a comparison with a bare TypeError. Values are not
        # converted (2 stays 2, not 2.0): config_hash() hashes them as given, and stored
        # results are keyed by it.
        bad = []
        for name in INT_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad.append(f"{name}={v!r} must be a positive integer")
        for name in BOOL_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, bool):
                bad.append(f"{name}={v!r} must be True or False (a bool: a string such as 'False' or 'no' "
                           "would count as true)")
        for name in REAL_FIELDS:
            v = getattr(self, name)
            if v is None and name in OPTIONAL_FIELDS:
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                allowed = "an int or a float" + (" (or None)" if name in OPTIONAL_FIELDS else "")
                bad.append(f"{name}={v!r} must be a number, {allowed}; got {type(v).__name__}")
            elif not math.isfinite(v):
                bad.append(f"{name}={v!r} must be finite")
        for name in STR_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, str):
                bad.append(f"{name}={v!r} must be a string, got {type(v).__name__}")
        if bad:
            raise ValueError("invalid ModelConfig: " + "; ".join(bad))
        if self.n_embd % self.n_head:
            bad.append(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            bad.append(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if not self.mlp_ratio > 0:
            bad.append(f"mlp_ratio={self.mlp_ratio!r} must be positive")
        elif abs(self.mlp_ratio * self.n_embd - round(self.mlp_ratio * self.n_embd)) > 1e-6:
            bad.append(f"mlp_ratio={self.mlp_ratio} * n_embd={self.n_embd} is not a whole hidden width")
        for name, allowed in (
            ("attn_impl", ATTN_IMPLS),
            ("kv_layout", KV_LAYOUTS),
            ("norm", NORMS),
            ("init", INITS),
            ("activation", ACTIVATIONS),
        ):
            if getattr(self, name) not in allowed:
                bad.append(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if self.kv_layout == "broadcast" and self.n_kv_head not in (1, self.n_head):
            bad.append(
                f"kv_layout='broadcast' needs n_kv_head=1 or n_head, got n_kv_head={self.n_kv_head}"
            )
        if not 0.0 <= self.dropout < 1.0:
            bad.append(f"dropout={self.dropout} must be in [0, 1)")
        if self.attn_dropout is not None and not 0.0 <= self.attn_dropout < 1.0:
            bad.append(f"attn_dropout={self.attn_dropout} must be None or in [0, 1)")
        if not self.norm_eps > 0:
            bad.append(f"norm_eps={self.norm_eps} must be positive")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            bad.append(f"logit_softcap={self.logit_softcap} must be None or positive")
        if bad:
            raise ValueError("invalid ModelConfig: " + "; ".join(bad))

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def attn_dropout_p(self) -> float:
        """The attention-probability dropout in effect (``attn_dropout``, else ``dropout``)."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def d_ff(self) -> int:
        return round(self.mlp_ratio * self.n_embd)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed, validated again."""
        _check_field_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name, neutral in NEUTRAL.items():  # left out at their neutral value: config_hash() keys stored rows
            if d[name] is neutral:  # None and False are singletons
                del d[name]
        return d

    def config_hash(self) -> str:
        """Short stable hash of every field, used as a cache key for results."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def check_sequence(self, T: int) -> None:
        if T > self.block_size:
            raise ValueError(f"sequence length T={T} is longer than the context block_size={self.block_size}")


# The exact configurations of the original FastTransformer repository's two models, and nanoGPT's.
PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": dict(
        n_kv_head=8, attn_impl="explicit", mlp_ratio=4.0, norm="layernorm", bias=True, init="torch"
    ),
    "fasttransformer": dict(
        n_kv_head=1, attn_impl="sdpa", mlp_ratio=2.0, norm="rmsnorm", bias=False, init="normal"
    ),
    # nanoGPT's config/train_shakespeare_char.py on model.py's defaults:
    # 6 layers, 6 heads, 384 wide, dropout 0.2, no biases, tied embeddings, exact GELU, flash SDPA.
    "nanogpt-char": dict(
        n_layer=6, n_head=6, n_kv_head=6, n_embd=384, block_size=256, mlp_ratio=4.0,
        attn_impl="sdpa", norm="layernorm", bias=False, activation="gelu", dropout=0.2,
        init="gpt2", tie_weights=True,
    ),
}


def _check_field_names(changes: dict[str, Any]) -> None:
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(ModelConfig)})
    if unknown:
        raise ValueError(f"unknown ModelConfig field(s) {unknown}; the fields are "
                         f"{[f.name for f in dataclasses.fields(ModelConfig)]}")


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named configuration, with any field overridden: ``preset('gpt2', n_kv_head=1)``."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
    _check_field_names(overrides)
    return ModelConfig(**{**PRESETS[name], **overrides})
