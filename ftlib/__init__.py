"""ftlib: the package behind the FastTransformer book.

Layers, lowest first (ARCHITECTURE.md; ``lint-imports`` checks that imports only point down):
``core`` (devices, precisions, helpers), ``model`` (the transformer), ``analysis`` (FLOPs, bytes,
peaks, the post's claims) and ``training`` (the step, the trainer, the engine), ``harness``
(measuring and storing rows), ``views`` (rows to tables and figures).

Import has no side effects: it neither prints nor changes global torch settings.
"""

from ftlib.model.config import PRESETS, ModelConfig, preset
from ftlib.model.gpt import GPT, build_model

__all__ = ["GPT", "ModelConfig", "PRESETS", "build_model", "preset"]
__version__ = "0.1.0"
