"""The README's and the introduction's findings are what the committed rows give, and no other
measured number is typed into the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ftlib.views import findings

ROOT = Path(__file__).resolve().parent.parent
FILES = (ROOT / "README.md", ROOT / "book" / "intro.md")
# A measured quantity: a time, a share, a throughput or a ratio with decimals ("1.45×").
MEASURED = re.compile(r"\d[\d,]*(\.\d+)?\s?(ms|µs|s\b|%|tok/s|tokens/s|GB/s|TFLOP/s)|\d+\.\d+\s?[×x]\b")


@pytest.fixture(scope="module")
def block() -> str:
    return findings.markdown("h200")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_findings_block_is_what_the_rows_give(path, block):
    assert findings.block_of(path.read_text(encoding="utf-8")) == block, "stale findings: run python ci/findings"


def test_an_edited_number_is_caught(block):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    numbers = re.findall(r"\d+\.\d\d×", findings.block_of(text))
    assert numbers, "the findings hold measured ratios"
    edited = text.replace(numbers[0], "9.99×", 1)
    assert findings.block_of(edited) != block


def test_the_readme_types_no_measured_number_outside_the_generated_block():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    outside = text[: text.index(findings.START)] + text[text.index(findings.END):]
    assert not [m.group(0) for m in MEASURED.finditer(outside)]


def test_the_findings_cover_the_headline_claims(block):
    for _, name in findings.HEADLINE_CLAIMS[:4]:
        assert name.format(precision="fp32") in block  # a claim headlined per precision shows fp32, the post's
    assert "| verdict |" in block and "Beyond the post" in block


def test_markers_are_required():
    with pytest.raises(ValueError, match="no findings markers"):
        findings.replace_block("no markers here", "x")
