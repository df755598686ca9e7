"""The free probe: do the models get a recording's key terms right more often when the term was said before, and how
does that depend on how long ago it was said? Scored from hypotheses ``evaluate`` already wrote; no model is run.

``python -m asr_core repeats HYPS [HYPS ...] --data NAME=podcast:PATH [--out DIR]``

The synthetic corpus (``python -m asr_core synth``) records per recording the ``key_terms`` its generator repeats
(``<split>/../meta/<id>.json``). Every time a key term is said in the transcript is an *occurrence*: ``first`` when
no earlier word of the recording is the same term, else a ``repeat`` whose ``distance_s`` is its start minus the
end of the previous mention. An occurrence is scored as the recall plant's slots are
(:mod:`asr_core.evaluation.scorers.slots`): the reference normalised word by word, aligned with the normalised hypothesis,
and the occurrence correct when the hypothesis word aligned with it equals the reference word.

Each ``HYPS`` file (``<trial folder>/eval/<NAME>.hyp.jsonl``) is one model, labelled by its trial folder; its context
and seed come from the trial folder's ``config.json`` (``data.context_s``, ``train.seed``) where there is one. Only
the ``clean`` condition's rows are used. Prints per model the error rate of first mentions and of repeats by distance
bin (:data:`BINS`); ``--out DIR`` also writes ``repeats.csv`` (one row per model and occurrence,
:data:`OCCURRENCE_COLUMNS`) and ``summary.csv`` (:data:`SUMMARY_COLUMNS`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.metrics import CLEAN
from asr_core.contract.specs import CorpusError, parse_dataset_spec
from asr_core.contract.trial import CONFIG_FILE
from asr_core.data.corpora import load_corpus
from asr_core.data.corpora.base import Recording
from asr_core.data.synth.cues import meta_file, read_meta
from asr_core.evaluation.scorers.slots import aligned_words
from asr_core.scoring.score import normalise, normalise_marked

FIRST = "first"
REPEAT = "repeat"
# distance bins of repeats, seconds back to the previous mention: (label, from, below)
BINS: tuple[tuple[str, float, float], ...] = (("0-5", 0.0, 5.0), ("5-10", 5.0, 10.0), ("10-20", 10.0, 20.0),
                                              ("20-40", 20.0, 40.0), ("40-80", 40.0, 80.0), ("80+", 80.0, math.inf))
OCCURRENCE_COLUMNS = ("model", "context_s", "seed", "dataset", "recording", "term", "index", "start", "end", "kind",
                      "distance_s", "bin", "hyp", "correct")
SUMMARY_COLUMNS = ("model", "context_s", "seed", "dataset", "bin", "n", "errors", "error_pct")


def distance_bin(distance_s: float) -> str:
    """The label of the bin of :data:`BINS` holding a repeat ``distance_s`` seconds after its previous mention (an
    overlap, below 0, counts in the first bin)."""
    for label, _, below in BINS:
        if distance_s < below:
            return label
    return BINS[-1][0]


@dataclass(frozen=True)
class Occurrence:
    """One mention of a key term: ``index`` among the recording's words, ``start``/``end`` seconds, ``kind``
    (:data:`FIRST` or :data:`REPEAT`) and, for a repeat, ``distance_s`` back to the previous mention's end."""

    recording: str
    term: str
    index: int
    start: float
    end: float
    kind: str
    distance_s: float | None

    @property
    def bin(self) -> str:
        """``first`` for a first mention, else the label of the repeat's distance bin."""
        return FIRST if self.distance_s is None else distance_bin(self.distance_s)


def occurrences(rec: Recording, terms: Sequence[str]) -> tuple[Occurrence, ...]:
    """Every mention of one of ``terms`` among ``rec.words`` (matched ignoring case), in order."""
    wanted = {t.casefold() for t in terms}
    last_end: dict[str, float] = {}
    out = []
    for i, w in enumerate(rec.words):
        term = w.text.casefold()
        if term not in wanted:
            continue
        start, end = float(w.start or 0.0), float(w.end or 0.0)
        before = last_end.get(term)
        distance = None if before is None else round(start - before, 3)
        out.append(Occurrence(rec.id, term, i, start, end, FIRST if before is None else REPEAT, distance))
        last_end[term] = end
    return tuple(out)


