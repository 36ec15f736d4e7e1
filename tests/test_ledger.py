"""ftlib.views.ledger: the floors against hand computations, the ratio's scaling, the stored rows' kernels
all in a class, and one device's rows never pooled with another's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftlib.analysis.accounting import matmul_params, num_params
from ftlib.analysis.accounting import rows as accounting_rows
from ftlib.analysis.peaks import lookup
from ftlib.harness.results import load_rows
from ftlib.model.config import preset
from ftlib.views import ledger as L

ROOT = Path(__file__).resolve().parent.parent
B, T = 4, 64
H200_BF16 = 989e12  # FLOP/s, dense BF16 tensor core (NVIDIA H200 datasheet, SXM; ftlib.analysis.peaks)
H200_FP32 = 67e12  # FLOP/s, FP32 pipes
H200_BW = 4.8e12  # bytes/s, HBM3e

# One kernel per class (name, launches per step, µs per step).
KERNELS = [("nvjet_sm90_tst_128x128", 30, 300.0), ("_attn_fwd_kernel", 6, 120.0), ("_add_norm_fwd_kernel", 12, 60.0),
           ("_adamw_kernel", 1, 10.0), ("_cross_entropy_kernel", 1, 4.0), ("vectorized_gather_kernel", 2, 3.0),
           ("reduce_kernel<128, 4>", 26, 80.0), ("Memset (Device)", 10, 8.0),
           ("vectorized_elementwise_kernel<GeluCUDAKernelImpl>", 6, 20.0), ("mystery_kernel", 3, 5.0)]


def probe_row(device: str = "NVIDIA H200", slug: str = "h200", scale: float = 1.0, **kw) -> dict:
    cfg = preset("fasttransformer")
    return {"bench": "engine_probe", "status": "ok", "label": "fasttransformer", "preset": "fasttransformer",
            "precision": "bf16", "B": B, "T": T, "config": cfg.to_dict(), "device": device, "device_slug": slug,
            "date": "2026-01-01T00:00:00Z", "step_median_us": 1000.0 * scale,
            "describe": {"kernels": ["rmsnorm", "attention", "adamw"], "fuse_residual_norm": True},
            "kernels": [{"name": n, "count": c, "us": us * scale} for n, c, us in KERNELS], **kw}


def by_class(rows: list[dict]) -> dict[str, dict]:
    return {x["class"]: x for x in rows}


def test_floors_equal_hand_computations():
    led = by_class(L.ledger.rows([probe_row()]))
    cfg, N = preset("fasttransformer"), B * T
    # matmuls: 2 m n k forward, twice that backward, over every Linear weight (no biases here)
    mm = led["matmul"]
    assert mm["FLOP floor µs"] == pytest.approx(1e6 * 6 * N * matmul_params(cfg) / H200_BF16)
    mm_bytes = sum(a["bytes"] for a in accounting_rows(cfg, B, T, "bf16", backend="flash")
                   if a["component"] in ("qkv", "out_proj", "mlp_up", "mlp_down", "head"))
    assert mm["byte floor µs"] == pytest.approx(1e6 * mm_bytes / H200_BW)
    assert mm["speed of light µs"] == max(mm["FLOP floor µs"], mm["byte floor µs"])
    assert mm["measured / speed of light"] == pytest.approx(300.0 / mm["speed of light µs"])
    # AdamW: 16 FLOPs per parameter on the FP32 pipes; reads p, g, m, v and writes p, m, v in fp32
    opt = led["optimizer"]
    assert opt["FLOP floor µs"] == pytest.approx(1e6 * 16 * num_params(cfg) / H200_FP32)
    assert opt["byte floor µs"] == pytest.approx(1e6 * 7 * 4 * num_params(cfg) / H200_BW)
    # the residual add is fused into the norms: its bytes are theirs, not the elementwise class's
    norm_bytes = sum(a["bytes"] for a in accounting_rows(cfg, B, T, "bf16", backend="flash")
                     if a["component"] in ("norm1", "norm2", "final_norm", "residual"))
    assert led["norms"]["byte floor µs"] == pytest.approx(1e6 * norm_bytes / H200_BW)
    gelu = sum(a["bytes"] for a in accounting_rows(cfg, B, T, "bf16", backend="flash") if a["component"] == "gelu")
    assert led["other elementwise"]["byte floor µs"] == pytest.approx(1e6 * gelu / H200_BW)
    # no accounting counterpart: no floor, and no ratio to one
    red = led["reductions (sums)"]
    assert (red["FLOP floor µs"], red["byte floor µs"]) == (0.0, 0.0)
    assert red["speed of light µs"] is None and red["bound"] is None and red["measured / speed of light"] is None
    assert led["other"]["speed of light µs"] is None


def test_gaps_between_kernels_are_the_rows_own_and_stay_out_of_the_floor():
    """(captured step − profiled kernel time) / kernels, from the row; a slower step between the same kernels
    moves the gaps and leaves every floor where it was."""
    cfg = preset("fasttransformer")
    kernel_us, n = sum(us for _, _, us in KERNELS), sum(c for _, c, _ in KERNELS)
    gap = (1000.0 - kernel_us) / n
    assert L.gap_per_kernel(probe_row()) == pytest.approx(gap)
    led = by_class(L.ledger.rows([probe_row()]))
    assert led["reductions (sums)"]["gaps µs (measured)"] == pytest.approx(26 * gap)
    (t,) = L.ledger_totals.rows([probe_row()])
    assert t["gaps µs (measured)"] == pytest.approx(1000.0 - kernel_us)
    assert t["measured gap per kernel µs"] == pytest.approx(gap)
    assert t["sum of floors µs"] == pytest.approx(sum(x["speed of light µs"] or 0 for x in led.values()))
    slow = by_class(L.ledger.rows([probe_row(step_median_us=3000.0)]))
    for cls, x in led.items():
        assert slow[cls]["speed of light µs"] == x["speed of light µs"]
    assert slow["matmul"]["gaps µs (measured)"] == pytest.approx(30 * (3000.0 - kernel_us) / n)
    shadow = by_class(L.ledger.rows([probe_row(describe={"bf16_weights": True})]))["copies and casts"]
    assert shadow["byte floor µs"] == pytest.approx(1e6 * num_params(cfg) * (4 + 2) / H200_BW)


def test_the_fused_head_takes_the_heads_and_the_losss_work_and_kernels():
    """Under fuse_head_loss the head's GEMM and the loss run in the two _lce_ kernels: their floors and time
    form one class, the matmul class keeps the other Linears, and no loss class is left."""
    cfg = preset("fasttransformer")
    kernels = [k for k in KERNELS if k[0] != "_cross_entropy_kernel"] + [("_lce_fwd_kernel", 1, 6.0),
                                                                        ("_lce_bwd_kernel", 1, 14.0)]
    row = probe_row(describe={"fuse_head_loss": True, "fuse_residual_norm": True},
                    kernels=[{"name": n, "count": c, "us": us} for n, c, us in kernels])
    plain, fused = by_class(L.ledger.rows([probe_row()])), by_class(L.ledger.rows([row]))
    rows = accounting_rows(cfg, B, T, "bf16", backend="flash")
    work = {(c, k): sum(a[k] for a in rows if a["component"] == c)
            for c in ("head", "loss") for k in ("bytes", "flops")}
    head = fused[L.FUSED_HEAD]
    assert (head["measured µs"], head["kernels"]) == (20.0, 2)
    assert head["byte floor µs"] == pytest.approx(1e6 * (work["head", "bytes"] + work["loss", "bytes"]) / H200_BW)
    assert head["GFLOP"] == pytest.approx((work["head", "flops"] + work["loss", "flops"]) / 1e9)
    assert head["floor from"] == "head, loss"
    assert fused["matmul"]["MB"] == pytest.approx(plain["matmul"]["MB"] - work["head", "bytes"] / 1e6)
    assert "loss" not in fused and "loss" in plain and L.FUSED_HEAD not in plain
    assert L.probe_category("_lce_bwd_kernel") == L.FUSED_HEAD
    mapped = {x["class"]: x["accounting components"] for x in L.component_map.rows()}
    assert mapped[L.FUSED_HEAD] == "head (with fuse_head_loss), loss (with fuse_head_loss)"
    assert "head (unless fuse_head_loss)" in mapped["matmul"] and mapped["loss"] == "loss (unless fuse_head_loss)"


def test_tf32x3_route_runs_at_a_third_of_the_tf32_peak():
    row = probe_row(precision="fp32", describe={"linear_precision": "tf32x3"})
    mm = by_class(L.ledger.rows([row]))["matmul"]
    N = B * T
    assert mm["FLOP floor µs"] == pytest.approx(1e6 * 6 * N * matmul_params(preset("fasttransformer")) / (495e12 / 3))


def test_twice_the_kernel_time_doubles_measured_over_speed_of_light():
    one, two = by_class(L.ledger.rows([probe_row()])), by_class(L.ledger.rows([probe_row(scale=2.0)]))
    for cls in (c for c in L.CLASSES if c in one and one[c]["speed of light µs"]):
        assert two[cls]["speed of light µs"] == pytest.approx(one[cls]["speed of light µs"])
        assert two[cls]["measured / speed of light"] == pytest.approx(2 * one[cls]["measured / speed of light"])
    t1, t2 = L.ledger_totals.rows([probe_row()])[0], L.ledger_totals.rows([probe_row(scale=2.0)])[0]
    assert t2["step / sum of floors"] == pytest.approx(2 * t1["step / sum of floors"])
    assert t2["step / roofline"] == pytest.approx(2 * t1["step / roofline"])


def test_every_accounting_component_has_a_class():
    for cfg, kw in ((preset("gpt2"), {}), (preset("fasttransformer"), {}),
                    (preset("nanogpt-char"), {"grad_clip": True})):
        for a in accounting_rows(cfg, B, T, "bf16", **kw):
            assert L.component_class(a["component"]) in L.CLASSES


def test_classes_cover_every_kernel_of_the_stored_rows():
    stored = [r for r in load_rows("engine_probe", root=ROOT / "data" / "results") if r.get("status") == "ok"]
    assert stored, "no stored engine_probe rows"
    led = L.ledger.rows(stored)
    for r in stored:
        mine = [x for x in led if x["device"] == r["device_slug"] and x["case"] == L.short_case(r)]
        # the fused head's class stands in for the loss's where the step ran it (and only there)
        absent = ("other", "loss" if (r.get("describe") or {}).get(L.FUSED_HEAD_FLAG) else L.FUSED_HEAD)
        assert [x["class"] for x in mine] == [c for c in L.CLASSES if c not in absent]
        assert sum(x["measured µs"] for x in mine) == pytest.approx(r["kernel_us"], rel=1e-6)
        assert sum(x["kernels"] for x in mine) == pytest.approx(sum(k["count"] for k in r["kernels"]))
        # every stored kernel is named by a pattern: nothing is left to 'other'
        assert [k["name"] for k in r["kernels"] if L.probe_category(k["name"]) == "other"] == []


def test_rows_of_two_devices_are_never_pooled():
    h200, a100 = probe_row(), probe_row("NVIDIA A100-SXM4-80GB", "a100", scale=3.0)
    led = L.ledger.rows([h200, a100])
    assert len(led) == 2 * (len(L.CLASSES) - 1)  # every class but the fused head's has a kernel in the synthetic step
    per = {dev: by_class([x for x in led if x["device"] == dev]) for dev in ("h200", "a100")}
    assert per["h200"]["matmul"]["measured µs"] == 300.0 and per["a100"]["matmul"]["measured µs"] == 900.0
    # each device's floors come from its own peaks
    ratio = lookup("NVIDIA H200").bandwidth / lookup("NVIDIA A100-SXM4-80GB").bandwidth
    assert per["a100"]["norms"]["byte floor µs"] == pytest.approx(per["h200"]["norms"]["byte floor µs"] * ratio)
    totals = {t["device"]: t for t in L.ledger_totals.rows([h200, a100])}
    assert totals["h200"]["kernel µs"] == pytest.approx(sum(us for _, _, us in KERNELS))
    assert totals["a100"]["captured step µs"] == 3000.0
    fig = L.ledger_figure([h200, a100], "h200")
    measured = [t for t in fig.data if t.name == "measured, FastTransformer"]
    assert len(measured) == 1 and max(measured[0].x) == 300.0
    assert L.devices_of([h200, a100]) == ["a100", "h200"]


def test_the_newest_row_of_a_case_wins_and_unknown_devices_are_left_out():
    old, new = probe_row(scale=1.0), probe_row(scale=2.0, date="2026-02-01T00:00:00Z")
    led = by_class(L.ledger.rows([new, old, probe_row("cpu", "cpu")]))
    assert led["matmul"]["measured µs"] == 600.0


def test_summary_names_the_classes_furthest_from_their_floor():
    text = L.ledger_summary([probe_row()], "h200", top=2)
    led = sorted((x for x in L.ledger.rows([probe_row()]) if x["above floor µs"] is not None),
                 key=lambda x: -x["above floor µs"])
    assert text.startswith("* **FastTransformer bf16**")
    assert f"{led[0]['class']} ({led[0]['above floor µs']:,.0f} µs above" in text
    assert f"{led[1]['class']} (" in text and f"{led[2]['class']} (" not in text


def test_without_a_default_engine_case_the_figure_gives_way_to_a_sentence():
    """Probe rows are named against today's defaults (ftlib.views.engine.latest_probes): a profile of an earlier
    engine is no default case, so the figure has no panel for it and the chapter says why instead."""
    import dataclasses

    from ftlib.training.engine.options import EngineOptions
    from ftlib.views.engine import latest_probes
    from ftlib.views.engine_config import TRIAL_WINNERS

    today = {k: v for k, v in dataclasses.asdict(EngineOptions()).items() if k in TRIAL_WINNERS}
    old = probe_row(commit="c")  # its describe() records none of today's defaults
    now = probe_row(commit="c", describe={**old["describe"], **today})
    assert latest_probes([old])[0]["label"] != "fasttransformer" and L.figure_rows(latest_probes([old]), "h200") == []
    assert [r["label"] for r in L.figure_rows(latest_probes([now]), "h200")] == ["fasttransformer"]
    assert L.no_default_profile("h200").startswith("No profile of the current engine's default steps on the H200")
    # The list of each case's largest classes says so too, rather than stand empty under its heading.
    assert L.class_order(latest_probes([old]), "h200").startswith("no profile of the current engine's default")
    assert L.class_order(latest_probes([now]), "h200").startswith("* **FastTransformer bf16**: matmul (")
    # An earlier engine's case is named by what it lacks, in words, never by option keys.
    assert "=" not in L.short_case(latest_probes([old])[0]) and L.short_case(old) == "FastTransformer bf16"


def test_every_default_a_case_ran_without_is_named_in_words():
    """A profile of an earlier engine is named by the defaults it lacked (``<option>=False`` or ``=None`` in its
    label, ftlib.views.engine.probe_label); each of those has its words, so no option key reaches a reader."""
    import dataclasses

    from ftlib.training.engine.options import EngineOptions
    from ftlib.views.engine_config import TRIAL_WINNERS

    now = dataclasses.asdict(EngineOptions())
    for option in TRIAL_WINNERS:
        off = "False" if isinstance(now[option], bool) else "None"  # as probe_label writes it
        name = L.short_case(probe_row(label=f"fasttransformer {option}={off}"))
        assert name.startswith("FastTransformer bf16, ") and option not in name, name


def test_kernels_that_overlap_on_two_streams_give_no_gap_but_their_overlap():
    """A step whose kernels run side by side on two streams is shorter than their sum: no gap can be read
    off it (none is made up as a negative one), and the totals and the summary say how much they overlap."""
    kernel_us = sum(us for _, _, us in KERNELS)
    row = probe_row(step_median_us=kernel_us - 50.0)
    assert L.gap_per_kernel(row) is None
    assert all(x["gaps µs (measured)"] is None for x in L.ledger.rows([row]))
    (t,) = L.ledger_totals.rows([row])
    assert t["gaps µs (measured)"] is None and t["overlap µs"] == pytest.approx(50.0)
    assert L.ledger_totals.rows([probe_row()])[0]["overlap µs"] == 0.0  # the default row: a step longer than its sum
    text = L.ledger_summary([row], "h200")
    assert "overlap: their sum exceeds the captured step by 50 µs" in text and "Between kernels" not in text


def test_the_figure_keys_each_models_measured_bars_in_its_colour_once():
    from ftlib.views.plots import MODEL_COLORS

    ft, g2 = probe_row(), {**probe_row(), "label": "gpt2", "preset": "gpt2"}
    fig = L.ledger_figure([ft, g2], "h200")
    keyed = {t.name: t.marker.color for t in fig.data if t.showlegend is not False and t.name.startswith("measured")}
    assert len(L.figure_rows([ft, g2], "h200")) == 2  # both cases drawn: each model keyed in its own colour
    assert keyed == {"measured, FastTransformer": MODEL_COLORS["fasttransformer"],
                     "measured, GPT-2": MODEL_COLORS["gpt2"]}
    assert "under 1×" in fig.layout.title.text  # the subtitle says how a ratio under 1 comes about

