"""The book's engine against the strongest baseline of the same run, per device: the tables and sentences of the
findings (README.md, book/intro.md, chapters 7 and 10), computed from the baselines suite's complete runs.

``engine_results(device)`` is one device's table; ``engine_notes(device)`` the sentences beside it (a baseline
that moves from run to run, runs left out of the ratios, the engine's goals). Devices are never pooled: the
headline device gets its table, each ``other_devices`` its own, and ``weaker_set`` says where the headline
device's runs lack a configuration that was the strongest baseline on another device.
"""

from __future__ import annotations

import pandas as pd

from ftlib.views.bench import gpu_name, model_title
from ftlib.views.engine_config import engine_words

# The engine's table: what a reader compares, in reading order.
ENGINE_COLUMNS = ["model", "precision", "engine ms", "strongest baseline of the same run", "its ms",
                  "engine speed-up", "runs", "verdict", "engine"]
ENGINE_INTRO = ("The book's whole-step engine (its own Triton kernels, the whole training step replayed as one "
                "CUDA graph; chapter 6) against the strongest baseline measured in the same run: the fastest step "
                "of torch.compile's configurations or of a manual CUDA graph, named in the table (where the runs' "
                "fastest differ, each one). The speed-up is the median over runs, with the slowest and fastest "
                "run; a line measured only by an earlier engine names the default options it lacked (chapter 6 "
                "describes each).")


def all_runs() -> pd.DataFrame:
    """The baselines suite's complete runs on every device (:func:`ftlib.views.baselines.load`)."""
    from ftlib.harness.suites import baselines
    from ftlib.views import baselines as bv

    return bv.load(baselines())


def device_runs(device: str = "h200") -> pd.DataFrame:
    """The baselines suite's complete runs on ``device``: what the engine's table, the moving baseline, the
    engine's goals and the lessons read, loaded once by :func:`markdown` and :func:`show_findings` and passed
    to each."""
    runs = all_runs()
    return runs[runs["device_slug"] == device]


