"""The speedrun's candidates by short id (chapter 8): one legend that says what each id is.

The rows name each candidate in full (its ``model`` field, a key of the rows that can run to two
hundred characters). Tables and figures show a short id instead: ``nanoGPT`` for the reference,
``C1``, ``C2``, ... for the others, numbered by the date of their first stored run and then by their
order in the rows, so that a candidate run later gets the next number and the earlier ids stay as
they were. :func:`legend` says what each id is, in short columns read off the stored config and recipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ftlib.harness.studies import REFERENCE
from ftlib.views.tables import table_view

REFERENCE_ID = "nanoGPT"

# The engine options the legend names, in the words of the chapter's glossary.
OPTION_WORDS = {
    "bf16_weights": "bf16 weights",
    "bf16_norm_out": "bf16 norms",
    "fuse_dropout": "fused dropout",
    "dropout_rng4": "per 4 columns",
    "muon_grouped": "grouped Muon",
    "fuse_residual_norm": "fused residual-norm",
}


def short_ids(rows: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Stored candidate name -> short id: the reference ``nanoGPT``, the others ``C1``, ``C2``, ... by
    the date of their first run, then by their first appearance in ``rows``."""
    dates: dict[str, str] = {}
    index: dict[str, int] = {}
    for i, r in enumerate(rows):
        name = r.get("model")
        if name is None or name == REFERENCE:
            continue
        index.setdefault(name, i)
        day = str(r.get("date") or "")
        dates[name] = min(dates.get(name, day), day)
    order = sorted(index, key=lambda n: (dates[n], index[n]))
    return {REFERENCE: REFERENCE_ID, **{name: f"C{k}" for k, name in enumerate(order, 1)}}


def id_of(ids: Mapping[str, str], name: str) -> str:
    """The short id of ``name`` (a label with a parameter count added keeps its suffix), else the name."""
    for full, short in ids.items():
        if name == full:
            return short
        if name.startswith(full + " (") and name.endswith(" params)"):
            return short + name[len(full):]
    return name


def _model(cfg: dict[str, Any]) -> str:
    """'256x6 FT-style' (width x layers, the block's kind) and the block's additions."""
    ft = cfg.get("n_kv_head") == 1 and cfg.get("mlp_ratio") == 2.0 and cfg.get("norm") == "rmsnorm"
    words = [f"{cfg.get('n_embd')}x{cfg.get('n_layer')} " + ("FT-style" if ft else "GPT-2 style")]
    if cfg.get("activation") == "relu2":
        words.append("ReLU²")
    if cfg.get("qk_norm"):
        words.append("QK-norm")
    if cfg.get("logit_softcap"):
        words.append(f"soft-cap {cfg['logit_softcap']:g}")
    return " + ".join(words)


def _optimizer(rec: dict[str, Any]) -> str:
    if rec.get("optimizer", "adamw") == "muon":
        return f"Muon {rec.get('muon_lr', 0.02):g} + AdamW {rec.get('lr'):g}"
    return f"AdamW {rec.get('lr'):g}"


def _schedule(rec: dict[str, Any]) -> str:
    if rec.get("schedule", "cosine") == "trapezoid":
        return f"trapezoid (cool-down {rec.get('cooldown')})"
    return "cosine"


def _execution(rec: dict[str, Any]) -> str:
    if rec.get("engine"):
        return "engine"
    return f"compile {rec.get('compile')}" if rec.get("compile") else "eager"


def _options(rec: dict[str, Any]) -> str:
    on = [k for k, v in rec.get("engine_options") or () if v]
    for pair, words in ((("bf16_weights", "bf16_norm_out"), "bf16 weights and norms"),
                        (("fuse_dropout", "dropout_rng4"), "fused dropout per 4 columns")):
        if all(k in on for k in pair):  # the two together, in the words the glossary defines
            on = [words if k == pair[0] else k for k in on if k != pair[1]]
    return ", ".join(OPTION_WORDS.get(k, k) for k in on) or "–"


def describe(row: dict[str, Any]) -> dict[str, Any]:
    """A run's model and recipe in the legend's short columns."""
    cfg, rec = row.get("config") or {}, row.get("recipe") or {}
    attn = cfg.get("attn_dropout")  # not set: the attention takes the model's dropout
    return {"model": _model(cfg), "dropout": cfg.get("dropout"),
            "attn dropout": cfg.get("dropout") if attn is None else attn,
            "optimizer (lr)": _optimizer(rec), "warm-up": rec.get("warmup"), "schedule": _schedule(rec),
            "horizon": rec.get("decay_steps"),
            "weight decay": rec.get("weight_decay"), "batch": rec.get("batch_size"), "execution": _execution(rec),
            "precision": rec.get("precision"), "engine options": _options(rec)}


def in_words(row: dict[str, Any]) -> str:
    """:func:`describe` as one line: model, optimizer, schedule and horizon, batch, execution."""
    d = describe(row)
    opts = f" ({d['engine options']})" if d["engine options"] != "–" else ""
    return (f"{d['model']}, dropout {d['dropout']}, {d['optimizer (lr)']}, {d['schedule']} over "
            f"{d['horizon']} steps, batch {d['batch']}, {d['execution']}{opts}")


@table_view
def legend(rows: list[dict[str, Any]], ids: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One line per id of ``ids`` (default :func:`short_ids` of ``rows``) that has a run among ``rows``:
    its model and recipe (:func:`describe`, from its first run)."""
    ids = short_ids(rows) if ids is None else ids
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("model") in ids and r.get("config"):
            first.setdefault(r["model"], r)
    order = sorted(first, key=lambda n: (ids[n] != REFERENCE_ID, int(ids[n][1:]) if ids[n][1:].isdigit() else 0))
    return [{"id": ids[n], **describe(first[n])} for n in order]
