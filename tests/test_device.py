"""ftlib.core.device: descriptions from a capability, the CPU, and the FTLIB_CAPABILITY rehearsal."""

from __future__ import annotations

import json

import pytest
import torch

from ftlib.core.device import ENV_CAPABILITY, KNOWN_GPUS, DeviceInfo, known_gpu, parse_capability


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv(ENV_CAPABILITY, raising=False)


@pytest.mark.parametrize("text", ["7.5", "75", "sm_75", "SM75", 7.5, (7, 5)])
def test_parse_capability_forms(text):
    assert parse_capability(text) == (7, 5)


@pytest.mark.parametrize("bad", ["", "seven", "7.x", "0.5", "99.0", (7,), (7, -1)])
def test_parse_capability_rejects_with_the_value(bad):
    with pytest.raises(ValueError, match="capability"):
        parse_capability(bad)


def test_t4_is_sm75_fp16_only_with_64kb():
    t4 = DeviceInfo.for_capability("7.5")
    assert (t4.name, t4.capability, t4.sm_count) == ("Tesla T4", (7, 5), 40)
    assert t4.shared_memory_per_block == 64 * 1024
    assert t4.tensor_cores == ("fp16",)
    assert not t4.has_tensor_cores("tf32") and not t4.has_tensor_cores("bf16") and t4.has_tensor_cores("fp16")
    # Triton 3 lowers no tl.dot to MMA below sm_80 (tests/test_aot.py checks the compiler).
    assert t4.triton_dot_tensor_cores == () and not t4.triton_dot_uses_tensor_cores("fp16")
    assert t4.sdpa_backends("fp16") == ("efficient", "math")  # no flash, no cuDNN before sm_80
    assert t4.sdpa_backends("fp32") == ("efficient", "math")
    assert t4.sdpa_backends("bf16") == ("math",)
    assert t4.label() == "Tesla T4 (sm_75)" and not t4.rehearsal


@pytest.mark.parametrize("cc,name,smem_kb", [("8.0", "A100-SXM4-80GB", 163), ("8.9", "L4", 99),
                                             ("9.0", "H100-SXM5-80GB", 227)])
def test_sm80_and_later_have_every_tensor_core_precision(cc, name, smem_kb):
    info = DeviceInfo.for_capability(cc)
    assert info.name == name and info.shared_memory_per_block == smem_kb * 1024
    assert set(info.tensor_cores) == {"tf32", "bf16", "fp16"}
    assert all(info.triton_dot_uses_tensor_cores(p) for p in ("tf32", "tf32x3", "bf16", "fp16"))
    assert not info.triton_dot_uses_tensor_cores("ieee")
    assert info.sdpa_backends("bf16") == ("flash", "efficient", "cudnn", "math")
    assert info.sdpa_backends("fp32") == ("efficient", "math")


def test_unknown_capability_gets_the_guides_shared_memory_and_no_name():
    info = DeviceInfo.for_capability("8.6")
    assert info.name == "sm_86" and info.sm_count is None and info.shared_memory_per_block == 99 * 1024
    assert known_gpu("8.6") is None and known_gpu("9.0").name == "H100-SXM5-80GB"
    assert {g.capability for g in KNOWN_GPUS} >= {(7, 5), (8, 0), (8, 9), (9, 0)}


def test_cpu_description():
    cpu = DeviceInfo.detect("cpu")
    assert cpu == DeviceInfo.cpu() and cpu.kind == "cpu" and cpu.capability is None and cpu.sm is None
    assert cpu.tensor_cores == () and cpu.shared_memory_per_block is None and not cpu.rehearsal


def test_override_rehearses_another_gpu_and_says_so(monkeypatch):
    monkeypatch.setenv(ENV_CAPABILITY, "7.5")
    info = DeviceInfo.detect("cpu")
    assert info.rehearsal and info.actual == "cpu" and info.capability == (7, 5)
    assert info.shared_memory_per_block == 64 * 1024 and info.kind == "cuda"
    monkeypatch.setenv(ENV_CAPABILITY, "fast")
    with pytest.raises(ValueError, match=ENV_CAPABILITY):
        DeviceInfo.detect("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to detect")
def test_detect_live_gpu():
    info = DeviceInfo.detect("cuda")
    props = torch.cuda.get_device_properties(0)
    assert info.capability == (props.major, props.minor) and info.source == "detected"
    assert info.shared_memory_per_block >= props.shared_memory_per_block


def test_invalid_descriptions_raise():
    with pytest.raises(ValueError, match="kind"):
        DeviceInfo(name="x", kind="tpu", capability=None)
    with pytest.raises(ValueError, match="needs a capability"):
        DeviceInfo(name="x", kind="cuda", capability=None)
    with pytest.raises(ValueError, match="sm_count"):
        DeviceInfo(name="x", kind="cuda", capability=(8, 0), sm_count=0)
    with pytest.raises(ValueError, match="rehearsal"):
        DeviceInfo(name="x", kind="cuda", capability=(8, 0), rehearsal=True)
    with pytest.raises(ValueError, match="dtype"):
        DeviceInfo.for_capability("9.0").sdpa_backends("fp8")


def test_to_dict_is_json():
    d = DeviceInfo.for_capability("7.5", rehearsal_of="NVIDIA H200 (sm_90)").to_dict()
    back = json.loads(json.dumps(d))
    assert back["capability"] == "7.5" and back["rehearsal"] and back["sdpa"]["fp16"] == ["efficient", "math"]
    assert back["tensor_cores"] == ["fp16"]


def test_the_rehearsed_description_and_the_kernels_limits_agree(monkeypatch):
    import torch

    from kernels import limits

    monkeypatch.setattr(limits, "_CACHE", {})
    monkeypatch.setenv(ENV_CAPABILITY, "7.5")
    info, lim = DeviceInfo.detect("cpu"), limits.device_limits(torch.device("cpu"))
    assert info.rehearsal and (lim.capability, lim.smem_per_block) == (info.capability, info.shared_memory_per_block)
    assert info.limits().smem_per_block == 64 * 1024
    monkeypatch.delenv(ENV_CAPABILITY)
    assert limits.device_limits(torch.device("cpu")) is None and DeviceInfo.detect("cpu").limits() is None
