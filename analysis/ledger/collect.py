"""Turn a sweep's MLflow runs into tidy pandas DataFrames (docs/ARCHITECTURE.md, "MLflow ledger schema"):
:func:`collect` reads the runs (:mod:`analysis.ledger.fetch`) and :func:`build_sweep` builds the :class:`Sweep`.

One experiment per sweep; one child run per trial (tag ``sweep.role=trial``) whose params are the flattened
config; metrics ``wer/<DATASET>`` and ``wer/<DATASET>/snr<DB>`` in percent; artifact ``eval/<DATASET>.csv`` with
one row per recording and condition (every name as :mod:`asr_core.contract.metrics` builds and parses it).
Nothing is dropped silently: every run that is unfinished, lacks a metric, lacks its per-recording table, or whose
table disagrees with its metric is listed in :attr:`Sweep.problems`.

Identity of what is compared (:mod:`analysis.ledger.naming`):

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
A window fusion method (paper 001, ``fusion-<METHOD>``; greedy is the averaging method) and greedy decoding at another
window than trained (``window-<W:g>s``) are read as beam decoders are: :attr:`Sweep.beam_decoders` leaves them out,
:attr:`Sweep.fusion_decoders` and :attr:`Sweep.window_decoders` list them.

Also read: head similarity (``heads/<DATASET>/<R>/sum|similarity|layer<i>``, paper 003) into :attr:`Sweep.heads`,
and LM perplexity (``lm_ppl/<DATASET>/ctx<N>`` on the LM's own run, ``python -m asr_core lm ppl``) into
:attr:`Sweep.lm_ppl`, from LM runs in the sweep's experiment, the LM runs its decoders name (``lm_run`` in their
tag) and every run of the experiments given as ``lm_experiments``.

Datasets with the recall plant (``synth --recall``) have per-slot tables ``eval/<DATASET>[.<DECODER>].slots.csv``
(:data:`asr_core.contract.metrics.SLOT_COLUMNS`): read into :attr:`Sweep.slots` for the runs whose per-recording
tables are read.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import pandas as pd

from analysis.ledger.cache import TableCache
from analysis.ledger.fetch import CollectError, RunRecord, fetch_records, is_lm_run
from analysis.ledger.naming import (CONTEXT_PARAM, SEED_PARAM, config_label, digest, name_configs, name_series, number,
                             science_params, seed_of)
from analysis.ledger.tables import condition_summary, read_slot_table, read_table
from asr_core.contract.metrics import (CLEAN, CUE_COLUMNS, GREEDY, SLOT_COLUMNS, TABLE_COLUMNS, TAIL_COLUMNS,
                                       condition_name, decoder_tag, fusion_method, metric_name,
                                       parse_decoder_metric_key, parse_heads_key, parse_lm_ppl_key, parse_metric_key,
                                       slot_table_name, table_name, window_seconds, WORDS_LOST)
from asr_core.contract.trial import (FINISHED, ROLE_EXTERNAL, ROLE_PARENT, ROLE_TRIAL, TAG_ERROR, TAG_KERNELS,
                                     TAG_LABEL, TAG_RECEPTIVE_FIELD, TAG_ROLE, TAG_SUBGRIDS, TAG_SYSTEM)

log = logging.getLogger(__name__)

NO_FAMILY = "(none)"
# a metric and the corpus WER recomputed from its table may differ by rounding only
METRIC_TOLERANCE_PTS = 0.05
# a finished run whose clean greedy WER is at least this on every dataset wrote (almost) nothing: a model that never
# left the CTC blank plateau. Listed under problems, kept in the tables (it is what that seed trained)
NOTHING_LEARNED_WER = 99.0

TRIAL_COLUMNS = ["run_id", "label", "config", "config_id", "series", "series_id", "families", "seed", "status",
                 "context_s", "layers", "d_model", "heads", "posenc", "rotary_theta", "error", "kernels", "cut",
                 "words_lost_pct", "receptive_field_s"]
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
# one row per finished run, decoder, dataset, condition and recall slot (the per-slot tables)
SLOT_FRAME_COLUMNS = ["run_id", "dataset", "decoder", *SLOT_COLUMNS]


def greedy_rows(frame: pd.DataFrame, decoder: str = GREEDY) -> pd.DataFrame:
    """The rows of ``frame`` (:attr:`Sweep.wer`, :attr:`Sweep.recordings`) decoded by ``decoder``, without the
    ``decoder`` column: what code that assumes one WER per trial, dataset and condition reads. A frame without the
    column (built before decoders were collected) is all greedy."""
    if "decoder" not in frame.columns:
        return frame if decoder == GREEDY else frame.iloc[0:0]
    return frame[frame["decoder"] == decoder].drop(columns="decoder")


@dataclass(frozen=True)
class Sweep:
    """A sweep as DataFrames.

    * ``trials``: one row per trial run, whatever its status (:data:`TRIAL_COLUMNS`);
    * ``wer``: one row per finished run, decoder, dataset and condition: the run's corpus WER metric (``wer``,
      percent), the WER recomputed from its table (``wer_table``) and its recording count; ``decoder`` is
      ``greedy``, a beam decoder's or a window fusion method's (``fusion-<METHOD>``) name (:func:`greedy_rows`);
    * ``recordings``: the tidy frame, one row per finished run, decoder, dataset, condition and recording, with the
      trial columns, the counts of ``eval/<DATASET>[.<DECODER>].csv`` and ``errors`` = S + D + I; the cue and
      tail counts (:data:`CUE_COLUMNS`, :data:`TAIL_COLUMNS`) are NaN where a table lacks them;
    * ``problems``: ``run_id, label, status, problem`` for everything left out or suspicious;
    * ``params``: the runs' params (strings), one row per run, for describing how series differ;
    * ``external``: other systems' WERs (:data:`EXTERNAL_COLUMNS`), one row per system, dataset and condition;
    * ``decoders``: one row per finished run and beam decoder, its settings from the tag ``eval.decoder.<D>``
      (:data:`DECODER_COLUMNS`; ``settings`` the tag's JSON);
    * ``heads``: head similarity (:data:`HEAD_COLUMNS` and the trial columns), one row per finished run, dataset,
      representation (A, Q, K, V, Y) and statistic (``sum``, ``similarity``, ``layer`` with its ``layer``);
    * ``lm_ppl``: LM perplexity per token (:data:`LM_PPL_COLUMNS`), one row per LM run, dataset and LM context;
    * ``evaluations``: which evaluation measured what on each finished run (:data:`EVALUATION_COLUMNS`), from the
      runs' ``eval.evaluation.<id>`` tags (none on runs made before evaluations were recorded);
    * ``slots``: the recall plant's per-slot rows (:data:`SLOT_FRAME_COLUMNS` and the trial columns), one row per
      finished run, decoder, dataset, condition and slot; empty for a sweep without the plant.
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
    slots: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SLOT_FRAME_COLUMNS))

    @property
    def families(self) -> list[str]:
        return sorted({f for fams in self.trials["families"] for f in fams.split(",") if f})

    @property
    def datasets(self) -> list[str]:
        """The datasets of the greedy results (every trial's own evaluation)."""
        wer = greedy_rows(self.wer)
        return sorted(wer["dataset"].unique()) if len(wer) else []

    @property
    def beam_decoders(self) -> list[str]:
        """The beam decoders some finished run has results of, sorted (not greedy, ``fusion-*`` or ``window-*``)."""
        names = set(self.wer["decoder"]) if "decoder" in self.wer.columns else set()
        return sorted(d for d in names if fusion_method(d) is None and window_seconds(d) is None)

    @property
    def fusion_decoders(self) -> list[str]:
        """The window fusion decoders (``fusion-<METHOD>``, paper 001) some finished run has results of, sorted."""
        names = set(self.wer["decoder"]) if "decoder" in self.wer.columns else set()
        return sorted(d for d in names if d != GREEDY and fusion_method(d) is not None)

    @property
    def window_decoders(self) -> list[str]:
        """The decoders at another window than trained (``window-<W:g>s``) some finished run has results of, by W."""
        names = set(self.wer["decoder"]) if "decoder" in self.wer.columns else set()
        return sorted((d for d in names if window_seconds(d) is not None), key=window_seconds)