def engine_results(device: str = "h200", runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per model and precision: the engine against the strongest compiled step of the same run.

    The runs behind a line measured one engine (the current one, or the earlier one closest to it, named in the
    ``engine`` column); runs of engines with different defaults are never pooled. ``runs``: :func:`device_runs`
    (loaded here where not given)."""
    from ftlib.views import baselines as bv

    runs = device_runs(device) if runs is None else runs
    if runs.empty:
        return pd.DataFrame(columns=ENGINE_COLUMNS)
    eng = bv.newest_engine(bv.engine_table(runs))
    out = []
    for label in ("fasttransformer", "gpt2"):
        for prec in ("bf16", "fp16", "tf32", "fp32"):
            e = bv.lookup_row(eng, label=label, precision=prec)
            if e is None:
                continue
            out.append({"model": bv.MODEL_NAMES[label], "precision": prec, "engine ms": e["engine_ms"],
                        "strongest baseline of the same run": e["baseline"], "its ms": e["baseline_ms"],
                        "engine speed-up": bv.range_text(e["median"], e["min"], e["max"]).replace(" over runs", ""),
                        "runs": bv.runs_on_starts(int(e["runs"]), int(e["machines"])),
                        "verdict": bv.verdict_word(e["verdict"]),
                        "engine": engine_words(e["engine_config"]).removeprefix("the ")})
    return pd.DataFrame(out, columns=ENGINE_COLUMNS)


def moving_baseline(device: str = "h200", runs: pd.DataFrame | None = None) -> str | None:
    """A sentence naming the strongest baselines that move from run to run (None where none moves); ``runs``:
    :func:`device_runs`."""
    from ftlib.views import baselines as bv
    from ftlib.views.steadiness import STEADY_PCT, steadiness_table

    runs = device_runs(device) if runs is None else runs
    if runs.empty:
        return None
    steady = steadiness_table(runs)
    moving = [f"{r['model']} {r['precision']} {r['strongest baseline ms (min–max)']} ms over {r['runs']} runs"
              for _, r in steady.iterrows() if r["runs"] > 1 and r["compiled spread %"] > STEADY_PCT
              and r["model"] in (bv.MODEL_NAMES["fasttransformer"], bv.MODEL_NAMES["gpt2"])]
    if not moving:
        return None
    return ("The strongest baseline itself moves from run to run where its step leaves work to the host "
            "(chapter 6): " + "; ".join(moving) + ".")


def slow_baseline_runs(device: str = "h200", runs: pd.DataFrame | None = None) -> str | None:
    """A sentence naming each engine line whose runs had a strongest compiled step slower than that step's
    median over every run of ``device`` by more than the steadiness threshold: its same-run ratio then also
    measures those runs' hosts. Against the all-runs median (a ratio across runs, for scale only) the engine's
    time reads lower. None where no line's runs stand apart; ``runs``: :func:`device_runs`."""
    from ftlib.views import baselines as bv
    from ftlib.views.steadiness import STEADY_PCT

    runs = device_runs(device) if runs is None else runs
    if runs.empty:
        return None
    best = bv.strongest(runs)
    best = best[best["device_slug"] == device]
    eng = bv.newest_engine(bv.engine_table(runs))
    out = []
    for _, e in eng[eng["device_slug"] == device].iterrows():
        every = best[(best["label"] == e["label"]) & (best["precision"] == e["precision"])]["baseline_ms"]
        typical = float(every.median()) if len(every) else None
        if typical and e["baseline_ms"] > typical * (1 + STEADY_PCT / 100):
            out.append(f"{bv.MODEL_NAMES[e['label']]} {e['precision']}: the {int(e['runs'])} run"
                       f"{'s' * (e['runs'] != 1)} behind its engine ratio had a strongest compiled step of "
                       f"{e['baseline_ms']:.2f} ms, against {typical:.2f} ms over all {len(every)} runs here; against "
                       f"that, the engine's {e['engine_ms']:.2f} ms is {typical / e['engine_ms']:.2f}×")
    return ("Where the runs that measured the engine had a slow compiled step, the same-run ratio is high: "
            + "; ".join(out) + " (a ratio across runs, for scale only).") if out else None


def left_out_sentence(runs: pd.DataFrame) -> str | None:
    """Runs without a configuration that was the strongest baseline elsewhere, left out of the ratios."""
    from ftlib.views.baselines import runs_left_out

    out = [f"{model_title(r['label'])} {r['precision']}, {r['runs left out']} run{'s' * (r['runs left out'] != 1)} "
           f"without {r['lacking']}"
           for _, r in runs_left_out(runs).iterrows()]
    return ("Left out of the engine's ratios, for lacking a configuration that was the strongest baseline in other "
            "runs: " + "; ".join(out) + ".") if out else None


def goals_sentence(device: str, runs: pd.DataFrame) -> str | None:
    """The engine's goals (chapter 6) by the state of the current engine's runs, in a sentence."""
    from ftlib.views.engine_goals import goal_states

    states = goal_states(runs, device)
    return f"The engine's goals against the strongest compiled step (chapter 6): {states}." if states else None


def engine_notes(device: str = "h200", runs: pd.DataFrame | None = None) -> list[str]:
    """The sentences that go beside ``device``'s engine table: a strongest baseline that moves from run to run,
    runs left out of the ratios, the engine's goals; ``runs``: :func:`device_runs`."""
    runs = device_runs(device) if runs is None else runs
    return [s for s in (moving_baseline(device, runs), slow_baseline_runs(device, runs), left_out_sentence(runs),
                        goals_sentence(device, runs)) if s]


def other_devices(device: str = "h200") -> list[str]:
    """The devices besides ``device`` with complete baselines runs that measured the engine, by name."""
    runs = all_runs()
    runs = runs[(runs["device_slug"] != device) & (runs["mode"] == "engine")]
    return sorted(set(runs["device_slug"]))


def _row_name(device: str, runs: pd.DataFrame) -> str | None:
    names = sorted(set(runs.loc[runs["device_slug"] == device, "device"].dropna()))
    return names[0] if names else None


def device_title(device: str, runs: pd.DataFrame) -> str:
    """The device's name as its rows give it ('NVIDIA H100 80GB HBM3'), else its folder name."""
    return _row_name(device, runs) or device


def short_name(device: str, runs: pd.DataFrame | None = None) -> str:
    """'H100 80GB HBM3': the device's name as its rows give it, without the vendor (:func:`bench.gpu_name`);
    ``runs``: baselines runs already loaded (:func:`device_runs` or :func:`all_runs`), else read here."""
    return gpu_name(_row_name(device, device_runs(device) if runs is None else runs), device)


def other_device_intro(device: str, headline: str, runs: pd.DataFrame) -> str:
    """The line before another device's engine table."""
    return (f"On the {device_title(device, runs)}, in its own runs (never pooled with the {short_name(headline)}'s), "
            "the same comparison:")


def weaker_set(device: str = "h200",
               consequence: str = "its engine ratios above are against a weaker set of configurations") -> str | None:
    """A sentence where no run of ``device`` measured a configuration that was the strongest baseline in runs of
    another device (None where its runs measured every such configuration): its ratios are then against a weaker
    set of configurations than the other device's, the ``consequence`` the sentence ends with."""
    from ftlib.views import baselines as bv

    every = bv.valid_rows(all_runs())
    if every.empty or not (every["device_slug"] == device).any():
        return None
    here = set(every.loc[every["device_slug"] == device, "config"])
    best = bv.strongest(every)
    out = []
    for (dev, name), won in best[best["device_slug"] != device].groupby(["device_slug", "baseline"]):
        if name in here:
            continue
        measured = every[(every["device_slug"] == dev) & (every["config"] == name)]
        n_measured = measured.groupby(["run_id", "label", "precision"]).ngroups
        out.append(f"{name}, the strongest baseline in {len(won)} of the {n_measured} cases (a model and precision "
                   f"in one run) on the {device_title(dev, every)} that measured it")
    if not out:
        return None
    return (f"No run on the {device_title(device, every)} measured the " + "; nor the ".join(out)
            + f": {consequence}.")
