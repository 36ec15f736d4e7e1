"""Which engine configurations capture their step in a CUDA graph, each tried in a fresh process.

    python -m benchmarks.kernels.capture_dev [--repeats N]        (GPU only; prints one line per try)

Why: a capture that fails names the CUDA call that broke it ("dependency created on uncaptured work in
another stream", say), not the op that made the stream dependency. Trying the configuration with one option
changed at a time says which option the failure needs, and a fresh process per try keeps one failed capture
from leaving state (the CUDA generator, a stream's capture mode) that fails the next. The cases are those of a
100-step check that failed to capture (``ftlib.harness.engine_check``), with the options around it switched. The
engine captures on its warm-up's stream (``Engine._warm_up_and_capture`` says why), so every case should print
'ok'; one that does not names the configuration to look at.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

# (label, preset, precision, engine options): the failing check first, then one option changed at a time, then
# the check's predecessor and the failing case in one process, as the check suite runs them.
CASES: tuple[tuple[str, str, str, dict], ...] = (
    ("fuse_mlp_act tf32", "fasttransformer", "tf32", {"fuse_mlp_act": True}),
    ("  without fuse_embedding", "fasttransformer", "tf32", {"fuse_mlp_act": True, "fuse_embedding": False}),
    ("  attention backward on one stream", "fasttransformer", "tf32",
     {"fuse_mlp_act": True, "attention_bwd_streams": False}),
    ("  with relaxed_atomics", "fasttransformer", "tf32", {"fuse_mlp_act": True, "relaxed_atomics": True}),
    ("default tf32", "fasttransformer", "tf32", {}),
    ("fuse_mlp_act bf16", "fasttransformer", "bf16", {"fuse_mlp_act": True}),
)


def try_capture(name: str, precision: str, options: dict) -> str:
    """'ok', or the error's first line, for an engine of preset ``name`` captured at B=32, T=256."""
    from ftlib.model.config import preset
    from ftlib.training.engine import Engine

    try:
        eng = Engine(preset(name), 32, 256, precision, torch.device("cuda"), seed=0, **options)
        x = torch.randint(eng.config.vocab_size, (32, 256), device="cuda")
        loss = float(eng.step(x, x))
        return "ok" if eng.captured and loss == loss else f"not captured (captured={eng.captured}, loss {loss})"
    except Exception as e:  # the printed line is the failure
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="fresh processes per case")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: one case as JSON, its answer on stdout
    args = ap.parse_args(argv)
    if args.one:
        print(try_capture(*json.loads(args.one)))
        return 0
    if not torch.cuda.is_available():
        print("capture_dev: needs a CUDA device")
        return 2
    for label, name, precision, options in CASES:
        for i in range(args.repeats):
            child = subprocess.run([sys.executable, "-m", "benchmarks.kernels.capture_dev", "--one",
                                    json.dumps([name, precision, options])], capture_output=True, text=True)
            answer = (child.stdout.strip().splitlines() or [child.stderr.strip()[-300:]])[-1]
            print(f"{label:<38} {name} {precision} try {i + 1}: {answer}", flush=True)
    print(f"{'GPT-2 fuse_mlp_act bf16, then the first':<38} one process:", flush=True)
    for name, precision in (("gpt2", "bf16"), ("fasttransformer", "tf32")):
        print(f"  {name} {precision}: {try_capture(name, precision, {'fuse_mlp_act': True})}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
