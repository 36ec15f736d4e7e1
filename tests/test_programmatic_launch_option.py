"""The engine's ``programmatic_launch`` option (it lost its trial: an option, off) and the kernels' programmatic
dependent launch (PDL, ``kernels/pdl.py``): validated as a bool, off by default; it applies on CUDA devices of sm_90 or
later only (a note says why elsewhere); while the engine's step runs, forward and backward, every launcher that takes
PDL is asked; and the step trains exactly as without it, the same kernels computing the same sums (compiled on a
Hopper GPU, where the launches really are programmatic, the losses are compared bit for bit, captured and not). Its
``programmatic_trigger`` 'exit' (no early signal: the next kernel starts as each one's programs end) lost its trial
too: an option, off; compiled for sm_90 the kernels signal early only with the 'start' trigger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_breadth import case
from small_engines import FT, GPT2, B, T, engine

from ftlib.core.device import DeviceInfo
from ftlib.harness.engine_check import pattern_batches
from ftlib.training.engine import Engine, EngineOptions
from ftlib.training.engine.launches import PDL_CAPABILITY, programmatic_launch_applies

pytest.importorskip("triton")


def test_it_is_off_by_default_a_bool_both_triggers_trials_done_with_their_checks_kept():
    from ftlib.harness.engine_check import CHECKS
    from ftlib.harness.suites import CANDIDATES, SUITES

    assert EngineOptions().programmatic_launch is False  # it lost its trial (chapter 6): an option, off
    with pytest.raises(ValueError, match="programmatic_launch"):
        EngineOptions(programmatic_launch="yes")
    assert EngineOptions().programmatic_trigger == "start"
    with pytest.raises(ValueError, match="programmatic_trigger='end'"):
        EngineOptions(programmatic_trigger="end")
    exit_trigger = {"programmatic_launch": True, "programmatic_trigger": "exit"}
    assert not [c for c in CANDIDATES if "programmatic_launch" in c[1]]  # both triggers lost (chapter 6)
    assert not [c.label for c in SUITES["engine_candidates"].cases() if c.extra.get("programmatic_launch")]
    for prec in ("bf16", "tf32"):
        for name in ("fasttransformer", "gpt2"):
            assert (prec, name, {"programmatic_launch": True}) in CHECKS
    assert {(p, m) for p, m, o in CHECKS if o == exit_trigger} == {("bf16", "fasttransformer"), ("bf16", "gpt2")}


def _info(kind: str, capability: tuple[int, int] | None) -> DeviceInfo:
    return DeviceInfo(name="test device", kind=kind, capability=capability)


@pytest.mark.parametrize("kind, capability, kernels, applies, note", [
    ("cpu", None, {"attention": True}, False, "CUDA devices of sm_90 or later"),
    ("cuda", (7, 5), {"attention": True}, False, "test device is sm_75"),
    ("cuda", (8, 0), {"attention": True}, False, "test device is sm_80"),
    ("cuda", (9, 0), {"attention": False, "adamw": False}, False, "no Triton kernel"),
    ("cuda", (9, 0), {"attention": False, "adamw": True}, True, "kernels/pdl.py"),
    ("cuda", (10, 0), {"attention": True}, True, "kernels/pdl.py"),
])
def test_where_it_applies_and_the_note_that_says_so(kind, capability, kernels, applies, note):
    notes = {}
    on = programmatic_launch_applies(EngineOptions(programmatic_launch=True), kernels, _info(kind, capability), notes)
    assert on is applies and note in notes["programmatic_launch"]
    if applies:  # the note says where each kernel lets the next one start
        assert notes["programmatic_launch"].endswith("once every program of it has waited")
        exit_notes = {}
        programmatic_launch_applies(EngineOptions(programmatic_launch=True, programmatic_trigger="exit"), kernels,
                                    _info(kind, capability), exit_notes)
        assert exit_notes["programmatic_launch"].endswith("only as its programs end")
    off = {}
    assert programmatic_launch_applies(EngineOptions(), kernels, _info(kind, capability), off) is False and not off


def test_the_switch_nests_and_asks_only_on_a_device_that_can():
    from kernels import pdl

    assert pdl.PDL_CAPABILITY == PDL_CAPABILITY  # the engine's rule and the kernels' are one
    x = torch.zeros(1)
    assert pdl.pdl_args(x) == {}
    with pdl.programmatic_launch(True):
        assert pdl.pdl_args(x) == {}  # a CPU tensor: the interpreter has no grid dependency control
        with pdl.programmatic_launch(False):
            assert pdl._ON is False
        assert pdl._ON is True
    assert pdl._ON is False


def test_the_trigger_reaches_the_kernels_constexpr_and_nests(monkeypatch):
    from ftlib.training.engine.options import PDL_TRIGGERS
    from kernels import pdl

    assert tuple(pdl.TRIGGERS) == PDL_TRIGGERS  # the engine's names and the kernels' are one
    monkeypatch.setattr(pdl, "pdl_supported", lambda device: True)  # as on a Hopper GPU
    x = torch.zeros(1)
    with pdl.programmatic_launch(True):
        assert pdl.pdl_args(x) == {"PDL": True, "launch_pdl": True}
        with pdl.programmatic_launch(True, "exit"):
            assert pdl.pdl_args(x) == {"PDL": 2, "launch_pdl": True}
        assert pdl.pdl_args(x)["PDL"] is True
    assert pdl.pdl_args(x) == {}
    with pytest.raises(ValueError, match="trigger 'end'"):
        with pdl.programmatic_launch(True, "end"):
            pass


_COMPILE = r"""
import json, re, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from kernels.pdl import TRIGGERS, _grid_dependency

