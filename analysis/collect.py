"""Read a sweep from MLflow into tidy pandas DataFrames (docs/ARCHITECTURE.md, "MLflow ledger schema").

One experiment per sweep; one child run per trial (tag ``sweep.role=trial``) whose params are the flattened
config; metrics ``wer/<DATASET>`` and ``wer/<DATASET>/snr<DB>`` in percent; artifact ``eval/<DATASET>.csv`` with
one row per recording and condition. Nothing is dropped silently: every run that is unfinished, lacks a metric,
lacks its per-recording table, or whose table disagrees with its metric is listed in :attr:`Sweep.problems`.

Identity of what is compared:

* a **configuration** is a trial's config without its seed (``config_id``: a digest of the params minus
  ``train.seed``); its display name ``config`` is the trial label without its ``-s<seed>`` suffix;
* a **series** is the configurations that differ only in ``data.context_s`` (``series_id``); WERR is measured
  within a series against its model at the baseline context;
* a **family** is a sub-grid (tag ``trial.subgrids``, comma-separated); a configuration may sit in several.

Other systems scored on the same test sets by ``python -m asr_core score`` (runs tagged ``sweep.role=external``,
``external.system=NAME``, with the same metric keys) are not trials: their WERs are listed in :attr:`Sweep.external`.

Decoders. ``wer/...`` and ``eval/<DATASET>.csv`` are the trial's greedy decoding (``decoder = "greedy"``); a beam
decoder ``D`` (``asr_core.evaluation.evaluate.BeamDecoding``, ``python -m orchestrate evaluate SWEEP --decode FILE``) adds
``wer_<D>/<DATASET>[/snr<DB>]``, ``eval/<DATASET>.<D>.csv`` and the tag ``eval.decoder.<D>`` (JSON settings) to the
same run. :attr:`Sweep.wer` and :attr:`Sweep.recordings` hold every decoder's rows, told apart by their ``decoder``
column; whatever assumes one WER per trial, dataset and condition selects the greedy rows (:func:`greedy_rows`).

Also read: head similarity (``heads/<DATASET>/<R>/sum|similarity|layer<i>``, paper 003) into :attr:`Sweep.heads`,
and LM perplexity (``lm_ppl/<DATASET>/ctx<N>`` on the LM's own run, ``python -m asr_core lm ppl``) into
:attr:`Sweep.lm_ppl`, from LM runs in the sweep's experiment, the LM runs its decoders name (``lm_run`` in their
tag) and every run of the experiments given as ``lm_experiments``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from asr_core.contract.trial import (FINISHED, ROLE_EXTERNAL, ROLE_PARENT, ROLE_TRIAL, TAG_ERROR, TAG_LABEL,
                                     TAG_ROLE, TAG_SEED, TAG_SUBGRIDS, TAG_SYSTEM)

log = logging.getLogger(__name__)

SEED_PARAM = "train.seed"
CONTEXT_PARAM = "data.context_s"
EVAL_CSV_COLUMNS = ("dataset", "condition", "snr_db", "recording", "ref_words", "substitutions", "deletions",
                    "insertions", "hyp_words", "wer")
COUNT_COLUMNS = ("ref_words", "substitutions", "deletions", "insertions", "hyp_words")
# optional: planted cue words and their errors (asr_core.evaluation.evaluate); NaN where a table lacks them or leaves them empty
CUE_COLUMNS = ("cue_words", "cue_errors")
_SNR = r"(?:/snr(?P<snr>[-+]?[0-9.]+(?:e[-+]?[0-9]+)?))?"
METRIC_RE = re.compile(rf"^wer/(?P<dataset>.+?){_SNR}$")
# the names asr_core.evaluation.evaluate writes (GREEDY, BeamDecoding.metric_key, the decoder tag): tests/test_report_decoders.py
# checks them against it, so analysis needs no torch to read them
GREEDY = "greedy"
DECODER_METRIC_RE = re.compile(rf"^wer_(?P<decoder>[A-Za-z0-9._-]+)/(?P<dataset>.+?){_SNR}$")
DECODER_TAG_PREFIX = "eval.decoder."
# asr_core.probes.heads.HeadsSummary.metrics and asr_core.lm.ppl.metric_name
HEADS_METRIC_RE = re.compile(r"^heads/(?P<dataset>.+)/(?P<repr>[AQKVY])/"
                             r"(?P<stat>sum|similarity|layer(?P<layer>[0-9]+))$")
LM_PPL_RE = re.compile(r"^lm_ppl/(?P<dataset>.+)/ctx(?P<context>[0-9]+)$")
LM_TAG = "lm.data_fingerprint"  # every LM training run has it (asr_core.lm.train)
CLEAN = "clean"
NO_FAMILY = "(none)"
# a metric and the corpus WER recomputed from its table may differ by rounding only
METRIC_TOLERANCE_PTS = 0.05
# a finished run whose clean greedy WER is at least this on every dataset wrote (almost) nothing: a model that never
# left the CTC blank plateau. Listed under problems, kept in the tables (it is what that seed trained)
NOTHING_LEARNED_WER = 99.0

TRIAL_COLUMNS = ["run_id", "label", "config", "config_id", "series", "series_id", "families", "seed", "status",
                 "context_s", "layers", "d_model", "heads", "posenc", "rotary_theta", "error"]
EXTERNAL_COLUMNS = ["system", "run_id", "status", "dataset", "condition", "snr_db", "wer"]
WER_COLUMNS = ["run_id", "dataset", "condition", "snr_db", "decoder", "wer", "wer_table", "n_recordings"]
# the settings of a beam decoder as its tag holds them (strings; "" where the tag lacks one)
DECODER_SETTINGS = ("lm", "lm_context", "alpha", "beta", "beam_width", "lm_step", "lm_run", "prompt")
DECODER_COLUMNS = ["run_id", "decoder", *DECODER_SETTINGS, "settings"]
HEAD_COLUMNS = ["run_id", "dataset", "representation", "statistic", "layer", "value"]
LM_PPL_COLUMNS = ["lm_run", "lm_name", "dataset", "lm_context", "ppl"]
# one row per finished run, evaluation that ran on it, dataset and condition (asr_core.contract.evaluation's tags);
# ``job``: "own" (the trial's own evaluation at the end of training) or an evaluation job's id; ``setting``: JSON
EVALUATION_COLUMNS = ["run_id", "evaluation", "job", "dataset", "condition", "setting"]


class CollectError(RuntimeError):
    """The sweep cannot be read at all (no such experiment, no trial runs); the message says what exists."""


def condition_name(snr_db: float | None) -> str:
    """``None``/NaN -> ``"clean"``; -7.5 -> ``"snr-7.5"``; 10.0 -> ``"snr10"`` (the ``:g`` spelling of the metrics)."""
    if snr_db is None or (isinstance(snr_db, float) and math.isnan(snr_db)):
        return CLEAN
    return f"snr{float(snr_db):g}"


def _dataset_condition(m: re.Match) -> tuple[str, str, float]:
    snr = m.group("snr")
    if snr is None:
        return m.group("dataset"), CLEAN, math.nan
    value = float(snr)
    return m.group("dataset"), condition_name(value), value


def parse_metric_key(key: str) -> tuple[str, str, float] | None:
    """``"wer/test/snr-5"`` -> ``("test", "snr-5", -5.0)``; ``"wer/dev"`` -> ``("dev", "clean", nan)``; else None."""
    m = METRIC_RE.match(key)
    return _dataset_condition(m) if m else None


def parse_decoder_metric_key(key: str) -> tuple[str, str, str, float] | None:
    """Any decoder's WER metric: ``"wer/dev"`` -> ``("greedy", "dev", "clean", nan)``, ``"wer_beam-lm64/test/snr-5"``
    -> ``("beam-lm64", "test", "snr-5", -5.0)``; else None."""
    m = METRIC_RE.match(key)
    if m:
        return (GREEDY, *_dataset_condition(m))
    m = DECODER_METRIC_RE.match(key)
    if not m or m.group("decoder") == GREEDY:
        return None
    return (m.group("decoder"), *_dataset_condition(m))


def table_name(dataset: str, decoder: str = GREEDY) -> str:
    """The stem of a run's per-recording table: ``eval/<dataset>.csv`` (greedy), ``eval/<dataset>.<decoder>.csv``."""
    return dataset if decoder == GREEDY else f"{dataset}.{decoder}"


