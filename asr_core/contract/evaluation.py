"""The contract of an evaluation job: a trained model decoded and scored again, without training it again.

A sweep trains each model once. Its *default evaluation* is the grid's ``eval:`` section, run by the trial job at
the end of training (``wer/<dataset>[/snr<DB>]``, tables ``eval/<dataset>.csv``). Every later evaluation (another
test set, more SNRs, a beam decoder with an LM) is an **evaluation job**: a folder of its own in the sweep
(``<sweep>/trials/<evaluation key>/``, the key :func:`asr_core.contract.identity.evaluation_key`: the model key, a dash and
8 hex digits), run by the same command as a trial (:func:`asr_core.contract.trial.trial_command`) with the same
lease, outbox, attempts, progress and exit codes, and told apart by :data:`EVALUATION_FILE` in its folder.

What an evaluation job must hold to (both sides import this module; neither re-derives it):

* it reads the model's checkpoint and never writes it (no optimizer drop, no training);
* it logs into the model's MLflow run (the run id of its command) metrics and tables only: never the run's status,
  params or segment tags, which are the training's;
* it decodes exactly :attr:`EvaluationSpec.conditions` (dataset name → clean and/or SNRs), so nothing already
  measured is measured again, and logs each dataset's table merged with the tables the model already has
  (:func:`merge_tables`), so ``eval/<dataset>.csv`` always holds every condition measured: the merge and the upload
  run under the model's lock (:data:`TABLES_LOCK_FILE`, beside the model's folder), against the table the run holds at
  that moment and every local table of the model's evaluations, so jobs of one model running at once lose no row;
* it reads the model's checkpoint once, checked against the model's ``TRAINED`` record and key, and records what it
  read: :attr:`EvaluationSpec.checkpoint_sha256` and ``checkpoint_step`` in its ``evaluation.json``, the run's tags
  :func:`checkpoint_tags`, and :data:`CHECKPOINT_COLUMN` in each row it measured; rows of another checkpoint are
  never merged with its own;
* one name is one setting: the *fixed* setting (:func:`greedy_setting` for the default evaluation: stride,
  precision, noise) may not change under a name that has results; datasets and SNRs may grow.

This module imports neither torch nor mlflow: ``orchestrate`` reads it on every ``submit`` and ``status``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Mapping, Sequence

from asr_core.contract.atomic import write_atomic, write_with

EVALUATION_FILE = "evaluation.json"  # in an evaluation job's folder: its EvaluationSpec
DEFAULT_EVALUATION = "greedy"  # the grid's eval section: greedy CTC, metrics wer/..., tables eval/<dataset>.csv
# A tag on the model's run per evaluation that ran: <prefix><id> = JSON {name, conditions, setting}; id ``own`` for
# the trial job's own (default) evaluation, the evaluation key's last 8 digits for a job. analysis reads them to say
# which evaluation each of its tables uses.
EVALUATION_TAG_PREFIX = "eval.evaluation."
OWN_EVALUATION = "own"
# The checkpoint an evaluation read, on the model's run: eval.<id>.checkpoint_sha256 and eval.<id>.checkpoint_step
# (id as in EVALUATION_TAG_PREFIX's tags); in its tables, the column CHECKPOINT_COLUMN of each row it measured
CHECKPOINT_SHA_TAG = "eval.{}.checkpoint_sha256"
CHECKPOINT_STEP_TAG = "eval.{}.checkpoint_step"
CHECKPOINT_COLUMN = "checkpoint_sha256"
# beside the model's trial folder (``trials/.<model key>.eval-tables.lock``; the model's folder is never written):
# flock'ed while one of its evaluation jobs merges and uploads its tables
TABLES_LOCK_FILE = ".{}.eval-tables.lock"
# in an evaluation job's eval/: the tables of what it measured itself, before they are merged into eval/<table>
MEASURED_DIR = "measured"

Condition = float | None  # None: clean audio; a number: music at that SNR in dB
Conditions = dict[str, tuple[Condition, ...]]  # dataset name -> conditions, clean first then SNRs ascending


def _sorted_conditions(conds: Iterable[Condition]) -> tuple[Condition, ...]:
    s = set(conds)
    return ((None,) if None in s else ()) + tuple(sorted(float(c) for c in s if c is not None))


def conditions_of(datasets: Iterable[str], snrs: Iterable[float], noisy: Iterable[str] = ()) -> Conditions:
    """What an evaluation section decodes: every dataset clean, and at each SNR those named in ``noisy`` (none
    named: every dataset) — the rule of :func:`asr_core.evaluation.evaluate.evaluate`. ``datasets``: names or specs."""
    from asr_core.contract.specs import dataset_name

    names = [dataset_name(d) for d in datasets]
    noisy = set(noisy)
    return {n: _sorted_conditions([None, *(snrs if not noisy or n in noisy else ())]) for n in names}


def conditions_lacking(wanted: Mapping[str, Iterable[Condition]], have: Mapping[str, Iterable[Condition]]
                       ) -> Conditions:
    """The conditions of ``wanted`` that ``have`` lacks, datasets with none left out."""
    out: Conditions = {}
    for name, conds in wanted.items():
        left = set(conds) - set(have.get(name, ()))
        if left:
            out[name] = _sorted_conditions(left)
    return out


def conditions_union(*parts: Mapping[str, Iterable[Condition]]) -> Conditions:
    out: dict[str, set[Condition]] = {}
    for p in parts:
        for name, conds in p.items():
            out.setdefault(name, set()).update(conds)
    return {n: _sorted_conditions(c) for n, c in out.items()}


def conditions_json(c: Mapping[str, Iterable[Condition]]) -> dict[str, list[float | None]]:
    return {n: list(_sorted_conditions(v)) for n, v in sorted(c.items())}


def greedy_setting(stride: float, precision: str, noise: str) -> dict[str, Any]:
    """The fixed setting of a greedy evaluation: what must stay the same for its results to stay comparable (the
    noise by name, as in keys: :func:`asr_core.contract.identity.identity_value`)."""
    from asr_core.contract.identity import identity_value

    return {"decoder": "greedy", "stride": float(stride), "precision": precision,
            "noise": identity_value("eval.noise", noise)}


def default_evaluation(ev: Any) -> tuple[Conditions, dict[str, Any]]:
    """(conditions, fixed setting) of an eval section (:class:`asr_core.config.EvalConfig`): what the default
    evaluation of a model with it decodes, and how."""
    return conditions_of(ev.datasets, ev.snrs, ev.noisy), greedy_setting(ev.stride, ev.precision, ev.noise)


def describe_conditions(conditions: Mapping[str, Iterable[Condition]]) -> str:
    """``dev: snr5; other: clean, snr5``: what an evaluation decodes, for people (conditions named as
    :func:`asr_core.contract.metrics.condition_name` names them)."""
    return "; ".join(f"{n}: {', '.join('clean' if c is None else f'snr{c:g}' for c in _sorted_conditions(cs))}"
                     for n, cs in conditions.items())


def setting_differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``["stride: 0.125 there, 0.25 here", ...]`` for every field of a fixed setting that differs."""
    return [f"{k}: {before.get(k)!r} there, {now.get(k)!r} here" for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)]