@triton.jit
def one_store(x_ptr, PDL: tl.constexpr):
    _grid_dependency(PDL)
    tl.store(x_ptr, 1.0)

found = {}
for name, value in [("off", False), *TRIGGERS.items()]:
    src = triton.compiler.ASTSource(fn=one_store, signature={"x_ptr": "*fp32", "PDL": "constexpr"},
                                    constexprs={"PDL": value})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    found[name] = sorted(set(re.findall(r"griddepcontrol\.\w+", ptx)))
print(json.dumps(found))
"""


def test_compiled_for_sm90_only_the_start_trigger_signals_early(tmp_path):
    # Compiled, not interpreted (the interpreter has no grid dependency control): a script of its own, run with
    # TRITON_INTERPRET unset, compiles a kernel that calls _grid_dependency for each trigger and reads its PTX.
    script = tmp_path / "pdl_ptx.py"
    script.write_text(_COMPILE)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FTLIB_CAPABILITY")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"off": [], "start": ["griddepcontrol.launch_dependents", "griddepcontrol.wait"],
                     "exit": ["griddepcontrol.wait"]}


def test_every_launcher_of_the_step_is_asked_forward_and_backward(kernel_device, monkeypatch):
    # The switch is a module setting because autograd runs the backward's launchers on a thread of its own: record,
    # for one step with the switch forced on, which launchers ask whether PDL applies (the device's answer is the
    # real one, so in the interpreter every launch is still an ordinary one).
    from kernels import pdl

    asked = set()
    real = pdl.pdl_supported

    def spy(device: torch.device) -> bool:
        code = sys._getframe(2).f_code  # spy <- pdl_args <- the launcher
        asked.add(f"{Path(code.co_filename).stem}.{code.co_name}")
        return real(device)

    monkeypatch.setattr(pdl, "pdl_supported", spy)
    for cfg in (FT, GPT2):
        eng = engine(cfg, "bf16", kernel_device, programmatic_launch=True)
        eng.pdl = True  # as where it applies: the step runs inside the switch
        x, y = pattern_batches(cfg.vocab_size, B, T, 1, seed=2, device=kernel_device)[0]
        eng.step(x, y)
    assert asked >= {  # the forward's and the backward's (attention's inner launch functions included)
        "embedding_sum.embedding_sum_fwd", "embedding_sum.embedding_sum_bwd", "residual_norm.add_norm_fwd",
        "residual_norm.add_norm_bwd", "rmsnorm.rms_norm_fwd", "layernorm.layer_norm_fwd", "attention.launch",
        "attention.launch_dq", "attention.launch_dkdv", "kv_split_sum.kv_split_sum", "explicit_attention.launch",
        "explicit_attention.launch_dq", "explicit_attention.launch_dkdv", "bias_linear._launch",
        "linear_cross_entropy.linear_cross_entropy_fwd", "linear_cross_entropy.linear_cross_entropy_bwd",
        "adamw.adamw_step_"}, sorted(asked)
    asked.clear()
    engine(FT, "bf16", kernel_device).step(x, y)  # the option off: no launcher asks
    assert not asked


# Captured (one CUDA graph, the launches recorded as its edges) only where the kernels compile: the interpreter runs
# on the CPU, which has no graphs.
@pytest.mark.parametrize("trigger", ["start", case("exit", id="exit")])
@pytest.mark.parametrize("capture", [False, case(True, id="captured")])
@pytest.mark.parametrize("cfg", [FT, GPT2], ids=["fasttransformer", "gpt2"])
def test_it_trains_as_without_it(kernel_device, cfg, capture, trigger):
    from kernels.pdl import pdl_supported

    losses = {}
    for on in (False, True):
        eng = Engine(cfg, B, T, "bf16", kernel_device, seed=3, capture=capture, programmatic_launch=on,
                     programmatic_trigger=trigger)
        assert eng.describe()["programmatic_launch"] is (on and pdl_supported(kernel_device))
        batches = pattern_batches(cfg.vocab_size, B, T, 3, seed=2, device=kernel_device)
        losses[on] = torch.stack([eng.step(x, y).detach().float().clone() for x, y in batches])
    assert torch.equal(losses[True], losses[False])  # the same kernels and sums; only when each starts differs
