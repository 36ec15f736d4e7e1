"""ftlib: the package behind the FastTransformer book.

Import has no side effects: it neither prints nor changes global torch settings.
"""

from ftlib.config import PRESETS, ModelConfig, preset
from ftlib.model import GPT, build_model

__all__ = ["GPT", "ModelConfig", "PRESETS", "build_model", "preset"]
__version__ = "0.1.0"
