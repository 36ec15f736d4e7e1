"""The launch-parameter sweeps' view: the default found, the fastest variant set against it, and a win
called only beyond the spread of the replays."""

from __future__ import annotations

from ftlib.views import sweeps


def _row(op: str, variant: str, us: float, spread: float = 0.2, pass_: str = "", **kw) -> dict:
    return {"op": op, "variant": variant, "timing": "graph", "status": "ok", "check_ok": True, "median_us": us,
            "p20_us": us - spread, "p80_us": us + spread, "device_slug": "h200", "shape": {"pass": pass_},
            "date": "2026-12-04T10:00:00Z", **kw}


def test_the_defaults_are_the_launchers_defaults():
    from kernels._common import PERSISTENT_WARPS_PER_SM, RowGrid, row_tile_warps
    from kernels.residual_norm import ROWS
    from kernels.tiles import TILE_CANDIDATES

    tiles = TILE_CANDIDATES[0]
    assert sweeps.DEFAULTS["attention_tiles"] == {p: f"{p} {tiles.name}" for p in ("fwd", "bwd")}
    assert sweeps.DEFAULTS["explicit_tiles"] == {f"{p} {prec}": f"{p} {tiles.name}" for p in ("fwd", "bwd")
                                                 for prec in ("bf16", "tf32")}
    grid = RowGrid(ROWS, PERSISTENT_WARPS_PER_SM // row_tile_warps(ROWS, 256))
    assert sweeps.DEFAULTS["norm_bwd_grid"] == {"": f"atomic {grid.name}"}


def test_a_win_is_called_only_beyond_the_spread():
    base = "atomic 4 rows 4/SM"
    rows = [_row("norm_bwd_grid", base, 24.0), _row("norm_bwd_grid", "atomic 8 rows 4/SM", 21.0),
            _row("norm_bwd_grid", "atomic 4 rows 8/SM", 25.0),
            _row("norm_bwd_grid", "atomic 8 rows 8/SM", 20.0, check_ok=False),  # failed its check: left out
            _row("kernels", "v1", 1.0)]
    text = sweeps.sweep_findings(rows)
    assert len(text) == 1 and "fastest atomic 8 rows 4/SM at 21.0 µs" in text[0] and "1.14×" in text[0]
    assert "beyond the spread" in text[0] and "3 variants" in text[0]
    # The sweep's fastest is the engine's default grid: the finding says so.
    assert sweeps.engine_choice("norm_bwd_grid") == "atomic 8 rows 4/SM"
    assert "the engine runs it by default" in text[0] and "worth a trial" not in text[0]
    other = [_row("norm_bwd_grid", base, 24.0), _row("norm_bwd_grid", "atomic 4 rows 2/SM", 21.0)]
    assert "worth a trial in the engine" in sweeps.sweep_findings(other)[0]
    # The engine runs another grid than the launcher's: the fastest is set against the engine's too.
    other += [_row("norm_bwd_grid", "atomic 8 rows 4/SM", 22.0)]
    assert ("the engine runs atomic 8 rows 4/SM (22.0 µs here, 1.05× the fastest), beyond the spread too: worth a "
            "trial in the engine") in sweeps.sweep_findings(other)[0]
    other[-1] = _row("norm_bwd_grid", "atomic 8 rows 4/SM", 21.2)
    assert "1.01× the fastest), within the spread of the fastest." in sweeps.sweep_findings(other)[0]
    close = [_row("norm_bwd_grid", base, 24.0, 1.0), _row("norm_bwd_grid", "atomic 8 rows 4/SM", 23.5, 1.0)]
    assert "within the spread" in sweeps.sweep_findings(close)[0]
    table = sweeps.sweep_table.rows(rows, top=1)
    assert [(r["variant"], r["rank"]) for r in table] == [("atomic 8 rows 4/SM", 1), (base, 2)]  # top 1 + default
    assert [r["the engine's"] for r in table] == [True, False]  # the engine's grid, not the launcher's, is marked
    # The engine's grid is shown wherever it ranks, beside the top and the launcher's default.
    slow = [_row("norm_bwd_grid", base, 24.0), _row("norm_bwd_grid", "atomic 4 rows 2/SM", 21.0),
            _row("norm_bwd_grid", "atomic 8 rows 4/SM", 30.0)]
    assert [r["variant"] for r in sweeps.sweep_table.rows(slow, top=1)] == ["atomic 4 rows 2/SM", base,
                                                                            "atomic 8 rows 4/SM"]


def test_each_pass_has_its_own_default_and_the_newest_run_counts():
    rows = [_row("attention_tiles", "fwd 64x64 w4 s2", 18.0, pass_="fwd"),
            _row("attention_tiles", "fwd 64x64 w4 s2", 30.0, pass_="fwd", date="2026-12-01T00:00:00Z"),  # older
            _row("attention_tiles", "bwd 64x64 w4 s2", 45.0, pass_="bwd"),
            _row("attention_tiles", "bwd 128x64 w4 s2", 49.0, pass_="bwd")]
    text = sweeps.sweep_findings(rows)
    assert text[0].startswith("H200, attention tiles (bwd), 2 variants: the launcher's default, bwd 64x64 w4 s2, is "
                              "the fastest")
    assert "(fwd), 1 variants: the launcher's default, fwd 64x64 w4 s2, is the fastest (18.0 µs" in text[1]
    assert sweeps.sweep_findings([]) == [] and sweeps.sweep_table.rows([]) == []


def test_the_explicit_tile_sweep_is_read_per_pass_and_precision():
    rows = [_row("explicit_tiles", "fwd 64x64 w4 s2", 50.0, pass_="fwd tf32"),
            _row("explicit_tiles", "fwd 128x64 w8 s2", 40.0, pass_="fwd tf32"),
            _row("explicit_tiles", "fwd 64x64 w4 s2", 30.0, pass_="fwd bf16"),
            _row("explicit_tiles", "fwd 32x64 w4 s2", 31.0, pass_="fwd bf16")]
    text = sweeps.sweep_findings(rows)
    assert len(text) == 2  # one per precision: bf16's default is fastest, tf32's is beaten beyond the spread
    bf16, tf32 = text
    assert ("explicit-attention tiles (fwd bf16), 2 variants: the launcher's default, fwd 64x64 w4 s2, is the "
            "fastest") in bf16
    assert "fastest fwd 128x64 w8 s2 at 40.0 µs" in tf32 and "worth a trial in the engine" in tf32
    assert sweeps.engine_choice("explicit_tiles", "fwd tf32") is None  # the engine leaves the launchers' tiles


def test_the_explicit_backward_sweep_knows_the_engines_one_pass_dq_kernel():
    """The engine runs GPT-2's dQ kernel in one pass (64 query rows, 4 warps) by default: where the sweep finds
    that variant fastest, the finding says the engine runs it, not that it is worth a trial."""
    one_pass = "bwd one-pass 64x256 w4 s1"
    assert sweeps.engine_choice("explicit_tiles", "bwd bf16") == one_pass
    rows = [_row("explicit_tiles", "bwd 64x64 w4 s2", 60.0, pass_="bwd bf16"),
            _row("explicit_tiles", one_pass, 55.0, pass_="bwd bf16"),
            _row("explicit_tiles", "bwd one-pass 32x256 w2 s1", 59.0, pass_="bwd bf16")]
    (text,) = sweeps.sweep_findings(rows)
    assert f"fastest {one_pass} at 55.0 µs" in text and "the engine runs it by default" in text
    assert "worth a trial" not in text


def test_a_sweep_without_rows_is_named_with_its_command():
    rows = [_row("norm_bwd_grid", "atomic 4 rows 4/SM", 24.0)]
    text = sweeps.unswept_text(rows)
    assert "attention tiles (`python -m benchmarks.kernels.attention_tiles_dev --record`" in text
    assert "explicit_tiles_dev" in text and "norm_bwd_grid" not in text
    everything = rows + [_row(op, "v", 1.0) for op in ("attention_tiles", "explicit_tiles")]
    assert sweeps.unswept_text(everything) == ""
