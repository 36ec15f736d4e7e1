"""Training studies run and stored as result rows (resumable), and what a run leaves behind.

``run_study`` trains every (run, seed) of a study not yet stored under its bench, one row per run
(``ftlib.training.trainer.train``: the same loop for every model and execution); ``run_suites`` runs
the studies of ``ftlib.harness.studies`` within a time budget, then the speedrun's extra seeds for its
finalists. Rows record the time to target with and without the one-off startup (compilation, or the
engine's kernel JIT and graph capture), since that alone can dominate a short run; the speedrun claims
the time without it (``time_to_target_excl_startup_s``), as the public NanoGPT speedrun
(modded-nanogpt) README does. At the stop, rows also record the tokens to target and the loss on the
whole validation split beside the sampled estimate that stopped the run.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ftlib.core.device import device_slug
from ftlib.harness.provenance import provenance
from ftlib.harness.results import ResultStore, row_key
from ftlib.harness.studies import REFERENCE, TARGET_LOSS, suites
from ftlib.model.config import ModelConfig
from ftlib.training.data import CharDataset, load_tinyshakespeare, random_batch
from ftlib.training.trainer import Recipe, load_checkpoint, train


def steady_time_to_target(row: dict[str, Any]) -> float | None:
    """Time to target without the startup; None where not reached, or where the row records no startup."""
    return row.get("time_to_target_excl_startup_s")


def steady_time_at(evaluation: dict[str, Any], startup_s: float | None) -> float | None:
    """Training-step seconds up to ``evaluation`` (a history entry) without the one-off startup: the steps after
    the first (one reached at step 0 took none); None where the run records no startup."""
    if startup_s is None:
        return None
    return max(0.0, evaluation["time_s"] - startup_s) if evaluation["step"] > 0 else 0.0


def speedrun_finalists(rows: list[dict[str, Any]], always: Iterable[str] = ()) -> list[str]:
    """The reference, the seed-0 candidate with the least time to target excluding startup, and
    the candidates named in ``always`` (:data:`ALL_SEEDS`), in that order, without repeats.

    Excluding startup, because a compile or JIT cache warmed by an earlier run can shorten a startup;
    rows without a recorded startup are not candidates.
    """
    done = [r for r in rows if r.get("seed") == 0 and r.get("status") == "ok" and r["model"] != REFERENCE
            and steady_time_to_target(r) is not None]
    best = min(done, key=steady_time_to_target, default=None)
    return list(dict.fromkeys([REFERENCE] + ([best["model"]] if best is not None else []) + list(always)))


def run_suites(names: Iterable[str], device: torch.device | str, smoke: bool = False, budget_s: float | None = None,
               ds: CharDataset | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Run the named studies (``ftlib.harness.studies.suites``) until done or ``budget_s`` seconds have
    passed; then the speedrun's extra seeds for its finalists (the reference, the fastest seed-0
    candidate still listed, and ``ALL_SEEDS``)."""
    deadline = time.time() + budget_s if budget_s else None
    ds = ds or load_tinyshakespeare()
    table = suites(smoke)
    new = []
    for name in names:
        s = table[name]
        new += run_study(name, s["runs"], ds, s["seeds"], device, target_val_loss=s["target"],
                         deadline=deadline, progress=progress, repeat_of=s.get("repeat_of"))
        if s.get("more_seeds") and not (deadline is not None and time.time() > deadline):
            finalists = speedrun_finalists(ResultStore(name, device_slug(torch.device(device))).rows(),
                                           always=s.get("always", ()))
            runs = {n: s["runs"][n] for n in finalists if n in s["runs"]}  # rows of retired candidates stay rows
            new += run_study(name, runs, ds, s["more_seeds"], device,
                             target_val_loss=s["target"], deadline=deadline, progress=progress)
        if deadline is not None and time.time() > deadline:
            break
    return new


