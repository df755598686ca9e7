"""What a sweep's runs are, as the analysis compares them: configurations, series and their names.

* a **configuration** is a trial's config without its seed (``config_id``: a digest of the params that name the
  experiment, :func:`science_params`, minus ``train.seed``); its display name ``config`` is the trial label without
  its ``-s<seed>`` suffix (:func:`config_label`), with the digest appended where two configurations' labels
  coincide (:func:`name_configs`);
* a **series** is the configurations that differ only in ``data.context_s`` (``series_id``); its name says how it
  differs from the sweep's other series (:func:`name_series`, :func:`describe_params`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Mapping

import pandas as pd

from asr_core.contract.trial import TAG_SEED

SEED_PARAM = "train.seed"
CONTEXT_PARAM = "data.context_s"
HEAD_KEYS = ("model.heads",)  # the params that tell series apart by heads (figure 5, head similarity)
SIZE_KEYS = ("model.layers", "model.d_model")  # ... by model size (figure 4)


def digest(items: Mapping[str, str]) -> str:
    """A short stable digest of a set of params: the identity of a configuration or a series."""
    blob = json.dumps(sorted(items.items()), separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def number(value: str | None, kind: type = float) -> Any:
    """A param's text as a number: ``kind`` float (NaN where absent or not a number) or int (None there)."""
    if value is None or value == "":
        return math.nan if kind is float else None
    try:
        x = float(value)
    except ValueError:
        return math.nan if kind is float else None
    return int(x) if kind is int and x.is_integer() else x


def seed_of(tags: Mapping[str, str], params: Mapping[str, str]) -> int | None:
    """A trial's seed: its tag ``trial.seed``, else its param ``train.seed``; None where neither is an integer."""
    for value in (tags.get(TAG_SEED), params.get(SEED_PARAM)):
        v = number(value, int)
        if isinstance(v, int):
            return v
    return None


def science_params(params: Mapping[str, str], *, named: bool = False) -> dict[str, str]:
    """The params that name the experiment, as model keys see them (asr_core.contract.identity): execution settings and the
    evaluation (``eval.*``) dropped, data locations replaced by the data's names, values at the identity baseline
    dropped. So seeds of one configuration stay one configuration when they ran with other loader workers, from a
    moved corpus, evaluated on other test sets, or before and after an option was added (logged by some runs at its
    default, absent from older ones).

    ``named``: for naming series instead, keep baseline values and fill every baseline field a run lacks, so that
    every run shows every field (``posenc=rotary`` beside ``posenc=sinusoidal``)."""
    from asr_core.config import FIELD_DEFAULTS
    from asr_core.contract.identity import EVALUATION_SECTION, EXECUTION, NAMED, baseline, identity_value

    def shown(x: Any) -> str:
        return str(list(x)) if isinstance(x, (list, tuple)) else str(x)

    out: dict[str, str] = {}
    for k, v in params.items():
        if k in EXECUTION or k.startswith(EVALUATION_SECTION):
            continue
        if k in NAMED:  # data.train, data.tokenizer: the data's name, not where it lies
            try:
                v = shown(identity_value(k, v))
            except (ValueError, TypeError):
                pass  # not in the form the ledger logs: compare it as it is
        base = baseline(k, FIELD_DEFAULTS)
        if base is not None and v == shown(base) and not named:
            continue
        out[k] = v
    if named:
        from asr_core.contract.identity import BASELINE

        for k, base in BASELINE.items():
            if not k.startswith(EVALUATION_SECTION):
                out.setdefault(k, shown(base))
    return out


def config_label(label: str, seed: int | None) -> str:
    """The trial label without its seed: ``ctx82s-rope1.5M-6L768d6h-s2`` -> ``ctx82s-rope1.5M-6L768d6h``; the
    ledger appends ``-<key[:6]>`` to labels two trials share, and that goes too."""
    seed_re = str(seed) if seed is not None else r"\d+"
    return re.sub(rf"-s{seed_re}(-[0-9a-f]{{6}})?$", "", label)


def name_configs(trials: pd.DataFrame) -> pd.DataFrame:
    """One ``config`` name per ``config_id``; configurations whose labels coincide get their digest appended."""
    trials = trials.copy()
    first = trials.groupby("config_id")["config"].first()
    clash = first.duplicated(keep=False)
    names = {cid: f"{name}#{cid[:6]}" if clash[cid] else name for cid, name in first.items()}
    trials["config"] = trials["config_id"].map(names)
    return trials


def name_series(trials: pd.DataFrame, params: pd.DataFrame) -> pd.DataFrame:
    """Name each series by the params in which the series of the sweep differ (positional encoding, size, ...)."""
    trials = trials.copy()
    reps = trials.drop_duplicates("series_id").set_index("series_id")["run_id"]
    if len(reps) <= 1 or params.empty:
        trials["series"] = "all" if len(reps) <= 1 else trials["series_id"]
        return trials
    cols = [c for c in params.columns if c not in (SEED_PARAM, CONTEXT_PARAM)]
    table = params.reindex(reps.values)[cols].fillna("")
    differing = [c for c in cols if table[c].nunique() > 1]
    names = {}
    for sid, rid in reps.items():
        p = params.loc[rid] if rid in params.index else pd.Series(dtype=str)
        names[sid] = describe_params({c: str(p.get(c, "")) for c in differing}) or sid
    trials["series"] = trials["series_id"].map(names)
    return trials


def _short_number(text: str) -> str:
    try:
        x = float(text)
    except ValueError:
        return text
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def describe_params(diff: Mapping[str, str]) -> str:
    """A short human name for a set of differing params, e.g. ``"rotary θ=1.5M, 9L-768d-6H"``."""
    parts: list[str] = []
    rest = dict(diff)
    if "model.posenc" in rest or "model.rotary_theta" in rest:
        enc = rest.pop("model.posenc", None)
        theta = rest.pop("model.rotary_theta", None)
        if enc in (None, "rotary"):
            parts.append(f"{enc or 'rotary'} θ={_short_number(theta)}" if theta else (enc or "rotary"))
        else:
            parts.append(enc)
    arch = [k for k in ("model.layers", "model.d_model", "model.heads") if k in rest]
    if arch:
        vals = {k: rest.pop(k) for k in arch}
        bits = []
        if "model.layers" in vals:
            bits.append(f"{vals['model.layers']}L")
        if "model.d_model" in vals:
            bits.append(f"{vals['model.d_model']}d")
        if "model.heads" in vals:
            bits.append(f"{vals['model.heads']}H")
        parts.append("-".join(bits))
    parts.extend(f"{k.split('.')[-1]}={_short_number(v)}" for k, v in sorted(rest.items()))
    return ", ".join(parts)