def key_terms(recordings: Sequence[Recording], dataset: str) -> dict[str, tuple[str, ...]]:
    """The key terms of each recording whose metadata lists them, by recording id. :class:`CorpusError` when none
    does (not a corpus made by ``synth``, or its ``meta/`` folder is missing) or a list is not one of words."""
    found: dict[str, tuple[str, ...]] = {}
    for rec in recordings:
        path = meta_file(rec)
        if path is None or not path.is_file():
            continue
        terms = read_meta(path).get("key_terms")
        if terms is None:
            continue
        if not isinstance(terms, list) or not all(isinstance(t, str) and t.strip() for t in terms):
            raise CorpusError(f"{path}: 'key_terms' must be a list of words, got {terms!r}; regenerate the corpus "
                              "(python -m asr_core synth)")
        found[rec.id] = tuple(terms)
    if not found:
        raise CorpusError(f"dataset {dataset}: no recording has metadata with 'key_terms' (looked for "
                          "<split>/../meta/<id>.json); give a split of a corpus made by python -m asr_core synth")
    return found


@dataclass(frozen=True)
class Reference:
    """A recording's reference normalised word by word (``words``), its key-term ``occurrences`` and where each
    lies in ``words`` (``positions``, in the same order)."""

    words: tuple[str, ...]
    occurrences: tuple[Occurrence, ...]
    positions: tuple[int, ...]


def reference(rec: Recording, terms: Sequence[str]) -> Reference:
    """``rec``'s normalised reference with its key-term occurrences marked (ValueError naming a term that does not
    normalise to one word)."""
    occs = occurrences(rec, terms)
    words, positions = normalise_marked([w.text for w in rec.words], [o.index for o in occs])
    return Reference(tuple(words), occs, tuple(positions))


@dataclass(frozen=True)
class Model:
    """One HYPS file: its ``label`` (the trial folder's name), ``context_s`` (NaN when unknown) and ``seed``."""

    path: Path
    label: str
    context_s: float
    seed: int | None


def trial_folder(hyps: Path) -> Path:
    """The trial folder of ``<trial folder>/eval/<NAME>.hyp.jsonl``: the file's grandparent."""
    return hyps.resolve().parent.parent


def model_of(hyps: Path) -> Model:
    """The model behind ``hyps``, from its trial folder's ``config.json`` where it exists (ValueError naming a config
    that cannot be read)."""
    folder = trial_folder(hyps)
    config = folder / CONFIG_FILE
    context, seed = math.nan, None
    if config.is_file():
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
            data, train = cfg.get("data") or {}, cfg.get("train") or {}
            if data.get("context_s") is not None:
                context = float(data["context_s"])
            if train.get("seed") is not None:
                seed = int(train["seed"])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"{config}: cannot read the model's context and seed ({e}); expected the trial's "
                             "config.json with data.context_s and train.seed") from None
    return Model(hyps, folder.name, context, seed)


def read_hyps(path: Path) -> dict[str, str]:
    """The clean condition's hypothesis per recording of an ``evaluate`` hypotheses file (ValueError naming the file
    and line of a malformed row, a duplicate, or a file without clean rows)."""
    if not path.is_file():
        raise FileNotFoundError(f"hypotheses file {path} not found; give eval/<NAME>.hyp.jsonl of a trial folder")
    out: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}); truncated or corrupt") from None
        if not isinstance(row, dict) or not all(k in row for k in ("recording", "condition", "hyp")):
            raise ValueError(f"{path}:{n}: a row needs the keys recording, condition and hyp (as evaluate writes)")
        if row["condition"] != CLEAN:
            continue
        rid = str(row["recording"])
        if rid in out:
            raise ValueError(f"{path}:{n}: a second clean row for recording {rid!r}; give one evaluation's file")
        out[rid] = str(row["hyp"] or "")
    if not out:
        raise ValueError(f"{path}: no rows of condition {CLEAN!r}; evaluate writes one per recording")
    return out


def score_model(model: Model, dataset: str, refs: Mapping[str, Reference], hyps: Mapping[str, str]
                ) -> list[dict[str, Any]]:
    """One row per occurrence (:data:`OCCURRENCE_COLUMNS`) of the recordings of ``refs`` that ``hyps`` has."""
    rows: list[dict[str, Any]] = []
    for rid, ref in refs.items():
        if rid not in hyps or not ref.occurrences:
            continue
        at = aligned_words(ref.words, normalise(hyps[rid]).split(), ref.positions)
        for o, p in zip(ref.occurrences, ref.positions):
            rows.append({"model": model.label, "context_s": model.context_s, "seed": model.seed, "dataset": dataset,
                         "recording": rid, "term": o.term, "index": o.index, "start": o.start, "end": o.end,
                         "kind": o.kind, "distance_s": o.distance_s, "bin": o.bin, "hyp": at[p],
                         "correct": int(at[p] == ref.words[p])})
    return rows