def run_key(bench: str, cfg: ModelConfig, rec: Recipe, target: float | None) -> str:
    """The result key of one run (``Recipe.key_repr`` keeps the keys of rows stored before new fields)."""
    return row_key(bench, cfg.config_hash(), rec.batch_size, rec.block_size, str(rec.compile),
                   rec.precision, {"recipe": rec.key_repr(), "target": target})


def _row(name: str, cfg: ModelConfig, rec: Recipe, out: dict, device: torch.device, key: str,
         target: float | None) -> dict[str, Any]:
    reached = out["reached"]
    startup = out["startup_s"]
    return {
        **provenance(device), "key": key, "model": name, "config": cfg.to_dict(),
        "config_hash": cfg.config_hash(), "recipe": out["recipe"], "seed": rec.seed,
        "params": sum(p.numel() for p in out["model"].parameters()),
        "execution": "engine" if rec.engine else (f"compile {rec.compile}" if rec.compile else "eager"),
        "engine": out["engine"],
        "history": out["history"], "best_val_loss": out["best_val_loss"],
        "train_time_s": out["train_time_s"], "steps_done": out["steps_done"], "target": target,
        "build_s": out["build_s"], "first_step_s": out["first_step_s"], "startup_s": startup,
        # All wall time of training steps, the startup (compile / JIT + capture) included ...
        "time_to_target_s": reached["time_s"] if reached else None,
        # ... and without it: the steps after the first (a target reached at step 0 took none). This is
        # the speedrun's claimed time; the first step is untimed with the compilation it holds.
        "time_to_target_excl_startup_s": steady_time_at(reached, startup) if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        # Where the target was reached: the tokens trained on (steps x batch x block), the sampled
        # validation estimate that stopped the run, and beside it the loss on the whole validation
        # split at that step (every position once; computed after the clock stopped, in
        # full_val_eval_s seconds).
        "tokens_to_target": reached["tokens"] if reached else None,
        "val_loss_at_target": reached["val_loss"] if reached else None,
        "full_val_loss_at_target": out.get("full_val_loss"), "full_val_positions": out.get("full_val_positions"),
        "full_val_eval_s": out.get("full_val_s"),
        "status": "ok",
    }


def run_study(
    bench: str,
    runs: dict[str, tuple[ModelConfig, Recipe]],
    ds: CharDataset,
    seeds: Iterable[int],
    device: torch.device | str,
    target_val_loss: float | None = None,
    time_budget_s: float | None = None,
    deadline: float | None = None,
    progress: bool = True,
    repeat_of: str | None = None,
) -> list[dict[str, Any]]:
    """Train every (run, seed) not yet stored under ``bench``; return the new rows.

    ``deadline`` (a ``time.time()`` value) stops starting new runs when passed, so a
    run with a time limit ends cleanly; what is left is measured by the next call.
    ``repeat_of`` names the bench whose runs these repeat: each row then gets the key of
    the first run plus ``-repeat1`` and ``repeat_of_key`` (one repeat per run; a row marked as a
    repeat of that key counts, whatever its own key).
    """
    device = torch.device(device)
    store = ResultStore(bench, device_slug(device))
    new = []
    for seed in seeds:
        for name, (cfg, rec) in runs.items():
            rec = rec.replace(seed=seed)
            key = run_key(repeat_of or bench, cfg, rec, target_val_loss)
            base, key = key, (f"{key}-repeat1" if repeat_of else key)
            if store.has(key, skip_status=("error",)):  # a failed run is tried again
                continue
            if repeat_of and any(r.get("repeat_of_key") == base and r.get("status", "ok") == "ok"
                                 for r in store.rows()):
                continue
            if deadline is not None and time.time() > deadline:
                return new
            try:
                out = train(cfg, rec, ds, device, target_val_loss=target_val_loss,
                            time_budget_s=time_budget_s, progress=progress)
            except Exception as e:  # one failed run (an engine that cannot capture, a NaN) is a row, not the end
                row = {**provenance(device), "key": key, "model": name, "config": cfg.to_dict(),
                       "config_hash": cfg.config_hash(), "recipe": dataclasses.asdict(rec), "seed": seed,
                       "status": "error", "error": f"{type(e).__name__}: {e}"[:2000],
                       "traceback": traceback.format_exc()[-3000:]}
                store.append(row)
                new.append(row)
                continue
            row = _row(name, cfg, rec, out, device, key, target_val_loss)
            if repeat_of:
                row["repeat_of_key"] = base
            row["sample"] = sample_text(out["model"], ds, device, seed=seed)
            store.append(row)
            new.append(row)
    return new


