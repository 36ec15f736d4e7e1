"""Where the engine's gradient kernels add with atomic adds, and in which memory order (engine option
``relaxed_atomics``; :data:`kernels._common.ATOMIC_SEMS` says what the orders mean).

Each swap module that launches such a kernel keeps the order it was given as ``sem``: the fused embeddings
(:mod:`ftlib.training.engine.embedding`), the fused residual-norms (:mod:`ftlib.training.engine.swaps`) and the
fused head (:mod:`ftlib.training.engine.head_loss`). The option's note is read from them, so it says what ran.
"""

from __future__ import annotations

from ftlib.model.gpt import GPT


def relaxed_atomics_note(model: GPT, norms_atomic: bool) -> str:
    """Option ``relaxed_atomics``'s note: which of the engine's gradient kernels with atomic adds took relaxed ones
    (each swap module keeps its ``sem``; ``norms_atomic``: the norms add their weight gradients), or why none did."""
    modules = ((getattr(model, "embedding_sum", None), "the embeddings' gradients (kernels/embedding_sum.py)"),
               (getattr(model, "add_norm", None) if norms_atomic else None,
                "the norms' weight gradients (kernels/residual_norm.py)"),
               (getattr(model, "head", None), "the fused head's dW (kernels/linear_cross_entropy.py)"))
    where = [what for module, what in modules if getattr(module, "sem", None) == "relaxed"]
    if not where:
        return "not applied: needs fuse_embedding, norm_dw_into_buffer or fuse_head_loss where they apply"
    return "atomic adds in relaxed memory order for " + ", ".join(where)
