"""A test helper: an engine option built and on trial, not yet a default (ftlib.harness.suites.CANDIDATES)."""

from __future__ import annotations

import pytest

from ftlib.training.engine import EngineOptions


def assert_on_trial(option: str, label: str, model: str) -> None:
    """``option`` is off by default and validated as a bool; it is on trial as ``{option: True}`` in the candidates
    suite, in bf16 and tf32 beside ``model``'s default case (the case ``label``), with a 100-step check in each."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES, SUITES

    assert getattr(EngineOptions(), option) is False  # on trial: only a measured winner becomes a default
    with pytest.raises(ValueError, match=option):
        EngineOptions(**{option: 1})
    assert [c[1] for c in CANDIDATES if option in c[1]] == [{option: True}]
    labels = [c.label for c in SUITES["engine_candidates"].cases()]
    assert labels.count(label) == 2  # bf16 and tf32, each beside its default case
    for prec in ("bf16", "tf32"):
        assert (prec, model, {option: True}) in CHECKS