def describe_row(r: dict[str, Any]) -> str:
    """One log line for a stored row, finished or failed (for the GPU runner's output)."""
    head = f"{r['model']:<48} seed {r['seed']}"
    if r.get("status", "ok") != "ok":
        return f"{head}: {r.get('status')} {str(r.get('error', ''))[:200]}"

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}s"

    full = r.get("full_val_loss_at_target")
    return (f"{head}: best val {r['best_val_loss']:.4f} steps {r['steps_done']} train {r['train_time_s']:.1f}s "
            f"startup {s(r.get('startup_s'))} to-target {s(r.get('time_to_target_s'))} "
            f"(excl. startup {s(r.get('time_to_target_excl_startup_s'))})"
            + (f" full-split val {full:.4f}" if full is not None else ""))


def sample_text(model: torch.nn.Module, ds: CharDataset, device: torch.device | str,
                n: int = 300, seed: int = 0, prompt: str = "\n") -> str:
    """``n`` characters sampled (temperature 0.8, top-k 40) after ``prompt``, reproducibly."""
    model.eval()
    g = torch.Generator(device=torch.device(device)).manual_seed(seed)
    idx = torch.tensor([ds.encode(prompt)], dtype=torch.long, device=device)
    out = model.generate(idx, n, temperature=0.8, top_k=40, generator=g)
    return ds.decode(out[0, len(prompt):].tolist())


def checkpoint_roundtrip(name: str, ds: CharDataset, device: torch.device | str, path: str | Path,
                         smoke: bool = True) -> dict[str, Any]:
    """Train speedrun candidate ``name`` to 1.50 (at smoke size: 20 steps of a tiny model, on
    PyTorch ops), save it with :func:`ftlib.training.trainer.save_checkpoint`, load it back, and check
    that the reloaded model is the trained one: the same logits on a held-out batch and the
    same sampled text. The engine trains in its own flat buffers; its checkpoint holds a plain
    ``GPT``'s state dict, so it reloads without the kernels."""
    device = torch.device(device)
    cfg, rec = suites(smoke)["speedrun"]["runs"][name]
    if smoke:  # the engine's kernels would run in Triton's interpreter on CPU (minutes)
        rec = rec.replace(engine=False, engine_options=(), precision="fp32")
    path = Path(path)
    out = train(cfg, rec, ds, device, target_val_loss=TARGET_LOSS, progress=False, checkpoint=path)
    trained = out["model"].eval()
    model, ck = load_checkpoint(path, device)
    model.eval()
    g = torch.Generator().manual_seed(0)
    x, _ = random_batch(ds.val, 4, rec.block_size, generator=g, device=device)  # (4, T) held-out windows
    with torch.no_grad():
        a, b = trained(x)[0], model(x)[0]
    text = sample_text(model, ds, device)
    return {"model": name, "config": cfg.to_dict(), "steps": out["steps_done"], "best val loss": out["best_val_loss"],
            "checkpoint MB": path.stat().st_size / 2**20, "saved": sorted(ck),
            "config hash matches": ModelConfig(**ck["config"]).config_hash() == cfg.config_hash(),
            "max |logit difference|": (a - b).abs().max().item(),
            "same sample": text == sample_text(trained, ds, device), "sample": text}


