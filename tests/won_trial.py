"""A test helper: an engine option that won its trial and is now a default, with its ablation in the engine suite
and its 100-step checks kept (ftlib.harness.engine_suites, ftlib.harness.engine_check)."""

from __future__ import annotations

import pytest

from ftlib.training.engine import EngineOptions


def assert_won_trial(option: str, ablation: str, model: str, precisions: tuple[str, ...]) -> None:
    """``option`` is on by default and validated as a bool; nothing puts it on trial any more; the engine suite
    switches it off again as the case ``ablation`` in each of ``precisions`` (where it applies), and its 100-step
    checks in those precisions beside ``model``'s default case stay."""
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES, SUITES

    assert getattr(EngineOptions(), option) is True  # a measured winner
    with pytest.raises(ValueError, match=option):
        EngineOptions(**{option: 1})
    assert not [c for c in CANDIDATES if option in c[1]]
    assert not [c for c in SUITES["engine_candidates"].cases() if option in c.extra]
    ablations = {(c.precision, c.label): c.extra for c in SUITES["engine"].cases() if option in c.extra}
    assert ablations == {(prec, ablation): {option: False} for prec in precisions}
    assert {p for p, m, o in CHECKS if m == model and o == {option: True}} == set(precisions)