def metric_name(dataset: str, condition: str, decoder: str = GREEDY) -> str:
    """The inverse of :func:`parse_decoder_metric_key`: ``("test", "snr-5", "beam")`` -> ``"wer_beam/test/snr-5"``."""
    prefix = "wer" if decoder == GREEDY else f"wer_{decoder}"
    return f"{prefix}/{dataset}" + ("" if condition == CLEAN else f"/{condition}")


def greedy_rows(frame: pd.DataFrame, decoder: str = GREEDY) -> pd.DataFrame:
    """The rows of ``frame`` (:attr:`Sweep.wer`, :attr:`Sweep.recordings`) decoded by ``decoder``, without the
    ``decoder`` column: what code that assumes one WER per trial, dataset and condition reads. A frame without the
    column (built before decoders were collected) is all greedy."""
    if "decoder" not in frame.columns:
        return frame if decoder == GREEDY else frame.iloc[0:0]
    return frame[frame["decoder"] == decoder].drop(columns="decoder")


def is_lm_run(rec: "RunRecord") -> bool:
    """An LM training run (``python -m asr_core lm train``): its tag ``lm.data_fingerprint`` or perplexity metrics."""
    return LM_TAG in rec.tags or any(k.startswith("lm_ppl/") for k in rec.metrics)


