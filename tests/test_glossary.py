"""Chapter 0's glossary: every configuration name the tables use is defined, with the comparison rule's
numbers as the code applies them."""

from __future__ import annotations

import pytest

from ftlib.views import baselines, glossary


def test_every_configuration_name_is_defined_and_the_rule_is_the_codes():
    text = glossary.glossary_markdown()
    for name in baselines.CONFIG_NAMES.values():
        assert f"- *{name}*:" in text
    assert f"at least {baselines.MIN_RUNS} runs on {baselines.MIN_MACHINES} machine starts" in text


def test_a_configuration_without_a_meaning_is_an_error(monkeypatch):
    monkeypatch.setitem(baselines.CONFIG_NAMES, ("compile", "max-autotune"), "compile max-autotune")
    monkeypatch.setattr(glossary, "CONFIG_NAMES", baselines.CONFIG_NAMES)
    with pytest.raises(ValueError, match="max-autotune"):
        glossary.glossary_markdown()
