from ftlib.model.ablations import SWITCHES, grid, kv_head_sweep, ladder, mlp_ratio_sweep
from ftlib.model.config import preset


def test_grid_has_16_distinct_cells_and_corners():
    g = grid()
    assert len(g) == 16 and len({c.config_hash() for c in g.values()}) == 16
    assert g["gpt2"] == preset("gpt2")
    full = g["MQA+SDPA+MLP2x+RMS"]
    assert full.replace(bias=False) == preset("fasttransformer", init="torch")


def test_each_cell_differs_from_gpt2_by_its_switches_only():
    base = preset("gpt2").to_dict()
    for label, cfg in grid().items():
        changed = {k for k, v in cfg.to_dict().items() if base[k] != v}
        expected = set() if label == "gpt2" else {f for n in label.split("+") for f in SWITCHES[n]}
        assert changed == expected, label


def test_ladder_ends_at_fasttransformer():
    lad = ladder()
    assert list(lad)[0] == "gpt2" and len(lad) == 6
    assert list(lad.values())[-1] == preset("fasttransformer", init="torch")


def test_sweeps():
    assert [c.n_kv_head for c in kv_head_sweep().values()] == [1, 2, 4, 8]
    assert [c.d_ff for c in mlp_ratio_sweep().values()] == [256, 384, 512, 768, 1024]