def decoder_lm_runs(records: Iterable["RunRecord"]) -> set[str]:
    """The LM runs that trial runs' decoders name (``lm_run`` in their ``eval.decoder.<D>`` tags)."""
    out = set()
    for rec in records:
        for key, value in rec.tags.items():
            if key.startswith(DECODER_TAG_PREFIX):
                try:
                    lm_run = json.loads(value).get("lm_run")
                except (ValueError, AttributeError):
                    continue
                if isinstance(lm_run, str) and lm_run:
                    out.add(lm_run)
    return out


@dataclass(frozen=True)
class RunRecord:
    """What one MLflow run holds that the analysis needs; ``tables`` maps the stem of each ``eval/*.csv`` artifact
    (``<dataset>`` greedy, ``<dataset>.<decoder>`` a beam decoder's, :func:`table_name`) -> its text."""

    run_id: str
    status: str
    tags: Mapping[str, str]
    params: Mapping[str, str]
    metrics: Mapping[str, float]
    tables: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    """A sweep as DataFrames.

    * ``trials``: one row per trial run, whatever its status (:data:`TRIAL_COLUMNS`);
    * ``wer``: one row per finished run, decoder, dataset and condition: the run's corpus WER metric (``wer``,
      percent), the WER recomputed from its table (``wer_table``) and its recording count; ``decoder`` is
      ``greedy`` or a beam decoder's name (:func:`greedy_rows` selects one);
    * ``recordings``: the tidy frame, one row per finished run, decoder, dataset, condition and recording, with the
      trial columns, the counts of ``eval/<DATASET>[.<DECODER>].csv`` and ``errors`` = S + D + I;
    * ``problems``: ``run_id, label, status, problem`` for everything left out or suspicious;
    * ``params``: the runs' params (strings), one row per run, for describing how series differ;
    * ``external``: other systems' WERs (:data:`EXTERNAL_COLUMNS`), one row per system, dataset and condition;
    * ``decoders``: one row per finished run and beam decoder, its settings from the tag ``eval.decoder.<D>``
      (:data:`DECODER_COLUMNS`; ``settings`` the tag's JSON);
    * ``heads``: head similarity (:data:`HEAD_COLUMNS` and the trial columns), one row per finished run, dataset,
      representation (A, Q, K, V, Y) and statistic (``sum``, ``similarity``, ``layer`` with its ``layer``);
    * ``lm_ppl``: LM perplexity per token (:data:`LM_PPL_COLUMNS`), one row per LM run, dataset and LM context;
    * ``evaluations``: which evaluation measured what on each finished run (:data:`EVALUATION_COLUMNS`), from the
      runs' ``eval.evaluation.<id>`` tags (none on runs made before evaluations were recorded).
    """

    experiment: str
    trials: pd.DataFrame
    wer: pd.DataFrame
    recordings: pd.DataFrame
    problems: pd.DataFrame
    params: pd.DataFrame
    external: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EXTERNAL_COLUMNS))
    decoders: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DECODER_COLUMNS))
    heads: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=HEAD_COLUMNS))
    lm_ppl: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LM_PPL_COLUMNS))
    evaluations: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EVALUATION_COLUMNS))

    @property
    def families(self) -> list[str]:
        names = sorted({f for fams in self.trials["families"] for f in fams.split(",") if f})
        return names

    @property
    def datasets(self) -> list[str]:
        """The datasets of the greedy results (every trial's own evaluation)."""
        wer = greedy_rows(self.wer)
        return sorted(wer["dataset"].unique()) if len(wer) else []

    @property
    def beam_decoders(self) -> list[str]:
        """The beam decoders some finished run has results of, sorted."""
        return sorted(set(self.wer["decoder"]) - {GREEDY}) if "decoder" in self.wer.columns else []


# ---- identity ------------------------------------------------------------------------------------------------