# ---- building the frames -------------------------------------------------------------------------------------

@dataclass
class _Parts:
    """What :func:`build_sweep` gathers run by run, before the tables are made."""

    problems: list[dict[str, Any]] = field(default_factory=list)
    trial_rows: list[dict[str, Any]] = field(default_factory=list)
    external_rows: list[dict[str, Any]] = field(default_factory=list)
    lm_rows: list[dict[str, Any]] = field(default_factory=list)
    kept: list[RunRecord] = field(default_factory=list)
    wer_rows: list[dict[str, Any]] = field(default_factory=list)
    rec_frames: list[pd.DataFrame] = field(default_factory=list)
    decoder_rows: list[dict[str, Any]] = field(default_factory=list)
    head_rows: list[dict[str, Any]] = field(default_factory=list)
    evaluation_rows: list[dict[str, Any]] = field(default_factory=list)
    slot_frames: list[pd.DataFrame] = field(default_factory=list)


def build_sweep(experiment: str, records: Iterable[RunRecord], *, ignore_params: Iterable[str] = ()) -> Sweep:
    """Turn run records into a :class:`Sweep` (pure; :func:`collect` fetches the records from MLflow).

    ``ignore_params``: params that may differ between the seeds of one configuration (e.g. a per-trial output
    path) and must not split it.
    """
    records = list(records)
    parts = _Parts()
    seen: set[str] = set()
    for rec in records:
        if rec.run_id not in seen:  # a run given twice counts once
            seen.add(rec.run_id)
            _sort_run(rec, {SEED_PARAM, *ignore_params}, parts)
    trials = pd.DataFrame(parts.trial_rows, columns=TRIAL_COLUMNS)
    if len(trials) == 0:
        raise CollectError(f"experiment {experiment!r} has no trial runs (tag sweep.role=trial)")
    # one configuration's seeds may come from grids with other sub-grids (a trial a later grid shares): each run
    # takes the union of its configuration's families, so no table splits the seeds of one configuration
    union = trials.groupby("config_id")["families"].agg(lambda f: ",".join(sorted({x for v in f for x in v.split(",")
                                                                                  if x != NO_FAMILY} or {NO_FAMILY})))
    trials = name_configs(trials.assign(families=trials["config_id"].map(union)))
    params = pd.DataFrame([{"run_id": r.run_id, **science_params(r.params, named=True)} for r in records
                           if r.tags.get(TAG_ROLE) == ROLE_TRIAL]).set_index("run_id")
    trials = name_series(trials, params)
    labels = trials.set_index("run_id")["label"]
    expected = _expected_conditions(parts.kept)
    for rec in parts.kept:
        _read_results(rec, labels.loc[rec.run_id], expected[rec.run_id], parts)
    return _assemble(experiment, trials, params, parts)


