"""ftlib.harness.precision_plan: which precisions and benchmark cases run as labelled on a device."""

from __future__ import annotations

import json

import pytest

from ftlib.core.device import DeviceInfo
from ftlib.harness.bench.cases import Case, make_cases
from ftlib.harness.precision_plan import case_why_not, plan, plan_cases
from ftlib.model.config import preset

T4, A100, H200 = (DeviceInfo.for_capability(c) for c in ("7.5", "8.0", "9.0"))


def test_t4_runs_fp32_and_fp16_only():
    assert T4.precisions() == ("fp32", "fp16")
    assert "no TF32 tensor cores" in T4.why_not("tf32") and "sm_80" in T4.why_not("tf32")
    assert "no bf16 tensor cores" in T4.why_not("bf16")
    assert T4.why_not("fp16") is None and T4.why_not("fp32") is None


@pytest.mark.parametrize("info", [A100, H200], ids=["a100", "h200"])
def test_sm80_and_later_run_all_four(info):
    assert info.precisions() == ("fp32", "tf32", "bf16", "fp16")


def test_older_and_cpu_devices():
    p100 = DeviceInfo.for_capability("6.0")
    assert p100.precisions() == ("fp32",) and "sm_70" in p100.why_not("fp16")
    assert DeviceInfo.cpu().precisions() == ("fp32", "bf16", "fp16")
    with pytest.raises(ValueError, match="unknown precision"):
        T4.why_not("fp8")


def _suites():
    cfgs = {"gpt2": preset("gpt2"), "fasttransformer": preset("fasttransformer")}
    precision = make_cases(cfgs, [(32, 256)], ["compile-ro", "eager"], ["fp32", "tf32", "bf16", "fp16"])
    engine = [Case("fasttransformer", cfgs["fasttransformer"], 32, 256, "engine", "fp32",
                   {"attention_precision": "tf32x3", "linear_precision": "tf32x3"}),
              Case("fasttransformer", cfgs["fasttransformer"], 32, 256, "engine", "fp16")]
    return {"precision": precision, "engine": engine}


def test_plan_cases_on_a_t4_keeps_fp32_and_fp16_and_says_why_not_the_rest():
    rows = plan_cases(T4, _suites())
    assert len(rows) == 16 + 2
    for r in rows:
        assert {"suite", "label", "mode", "precision", "B", "T", "extra", "skipped"} <= set(r)
        if r["suite"] == "precision":
            assert (r["skipped"] is None) == (r["precision"] in ("fp32", "fp16")), r
    eng = [r for r in rows if r["suite"] == "engine"]
    assert "tf32x3" in eng[0]["skipped"] and "FMA" in eng[0]["skipped"]  # 3xTF32 without tensor cores
    assert eng[1]["skipped"] is None
    assert json.loads(json.dumps(rows)) == rows


def test_plan_on_h200_runs_everything_and_is_json():
    out = plan(H200, _suites())
    assert out["n_skipped"] == 0 and out["n_run"] == 18
    assert out["device"]["capability"] == "9.0" and all(v is None for v in out["precisions"].values())
    json.dumps(out)
    t4 = plan(T4, _suites())
    assert t4["n_run"] == 9 and t4["n_skipped"] == 9 and t4["precisions"]["fp16"] is None


def test_case_why_not_accepts_any_object_with_precision_and_mode():
    class Bare:
        precision, mode = "bf16", "eager"

    assert "bf16" in case_why_not(T4, Bare()) and case_why_not(A100, Bare()) is None