def _digest(items: Mapping[str, str]) -> str:
    blob = json.dumps(sorted(items.items()), separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def _number(value: str | None, kind: type = float) -> Any:
    if value is None or value == "":
        return math.nan if kind is float else None
    try:
        x = float(value)
    except ValueError:
        return math.nan if kind is float else None
    return int(x) if kind is int and x.is_integer() else x


def _seed(tags: Mapping[str, str], params: Mapping[str, str]) -> int | None:
    for value in (tags.get(TAG_SEED), params.get(SEED_PARAM)):
        v = _number(value, int)
        if isinstance(v, int):
            return v
    return None


def _science_params(params: Mapping[str, str], *, named: bool = False) -> dict[str, str]:
    """The params that name the experiment, as model keys see them (asr_core.identity): execution settings and the
    evaluation (``eval.*``) dropped, data locations replaced by the data's names, values at the identity baseline
    dropped. So seeds of one configuration stay one configuration when they ran with other loader workers, from a
    moved corpus, evaluated on other test sets, or before and after an option was added (logged by some runs at its
    default, absent from older ones).

    ``named``: for naming series instead, keep baseline values and fill every baseline field a run lacks, so that
    every run shows every field (``posenc=rotary`` beside ``posenc=sinusoidal``)."""
    from asr_core.identity import EVALUATION_SECTION, EXECUTION, NAMED, baseline, identity_value

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
        base = baseline(k)
        if base is not None and v == shown(base) and not named:
            continue
        out[k] = v
    if named:
        from asr_core.identity import BASELINE

        for k, base in BASELINE.items():
            if not k.startswith(EVALUATION_SECTION):
                out.setdefault(k, shown(base))
    return out


def _config_label(label: str, seed: int | None) -> str:
    """The trial label without its seed: ``ctx82s-rope1.5M-6L768d6h-s2`` -> ``ctx82s-rope1.5M-6L768d6h``; the
    ledger appends ``-<key[:6]>`` to labels two trials share, and that goes too."""
    seed_re = str(seed) if seed is not None else r"\d+"
    return re.sub(rf"-s{seed_re}(-[0-9a-f]{{6}})?$", "", label)


# ---- building the frames -------------------------------------------------------------------------------------

def build_sweep(experiment: str, records: Iterable[RunRecord], *, ignore_params: Iterable[str] = ()) -> Sweep:
    """Turn run records into a :class:`Sweep` (pure; :func:`collect` fetches the records from MLflow).

    ``ignore_params``: params that may differ between the seeds of one configuration (e.g. a per-trial output
    path) and must not split it.
    """
    ignored = {SEED_PARAM, *ignore_params}
    problems: list[dict[str, Any]] = []
    trial_rows: list[dict[str, Any]] = []
    external_rows: list[dict[str, Any]] = []
    lm_rows: list[dict[str, Any]] = []
    kept: list[RunRecord] = []
    seen: set[str] = set()
    for rec in records:
        if rec.run_id in seen:  # a run given twice counts once
            continue
        seen.add(rec.run_id)
        role = rec.tags.get(TAG_ROLE)
        if role == ROLE_PARENT:
            continue
        if role is None and is_lm_run(rec):
            lm_rows.extend(_lm_ppl_rows(rec))
            continue
        if role == ROLE_EXTERNAL:
            system = rec.tags.get(TAG_SYSTEM) or rec.run_id[:8]
            for key, value in sorted(rec.metrics.items()):
                if (parsed := parse_metric_key(key)) is not None:
                    external_rows.append({"system": system, "run_id": rec.run_id, "status": rec.status,
                                          "dataset": parsed[0], "condition": parsed[1], "snr_db": parsed[2],
                                          "wer": float(value)})
            continue
        label = rec.tags.get(TAG_LABEL) or rec.tags.get("mlflow.runName") or rec.run_id[:8]
        if role != ROLE_TRIAL:
            problems.append(_problem(rec, label, f"not a trial run (tag {TAG_ROLE}={role!r}); ignored"))
            continue
        seed = _seed(rec.tags, rec.params)
        config_params = {k: v for k, v in _science_params(rec.params).items() if k not in ignored}
        series_params = {k: v for k, v in config_params.items() if k != CONTEXT_PARAM}
        if not rec.params:
            # no params logged yet: the label (minus seed) is the best identity available
            config_id = "label:" + _config_label(label, seed)
        else:
            config_id = _digest(config_params)
        families = ",".join(sorted(f.strip() for f in rec.tags.get(TAG_SUBGRIDS, "").split(",") if f.strip()))
        context = _number(rec.params.get(CONTEXT_PARAM))
        trial_rows.append({
            "run_id": rec.run_id, "label": label, "config": _config_label(label, seed), "config_id": config_id,
            "series": "", "series_id": _digest(series_params) if rec.params else config_id,
            "families": families or NO_FAMILY, "seed": seed, "status": rec.status, "context_s": context,
            "layers": _number(rec.params.get("model.layers"), int),
            "d_model": _number(rec.params.get("model.d_model"), int),
            "heads": _number(rec.params.get("model.heads"), int),
            "posenc": rec.params.get("model.posenc", ""),
            "rotary_theta": _number(rec.params.get("model.rotary_theta")),
            "error": rec.tags.get(TAG_ERROR, ""),
        })
        if rec.status != FINISHED:
            detail = f": {rec.tags[TAG_ERROR]}" if rec.tags.get(TAG_ERROR) else ""
            problems.append(_problem(rec, label, f"run is {rec.status}{detail}; left out of every table"))
            continue
        if seed is None:
            problems.append(_problem(rec, label, "no seed (tag trial.seed / param train.seed); left out"))
            continue
        if math.isnan(context):
            problems.append(_problem(rec, label, f"no param {CONTEXT_PARAM}; left out"))
            continue
        kept.append(rec)

    trials = pd.DataFrame(trial_rows, columns=TRIAL_COLUMNS)
    if len(trials) == 0:
        raise CollectError(f"experiment {experiment!r} has no trial runs (tag sweep.role=trial)")
    trials = _name_configs(trials)
    params = pd.DataFrame([{"run_id": r.run_id, **_science_params(r.params, named=True)} for r in records
                           if r.tags.get(TAG_ROLE) == ROLE_TRIAL]).set_index("run_id")
    trials = _name_series(trials, params)
    by_run = trials.set_index("run_id")

    expected = _expected_conditions(kept)
    wer_rows: list[dict[str, Any]] = []
    rec_frames: list[pd.DataFrame] = []
    decoder_rows: list[dict[str, Any]] = []
    head_rows: list[dict[str, Any]] = []
    evaluation_rows: list[dict[str, Any]] = []
    for rec in kept:
        label = by_run.loc[rec.run_id, "label"]
        head_rows.extend(_head_rows(rec))
        evaluation_rows.extend(_evaluation_rows(rec))
        have: dict[tuple[str, str, str], tuple[float, float]] = {}  # (decoder, dataset, condition) -> (wer, snr)
        for key, value in rec.metrics.items():
            parsed = parse_decoder_metric_key(key)
            if parsed:
                have[parsed[:3]] = (float(value), parsed[3])
        if not any(dec == GREEDY for dec, _, _ in have):
            problems.append(_problem(rec, label, "FINISHED but has no wer/ metrics; left out"))
            continue
        clean = {d: w for (dec, d, c), (w, _) in have.items() if dec == GREEDY and c == CLEAN}
        if clean and min(clean.values()) >= NOTHING_LEARNED_WER:
            problems.append(_problem(rec, label, "clean WER " + ", ".join(f"{d} {w:.1f}%" for d, w in sorted(
                clean.items())) + ": the model has not learned to transcribe (as one that never left the CTC blank "
                "plateau, writing almost nothing); kept in the tables, but retrain it (another seed, a longer warmup) "
                "before reading anything into its context length"))
        for ds, cond in sorted(expected[rec.run_id] - {(d, c) for dec, d, c in have if dec == GREEDY}):
            problems.append(_problem(rec, label, f"lacks metric {metric_name(ds, cond)} that runs with the same "
                                                 f"eval settings have"))
        decoders = sorted({dec for dec, _, _ in have} - {GREEDY})
        for dec in decoders:
            row, why = _decoder_settings(rec, dec)
            decoder_rows.append(row)
            if why:
                problems.append(_problem(rec, label, why))
        tables: dict[tuple[str, str], pd.DataFrame] = {}
        for dec, ds in sorted({(dec, d) for dec, d, _ in have}):
            name = table_name(ds, dec)
            if name not in rec.tables:
                what = ds if dec == GREEDY else f"{ds} decoded by {dec}"
                problems.append(_problem(rec, label, f"no artifact eval/{name}.csv: no per-recording counts, so "
                                                     f"{what} is left out of the significance tests for this run"))
                continue
            table, why = _read_table(rec.tables[name], ds)
            if why:
                problems.append(_problem(rec, label, f"eval/{name}.csv {why}; left out of the significance tests"))
                continue
            tables[(dec, ds)] = table
        # per table, one pass: sums and duplicate checks per condition, then the usable rows in one slice
        summary = {key: _condition_summary(t) for key, t in tables.items()}
        usable: dict[tuple[str, str], dict[str, float]] = {}
        for (dec, ds, cond), (value, snr) in sorted(have.items()):
            row = {"run_id": rec.run_id, "dataset": ds, "condition": cond, "snr_db": snr, "decoder": dec,
                   "wer": value, "wer_table": math.nan, "n_recordings": 0}
            name, metric = table_name(ds, dec), metric_name(ds, cond, dec)
            if (dec, ds) in summary:
                info = summary[(dec, ds)].get(cond)
                if info is None:
                    problems.append(_problem(rec, label, f"eval/{name}.csv has no rows for condition {cond}; left "
                                                         f"out of the significance tests for {ds}/{cond}"
                                                         + ("" if dec == GREEDY else f" decoded by {dec}")))
                elif info["dup"]:
                    problems.append(_problem(rec, label, f"eval/{name}.csv lists recordings {info['dup'][:5]} "
                                                         f"twice under {cond}; left out of the significance tests"))
                else:
                    row["wer_table"], row["n_recordings"] = info["wer"], info["n"]
                    if not abs(info["wer"] - value) <= METRIC_TOLERANCE_PTS:
                        problems.append(_problem(
                            rec, label, f"metric {metric} = {value:.3f} but eval/{name}.csv gives "
                                        f"{info['wer']:.3f}; the table is used for tests"))
                    usable.setdefault((dec, ds), {})[cond] = snr
            wer_rows.append(row)
        for (dec, ds), conds in usable.items():
            t = tables[(dec, ds)]
            part = t[t["condition"].isin(list(conds))]
            rec_frames.append(part.assign(run_id=rec.run_id, snr_db=part["condition"].map(conds).astype(float),
                                          decoder=dec))

    info_cols = [c for c in TRIAL_COLUMNS if c not in ("status", "error")]
    wer = pd.DataFrame(wer_rows, columns=WER_COLUMNS)
    wer = trials[info_cols].merge(wer, on="run_id", how="inner")
    if rec_frames:
        recs = pd.concat(rec_frames, ignore_index=True)
        recs = trials[info_cols].merge(recs, on="run_id", how="inner")
    else:
        recs = pd.DataFrame(columns=info_cols + list(EVAL_CSV_COLUMNS) + list(CUE_COLUMNS) + ["errors", "decoder"])
    prob = pd.DataFrame(problems, columns=["run_id", "label", "status", "problem"])
    prob = prob.sort_values(["label", "problem"], kind="stable").reset_index(drop=True)
    external = pd.DataFrame(external_rows, columns=EXTERNAL_COLUMNS)
    heads = pd.DataFrame(head_rows, columns=HEAD_COLUMNS)
    heads = trials[info_cols].merge(heads, on="run_id", how="inner")
    lm_ppl = pd.DataFrame(lm_rows, columns=LM_PPL_COLUMNS).sort_values(["lm_name", "lm_run", "dataset",
                                                                        "lm_context"]).reset_index(drop=True)
    return Sweep(experiment, trials, wer, recs, prob, params, external,
                 pd.DataFrame(decoder_rows, columns=DECODER_COLUMNS), heads, lm_ppl,
                 pd.DataFrame(evaluation_rows, columns=EVALUATION_COLUMNS))


def _decoder_settings(rec: RunRecord, decoder: str) -> tuple[dict[str, Any], str]:
    """One :data:`DECODER_COLUMNS` row from the run's tag ``eval.decoder.<decoder>``, and what is wrong with the tag
    ("" when nothing)."""
    row: dict[str, Any] = {"run_id": rec.run_id, "decoder": decoder, **dict.fromkeys(DECODER_SETTINGS, ""),
                           "settings": ""}
    tag = DECODER_TAG_PREFIX + decoder
    text = rec.tags.get(tag)
    if text is None:
        return row, f"has wer_{decoder}/ metrics but no tag {tag}: the decoder's settings (LM, context) are unknown"
    try:
        value = json.loads(text)
    except ValueError as e:
        return row, f"tag {tag} is not JSON ({e}): the decoder's settings are unknown"
    if not isinstance(value, dict):
        return row, f"tag {tag} holds {type(value).__name__}, not a JSON object: the decoder's settings are unknown"
    row.update({k: str(value[k]) for k in DECODER_SETTINGS if value.get(k) is not None})
    row["settings"] = json.dumps(value, sort_keys=True)
    return row, ""


def _evaluation_rows(rec: RunRecord) -> list[dict[str, Any]]:
    from asr_core.contract.evaluation import parse_evaluation_tag

    out = []
    for key, value in sorted(rec.tags.items()):
        parsed = parse_evaluation_tag(key, value)
        if parsed is None:
            continue
        job, name, conditions, setting = parsed
        for dataset, conds in conditions.items():
            out += [{"run_id": rec.run_id, "evaluation": name, "job": job, "dataset": dataset,
                     "condition": condition_name(c), "setting": json.dumps(setting, sort_keys=True)} for c in conds]
    return out


def _head_rows(rec: RunRecord) -> list[dict[str, Any]]:
    out = []
    for key, value in rec.metrics.items():
        m = HEADS_METRIC_RE.match(key)
        if m:
            stat, layer = m.group("stat"), m.group("layer")
            out.append({"run_id": rec.run_id, "dataset": m.group("dataset"), "representation": m.group("repr"),
                        "statistic": "layer" if layer is not None else stat,
                        "layer": int(layer) if layer is not None else math.nan, "value": float(value)})
    return out


def _lm_ppl_rows(rec: RunRecord) -> list[dict[str, Any]]:
    name = rec.tags.get("mlflow.runName") or rec.run_id[:8]
    out = []
    for key, value in rec.metrics.items():
        m = LM_PPL_RE.match(key)
        if m:
            out.append({"lm_run": rec.run_id, "lm_name": name, "dataset": m.group("dataset"),
                        "lm_context": int(m.group("context")), "ppl": float(value)})
    return out


def _problem(rec: RunRecord, label: str, text: str) -> dict[str, Any]:
    return {"run_id": rec.run_id, "label": label, "status": rec.status, "problem": text}


def _read_table(text: str, dataset: str) -> tuple[pd.DataFrame, str]:
    """Parse one eval CSV; returns (table, "") or (empty, why it is unusable)."""
    try:
        df = pd.read_csv(io.StringIO(text), dtype={"recording": str, "condition": str, "dataset": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        return pd.DataFrame(), f"cannot be parsed ({type(e).__name__}: {e})"
    missing = [c for c in EVAL_CSV_COLUMNS if c not in df.columns]
    if missing:
        return pd.DataFrame(), f"lacks columns {missing} (has {list(df.columns)})"
    cue = {c: pd.to_numeric(df[c], errors="coerce") if c in df.columns else math.nan for c in CUE_COLUMNS}
    df = df[list(EVAL_CSV_COLUMNS)].assign(**cue)
    for c in COUNT_COLUMNS + ("wer",):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    bad = df[df[list(COUNT_COLUMNS)].isna().any(axis=1)]
    if len(bad):
        return pd.DataFrame(), f"has non-numeric counts for recordings {bad['recording'].tolist()[:5]}"
    other = sorted(set(df["dataset"]) - {dataset})
    if other:
        return pd.DataFrame(), f"holds rows of other datasets {other}"
    # canonical condition names, so that 'snr10.0' in a table matches the metric key 'snr10'
    snr = pd.to_numeric(df["snr_db"], errors="coerce")
    keys = df["condition"].astype(str) + "|" + snr.astype(str)  # NaN is no dict key: compare as text
    canon = {}
    for key, c, s in zip(keys, df["condition"].astype(str), snr):
        if key not in canon:
            canon[key] = CLEAN if c == CLEAN else condition_name(s if not math.isnan(s) else _snr_of(c))
    df["condition"] = keys.map(canon)
    df["errors"] = df["substitutions"] + df["deletions"] + df["insertions"]
    return df.drop(columns=["snr_db"]), ""


def _condition_summary(table: pd.DataFrame) -> dict[str, dict]:
    """Per condition of one eval table: recordings ``n``, corpus ``wer`` (percent) and duplicated recordings."""
    out = {}
    for cond, part in table.groupby("condition", sort=False):
        words = float(part["ref_words"].sum())
        rec = part["recording"]
        out[str(cond)] = {"n": len(part), "wer": 100.0 * float(part["errors"].sum()) / words if words > 0 else math.nan,
                          "dup": rec[rec.duplicated()].tolist()}
    return out


def _snr_of(condition: str) -> float:
    m = re.fullmatch(r"snr([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)", condition)
    return float(m.group(1)) if m else math.nan


def _expected_conditions(kept: list[RunRecord]) -> dict[str, set[tuple[str, str]]]:
    """Per run: the (dataset, condition) pairs that finished runs with the same ``eval.*`` params report."""
    groups: dict[str, set[tuple[str, str]]] = {}
    key_of: dict[str, str] = {}
    for rec in kept:
        key = _digest({k: v for k, v in rec.params.items() if k.startswith("eval.")})
        key_of[rec.run_id] = key
        pairs = {(p[0], p[1]) for p in map(parse_metric_key, rec.metrics) if p}
        groups.setdefault(key, set()).update(pairs)
    return {rid: groups[key] for rid, key in key_of.items()}


def _name_configs(trials: pd.DataFrame) -> pd.DataFrame:
    """One ``config`` name per ``config_id``; configurations whose labels coincide get their digest appended."""
    trials = trials.copy()
    first = trials.groupby("config_id")["config"].first()
    clash = first.duplicated(keep=False)
    names = {cid: f"{name}#{cid[:6]}" if clash[cid] else name for cid, name in first.items()}
    trials["config"] = trials["config_id"].map(names)
    return trials


def _name_series(trials: pd.DataFrame, params: pd.DataFrame) -> pd.DataFrame:
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


# ---- MLflow ----------------------------------------------------------------------------------------------------

def _experiment_id(client: Any, uri: str, name: str, what: str = "MLflow experiment") -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CollectError(f"no {what} named {name!r} at {uri}; experiments there: "
                           + (", ".join(repr(n) for n in names) or "none"))
    return exp.experiment_id


def _search_all(client: Any, experiment_id: str) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def fetch_records(experiment: str, tracking_uri: str | None = None, *, progress: bool = True,
                  lm_experiments: Iterable[str] = ()) -> list[RunRecord]:
    """Every run of the experiment named ``experiment`` with its eval CSVs (downloaded to a temporary folder); then
    the LM runs its decoders name that lie elsewhere, and the LM runs (those with ``lm_ppl/`` metrics) of the
    experiments ``lm_experiments``."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    exp_id = _experiment_id(client, uri, experiment)
    lm_ids = [_experiment_id(client, uri, name, "LM experiment (--lm-experiment)") for name in lm_experiments]
    runs = _search_all(client, exp_id)
    log.info("experiment %r: %d runs at %s", experiment, len(runs), uri)
    bar = _progress(runs, progress, "reading runs")
    # one progress bar for the runs, not one per downloaded folder
    quiet = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        records = _read_runs(client, uri, bar)
    finally:
        if quiet is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = quiet
    have = {r.run_id for r in records}
    extra = []
    for run_id in sorted(decoder_lm_runs(records) - have):
        try:
            extra.append(client.get_run(run_id))
        except MlflowException as e:  # deleted, or logged to another server: the report says it has no perplexity
            log.warning("LM run %s named by a decoder cannot be read at %s: %s", run_id, uri, str(e)[:200])
    for lm_id in lm_ids:
        extra.extend(r for r in _search_all(client, lm_id) if any(k.startswith("lm_ppl/") for k in r.data.metrics))
    for run in extra:
        if run.info.run_id not in have:
            have.add(run.info.run_id)
            records.append(RunRecord(run.info.run_id, run.info.status, dict(run.data.tags), dict(run.data.params),
                                     dict(run.data.metrics)))
    return records


def _read_runs(client: Any, uri: str, runs: Iterable[Any]) -> list[RunRecord]:
    import mlflow

    records = []
    with tempfile.TemporaryDirectory(prefix="analysis-") as tmp:
        for run in runs:
            tags, rid = dict(run.data.tags), run.info.run_id
            tables: dict[str, str] = {}
            if tags.get(TAG_ROLE) == ROLE_TRIAL and run.info.status == FINISHED:
                names = [f.path for f in client.list_artifacts(rid, "eval") if f.path.endswith(".csv")]
                if names:
                    local = Path(mlflow.artifacts.download_artifacts(run_id=rid, artifact_path="eval",
                                                                     dst_path=str(Path(tmp) / rid),
                                                                     tracking_uri=uri))
                    for name in names:
                        path = local / Path(name).name
                        tables[Path(name).stem] = path.read_text(encoding="utf-8", errors="replace")
            records.append(RunRecord(rid, run.info.status, tags, dict(run.data.params), dict(run.data.metrics),
                                     tables))
    return records


def _progress(items: list[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled or len(items) < 2:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="run", leave=False)


def collect(experiment: str, tracking_uri: str | None = None, *, ignore_params: Iterable[str] = (),
            progress: bool = True, lm_experiments: Iterable[str] = ()) -> Sweep:
    """Read sweep ``experiment`` from MLflow at ``tracking_uri`` (default: MLflow's own) into a :class:`Sweep`;
    ``lm_experiments``: experiments whose LM runs' perplexities are read too (:func:`fetch_records`)."""
    records = fetch_records(experiment, tracking_uri, progress=progress, lm_experiments=lm_experiments)
    return build_sweep(experiment, records, ignore_params=ignore_params)
