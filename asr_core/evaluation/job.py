"""The stage an evaluation job runs in place of training (:mod:`asr_core.contract.evaluation`).

``python -m asr_core trial`` runs it when its folder holds ``evaluation.json``: the trial job's lease, segments,
attempts, progress, signals and outbox all apply, but it trains nothing, writes nothing into the model's folder (beside
it, the lock file of the model's tables: :data:`~asr_core.contract.evaluation.TABLES_LOCK_FILE`), and tells the
model's run only metrics, tags and tables (never its status).

The checkpoint is read once (:mod:`asr_core.evaluation.checkpoint_read`): its bytes hashed, checked against the
model's ``TRAINED`` record and key (a mismatch is refused, naming both, before anything is decoded), and loaded from
those bytes for every use of the job. The job writes what it measures into ``eval/measured/``; its tables and metrics
are held back from the outbox and published under the model's lock (:func:`publish`): the table the run holds now,
the model's own tables and those of every other evaluation of the model under the same name are merged into the
job's own rows, written to its ``eval/`` and uploaded before the next job of the model may merge. So jobs of one
model running at once, or killed midway and run again, lose no row, a job that finds rows of a sibling missing from
the run restores them, and another job's ``eval/<table>`` is always a merged table, never a half-done one.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

from asr_core.contract.atomic import TEMP_SUFFIX, write_with
from asr_core.contract.evaluation import (CHECKPOINT_COLUMN, MEASURED_DIR, TABLES_LOCK_FILE, EvaluationSpec,
                                          checkpoint_tags, evaluation_tag, merge_tables, read_evaluation,
                                          recorded_checkpoints)
from asr_core.contract.folder.trained import trained_checkpoint
from asr_core.contract.trial import EVAL_DIR, TrialFolder
from asr_core.evaluation.checkpoint_read import CheckpointRead, CheckpointRefused
from asr_core.runtime import signals

if TYPE_CHECKING:
    from asr_core.config import Config
    from asr_core.runtime.outbox import Outbox
    from asr_core.contract.trial import ProgressLog

MERGE_PREFIX = ".merging-"  # in the job's eval/: a folder of the tables being merged (merge_folder)


class EvaluationInterrupted(Exception):
    """SIGUSR2/SIGTERM during evaluation: evaluation has no checkpoint, so it simply starts again on requeue."""


def _fault(progress: "ProgressLog", where: str = "eval") -> None:
    """``ASR_CORE_FAULT=sleep-in-eval:S`` (tests of the orchestration only, as the trainer's faults): the job
    sleeps S seconds before decoding, with an ``eval`` progress record of dataset ``fault``, so a test can kill it
    there; ``sleep-in-merge:S``: in :func:`publish`, holding the model's lock, its tables merged but not uploaded
    (dataset ``merge``)."""
    fault = os.environ.get("ASR_CORE_FAULT", "")
    if fault.startswith(f"sleep-in-{where}:"):
        progress.write("eval", 0, 1, "fault" if where == "eval" else where)
        time.sleep(float(fault.split(":", 1)[1]))


def earlier_tables(spec: EvaluationSpec, finished_only: bool = True) -> list[Path]:
    """The folders whose tables the job merges into its own: the model's own evaluation (``eval/``), then every
    finished evaluation job of the same model and name (``finished_only=False``: every one, finished or not: what
    it wrote is rows it measured), oldest first."""
    model = TrialFolder(Path(spec.model_dir))
    out = [model.eval_dir]
    siblings = []
    for d in model.path.parent.glob(f"{spec.model}-*"):
        if d.name == spec.key or (finished_only and not TrialFolder(d).done.exists()):
            continue
        try:
            other = read_evaluation(d)
        except ValueError:
            continue
        if other is not None and other.name == spec.name and other.model == spec.model:
            siblings.append((other.created, d))
    out += [TrialFolder(d).eval_dir for _, d in sorted(siblings)]
    return out


def check_model(spec: EvaluationSpec) -> Path:
    """The model's checkpoint, once its training is finished; an error saying what to do otherwise. An unreadable
    ``TRAINED`` counts as absent (with a warning); the checkpoint itself then says whether training finished
    (:func:`asr_core.training.checkpoint.training_finished`), as it does for the model's own job."""
    model = TrialFolder(Path(spec.model_dir))
    if not (model.done.exists() or trained_checkpoint(model.path) is not None or _finished_checkpoint(spec.checkpoint)):
        raise RuntimeError(f"evaluation {spec.key}: model {spec.model} has not finished training ({model.path} has "
                           "no readable TRAINED marker); its own job evaluates it at the end of training (and "
                           "writes TRAINED again: `orchestrate resume` runs it)")
    if not spec.checkpoint.is_file():
        raise FileNotFoundError(f"evaluation {spec.key}: the checkpoint of model {spec.model} is missing "
                                f"({spec.checkpoint})")
    return spec.checkpoint


def _finished_checkpoint(path: Path) -> bool:
    """Whether the checkpoint at ``path`` is a finished training's (False when there is none or it is unreadable)."""
    from asr_core.training.checkpoint import read_header, training_finished

    try:
        return path.is_file() and training_finished(read_header(path))
    except Exception:  # noqa: BLE001 - a checkpoint being written or broken: not finished, as far as we can tell
        return False


class _HeldBack:
    """The job's outbox with the evaluation's metrics and files held back (:func:`publish` sends them under the
    model's lock); everything else (tags, known tags, the run) goes to the outbox as it comes."""

    def __init__(self, outbox: "Outbox") -> None:
        self._box = outbox
        self.metrics_held: dict[str, float] = {}
        self.files: list[tuple[Path, str]] = []

    def metrics(self, step: int, values: dict[str, float], **_: Any) -> bool:
        self.metrics_held.update(values)
        return bool(values)

    def artifact(self, path: Path | str, artifact_dir: str | None = None) -> None:
        self.files.append((Path(path), artifact_dir or ""))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box, name)