def _sort_run(rec: RunRecord, ignored: set[str], parts: _Parts) -> None:
    """First pass over one run: parent runs skipped, LM and external runs to their rows, a trial to its row and,
    when finished with a seed and a context, to the runs whose results are read (``parts.kept``)."""
    role = rec.tags.get(TAG_ROLE)
    if role == ROLE_PARENT:
        return
    if role is None and is_lm_run(rec):
        parts.lm_rows.extend(_lm_ppl_rows(rec))
        return
    if role == ROLE_EXTERNAL:
        system = rec.tags.get(TAG_SYSTEM) or rec.run_id[:8]
        for key, value in sorted(rec.metrics.items()):
            if (parsed := parse_metric_key(key)) is not None:
                parts.external_rows.append({"system": system, "run_id": rec.run_id, "status": rec.status,
                                            "dataset": parsed[0], "condition": parsed[1], "snr_db": parsed[2],
                                            "wer": float(value)})
        return
    label = rec.tags.get(TAG_LABEL) or rec.tags.get("mlflow.runName") or rec.run_id[:8]
    if role != ROLE_TRIAL:
        parts.problems.append(_problem(rec, label, f"not a trial run (tag {TAG_ROLE}={role!r}); ignored"))
        return
    row = _trial_row(rec, label, ignored)
    parts.trial_rows.append(row)
    if rec.status != FINISHED:
        detail = f": {rec.tags[TAG_ERROR]}" if rec.tags.get(TAG_ERROR) else ""
        parts.problems.append(_problem(rec, label, f"run is {rec.status}{detail}; left out of every table"))
    elif row["seed"] is None:
        parts.problems.append(_problem(rec, label, "no seed (tag trial.seed / param train.seed); left out"))
    elif math.isnan(row["context_s"]):
        parts.problems.append(_problem(rec, label, f"no param {CONTEXT_PARAM}; left out"))
    else:
        parts.kept.append(rec)


