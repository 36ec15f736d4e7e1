"""The engine's ``norm_bwd_grid`` option: parsed and validated, the named grid reaches the fused residual-norm
backward's launcher (its rows apart from the forward's), and the step trains as on the default grid."""

from __future__ import annotations

import pytest
import torch
from call_spy import record_calls

from ftlib.harness.engine_check import pattern_batches
from ftlib.model.config import preset
from ftlib.training.engine import Engine, EngineOptions

pytest.importorskip("triton")

B, T = 1, 16
FT2 = preset("fasttransformer", n_layer=2, n_embd=64, n_head=4, n_kv_head=1, block_size=T)


def test_grids_are_parsed_and_bad_text_is_refused():
    from kernels._common import RowGrid

    assert RowGrid.parse("8 rows 16/SM") == RowGrid(8, 16) and RowGrid.parse(" 4 rows 2 / SM ") == RowGrid(4, 2)
    assert RowGrid.parse(RowGrid(16, 32).name) == RowGrid(16, 32)
    # ' s<k>': each program's loop over its tiles pipelined over k tiles; the name leaves out s1 (no pipelining)
    assert RowGrid.parse("8 rows 4/SM s2") == RowGrid(8, 4, 2) and RowGrid(8, 4, 2).name == "8 rows 4/SM s2"
    assert RowGrid.parse("8 rows 4/SM s1") == RowGrid(8, 4) and RowGrid(8, 4, 1).name == "8 rows 4/SM"
    for bad in ("8 rows", "6 rows 4/SM", "8 rows 0/SM", "rows 4/SM", "", "8 rows 4/SM s5", "8 rows 4/SM s0",
                "8 rows 4/SM 2"):
        with pytest.raises(ValueError):
            RowGrid.parse(bad)
    cpu = torch.device("cpu")  # the interpreter: 4 SMs
    assert RowGrid(4, 8).launch(cpu) == {"rows": 4, "programs": 32, "loop_stages": None}
    assert RowGrid(4, 8, 3).launch(cpu) == {"rows": 4, "programs": 32, "loop_stages": 3}
    with pytest.raises(ValueError, match="expected '<rows> rows"):
        EngineOptions(norm_bwd_grid="8 rows")
    # The default grid is the sweep's winner; without the atomic weight gradients it does not apply.
    assert EngineOptions().norm_bwd_grid == "8 rows 4/SM" and RowGrid.parse(EngineOptions().norm_bwd_grid)
    assert EngineOptions(norm_dw_into_buffer=False).norm_bwd_grid == "8 rows 4/SM"


def test_the_named_grid_reaches_the_backward_and_trains_like_the_default(kernel_device, monkeypatch):
    import kernels.residual_norm as R
    from kernels._common import RowGrid

    seen = {"fwd": record_calls(monkeypatch, R, "add_norm_fwd", lambda a: a.get("rows", R.ROWS)),
            "bwd": record_calls(monkeypatch, R, "add_norm_bwd",
                                lambda a: (a.get("rows", R.ROWS), a.get("programs"), a.get("dw_partials"),
                                           a.get("loop_stages")))}
    batches = pattern_batches(FT2.vocab_size, B, T, 3, seed=2, device=kernel_device)
    losses = {}
    for grid in (None, "8 rows 2/SM", "8 rows 2/SM s2"):
        for s in seen.values():
            s.clear()
        eng = Engine(FT2, B, T, "tf32", kernel_device, seed=3, norm_bwd_grid=grid, capture=False)
        assert eng.describe()["norm_bwd_grid"] == grid and eng.describe()["norm_dw_into_buffer"]
        losses[grid] = torch.stack([eng.step(x, y).detach().clone() for x, y in batches])
        assert seen["fwd"] == {R.ROWS}, seen  # the forward keeps its rows either way
        named = None if grid is None else RowGrid.parse(grid).launch(kernel_device)  # programs: per SM x SMs
        assert seen["bwd"] == ({(R.ROWS, None, "atomic", None)} if grid is None
                               else {(named["rows"], named["programs"], "atomic", named["loop_stages"])}), seen
    # The grid changes which program adds which rows' dweight (atomic adds: fp32 rounding), not the sums; the
    # pipelined loop computes the same tiles in the same order.
    torch.testing.assert_close(losses[None], losses["8 rows 2/SM"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(losses["8 rows 2/SM s2"], losses["8 rows 2/SM"], rtol=1e-5, atol=1e-5)
    # The default engine runs the default grid; without the atomic weight gradients no grid applies.
    seen["bwd"].clear()
    eng = Engine(FT2, B, T, "tf32", kernel_device, seed=3, capture=False)
    eng.step(*batches[0])
    launch = RowGrid.parse("8 rows 4/SM").launch(kernel_device)
    assert eng.describe()["norm_bwd_grid"] == "8 rows 4/SM"
    assert seen["bwd"] == {(launch["rows"], launch["programs"], "atomic", None)}, seen
    eng = Engine(FT2, B, T, "tf32", kernel_device, seed=3, norm_dw_into_buffer=False, capture=False)
    assert eng.describe()["norm_bwd_grid"] is None and not eng.describe()["norm_dw_into_buffer"]
