"""Chapter 8's recipe table (ftlib.views.recipe): settings in words, only those that apply to the recipe."""

from __future__ import annotations

from ftlib.training.recipe import Recipe
from ftlib.views.recipe import recipe_table


def _settings(rec: Recipe) -> dict[str, str]:
    return {r["field"]: r["value"] for r in recipe_table.rows(rec)}


def test_an_adamw_recipe_shows_no_muon_rate_no_cool_down_and_no_engine_options():
    got = _settings(Recipe(steps=100, lr=1e-3, min_lr=1e-4, warmup=10, compile="default"))
    assert "muon_lr" not in got and "cooldown" not in got and "engine_options" not in got and "seed" not in got
    assert got["schedule"] == "cosine decay" and got["decay_steps"] == "100"  # no horizon given: the last step
    assert got["engine / compile"] == "torch.compile, default mode"


def test_a_muon_recipe_on_the_engine_says_both_rates_its_cool_down_and_its_options():
    rec = Recipe(steps=700, lr=3e-3, min_lr=3e-4, warmup=50, schedule="trapezoid", cooldown=300, optimizer="muon",
                 engine=True, engine_options=(("fuse_dropout", True),), precision="bf16")
    got = _settings(rec)
    assert got["muon_lr"] == "0.02" and got["optimizer"].startswith("Muon for the blocks' matrices")
    assert got["schedule"] == "held, then a linear cool-down over the last 300 steps"
    assert got["engine_options"] == "fuse_dropout=True" and got["engine / compile"].startswith("the book's engine")
    assert _settings(Recipe())["min_lr"] == "constant after the warm-up"