def _trial_row(rec: RunRecord, label: str, ignored: set[str]) -> dict[str, Any]:
    """One :data:`TRIAL_COLUMNS` row of a trial run (its configuration and series named later)."""
    seed = seed_of(rec.tags, rec.params)
    config_params = {k: v for k, v in science_params(rec.params).items() if k not in ignored}
    series_params = {k: v for k, v in config_params.items() if k != CONTEXT_PARAM}
    # no params logged yet: the label (minus seed) is the best identity available
    config_id = digest(config_params) if rec.params else "label:" + config_label(label, seed)
    families = ",".join(sorted(f.strip() for f in rec.tags.get(TAG_SUBGRIDS, "").split(",") if f.strip()))
    return {
        "run_id": rec.run_id, "label": label, "config": config_label(label, seed), "config_id": config_id,
        "series": "", "series_id": digest(series_params) if rec.params else config_id,
        "families": families or NO_FAMILY, "seed": seed, "status": rec.status,
        "context_s": number(rec.params.get(CONTEXT_PARAM)),
        "layers": number(rec.params.get("model.layers"), int),
        "d_model": number(rec.params.get("model.d_model"), int),
        "heads": number(rec.params.get("model.heads"), int),
        "posenc": rec.params.get("model.posenc", ""),
        "rotary_theta": number(rec.params.get("model.rotary_theta")),
        "error": rec.tags.get(TAG_ERROR, ""),
        "kernels": rec.tags.get(TAG_KERNELS, ""),  # the CPU kernel levels that trained it ("" before recorded)
        "cut": rec.params.get("data.cut", "fixed"),  # runs made before the option cut at fixed multiples
        "words_lost_pct": float(rec.metrics.get(WORDS_LOST, math.nan)),  # what the training cuts drop
        "receptive_field_s": number(rec.tags.get(TAG_RECEPTIVE_FIELD)),  # each side; NaN: the whole window
    }