def remove_stale_temps(folder: Path) -> None:
    """Remove the temporary files (``.<table>.<random>.tmp``) that a job killed while writing a table left in
    ``folder`` (its ``eval/`` or ``eval/measured/``), and the merge folders (:data:`MERGE_PREFIX`) of one killed in
    :func:`publish`. Called at the job's start, under its lease: no other process
    writes into the job's folder."""
    if not folder.is_dir():
        return
    for work in sorted(folder.glob(f"{MERGE_PREFIX}*")):
        if work.is_dir():
            shutil.rmtree(work, ignore_errors=True)
            print(f"[eval] removed {work.name}/, the merge a killed job left", file=sys.stderr, flush=True)
    for tmp in sorted(folder.glob(f".*{TEMP_SUFFIX}")):
        try:
            tmp.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            print(f"[eval] warning: cannot remove {tmp}, a table a killed job left half written ({e})",
                  file=sys.stderr, flush=True)
            continue
        print(f"[eval] removed {tmp.name}, a table a killed job left half written", file=sys.stderr, flush=True)


@contextlib.contextmanager
def merge_folder(eval_dir: Path) -> Iterator[Path]:
    """A new folder for :func:`publish` to merge in, named :data:`MERGE_PREFIX` and a random tail, inside the job's own
    ``eval/`` (under its lease, no other process writes there), removed after. A job killed mid-merge leaves it in
    its folder, where its next start removes it (:func:`remove_stale_temps`), not in the node's ``/tmp``."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=MERGE_PREFIX, dir=eval_dir))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def model_lock(model_dir: Path | str) -> Iterator[None]:
    """Hold the model's table lock (``flock`` of :data:`~asr_core.contract.evaluation.TABLES_LOCK_FILE` beside its
    folder, shared by every evaluation job of the model; released by the kernel when its holder dies). Waits for it,
    saying so after 10 s; a stop signal interrupts the wait."""
    path = Path(model_dir).parent / TABLES_LOCK_FILE.format(Path(model_dir).name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        start, said = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said and time.monotonic() - start > 10:
                    print(f"[eval] waiting for {path}: another evaluation of the model is merging its tables",
                          file=sys.stderr, flush=True)
                    said = True
                time.sleep(0.2)
            except OSError as e:
                raise OSError(f"cannot lock {path} ({e.strerror or e}): the sweep's filesystem must support flock, "
                              "as the sweep's own lock does") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _stamp(table: Path, sha256: str) -> None:
    """Give every row of ``table`` (the rows this job measured) the checkpoint's hash in :data:`CHECKPOINT_COLUMN`."""
    with open(table, newline="") as fh:
        reader = csv.DictReader(fh)
        columns = [c for c in reader.fieldnames or [] if c != CHECKPOINT_COLUMN] + [CHECKPOINT_COLUMN]
        rows = [{**r, CHECKPOINT_COLUMN: sha256} for r in reader]

    def write(fh: BinaryIO) -> None:
        text = io.TextIOWrapper(fh, newline="", encoding="utf-8")
        w = csv.DictWriter(text, columns)
        w.writeheader()
        w.writerows(rows)
        text.flush()
        text.detach()

    write_with(table, write)