def summarise(model: Model, dataset: str, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per bin (``first``, then :data:`BINS`): occurrences ``n``, ``errors`` and ``error_pct`` (NaN for none)."""
    out = []
    for label in (FIRST, *(b[0] for b in BINS)):
        mine = [r for r in rows if r["bin"] == label]
        errors = sum(1 - int(r["correct"]) for r in mine)
        out.append({"model": model.label, "context_s": model.context_s, "seed": model.seed, "dataset": dataset,
                    "bin": label, "n": len(mine), "errors": errors,
                    "error_pct": round(100.0 * errors / len(mine), 2) if mine else math.nan})
    return out


def _cell(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def write_table(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """``rows`` as CSV with ``columns``; None and NaN as empty cells."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows({c: _cell(r.get(c)) for c in columns} for r in rows)
    return path


def format_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary as a table: model, context, seed, bin, n, error %."""
    width = max([len("model")] + [len(str(r["model"])) for r in rows])
    lines = [f"{'model':{width}s} {'context':>8s} {'seed':>5s} {'bin':>6s} {'n':>6s} {'error %':>8s}"]
    for r in rows:
        ctx = "-" if math.isnan(r["context_s"]) else f"{r['context_s']:g}s"
        seed = "-" if r["seed"] is None else str(r["seed"])
        err = "-" if math.isnan(r["error_pct"]) else f"{r['error_pct']:.1f}"
        lines.append(f"{r['model']:{width}s} {ctx:>8s} {seed:>5s} {r['bin']:>6s} {r['n']:6d} {err:>8s}")
    return "\n".join(lines)


def unique_labels(models: Sequence[Model]) -> list[Model]:
    """``models`` with a label that repeats an earlier one suffixed ``#2``, ``#3``, ... (two files of one trial)."""
    seen: dict[str, int] = {}
    out = []
    for m in models:
        seen[m.label] = seen.get(m.label, 0) + 1
        out.append(m if seen[m.label] == 1 else Model(m.path, f"{m.label}#{seen[m.label]}", m.context_s, m.seed))
    return out


def measure(data: str, hyps_files: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The occurrence rows and summary rows of every HYPS file on the dataset ``data`` (``NAME=podcast:PATH``).
    Raises :class:`CorpusError`, ValueError or FileNotFoundError with a message naming the file or value."""
    name, spec = parse_dataset_spec(data)
    missing = [str(p) for p in hyps_files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"hypotheses file not found: {', '.join(missing)}; give eval/<NAME>.hyp.jsonl of "
                                "a trial folder")
    recordings = load_corpus(spec, audio=False)
    terms = key_terms(recordings, name)
    refs: dict[str, Reference] = {}
    for rec in recordings:
        if rec.id in terms:
            try:
                refs[rec.id] = reference(rec, terms[rec.id])
            except ValueError as e:
                raise ValueError(f"dataset {name}, recording {rec.id}: {e}") from None
    known = {r.id for r in recordings}
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for model in unique_labels([model_of(p) for p in hyps_files]):
        hyps = read_hyps(model.path)
        stray = sorted(set(hyps) - known)
        if stray:
            raise ValueError(f"{model.path}: recordings {', '.join(stray[:3])} are not in dataset {name} ({spec}); "
                             "give the hypotheses of this dataset")
        lacking = sorted(set(refs) - set(hyps))
        if lacking:
            print(f"repeats: {model.path}: {len(lacking)} of {len(refs)} recordings with key terms have no clean "
                  f"hypothesis (first: {lacking[0]}); scored without them", file=sys.stderr)
        mine = score_model(model, name, refs, hyps)
        rows += mine
        summary += summarise(model, name, mine)
    return rows, summary


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core repeats", description=__doc__.split("\n\n")[0])
    ap.add_argument("hyps", type=Path, nargs="+", metavar="HYPS",
                    help="eval/<NAME>.hyp.jsonl of one or more trial folders (one model each)")
    ap.add_argument("--data", required=True, metavar="NAME=podcast:PATH",
                    help="the dataset the hypotheses are of: a split of a corpus made by synth")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="folder for repeats.csv and summary.csv (default: print the summary only)")
    a = ap.parse_args(argv)
    try:
        rows, summary = measure(a.data, a.hyps)
    except (CorpusError, ValueError, FileNotFoundError) as e:
        print(f"repeats: {e}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    if a.out is not None:
        try:
            print(f"table: {write_table(a.out / 'repeats.csv', rows, OCCURRENCE_COLUMNS)}")
            print(f"summary: {write_table(a.out / 'summary.csv', summary, SUMMARY_COLUMNS)}")
        except OSError as e:
            print(f"repeats: cannot write to --out {a.out} ({e})", file=sys.stderr)
            return 2
    return 0