def _read_results(rec: RunRecord, label: str, expected: set[tuple[str, str]], parts: _Parts) -> None:
    """Second pass over a kept run: its WER metrics of every decoder, checked against its per-recording tables
    (``expected``: the (dataset, condition) pairs runs with its eval settings have), its head, evaluation and slot
    rows, and what is wrong, into ``parts``."""
    parts.head_rows.extend(_head_rows(rec))
    parts.evaluation_rows.extend(_evaluation_rows(rec))
    have: dict[tuple[str, str, str], tuple[float, float]] = {}  # (decoder, dataset, condition) -> (wer, snr)
    for key, value in rec.metrics.items():
        parsed = parse_decoder_metric_key(key)
        if parsed:
            have[parsed[:3]] = (float(value), parsed[3])
    if not any(dec == GREEDY for dec, _, _ in have):
        parts.problems.append(_problem(rec, label, "FINISHED but has no wer/ metrics; left out"))
        return
    clean = {d: w for (dec, d, c), (w, _) in have.items() if dec == GREEDY and c == CLEAN}
    if clean and min(clean.values()) >= NOTHING_LEARNED_WER:
        parts.problems.append(_problem(rec, label, "clean WER " + ", ".join(f"{d} {w:.1f}%" for d, w in sorted(
              clean.items())) + ": the model has not learned to transcribe (as one that never left the CTC blank "
              "plateau, writing almost nothing); kept in the tables, but retrain it (another seed, a longer warmup) "
              "before reading anything into its context length"))
    for ds, cond in sorted(expected - {(d, c) for dec, d, c in have if dec == GREEDY}):
        parts.problems.append(_problem(rec, label, f"lacks metric {metric_name(ds, cond)} that runs with the same "
                                               f"eval settings have"))
    decoders = sorted({dec for dec, _, _ in have} - {GREEDY})
    for dec in decoders:
        row, why = _decoder_settings(rec, dec)
        parts.decoder_rows.append(row)
        if why:
            parts.problems.append(_problem(rec, label, why))
    tables: dict[tuple[str, str], pd.DataFrame] = {}
    for dec, ds in sorted({(dec, d) for dec, d, _ in have}):
        name = table_name(ds, dec)
        if name not in rec.tables:
            what = ds if dec == GREEDY else f"{ds} decoded by {dec}"
            parts.problems.append(_problem(rec, label, f"no artifact eval/{name}.csv: no per-recording counts, so "
                                                   f"{what} is left out of the significance tests for this run"))
            continue
        table, why = read_table(rec.tables[name], ds)
        if why:
            parts.problems.append(_problem(rec, label, f"eval/{name}.csv {why}; left out of the significance tests"))
            continue
        tables[(dec, ds)] = table
        slot_name = slot_table_name(ds, dec)
        if slot_name in rec.tables:
            slot_table, why = read_slot_table(rec.tables[slot_name])
            if why:
                parts.problems.append(_problem(rec, label, f"eval/{slot_name}.csv {why}; left out of the recall "
                                                       "control"))
            else:
                parts.slot_frames.append(slot_table.assign(run_id=rec.run_id, dataset=ds, decoder=dec))
    # per table, one pass: sums and duplicate checks per condition, then the usable rows in one slice
    summary = {key: condition_summary(t) for key, t in tables.items()}
    usable: dict[tuple[str, str], dict[str, float]] = {}
    for (dec, ds, cond), (value, snr) in sorted(have.items()):
        row = {"run_id": rec.run_id, "dataset": ds, "condition": cond, "snr_db": snr, "decoder": dec,
               "wer": value, "wer_table": math.nan, "n_recordings": 0}
        name, metric = table_name(ds, dec), metric_name(ds, cond, dec)
        if (dec, ds) in summary:
            info = summary[(dec, ds)].get(cond)
            if info is None:
                parts.problems.append(_problem(rec, label, f"eval/{name}.csv has no rows for condition {cond}; left "
                                                       f"out of the significance tests for {ds}/{cond}"
                                                       + ("" if dec == GREEDY else f" decoded by {dec}")))
            elif info["dup"]:
                parts.problems.append(_problem(rec, label, f"eval/{name}.csv lists recordings {info['dup'][:5]} "
                                                       f"twice under {cond}; left out of the significance tests"))
            else:
                row["wer_table"], row["n_recordings"] = info["wer"], info["n"]
                if not abs(info["wer"] - value) <= METRIC_TOLERANCE_PTS:
                    parts.problems.append(_problem(
                          rec, label, f"metric {metric} = {value:.3f} but eval/{name}.csv gives "
                                      f"{info['wer']:.3f}; the table is used for tests"))
                usable.setdefault((dec, ds), {})[cond] = snr
        parts.wer_rows.append(row)
    for (dec, ds), conds in usable.items():
        t = tables[(dec, ds)]
        part = t[t["condition"].isin(list(conds))]
        parts.rec_frames.append(part.assign(run_id=rec.run_id, snr_db=part["condition"].map(conds).astype(float),
                                      decoder=dec))


def _assemble(experiment: str, trials: pd.DataFrame, params: pd.DataFrame, parts: _Parts) -> Sweep:
    """The :class:`Sweep` of the gathered ``parts``."""
    info_cols = [c for c in TRIAL_COLUMNS
                 if c not in ("status", "error", "kernels", "cut", "words_lost_pct", "receptive_field_s")]
    wer = trials[info_cols].merge(pd.DataFrame(parts.wer_rows, columns=WER_COLUMNS), on="run_id", how="inner")
    if parts.rec_frames:
        recs = pd.concat(parts.rec_frames, ignore_index=True)
        parts.rec_frames.clear()
        recs = as_categories(as_categories(trials[info_cols]).merge(as_categories(recs), on="run_id", how="inner"))
    else:
        recs = pd.DataFrame(columns=info_cols + list(TABLE_COLUMNS) + list(CUE_COLUMNS) + list(TAIL_COLUMNS)
                            + ["errors", "decoder"])
    prob = pd.DataFrame(parts.problems, columns=["run_id", "label", "status", "problem"])
    prob = prob.sort_values(["label", "problem"], kind="stable").reset_index(drop=True)
    external = pd.DataFrame(parts.external_rows, columns=EXTERNAL_COLUMNS)
    heads = trials[info_cols].merge(pd.DataFrame(parts.head_rows, columns=HEAD_COLUMNS), on="run_id", how="inner")
    lm_ppl = pd.DataFrame(parts.lm_rows, columns=LM_PPL_COLUMNS).sort_values(["lm_name", "lm_run", "dataset",
                                                                        "lm_context"]).reset_index(drop=True)
    slots = pd.concat(parts.slot_frames, ignore_index=True)[SLOT_FRAME_COLUMNS] if parts.slot_frames else \
        pd.DataFrame(columns=SLOT_FRAME_COLUMNS)
    slots = trials[info_cols].merge(slots, on="run_id", how="inner")
    return Sweep(experiment, trials, wer, recs, prob, params, external,
                 pd.DataFrame(parts.decoder_rows, columns=DECODER_COLUMNS), heads, lm_ppl,
                 pd.DataFrame(parts.evaluation_rows, columns=EVALUATION_COLUMNS), slots)