def _other_checkpoints(tables: list[Path], sha256: str) -> dict[Path, str]:
    """The tables among ``tables`` holding a row of another checkpoint than ``sha256`` (and that checkpoint)."""
    out: dict[Path, str] = {}
    for t in tables:
        try:
            with open(t, newline="") as fh:
                for r in csv.DictReader(fh):
                    if r.get(CHECKPOINT_COLUMN) and r[CHECKPOINT_COLUMN] != sha256:
                        out[t] = str(r[CHECKPOINT_COLUMN])
                        break
        except (OSError, csv.Error):
            continue
    return out


def _merge(table: Path, older: list[Path]) -> None:
    if table.name.endswith(".slots.csv"):
        from asr_core.evaluation.scorers.slots import merge_slot_tables

        merge_slot_tables(table, older)
    else:
        merge_tables(table, older)


def publish(spec: EvaluationSpec, read: CheckpointRead | None, folder: TrialFolder, files: list[tuple[Path, str]],
            metrics: dict[str, float], run: tuple[str, str | None] | None, progress: "ProgressLog") -> None:
    """Under the model's lock (:func:`model_lock`): merge into each of the tables the job measured (``files``: the
    tables in ``eval/measured/`` and their artifact folders; its rows stamped with the checkpoint's hash) the table
    the run holds now, the job's own earlier one and those of the model and of every other evaluation of the model
    under the same name (finished or not), refusing (:class:`CheckpointRefused`) rows or tags of another checkpoint;
    write each into the job's ``eval/`` and upload it; log the ``metrics`` the run lacks (one point per metric,
    whoever measured it first) and the checkpoint's tags. Without a run, the tables are merged locally only.
    ``read`` None: nothing was decoded."""
    if read is None:
        return
    ident = spec.key.rsplit("-", 1)[-1]
    client = None
    if run is not None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(run[1])
    with model_lock(spec.model_dir), merge_folder(folder.eval_dir) as tmp:
        have: set[str] = set()
        if client is not None and run is not None:
            other = {i: s for i, s in recorded_checkpoints(client.get_run(run[0]).data.tags).items()
                     if s != read.sha256}
            if other:
                raise CheckpointRefused(
                    f"evaluation {spec.key}: checkpoint {read.path} has sha256 {read.sha256} (step {read.step}), but "
                    f"the run of model {spec.model} holds results of " + ", ".join(
                        f"evaluation {i} of sha256 {s}" for i, s in sorted(other.items()))
                    + ": the checkpoint was replaced since; its results would mix two checkpoints: nothing is merged")
            for d in sorted({a for _, a in files}):
                have |= {f.path for f in client.list_artifacts(run[0], d or None)}
        local = [folder.eval_dir] + earlier_tables(spec, finished_only=False)
        merged = []
        for n, (measured, adir) in enumerate(files):
            path = Path(tmp) / f"work-{n}" / measured.name  # the measured table stays as it was measured
            path.parent.mkdir()
            shutil.copyfile(measured, path)
            _stamp(path, read.sha256)
            name = f"{adir}/{path.name}" if adir else path.name
            older = []
            if client is not None and run is not None and name in have:  # what the run holds now
                older.append(Path(client.download_artifacts(run[0], name, str(Path(tmp) / str(n)))))
            older += [d / path.name for d in local]
            mixed = _other_checkpoints(older, read.sha256)
            if mixed:
                raise CheckpointRefused(
                    f"evaluation {spec.key}: checkpoint {read.path} has sha256 {read.sha256} (step {read.step}), but "
                    + ", ".join(f"{t} holds rows of sha256 {s}" for t, s in mixed.items())
                    + ": the checkpoint was replaced since; its results would mix two checkpoints: nothing is merged")
            _merge(path, older)
            target = folder.eval_dir / path.name
            data = path.read_bytes()
            write_with(target, lambda fh, data=data: fh.write(data))  # type: ignore[misc]
            merged.append((target, adir))
        _fault(progress, "merge")
        if client is None or run is None:
            return
        for target, adir in merged:
            client.log_artifact(run[0], str(target), adir or None)
        from mlflow.entities import Metric, RunTag

        present = set(client.get_run(run[0]).data.metrics)
        now = int(time.time() * 1000)
        fresh = [Metric(k, v, now, 0) for k, v in sorted(metrics.items()) if k not in present]
        marks = [RunTag(k, v) for k, v in checkpoint_tags(ident, read.sha256, read.step).items()]
        for i in range(0, max(len(fresh), 1), 500):
            client.log_batch(run[0], metrics=fresh[i:i + 500], tags=marks if i == 0 else [])
    print(f"[eval] {len(merged)} tables merged and uploaded, {len(fresh)} of {len(metrics)} metrics logged (the run "
          f"had the rest) to run {run[0]}", file=sys.stderr, flush=True)


