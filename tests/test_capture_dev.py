"""The capture diagnostic (benchmarks/kernels/capture_dev.py) names only real presets, precisions and engine
options, and without a GPU it says so instead of trying."""

from __future__ import annotations

import pytest
import torch

from benchmarks.kernels.capture_dev import CASES, main
from ftlib.model.config import preset
from ftlib.training.engine import EngineOptions

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def test_every_case_names_a_preset_a_precision_and_valid_options():
    for label, name, precision, options in CASES:
        preset(name)
        assert precision in PRECISIONS, label
        EngineOptions(**options)  # a misspelled option is a TypeError, a bad value a ValueError
    assert len({c[0] for c in CASES}) == len(CASES)  # each line of the printout says which case it is


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_without_a_gpu_it_says_so(capsys):
    assert main([]) == 2 and "needs a CUDA device" in capsys.readouterr().out