def as_categories(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its text columns as pandas categories: the per-recording frame repeats each run's names (run,
    label, configuration, series, family) and each dataset's recording names on every row, about 2.5 million rows
    at 3,000 runs, where a category stores each distinct name once and a small integer per row (a third of the
    memory). Values, comparisons, grouping (observed categories only) and lexical sorting read the same."""
    text = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])
            and not isinstance(frame[c].dtype, pd.CategoricalDtype)]
    return frame.astype({c: "category" for c in text}) if text else frame


def _decoder_settings(rec: RunRecord, decoder: str) -> tuple[dict[str, Any], str]:
    """One :data:`DECODER_COLUMNS` row from the run's tag ``eval.decoder.<decoder>``, and what is wrong with the tag
    ("" when nothing)."""
    row: dict[str, Any] = {"run_id": rec.run_id, "decoder": decoder, **dict.fromkeys(DECODER_SETTINGS, ""),
                           "settings": ""}
    tag = decoder_tag(decoder)
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
        parsed = parse_heads_key(key)
        if parsed:
            dataset, representation, statistic, layer = parsed
            out.append({"run_id": rec.run_id, "dataset": dataset, "representation": representation,
                        "statistic": statistic, "layer": layer if layer is not None else math.nan,
                        "value": float(value)})
    return out


def _lm_ppl_rows(rec: RunRecord) -> list[dict[str, Any]]:
    name = rec.tags.get("mlflow.runName") or rec.run_id[:8]
    out = []
    for key, value in rec.metrics.items():
        parsed = parse_lm_ppl_key(key)
        if parsed:
            out.append({"lm_run": rec.run_id, "lm_name": name, "dataset": parsed[0], "lm_context": parsed[1],
                        "ppl": float(value)})
    return out


def _problem(rec: RunRecord, label: str, text: str) -> dict[str, Any]:
    return {"run_id": rec.run_id, "label": label, "status": rec.status, "problem": text}


def _expected_conditions(kept: list[RunRecord]) -> dict[str, set[tuple[str, str]]]:
    """Per run: the (dataset, condition) pairs that finished runs with the same ``eval.*`` params report."""
    groups: dict[str, set[tuple[str, str]]] = {}
    key_of: dict[str, str] = {}
    for rec in kept:
        key = digest({k: v for k, v in rec.params.items() if k.startswith("eval.")})
        key_of[rec.run_id] = key
        pairs = {(p[0], p[1]) for p in map(parse_metric_key, rec.metrics) if p}
        groups.setdefault(key, set()).update(pairs)
    return {rid: groups[key] for rid, key in key_of.items()}


def collect(experiment: str, tracking_uri: str | None = None, *, ignore_params: Iterable[str] = (),
            progress: bool = True, lm_experiments: Iterable[str] = (), cache: TableCache | None = None) -> Sweep:
    """Read sweep ``experiment`` from MLflow at ``tracking_uri`` (default: MLflow's own) into a :class:`Sweep`;
    ``lm_experiments``: experiments whose LM runs' perplexities are read too (:func:`fetch_records`); ``cache``:
    where finished runs' tables are kept between reads (:mod:`analysis.ledger.cache`)."""
    records = fetch_records(experiment, tracking_uri, progress=progress, lm_experiments=lm_experiments, cache=cache)
    return build_sweep(experiment, records, ignore_params=ignore_params)