def run_evaluation(spec: EvaluationSpec, cfg: "Config", folder: TrialFolder, tracking_uri: str | None,
                   run_id: str | None, progress: "ProgressLog", outbox: "Outbox | None") -> None:
    """Decode ``spec.conditions`` of ``spec.datasets`` with the model's checkpoint (greedy, the spec's beam
    decoder, or greedy with its window fusion methods and at its other windows: the decoder's ``fusion`` and
    ``windows``, seconds) into ``folder/eval``, and publish the tables and metrics to the model's run
    (:func:`publish`); a stop signal interrupts it at once (:class:`EvaluationInterrupted`). The checkpoint is read
    once (:class:`~asr_core.evaluation.checkpoint_read.ModelCheckpoint`), recorded in the job's ``evaluation.json``;
    one that is not the model's trained checkpoint is refused (:class:`CheckpointRefused`) before any decoding.
    Runs under the job's lease (:func:`asr_core.trial.run_trial`)."""
    from asr_core.evaluation.checkpoint_read import ModelCheckpoint
    from asr_core.evaluation.decoders import beam_decoding
    from asr_core.evaluation.evaluate import Destination, EvaluationRun, evaluate

    measured = folder.eval_dir / MEASURED_DIR
    remove_stale_temps(folder.eval_dir)
    remove_stale_temps(measured)
    checkpoint = check_model(spec)
    source = ModelCheckpoint(spec, cfg.key(), on_read=lambda read: _record_read(folder, spec, read))
    beam = None
    stride = cfg.eval.stride
    fusion: tuple[str, ...] = ()
    windows: tuple[float, ...] = ()
    if spec.decoder is not None and (spec.decoder.get("fusion") or spec.decoder.get("windows")):
        fusion = tuple(spec.decoder.get("fusion") or ())  # window fusion methods, greedy (paper 001)
        windows = tuple(float(w) for w in spec.decoder.get("windows") or ())  # greedy at other windows (seconds)
        stride = spec.decoder.get("stride") or stride
    elif spec.decoder is not None:
        d = spec.decoder
        beam = beam_decoding("beam", lm_path=Path(d["lm"]) if d.get("lm") else None,
                             alpha=d.get("alpha") if d.get("lm") else None, beta=d.get("beta"),
                             beam_width=d.get("beam_width"), lm_context=d.get("lm_context"),
                             prompt=Path(d["prompt"]) if d.get("prompt") else None, name=spec.name)
        if d.get("lm"):  # the LM reads the ids of the checkpoint's tokenizer: the one read's, not the file's now
            _check_lm_tokenizer(Path(d["lm"]), source)
        stride = d.get("stride") or stride
    tail = {"tail": Path(spec.decoder["tail"])} if spec.decoder is not None and spec.decoder.get("tail") else {}
    box = _HeldBack(outbox) if outbox is not None else None
    with signals.installed(), signals.raising(EvaluationInterrupted):
        _fault(progress)
        evaluate(EvaluationRun.of(checkpoint, cfg.eval, datasets=list(spec.datasets), snrs=[], noisy=(), stride=stride,
                                  **tail,
                                  beam=beam, conditions=spec.conditions, tables_from=(),
                                  fusion=fusion, windows=windows, reader=source),
                 Destination(out_dir=measured, log=box is not None, run_id=run_id, tracking_uri=tracking_uri,
                             outbox=box, progress=progress))  # type: ignore[arg-type]
        if box is None:  # no run: the local tables still hold every condition measured
            publish(spec, source.done, folder, [(p, EVAL_DIR) for p in sorted(measured.glob("*.csv"))], {}, None,
                    progress)
        else:
            rid, uri = run_id or box.run_id, tracking_uri or box.tracking_uri
            _retrying(lambda: publish(spec, source.done, folder, box.files, box.metrics_held,
                                      (rid, uri) if rid else None, progress))
        for hyps in sorted(measured.glob("*.hyp.jsonl")):  # beside the tables, as the model's own evaluation's
            os.replace(hyps, folder.eval_dir / hyps.name)
    if outbox is not None:
        outbox.tags(evaluation_tag(spec.key.rsplit("-", 1)[-1], spec.name, spec.conditions, spec.setting))


