"""The engine captures its step on the stream it warmed up on (engine.py, ``_warm_up_and_capture``): autograd keeps
each parameter's AccumulateGrad node and its stream from the warm-up, and where every gradient is added out of
band no gradient moves it onto another capture stream, so a capture on a second stream would end its backward
waiting on a stream outside the capture. The CUDA calls are stand-ins here (no GPU): the test checks which stream
the graph is given."""

from __future__ import annotations

import contextlib

import torch
from small_engines import FT, engine


class _Stream:
    made: list[_Stream] = []

    def __init__(self, device: torch.device | None = None) -> None:
        _Stream.made.append(self)

    def wait_stream(self, other: _Stream) -> None:
        pass


def test_the_step_is_captured_on_the_stream_it_warmed_up_on(monkeypatch):
    eng = engine(FT, "fp32", torch.device("cpu"))
    _Stream.made.clear()
    current, entered, captured = _Stream(), [], []

    @contextlib.contextmanager
    def on(stream):
        entered.append(stream)
        yield

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, **kw):
        captured.append(stream)
        yield

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(eng, "_warm_up", lambda steps: None)
    monkeypatch.setattr(eng, "_step_body", lambda: torch.zeros(()))
    eng._warm_up_and_capture(1)
    side = [s for s in _Stream.made if s is not current]
    assert len(side) == 1 and entered == side  # warmed up on one side stream
    assert captured == side  # and captured on it, not on torch.cuda.graph's own stream
    assert eng.captured