@dataclass(frozen=True)
class EvaluationSpec:
    """One evaluation job (``evaluation.json``): which model, under which name and setting, on what.

    ``datasets``: the ``NAME=FORMAT:PATH`` specs to read; ``conditions``: what to decode of each (by name);
    ``decoder``: None for greedy CTC; with ``windows`` (seconds) greedy decoding at those windows; with ``fusion`` (a
    list of window fusion methods) greedy decoding joined each
    of those ways; else the beam decoder's resolved setting (``lm``, ``alpha``, ``beta``,
    ``beam_width``, ``lm_context``, ``prompt``, ``stride``: :class:`orchestrate.plan.decode_file.DecodeSpec`)."""

    key: str
    model: str  # the model key
    model_dir: str  # the model's trial folder (its checkpoint.pt is read, never written)
    name: str  # DEFAULT_EVALUATION or a decoder's name
    setting: dict[str, Any]
    datasets: tuple[str, ...]
    conditions: Conditions
    decoder: dict[str, Any] | None = None
    created: float = field(default=0.0, compare=False)
    # what the job read (written by the job once it read the checkpoint; None before)
    checkpoint_sha256: str | None = field(default=None, compare=False)
    checkpoint_step: int | None = field(default=None, compare=False)

    @property
    def checkpoint(self) -> Path:
        from asr_core.contract.trial import CHECKPOINT_FILE

        return Path(self.model_dir) / CHECKPOINT_FILE

    def to_dict(self) -> dict[str, Any]:
        read = {"checkpoint_sha256": self.checkpoint_sha256, "checkpoint_step": self.checkpoint_step}
        return {"key": self.key, "model": self.model, "model_dir": self.model_dir, "name": self.name,
                "setting": self.setting, "datasets": list(self.datasets),
                "conditions": conditions_json(self.conditions), "decoder": self.decoder, "created": self.created,
                **({k: v for k, v in read.items() if v is not None} if self.checkpoint_sha256 else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EvaluationSpec":
        return cls(key=d["key"], model=d["model"], model_dir=d["model_dir"], name=d["name"],
                   setting=dict(d["setting"]), datasets=tuple(d["datasets"]),
                   conditions={n: _sorted_conditions(v) for n, v in d["conditions"].items()},
                   decoder=d.get("decoder"), created=float(d.get("created", 0.0)),
                   checkpoint_sha256=d.get("checkpoint_sha256") or None,
                   checkpoint_step=int(d["checkpoint_step"]) if d.get("checkpoint_step") is not None else None)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return write_atomic(folder / EVALUATION_FILE, json.dumps(self.to_dict(), indent=1))


def read_evaluation(folder: Path | str) -> EvaluationSpec | None:
    """The folder's evaluation spec; None for a training trial's folder (no :data:`EVALUATION_FILE`)."""
    path = Path(folder) / EVALUATION_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return EvaluationSpec.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is unreadable ({type(e).__name__}: {e}); it is written by `orchestrate submit` "
                         "or `orchestrate evaluate`: remove the folder and run that again") from None


def is_evaluation(folder: Path | str) -> bool:
    return (Path(folder) / EVALUATION_FILE).exists()


def evaluation_tag(ident: str, name: str, conditions: Mapping[str, Iterable[Condition]],
                   setting: Mapping[str, Any]) -> dict[str, str]:
    """The tag (one item) recording one evaluation on its model's run (:data:`EVALUATION_TAG_PREFIX`)."""
    return {f"{EVALUATION_TAG_PREFIX}{ident}": json.dumps({"name": name, "conditions": conditions_json(conditions),
                                                           "setting": dict(setting)}, sort_keys=True)}


def checkpoint_tags(ident: str, sha256: str, step: int) -> dict[str, str]:
    """The tags recording the checkpoint evaluation ``ident`` read (:data:`CHECKPOINT_SHA_TAG`)."""
    return {CHECKPOINT_SHA_TAG.format(ident): sha256, CHECKPOINT_STEP_TAG.format(ident): str(step)}


def recorded_checkpoints(tags: Mapping[str, str]) -> dict[str, str]:
    """evaluation id → the sha256 of the checkpoint it read, from a run's tags."""
    head, tail = CHECKPOINT_SHA_TAG.split("{}")
    return {k[len(head):-len(tail)]: v for k, v in tags.items() if k.startswith(head) and k.endswith(tail)
            and len(k) > len(head) + len(tail)}


def parse_evaluation_tag(key: str, value: str) -> tuple[str, str, Conditions, dict[str, Any]] | None:
    """(id, name, conditions, setting) of an evaluation tag; None for another tag or one that does not parse."""
    if not key.startswith(EVALUATION_TAG_PREFIX):
        return None
    try:
        d = json.loads(value)
        return (key[len(EVALUATION_TAG_PREFIX):], str(d["name"]),
                {n: _sorted_conditions(v) for n, v in d["conditions"].items()}, dict(d["setting"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


# ---- what a finished default evaluation covered -----------------------------------------------------------------
def evaluated_record(conditions: Mapping[str, Iterable[Condition]], setting: Mapping[str, Any]) -> str:
    """The text of a trial's ``EVALUATED`` marker: what its own evaluation decoded, and how."""
    return json.dumps({"datasets": sorted(conditions), "conditions": conditions_json(conditions),
                       "setting": dict(setting)})


def read_evaluated(path: Path) -> tuple[Conditions, dict[str, Any]] | None:
    """(conditions, setting) of an ``EVALUATED`` marker; None when absent, or written before it recorded them."""
    try:
        d = json.loads(path.read_text())
        return {n: _sorted_conditions(v) for n, v in d["conditions"].items()}, dict(d["setting"])
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return None


# ---- tables ---------------------------------------------------------------------------------------------------------
TABLE_KEY = ("condition", "recording")  # a per-recording table holds one row per recording and condition


def merge_tables(new: Path, older: Iterable[Path], key: Sequence[str] = TABLE_KEY,
                 missing: Mapping[str, str] | None = None) -> int:
    """Rewrite the table ``new`` so that it also holds the rows of the ``older`` tables of the same dataset and
    decoder that it does not measure itself: rows are told apart by their ``key`` columns (per-recording tables: one
    row per recording and condition; ``new``'s rows win), a key column a row lacks or leaves empty read as
    ``missing``'s value for it (a column added later: what rows written before it meant). Returns the number of rows
    taken over. Tables that are missing or unreadable are skipped, and so are rows cut short (a copy killed midway);
    ``new`` is replaced whole (:func:`asr_core.contract.atomic.write_with`)."""
    with open(new, newline="") as fh:
        reader = csv.DictReader(fh)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    fill = dict(missing or {})

    def key_of(r: Mapping[str, str | None]) -> tuple[str, ...]:
        return tuple(r.get(c) or fill.get(c, "") for c in key)

    seen = {key_of(r) for r in rows}
    taken: list[dict[str, str]] = []
    for p in older:
        try:
            with open(p, newline="") as fh:
                old = list(csv.DictReader(fh))
        except (OSError, csv.Error):
            continue
        for r in old:
            if None in r.values() or None in r:  # a row cut short, or one with more cells than its header
                continue
            k = key_of(r)
            if k not in seen:
                seen.add(k)
                taken.append({c: r.get(c, "") for c in columns})
    if taken:
        def write(fh: BinaryIO) -> None:
            text = io.TextIOWrapper(fh, newline="", encoding="utf-8")
            w = csv.DictWriter(text, columns)
            w.writeheader()
            w.writerows(taken + rows)
            text.flush()
            text.detach()

        write_with(new, write)
    return len(taken)