def _retrying(publishing: "Any") -> None:
    """Run ``publishing`` again while the ledger fails it, for at most
    :data:`~asr_core.runtime.outbox.FINAL_FLUSH_S` seconds (a refusal is final); then its error ends the job, which
    its next run (``orchestrate resume``) does again: its tables stay in its folder meanwhile."""
    from asr_core.runtime.outbox import FINAL_FLUSH_S

    end, wait = time.monotonic() + FINAL_FLUSH_S, 1.0
    while True:
        try:
            return publishing()
        except (CheckpointRefused, EvaluationInterrupted):
            raise
        except Exception as e:  # noqa: BLE001 - an MLflow outage takes many forms; retried, then raised
            if time.monotonic() + wait > end:
                raise
            print(f"[eval] cannot publish the tables yet ({type(e).__name__}: {str(e)[:200]}); again in {wait:g} s",
                  file=sys.stderr, flush=True)
            time.sleep(wait)
            wait = min(2 * wait, 15.0)


def _check_lm_tokenizer(lm: Path, source: "Any") -> None:
    """A beam decoder's LM must have been trained with the acoustic checkpoint's tokenizer (the one read's)."""
    from asr_core.training.checkpoint import read_header

    read = source.read()
    if bytes(read_header(lm)["tokenizer"]) != read.tokenizer_bytes:
        raise ValueError(f"LM {lm} was trained with another tokenizer than acoustic checkpoint {read.path} (sha256 "
                         f"{read.sha256}): retrain it with `lm train --tokenizer {read.path}`")


def _record_read(folder: TrialFolder, spec: EvaluationSpec, read: CheckpointRead) -> None:
    """Record the checkpoint the job read in its ``evaluation.json`` (its spec, with the read's hash and step)."""
    import dataclasses

    if (spec.checkpoint_sha256, spec.checkpoint_step) != (read.sha256, read.step):
        dataclasses.replace(spec, checkpoint_sha256=read.sha256, checkpoint_step=read.step).write(folder.path)
