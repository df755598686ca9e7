"""Score another system's transcripts (Whisper, a vendor) exactly as ``evaluate`` scores a model.

``python -m asr_core score --ref NAME=FORMAT:PATH --hyp [NAME=]FOLDER --system SYSTEM [--ref ... --hyp ...]
[--out DIR] [--tail FILE.json] [--tracking-uri URI --sweep SWEEP] [--strict] [--verbose]``

References are read with the corpus readers (:func:`asr_core.data.corpora.read_corpus`, ``audio=False``: no audio is
needed). Hypotheses are a folder with one file per recording, named by its recording id: ``<id>.txt`` (plain text)
or ``<id>.nlp`` (Rev's token format: the ``token`` column, ``<...>`` tags stripped as in the references); an id with
a ``/`` (podcast episodes) is a sub-folder. ``--hyp NAME=FOLDER`` pairs a folder with the ``--ref`` of that name;
unnamed ``--hyp`` folders pair with the ``--ref`` options in order.

Scoring is ``evaluate``'s (:mod:`asr_core.scoring.score`): Whisper's English normaliser on both sides, per-recording S/D/I
counts, corpus WER = all errors / all reference words, in percent. Every hypothesis that has a reference recording
is scored. A recording without a hypothesis file (*missing*) counts as empty output (all its words deleted); a
hypothesis file without a reference recording (*extra*: a release's output folder may hold a call its references
lack) is left out. Both are named on stderr and counted in the summary (and in MLflow's tags); with ``--strict``
either is an error (exit 2), as is a reference file the reader would skip. A bad ``--ref`` spec, a missing ``--hyp``
folder, an unreadable file and two hypotheses of one recording are errors (exit 2) naming it.

Prints the corpus WER per dataset (``--verbose``: and per recording); ``--out DIR`` writes ``DIR/<NAME>.csv`` with
``evaluate``'s columns. With ``--tracking-uri`` (or ``MLFLOW_TRACKING_URI``) the result is recorded in MLflow in the
form ``python -m analysis report`` lists beside the sweep's models: one run per system in experiment ``--sweep``
(or ``MLFLOW_EXPERIMENT_NAME``; give the sweep's), tags ``sweep.role=external`` (:data:`ROLE_EXTERNAL`) and
``external.system=SYSTEM`` (:data:`TAG_SYSTEM`), ``evaluate``'s metric keys (``wer/<NAME>``) and per-recording tables
(artifact ``eval/<NAME>.csv``). Scoring the same system again updates its run (one run per system; the newest values
are the ones shown).

With ``--tail FILE.json`` (a tail set, ``python -m asr_core tailset``) the tail-word error rate of paper 002 is
scored too, as ``evaluate --tail`` scores it (:mod:`asr_core.scoring.tail`): the tables gain the columns
``tail_words`` and ``tail_errors``, the summary a ``tail`` rate per system and dataset, and the MLflow run the
metrics ``tail/<NAME>`` and the tag ``eval.tail``.

Exit codes: 0 done; 1 MLflow did not take the result (the scores were printed, and written with ``--out``); 2 bad
arguments or data.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asr_core.contract.specs import parse_dataset_spec
from asr_core.data.corpora import CorpusError, read_corpus
from asr_core.contract.trial import EVAL_DIR, ROLE_EXTERNAL, TAG_ROLE, TAG_SYSTEM
from asr_core.contract.options import renamed
from asr_core.contract.tracking import tracking_uri as ledger_uri
from asr_core.scoring.tail import TailSet, corpus_tail_rate, describe, load_tail, tail_counts

TAG_REF = "external.ref.{}"  # the reference spec a dataset name stood for
TAG_HYP = "external.hyp.{}"  # the hypothesis folder
TAG_MISSING = "external.missing.{}"  # recordings without a hypothesis file (scored as empty output)
TAG_EXTRA = "external.extra.{}"  # hypothesis files without a reference recording (left out)
HYP_SUFFIXES = (".txt", ".nlp")
EXIT_OK, EXIT_TRACKING, EXIT_USAGE = 0, 1, 2


class ScoreError(ValueError):
    """Bad arguments or data; the message names the file, folder or option."""


@dataclass
class Scored:
    """One dataset's result: per-recording rows (``evaluate``'s columns), its corpus WER, the recordings that had
    no hypothesis file (``missing``) and the hypothesis files of no reference recording (``extra``, left out).
    Scored with a tail set: ``tail``, the corpus tail-word error rate (NaN without tail words; None without a tail
    set), and ``texts``, the references (for the tail's share of them)."""

    name: str
    spec: str
    hyp_dir: Path
    rows: list[dict[str, Any]]
    wer: float
    missing: list[str]
    extra: list[str] = field(default_factory=list)
    tail: float | None = None
    texts: list[str] = field(default_factory=list)


def read_hypotheses(folder: Path) -> dict[str, tuple[Path, str]]:
    """``{recording id: (file, text)}`` for every ``<id>.txt`` / ``<id>.nlp`` below ``folder``."""
    from asr_core.data.corpora.earnings22 import NlpError, parse_nlp

    if not folder.exists():
        raise ScoreError(f"hypothesis folder {folder} does not exist")
    if not folder.is_dir():
        raise ScoreError(f"--hyp {folder} is not a folder (give a folder of <recording id>.txt or .nlp files)")
    out: dict[str, tuple[Path, str]] = {}
    files = sorted(p for p in folder.rglob("*") if p.suffix in HYP_SUFFIXES and p.is_file())
    for f in files:
        rec_id = f.relative_to(folder).with_suffix("").as_posix()
        if rec_id in out:
            raise ScoreError(f"two hypotheses for recording {rec_id!r}: {out[rec_id][0]} and {f}; keep one")
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ScoreError(f"hypothesis {f} cannot be read: {e}") from None
        if f.suffix == ".nlp":
            try:
                text = " ".join(w.text for w in parse_nlp(text).words)
            except NlpError as e:
                raise ScoreError(f"hypothesis {f}: {e}") from None
        out[rec_id] = (f, text)
    if not out:
        raise ScoreError(f"hypothesis folder {folder} holds no <recording id>.txt or .nlp files")
    return out


def _listed(items: list[str], most: int = 10) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def score_dataset(name: str, spec: str, hyp_dir: Path, *, strict: bool = False, tail: TailSet | None = None) -> Scored:
    """Score the hypotheses in ``hyp_dir`` that have a reference recording in ``spec``, as ``evaluate`` scores a
    model (and the errors on the words of ``tail``, when given). The others (extra) and the recordings without a
    hypothesis (missing) are named on stderr; with ``strict`` either raises :class:`ScoreError`."""
    from asr_core.contract.metrics import condition_name
    from asr_core.scoring.score import Counts, corpus_wer, normalise, score

    hyps = read_hypotheses(hyp_dir)
    report = read_corpus(spec, strict=strict, audio=False)
    ids = {r.id for r in report.recordings}
    stray = sorted(set(hyps) - ids)
    if stray:
        files = _listed([str(hyps[i][0]) for i in stray], 5)
        names = {Path(i).name for i in stray}
        why = "; ".join(f"{f}: {reason}" for f, reason in report.skipped if Path(f).stem in names)
        what = (f"{len(stray)} {'hypothesis has' if len(stray) == 1 else 'hypotheses have'} no reference recording "
                f"in {name} ({spec}): {files}" + (f" (the reader skipped {why})" if why else ""))
        if strict:
            raise ScoreError(f"{what}; its recordings are e.g. {', '.join(sorted(ids)[:3])} (--strict: drop "
                             f"--strict to score the others and leave these out)")
        print(f"score: {what}; left out", file=sys.stderr)
    rows, missing, tails = [], [], []
    for rec in report.recordings:
        if rec.id in hyps:
            text = hyps[rec.id][1]
        else:
            text = ""
            missing.append(rec.id)
        ref, hyp = normalise(rec.text), normalise(text)
        c = score(ref, hyp, normalised=True)
        rows.append({"dataset": name, "condition": condition_name(None), "snr_db": None, "recording": rec.id,
                     "ref_words": c.ref_words, "substitutions": c.substitutions, "deletions": c.deletions,
                     "insertions": c.insertions, "hyp_words": c.hyp_words, "wer": c.wer})
        if tail is not None:
            t = tail_counts(ref, hyp, tail, normalised=True)
            tails.append(t)
            rows[-1].update(tail_words=t.words, tail_errors=t.errors)
    if missing:
        what = f"{name}: {len(missing)} of {len(rows)} recordings have no hypothesis in {hyp_dir}: {_listed(missing)}"
        if strict:
            raise ScoreError(f"{what} (--strict: drop --strict to score them as empty output)")
        print(f"score: {what}; they count as empty output", file=sys.stderr)
    wer = corpus_wer(Counts(r["ref_words"], r["substitutions"], r["deletions"], r["insertions"], r["hyp_words"])
                     for r in rows)
    if tail is None:
        return Scored(name, spec, hyp_dir, rows, wer, missing, stray)
    return Scored(name, spec, hyp_dir, rows, wer, missing, stray, corpus_tail_rate(tails),
                  [rec.text for rec in report.recordings])


def pair_hypotheses(refs: list[tuple[str, str]], hyps: list[str]) -> list[tuple[str, str, Path]]:
    """``(name, spec, hypothesis folder)`` per ``--ref``: ``--hyp NAME=FOLDER`` by name, unnamed ones in order."""
    names = [n for n, _ in refs]
    named: dict[str, Path] = {}
    unnamed: list[Path] = []
    for h in hyps:
        head, sep, rest = h.partition("=")
        if sep and head in names:
            if head in named:
                raise ScoreError(f"--hyp {h}: dataset {head!r} already has hypotheses {named[head]}")
            named[head] = Path(rest)
        else:
            unnamed.append(Path(h))
    if named and unnamed:
        raise ScoreError(f"--hyp: name every folder (NAME=FOLDER, NAME one of {', '.join(names)}) or none; "
                         f"unnamed: {', '.join(map(str, unnamed))}")
    if unnamed:
        if len(unnamed) != len(refs):
            raise ScoreError(f"{len(refs)} --ref but {len(unnamed)} --hyp: give one hypothesis folder per reference, "
                             f"in the same order, or name them (--hyp NAME=FOLDER)")
        return [(n, s, h) for (n, s), h in zip(refs, unnamed)]
    lacking = [n for n in names if n not in named]
    if lacking:
        raise ScoreError(f"no --hyp for {', '.join(lacking)} (give --hyp NAME=FOLDER)")
    return [(n, s, named[n]) for n, s in refs]


def columns(scored: Scored) -> list[str]:
    """The columns of a dataset's table: ``evaluate``'s, and the tail columns when scored with a tail set."""
    from asr_core.contract.metrics import TAIL_COLUMNS
    from asr_core.evaluation.evaluate import CSV_COLUMNS

    return CSV_COLUMNS + (list(TAIL_COLUMNS) if scored.tail is not None else [])


def write_table(scored: Scored, out: Path) -> Path:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{scored.name}.csv"
    pd.DataFrame(scored.rows, columns=columns(scored)).to_csv(path, index=False)
    return path


def record(results: list[Scored], tables: dict[str, Path], system: str, tracking_uri: str, experiment: str,
           tail: TailSet | None = None) -> str:
    """Record ``results`` in the run of ``system`` in ``experiment`` (created when missing); returns its id. With
    the ``tail`` set they were scored with, also its rates (``tail/<NAME>``) and the tag ``eval.tail``."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    from asr_core.contract.ledger import experiment_id, shown_tags
    from asr_core.contract.metrics import TAIL_TAG, metric_key, tail_metric_key

    client = MlflowClient(tracking_uri)
    exp_id = experiment_id(client, experiment)
    found = client.search_runs([exp_id], f"tags.`{TAG_ROLE}` = '{ROLE_EXTERNAL}' and tags.`{TAG_SYSTEM}` = '{system}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if found:
        run_id = found[0].info.run_id
    else:
        run_id = client.create_run(exp_id, tags={TAG_ROLE: ROLE_EXTERNAL, TAG_SYSTEM: system},
                                   run_name=f"external-{system}").info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(metric_key(s.name), s.wer, now, 0) for s in results if not math.isnan(s.wer)]
    tags = [RunTag(TAG_ROLE, ROLE_EXTERNAL), RunTag(TAG_SYSTEM, system)]
    tags += [RunTag(k, v) for k, v in shown_tags({m.key: m.value for m in metrics}).items()]  # the view's columns
    if tail is not None:
        metrics += [Metric(tail_metric_key(s.name), s.tail, now, 0) for s in results
                    if s.tail is not None and not math.isnan(s.tail)]
        tags.append(RunTag(TAIL_TAG, describe(tail, {s.name: s.texts for s in results})))
    for s in results:
        tags += [RunTag(TAG_REF.format(s.name), s.spec), RunTag(TAG_HYP.format(s.name), str(s.hyp_dir.resolve())),
                 RunTag(TAG_MISSING.format(s.name), str(len(s.missing))),
                 RunTag(TAG_EXTRA.format(s.name), str(len(s.extra)))]
    client.log_batch(run_id, metrics=metrics, tags=tags)
    for path in tables.values():
        client.log_artifact(run_id, str(path), EVAL_DIR)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def _summary(results: list[Scored], system: str, verbose: bool) -> str:
    import pandas as pd

    lines = []
    if verbose:
        for s in results:
            table = pd.DataFrame(s.rows, columns=columns(s)).drop(columns=["condition", "snr_db"])
            lines += [table.round(2).to_string(index=False), ""]
    rows = []
    for s in results:
        t = pd.DataFrame(s.rows, columns=columns(s))
        rows.append({"system": system, "dataset": s.name, "recordings": len(t), "missing": len(s.missing),
                     "extra": len(s.extra), "ref_words": int(t.ref_words.sum()),
                     "substitutions": int(t.substitutions.sum()),
                     "deletions": int(t.deletions.sum()), "insertions": int(t.insertions.sum()), "wer": s.wer})
        if s.tail is not None:  # the tail-word error rate beside the WER
            rows[-1].update(tail_words=int(t.tail_words.sum()), tail_errors=int(t.tail_errors.sum()), tail=s.tail)
    lines.append(pd.DataFrame(rows).round(2).to_string(index=False))
    for s in results:  # what the table's counts stand for
        if s.missing:
            lines.append(f"{s.name}: missing (scored as empty output): {_listed(s.missing)}")
        if s.extra:
            lines.append(f"{s.name}: extra (no reference, left out): {_listed(s.extra)}")
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core score", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", action="append", required=True, metavar="NAME=FORMAT:PATH",
                    help="a reference test set (repeatable), read without audio")
    ap.add_argument("--hyp", action="append", required=True, metavar="[NAME=]FOLDER",
                    help="a folder of <recording id>.txt or .nlp hypotheses (one per --ref, in order, or named)")
    ap.add_argument("--system", required=True, help="the system's name, e.g. whisper-large-v3")
    ap.add_argument("--out", type=Path, default=None, help="write OUT/<NAME>.csv (evaluate's columns)")
    ap.add_argument("--tail", type=Path, default=None, metavar="FILE.json",
                    help="a tail set (python -m asr_core tailset): also score the tail-word error rate (columns "
                         "tail_words, tail_errors; metric tail/<NAME>)")
    ap.add_argument("--tracking-uri", default=None, help="record the result in MLflow (default: MLFLOW_TRACKING_URI)")
    renamed(ap, "--experiment", ap.add_argument("--sweep", dest="experiment", default=None, help="the sweep "
                                                "(its MLflow experiment; default: MLFLOW_EXPERIMENT_NAME) the run "
                                                "is recorded in, so python -m analysis report SWEEP lists it"))
    ap.add_argument("--strict", action="store_true", help="fail (exit 2) on a bad reference file, a hypothesis "
                    "without a reference or a recording without a hypothesis, instead of naming it and going on")
    ap.add_argument("--verbose", action="store_true", help="also print the per-recording table")
    a = ap.parse_args(argv)
    tracking_uri = ledger_uri(a.tracking_uri, local_default=False)
    experiment = a.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or None
    try:
        system = a.system.strip()
        if not system or any(c in system for c in "'\"\\\n"):
            raise ScoreError(f"--system {a.system!r}: give a name without quotes or backslashes")
        if tracking_uri and not experiment:
            raise ScoreError(f"recording in MLflow at {tracking_uri} needs --sweep (the sweep's experiment, so "
                             f"that python -m analysis report lists the system beside its models)")
        try:
            refs = [parse_dataset_spec(r) for r in a.ref]
        except CorpusError as e:
            raise ScoreError(f"--ref: {e}") from None
        names = [n for n, _ in refs]
        if len(set(names)) != len(names):
            raise ScoreError(f"--ref names must be unique, got {names}")
        pairs = pair_hypotheses(refs, a.hyp)
        for _, _, folder in pairs:  # every folder checked before any reading
            if not folder.is_dir():
                raise ScoreError(f"hypothesis folder {folder} "
                                 f"{'is not a folder' if folder.exists() else 'does not exist'}")
        try:
            tail = load_tail(a.tail) if a.tail is not None else None
        except (ValueError, FileNotFoundError) as e:
            raise ScoreError(str(e)) from None
        results = [score_dataset(n, s, h, strict=a.strict, tail=tail) for n, s, h in pairs]
    except (ScoreError, CorpusError) as e:
        print(f"score: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(_summary(results, system, a.verbose))
    if a.out is None and tracking_uri:  # the tables go to MLflow only: written to a folder removed afterwards
        with tempfile.TemporaryDirectory(prefix="asr-score-") as tmp:
            return _write_and_record(results, Path(tmp), system, tracking_uri, experiment or "", tail, kept=False)
    return _write_and_record(results, a.out, system, tracking_uri, experiment or "", tail, kept=True)


def _write_and_record(results: list, out: Path | None, system: str, tracking_uri: str | None, experiment: str,
                      tail: Any, *, kept: bool) -> int:
    """Write each dataset's table to ``out`` (None: nowhere; ``kept``: the user's folder, named on stderr) and record
    the scores in MLflow when ``tracking_uri`` is given; the exit status."""
    tables = {s.name: write_table(s, out) for s in results} if out is not None else {}
    if out is not None and kept:
        print(f"score: tables in {out}", file=sys.stderr)
    if tracking_uri:
        from asr_core.runtime.outbox import fail_fast_http

        fail_fast_http()
        try:
            run_id = record(results, tables, system, tracking_uri, experiment, tail)
        except Exception as e:  # any MLflow or network failure: the scores are printed already
            print(f"score: MLflow at {tracking_uri} did not take the result: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return EXIT_TRACKING
        print(f"score: recorded {system} in MLflow run {run_id} (experiment {experiment!r} at {tracking_uri})",
              file=sys.stderr)
    return EXIT_OK
