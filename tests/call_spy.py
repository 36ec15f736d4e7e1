"""A test helper: record something about every call of a module's function while it still runs."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest


def record_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str,
                 key: Callable[[dict[str, Any]], Any]) -> set:
    """Replace ``module.name`` (for the test) by a wrapper that calls it and adds ``key(arguments)`` to the
    returned set, ``arguments`` being the call's arguments bound to the function's parameters by name
    (defaults left out)."""
    real, seen = getattr(module, name), set()
    signature = inspect.signature(real)

    def wrapper(*args: Any, **kw: Any) -> Any:
        seen.add(key(signature.bind(*args, **kw).arguments))
        return real(*args, **kw)

    monkeypatch.setattr(module, name, wrapper)
    return seen


def record_attention_launches(monkeypatch: pytest.MonkeyPatch, keyword: str,
                              explicit: bool = False) -> tuple[set, set]:
    """The values of ``keyword`` that the attention's forward and backward launchers are called with, as
    (forward's, backward's) sets; None where a call leaves it at its default. The flash kernels'
    (kernels.attention), or with ``explicit`` GPT-2's explicit-attention kernels' (kernels.explicit_attention)."""
    import kernels.attention as A
    import kernels.explicit_attention as E

    module, prefix = (E, "explicit_attention") if explicit else (A, "attention")
    return (record_calls(monkeypatch, module, f"{prefix}_fwd", lambda a: a.get(keyword)),
            record_calls(monkeypatch, module, f"{prefix}_bwd", lambda a: a.get(keyword)))
