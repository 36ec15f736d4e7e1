"""Which of the book's precisions a device runs as labelled, and which benchmark cases that leaves.

A row labelled 'tf32' measured on a T4 would be an fp32 row, a 'bf16' row under ``torch.compile``
eager bf16 emulated through fp32 (:meth:`ftlib.core.device.DeviceInfo.why_not`). So the plan drops
those precisions on sm_75 with the reason, instead of storing rows under the wrong label. fp16 is the
T4's tensor-core precision (with dynamic loss scaling: :mod:`ftlib.training.loss_scale`).

``plan_cases`` filters benchmark cases (anything with ``.precision`` and ``.mode``, optionally
``.label``, ``.B``, ``.T``, ``.extra``: :class:`ftlib.harness.bench.Case`) for a device description.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ftlib.core.device import DeviceInfo
from ftlib.core.precision import PRECISIONS

# Engine options whose value names a Triton tl.dot input precision (ftlib.training.engine.Engine).
_TRITON_DOT_OPTIONS = ("attention_precision", "linear_precision")


def case_why_not(info: DeviceInfo, case: Any) -> str | None:
    """Why a benchmark case would not measure what it is labelled on ``info`` (None: it runs).

    Its precision first (:meth:`DeviceInfo.why_not`); then engine options that name a Triton ``tl.dot``
    precision ('tf32', 'tf32x3'): below sm_80 Triton runs every dot on the FMA units, so a
    3xTF32 variant would measure FMA arithmetic.
    """
    reason = info.why_not(case.precision)
    if reason is not None:
        return reason
    extra = getattr(case, "extra", None) or {}
    if info.kind == "cuda":
        for opt in _TRITON_DOT_OPTIONS:
            value = extra.get(opt)
            if value not in (None, "ieee") and not info.triton_dot_uses_tensor_cores(value):
                return (f"{opt}={value!r}: Triton's tl.dot has no tensor cores on {info.label()} "
                        "(it falls back to FMA below sm_80)")
    return None


def plan_cases(info: DeviceInfo, suites: Mapping[str, Iterable[Any]]) -> list[dict[str, Any]]:
    """One JSON-able dict per case of every suite, in order: ``suite``, ``label``, ``mode``,
    ``precision``, ``B``, ``T``, ``extra`` and ``skipped`` (None when the case runs on ``info``,
    else the reason)."""
    rows = []
    for suite, cases in suites.items():
        for case in cases:
            rows.append({
                "suite": suite, "label": getattr(case, "label", None), "mode": case.mode,
                "precision": case.precision, "B": getattr(case, "B", None), "T": getattr(case, "T", None),
                "extra": _jsonable(getattr(case, "extra", None) or {}),
                "skipped": case_why_not(info, case),
            })
    return rows


def plan(info: DeviceInfo, suites: Mapping[str, Iterable[Any]]) -> dict[str, Any]:
    """The whole plan for ``ci/gpu_bench.py plan --json``: the device, its precisions, every
    case (``plan_cases``) and the counts run / skipped."""
    cases = plan_cases(info, suites)
    return {
        "device": info.to_dict(),
        "precisions": {p: info.why_not(p) for p in PRECISIONS},
        "cases": cases,
        "n_run": sum(c["skipped"] is None for c in cases),
        "n_skipped": sum(c["skipped"] is not None for c in cases),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
