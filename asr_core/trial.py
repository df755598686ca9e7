"""One grid trial: train, then evaluate, inside one MLflow run.

This is the command every backend runs for a trial (:func:`asr_core.contract.trial.trial_command`)::

    python -m asr_core trial --config TRIAL_DIR/config.json --out TRIAL_DIR --tracking-uri URI --run-id RUN_ID

Exit codes are the contract with the schedulers (defined in :mod:`asr_core.contract.trial`):

* ``0``  trained and evaluated; the run is FINISHED.
* ``75`` (EX_TEMPFAIL) SIGUSR2 or SIGTERM arrived: training checkpointed (or evaluation, or the setup before
  training, was interrupted: nothing new to keep), the run is back to SCHEDULED with ``trial.preemptions`` = the
  folder's count of preempted attempts; run the same command again to continue.
* ``77`` the trial is cancelled (``TRIAL_DIR/CANCELLED``, written by ``orchestrate cancel``): a job that starts exits
  at once; a running one that gets SIGUSR2/SIGTERM checkpoints first. The run is KILLED; never requeue it.
* ``65`` the loss stayed non-finite for ``train.max_nonfinite_steps`` steps in a row: the run is FAILED with
  ``trial.error`` = ``diverged: …`` (the steps, the loss, the checkpoint kept), the outcome ``diverged`` counts
  against the failure budget, and the last checkpoint is left as it was (never one with non-finite weights).
* ``73`` another live job holds the trial's lease (:mod:`asr_core.contract.folder.lease`): this one exited having
  written nothing, or, having lost the lease while training, stopped without saving.
* ``1``  failed; the run is FAILED with the error's last line in the tag ``trial.error``.
* ``2``  the config file is invalid; nothing ran. The run (when ``--run-id`` is given) is FAILED with
  ``trial.error`` = ``config <path> invalid: <reason>``, so ``orchestrate status`` names the reason instead of
  the trial looking lost; correct the config, then ``orchestrate retry`` runs it again.

Re-running a trial is always safe: training resumes from ``TRIAL_DIR/checkpoint.pt``, a finished training phase is
remembered in ``TRIAL_DIR/TRAINED``, a finished evaluation in ``TRIAL_DIR/EVALUATED`` and a finished trial in
``TRIAL_DIR/DONE``, so nothing is trained or evaluated twice. Markers are written atomically
(:mod:`asr_core.contract.atomic`); an unreadable ``TRAINED`` (left by an older version on a full disk) is treated as
absent with a warning, and the trainer then finds from the checkpoint that training finished
(:func:`asr_core.training.train.train`). A job that holds the lease removes the partial checkpoints
(``.checkpoint.pt.*.tmp``) that a job killed while saving left, saying how many bytes that frees.

With ``eval.head_diversity`` on, evaluation is followed by a stage measuring how alike the model's attention heads
are (paper 003; :mod:`asr_core.probes.heads`) on the first evaluation dataset: metrics ``heads/…`` and files in
``TRIAL_DIR/heads/`` (also the run's artifacts under ``heads/``). A segment stopped during it runs it again, and
only it.

The trial folder holds the truth, MLflow is its mirror. Order of a start: DONE or CANCELLED (read only) → the lease
(:class:`asr_core.contract.folder.lease.Lease`, taken before the job touches the checkpoint, the outbox or the run; held
→ exit 73) → the segment → training → evaluation → the outcome. Everything the job tells MLflow (params, tags, metrics,
artifacts, the run's status) goes through the trial's outbox (:mod:`asr_core.runtime.outbox`), shipped by a background
thread: nothing in the job waits for MLflow. At the end the job waits for the outbox at most
``ASR_CORE_FINAL_FLUSH_S`` (60 s) after finishing or failing and ``ASR_CORE_PREEMPT_FLUSH_S`` (5 s) after a stop
signal, then exits anyway: what is left is shipped by the next segment or by ``orchestrate status``/``resume``
(:func:`asr_core.runtime.shipper.ship_pending`).

SIGUSR2/SIGTERM are recorded from the first line of the process (:mod:`asr_core.runtime.signals`), so a signal that
arrives while the job imports, loads its corpus or learns its tokenizer still ends in exit 75 (or 77) and an
outcome in the folder.

Every start of the job that has work to do is a *segment* (the first start, then one per resume). Each appends a
line to ``TRIAL_DIR/segments.jsonl`` (time, code version, host, scheduler job id) and sets the run's tags
``trial.segments`` (how many) and ``trial.code`` (every code version that ran a segment, in order of first use,
from ``segments.jsonl``), so a run resumed after a new commit names both commits. A segment run from a dirty work
tree also leaves its diff in ``TRIAL_DIR/code-<segment>.diff``
(:meth:`~asr_core.contract.trial.TrialFolder.segment_diff`) and in the run's artifacts under ``code/``
(:data:`~asr_core.contract.trial.CODE_ARTIFACT_DIR`). ``TRIAL_DIR/progress.jsonl`` follows the job (``start``,
``train``, ``eval``, then ``preempted``, ``failed``, ``cancelled`` or ``done``) for ``orchestrate``, and each
segment's outcome is one line of ``TRIAL_DIR/attempts.jsonl`` (:func:`~asr_core.contract.trial.record_attempt`,
``by="job"``: ``finished``, ``preempted``, ``failed`` with the error's last line, ``cancelled``, ``fenced``), which
the failure budget of ``orchestrate`` counts.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from asr_core.runtime import signals
from asr_core.config import Config
from asr_core.contract.atomic import stale_temps
from asr_core.contract.folder.trained import mark_trained, seal_trained, trained_checkpoint
from asr_core.config.parse import ConfigError
from asr_core.contract.evaluation import (DEFAULT_EVALUATION, OWN_EVALUATION, EvaluationSpec, default_evaluation,
                                          describe_conditions, evaluated_record, evaluation_tag, read_evaluation)
from asr_core.evaluation.checkpoint_read import CheckpointRefused
from asr_core.evaluation.job import EvaluationInterrupted, run_evaluation
from asr_core.runtime.outbox import FINAL_FLUSH_S, PREEMPT_FLUSH_S, Outbox, fail_fast_http
from asr_core.contract.provenance import CodeVersion, code_version, cpu_kernels, cpu_model
from asr_core.contract.trial import (
    CODE_ARTIFACT_DIR,
    ENV_JOB_ID,
    EXIT_CANCELLED,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    FAILED,
    HEADS_DIR,
    FINISHED,
    KILLED,
    OUTCOME_CANCELLED,
    OUTCOME_DIVERGED,
    OUTCOME_FAILED,
    OUTCOME_FENCED,
    OUTCOME_FINISHED,
    OUTCOME_PREEMPTED,
    RUNNING,
    SCHEDULED,
    TAG_CODE,
    TAG_CPU,
    TAG_ERROR,
    TAG_GIT_COMMIT,
    TAG_JOB_ID,
    TAG_KERNELS,
    TAG_PREEMPTIONS,
    TAG_SEGMENTS,
    ProgressLog,
    TrialFolder,
    error_line,
    mark_done,
    mark_evaluated,
    preemptions,
    read_attempts,
    record_attempt,
)
from asr_core.contract.folder.segments import Segment, append_segment, code_labels, kernel_levels, read_segments

if TYPE_CHECKING:
    from asr_core.contract.folder.lease import Lease


def _say(text: str) -> None:
    print(f"[trial] {text}", flush=True)


# ---- the fence -----------------------------------------------------------------------------------------------------
def _acquire(folder: TrialFolder, job_id: str) -> "Lease | None":
    """The trial's lease, or None (after saying who holds it) when another live job has it."""
    from asr_core.contract.folder.lease import Lease, LeaseHeld

    try:
        return Lease(folder.path, job_id).acquire()
    except LeaseHeld as e:
        _say(f"{folder.path} is being run by another job ({e.info.describe()}); this one exits "
             f"{EXIT_FENCED} having changed nothing")
        return None


def _remove_partial_checkpoints(folder: TrialFolder, lease: "Lease") -> None:
    """Remove the temporary files of checkpoint saves that a killed job left (GBs each at the paper's sizes). Only
    while this job holds the lease: then no other trainer of the trial can be writing one."""
    for tmp in stale_temps(folder.checkpoint):
        if not lease.held():
            return
        try:
            size = tmp.stat().st_size
            tmp.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            _say(f"warning: cannot remove {tmp}, a partial checkpoint a killed job left ({e}); remove it by hand")
            continue
        _say(f"removed {tmp.name}, a partial checkpoint a killed job left ({size:,} bytes)")


def _outbox(folder: TrialFolder, segment: int | None, tracking_uri: str | None, run_id: str | None,
            lease: "Lease") -> Outbox | None:
    """The job's outbox (None when there is no MLflow to tell: no tracking URI and no run id)."""
    if not (tracking_uri or run_id):
        return None
    return Outbox(folder.path, segment=segment, tracking_uri=tracking_uri, run_id=run_id, guard=lease.held).start()


def _flush(outbox: Outbox | None, deadline_s: float) -> None:
    """Wait for the outbox at most ``deadline_s`` (less once a stop signal arrives), then go on regardless."""
    if outbox is None:
        return
    if not outbox.flush(deadline_s, hurry=lambda: signals.received() is not None):
        left = outbox.pending()
        why = outbox.last_error or (f"not done within {deadline_s:g} s" if outbox.run_id else "no run to ship to")
        print(f"[trial] MLflow has not taken {left} outbox record(s) yet ({why}); they wait in {outbox.dir} and "
              "are shipped by the next segment or by `orchestrate status`/`resume`", file=sys.stderr, flush=True)
    outbox.close()


# ---- segments ------------------------------------------------------------------------------------------------------
def _start_segment(folder: TrialFolder, version: CodeVersion) -> int:
    """Append this start's record to ``segments.jsonl``; returns its number (1 for the first start)."""
    n = len(read_segments(folder.path)) + 1
    seg = Segment(number=n, time=round(time.time(), 3), code=version.label, commit=version.commit,
                  dirty=version.dirty, host=socket.gethostname(), job_id=os.environ.get(ENV_JOB_ID),
                  kernels=cpu_kernels(), cpu=cpu_model())
    append_segment(folder.path, seg)
    where = f" (job {seg.job_id})" if seg.job_id else ""
    why = f" ({version.why})" if not version.known else ""
    _say(f"segment {n}: code {version.label}{why} on {seg.host}{where}, CPU kernels {seg.kernels or 'unknown'}")
    if version.dirty:
        folder.segment_diff(n).write_text(version.diff, errors="surrogateescape")
    return n


def _record_segment(folder: TrialFolder, segment: int, version: CodeVersion, outbox: Outbox) -> None:
    """The run is RUNNING, tagged with the segment count and the code versions so far (both from
    ``segments.jsonl``, never read back from MLflow); a dirty tree's diff goes to its artifacts."""
    segs = read_segments(folder.path)
    tags = {TAG_SEGMENTS: str(segment), TAG_CODE: ",".join(code_labels(segs))}
    if kernel_levels(segs):
        tags[TAG_KERNELS] = ",".join(kernel_levels(segs))
    if segs and segs[-1].cpu:
        tags[TAG_CPU] = segs[-1].cpu
    first_commit = next((s.commit for s in segs if s.commit), None)
    if first_commit:  # MLflow's own tag names the first segment's commit
        tags[TAG_GIT_COMMIT] = first_commit
    if segs and segs[-1].job:  # the scheduler's job running this segment (submission does not tag it)
        tags[TAG_JOB_ID] = segs[-1].job
    outbox.status(RUNNING, tags)
    diff = folder.segment_diff(segment)
    if version.dirty and diff.exists():
        outbox.artifact(diff, CODE_ARTIFACT_DIR)


# ---- the job -------------------------------------------------------------------------------------------------------
def run_trial(cfg: Config, out_dir: Path, *, tracking_uri: str | None = None, run_id: str | None = None,
              evaluation: EvaluationSpec | None = None) -> int:
    """Train ``cfg`` into ``out_dir`` and evaluate it on ``cfg.eval.datasets``; returns the exit code above.

    ``evaluation`` (the folder's ``evaluation.json``): an evaluation job instead: no training, the spec's
    evaluation of the model's checkpoint into the model's run (``run_id``), whose status it never changes."""
    folder = TrialFolder(Path(out_dir))
    folder.path.mkdir(parents=True, exist_ok=True)
    job_id = os.environ.get(ENV_JOB_ID) or ""
    if folder.done.exists():  # not a segment: nothing of the trial runs
        _say(f"{folder.path} already finished; nothing to do")
    elif folder.cancelled.exists():
        _say(f"{folder.path} is cancelled (its {folder.cancelled.name} file); nothing runs, exit {EXIT_CANCELLED}")
    lease = _acquire(folder, job_id)
    if lease is None:  # the holder ends the run; this start's own answer still says what the folder says
        return EXIT_OK if folder.done.exists() else EXIT_CANCELLED if folder.cancelled.exists() else EXIT_FENCED
    try:
        _remove_partial_checkpoints(folder, lease)
        # an evaluation job never tells its model's run a status: that is the training's
        says = run_id if evaluation is None else None
        if folder.done.exists():
            return _closed(folder, lease, tracking_uri, says, FINISHED, EXIT_OK,
                           time_ms=int(folder.done.stat().st_mtime * 1000))
        if folder.cancelled.exists():
            record_attempt(folder.path, OUTCOME_CANCELLED, "cancelled before the job started", job_id=job_id,
                           by="job")
            return _closed(folder, lease, tracking_uri, says, KILLED, EXIT_CANCELLED)
        return _segment(cfg, folder, lease, job_id, tracking_uri, run_id, evaluation)
    finally:
        lease.release()


def _closed(folder: TrialFolder, lease: "Lease", tracking_uri: str | None, run_id: str | None, status: str,
            code: int, time_ms: int | None = None) -> int:
    """A start that opens no segment: bring the run to the state the folder says (FINISHED, KILLED)."""
    outbox = _outbox(folder, None, tracking_uri, run_id, lease) if run_id else None
    if outbox is not None:
        outbox.status(status, time_ms=time_ms)
        _flush(outbox, FINAL_FLUSH_S)  # nothing else to do; a stop signal still shortens it
    return code


def _segment(cfg: Config, folder: TrialFolder, lease: "Lease", job_id: str, tracking_uri: str | None,
             run_id: str | None, evaluation: EvaluationSpec | None = None) -> int:
    progress = ProgressLog(folder.path)
    progress.write("start")
    version = code_version()
    segment: int | None = None
    outbox: Outbox | None = None

    def outcome(kind: str, reason: str = "") -> None:
        record_attempt(folder.path, kind, reason, segment=segment, job_id=job_id, by="job")

    def status(state: str, tags: dict[str, str] | None = None) -> None:
        if outbox is not None and evaluation is None:  # an evaluation job leaves its model's run state alone
            outbox.status(state, tags)

    from asr_core.training.loop import Diverged, Fenced, Preempted

    preload()
    try:
        segment = _start_segment(folder, version)
        outbox = _outbox(folder, segment, tracking_uri, run_id, lease)
        if evaluation is not None:  # no training: the spec's evaluation of the model's checkpoint
            _say(f"evaluation {evaluation.name} of model {evaluation.model}: "
                 f"{describe_conditions(evaluation.conditions)}")
            run_evaluation(evaluation, cfg, folder, tracking_uri, run_id, progress, outbox)
            if outbox is not None:
                outbox.sync()
        else:
            if outbox is not None:
                _record_segment(folder, segment, version, outbox)
            _train_and_evaluate(cfg, folder, lease, tracking_uri, run_id, progress, outbox)
    except Fenced as e:  # another job has the trial now: leave the folder and the run to it
        _say(f"{e}; exit {EXIT_FENCED}")
        outcome(OUTCOME_FENCED, str(e))
        if outbox is not None:
            outbox.close()
        return EXIT_FENCED
    except (Preempted, EvaluationInterrupted) as e:
        what = e or type(e).__name__
        if folder.cancelled.exists():  # `orchestrate cancel` sent the signal: the end is final
            _say(f"cancelled ({what}); checkpointed, the run is KILLED, exit {EXIT_CANCELLED}")
            outcome(OUTCOME_CANCELLED, f"cancelled ({what})")
            progress.write("cancelled")
            status(KILLED)
            _flush(outbox, PREEMPT_FLUSH_S)
            return EXIT_CANCELLED
        outcome(OUTCOME_PREEMPTED, str(what))
        n = preemptions(read_attempts(folder.path))
        _say(f"preempted ({what}); checkpointed, exit {EXIT_PREEMPTED} to be requeued")
        progress.write("preempted")
        status(SCHEDULED, {TAG_PREEMPTIONS: str(n)})
        _flush(outbox, PREEMPT_FLUSH_S)
        return EXIT_PREEMPTED
    except (CheckpointRefused, Diverged) as e:  # failures of their own: each its exit code, outcome and reason
        code, kind, reason = ((EXIT_DIVERGED, OUTCOME_DIVERGED, "diverged") if isinstance(e, Diverged)
                              else (EXIT_USAGE, OUTCOME_FAILED, "checkpoint refused"))  # nothing evaluated or merged
        _say(f"{e}; exit {code}")
        outcome(kind, str(e))
        progress.write("failed")
        status(FAILED, {TAG_ERROR: error_line(str(e), reason)})
        _flush(outbox, FINAL_FLUSH_S)
        return code
    except Exception as e:  # noqa: BLE001 - every failure must reach the folder and the ledger
        traceback.print_exc()
        last = error_line(f"{type(e).__name__}: {e}", type(e).__name__)
        outcome(OUTCOME_FAILED, last)
        progress.write("failed")
        status(FAILED, {TAG_ERROR: last})
        _flush(outbox, FINAL_FLUSH_S)
        return EXIT_FAILED
    mark_done(folder.path)
    outcome(OUTCOME_FINISHED)
    progress.write("done")
    status(FINISHED)
    _say(f"finished: {folder.path}")
    _flush(outbox, FINAL_FLUSH_S)
    return EXIT_OK


# what a trial job imports later (evaluation after training, the head measurement, beam decoding): imported when the
# job starts, so that a checkout pulled or edited while the job trains cannot give one process two versions of the code
PRELOAD = ("asr_core.training.train", "asr_core.training.checkpoint", "asr_core.evaluation.evaluate",
           "asr_core.evaluation.decoders", "asr_core.data.features", "asr_core.probes.heads")


def preload() -> None:
    """Import every module of :data:`PRELOAD` now."""
    for name in PRELOAD:
        importlib.import_module(name)


def _train_and_evaluate(cfg: Config, folder: TrialFolder, lease: "Lease", tracking_uri: str | None,
                        run_id: str | None, progress: ProgressLog, outbox: Outbox | None) -> None:
    """A model's stages, each skipped when its marker says it is done: training (``TRAINED``), the default
    evaluation (``EVALUATED``: what it decoded, and how), head similarity."""
    from asr_core.training.train import train

    trained = trained_checkpoint(folder.path)  # None when absent or unreadable (then train() finds it finished)
    if trained is not None:
        checkpoint = trained
        _say(f"training already finished ({checkpoint}); evaluating")
    else:
        result = train(cfg, folder.path, tracking_uri=tracking_uri, run_id=run_id, end_run=False,
                       progress=progress, outbox=outbox, held=lease.held)
        run_id = result.run_id or run_id
        checkpoint = Path(result.checkpoint)
        mark_trained(folder.path, checkpoint, result.steps)
    _drop_optimizer(checkpoint, lease)
    if lease.held():
        seal_trained(folder.path)  # the checkpoint's hash as every evaluation of the model will check it
    if not cfg.eval.datasets:
        return
    evaluated = folder.evaluated
    if evaluated.exists():
        _say("evaluation already finished")
    else:
        _evaluate_interruptibly(cfg, checkpoint, folder.path, tracking_uri, run_id, progress, outbox)
        own = default_evaluation(cfg.eval)
        if outbox is not None:
            outbox.tags(evaluation_tag(OWN_EVALUATION, DEFAULT_EVALUATION, *own))
            outbox.sync()  # the evaluation's records are on disk before the marker that skips it
        mark_evaluated(folder.path, evaluated_record(*own))
    if cfg.eval.head_diversity:
        _measure_heads_interruptibly(cfg, checkpoint, folder, tracking_uri, run_id, progress, outbox)


def _drop_optimizer(checkpoint: Path, lease: "Lease") -> None:
    """A trained model's checkpoint keeps no optimizer state (nothing will train it further); also done by the
    segment after one that stopped between TRAINED and the rewrite. Only while this job holds the trial."""
    from asr_core.training.checkpoint import drop_optimizer_state

    if checkpoint.is_file() and lease.held():
        saved = drop_optimizer_state(checkpoint)
        if saved:
            _say(f"training finished: dropped the optimizer state from {checkpoint.name} ({saved / 2**20:.1f} MiB)")


def _evaluate_interruptibly(cfg: Config, checkpoint: Path, out_dir: Path, tracking_uri: str | None,
                            run_id: str | None, progress: ProgressLog, outbox: Outbox | None) -> None:
    """Evaluation has no checkpoint: a stop signal (also one that arrived before it began) interrupts it at once."""
    from asr_core.evaluation.evaluate import Destination, EvaluationRun, evaluate

    with signals.installed(), signals.raising(EvaluationInterrupted):
        evaluate(EvaluationRun.of(checkpoint, cfg.eval),
                 Destination(out_dir=TrialFolder(out_dir).eval_dir, log=outbox is not None, run_id=run_id,
                             tracking_uri=tracking_uri, outbox=outbox, progress=progress))


def _measure_heads_interruptibly(cfg: Config, checkpoint: Path, folder: TrialFolder, tracking_uri: str | None,
                                 run_id: str | None, progress: ProgressLog, outbox: Outbox | None) -> None:
    """``eval.head_diversity``: paper 003's head similarity on the first evaluation dataset
    (:func:`asr_core.probes.heads.measure`), into ``TRIAL_DIR/heads/`` and the run. Like evaluation it has no
    checkpoint: a stop signal interrupts it at once, and the next segment runs this stage again (only this one:
    ``EVALUATED`` says the evaluation is done). Progress records are ``eval`` records of dataset ``heads:NAME``."""
    from asr_core.probes.heads import measure

    def step(name: str, done: int, total: int) -> None:
        progress.write("eval", done, total, f"{HEADS_DIR}:{name}")

    with signals.installed(), signals.raising(EvaluationInterrupted):
        measure(checkpoint, list(cfg.eval.datasets[:1]), rows=cfg.eval.head_rows, max_windows=cfg.eval.head_windows,
                batch_windows=cfg.eval.batch_windows, precision=cfg.eval.precision, tracking_uri=tracking_uri,
                run_id=run_id, out_dir=folder.heads, log=outbox is not None, progress=step, outbox=outbox)


def _config_invalid(config: str, error: Exception, out_dir: Path, tracking_uri: str | None,
                    run_id: str | None) -> int:
    """Record an invalid config: a ``failed`` attempt and progress record, and the run FAILED with the reason (left
    SCHEDULED, it would look lost and every ``resume`` would submit it again without saying why it never starts).
    Needs the trial folder (made when a run id is given) and the lease (held by another job: exit 73, nothing
    written). MLflow is told through the outbox like everything else; the exit code says what happened."""
    if run_id:
        out_dir.mkdir(parents=True, exist_ok=True)
    if not out_dir.is_dir():
        return EXIT_USAGE
    folder = TrialFolder(out_dir)
    lease = _acquire(folder, os.environ.get(ENV_JOB_ID) or "")
    if lease is None:
        return EXIT_FENCED
    try:
        reason = error_line(str(error), type(error).__name__)
        reason = reason.removeprefix(f"{config}: ")  # the config's own message may start with its path too
        ProgressLog(out_dir).write("failed")
        record_attempt(out_dir, OUTCOME_FAILED, f"config {config} invalid: {reason}",
                       job_id=os.environ.get(ENV_JOB_ID) or "", by="job")
        return _closed_failed(folder, lease, tracking_uri, run_id, f"config {config} invalid: {reason}")
    finally:
        lease.release()


def _closed_failed(folder: TrialFolder, lease: "Lease", tracking_uri: str | None, run_id: str | None,
                   error: str) -> int:
    outbox = _outbox(folder, None, tracking_uri, run_id, lease) if run_id else None
    if outbox is not None:
        outbox.status(FAILED, {TAG_ERROR: error})
        _flush(outbox, FINAL_FLUSH_S)
    return EXIT_USAGE


def _limit_threads() -> None:
    """Use the CPUs the scheduler granted, not every core of the node: without cgroups, torch would start one
    thread per core in every job sharing the node. OMP_NUM_THREADS (set by Ray per trial, or by the user) wins."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    granted = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE")
    if granted and granted.isdigit() and int(granted) > 0:
        import torch

        torch.set_num_threads(int(granted))


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m asr_core trial", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the trial's config (JSON or YAML, Config.to_dict() form)")
    p.add_argument("--out", required=True, help="the trial's folder (checkpoint, logs, evaluation tables)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (sqlite:///… or http://…)")
    p.add_argument("--run-id", default=None, help="the MLflow run created for this trial at submission")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    try:
        cfg = Config.from_yaml(args.config, args.overrides, stored=True)
    except ConfigError as e:
        print(f"asr_core trial: {e}", file=sys.stderr)
        return _config_invalid(args.config, e, Path(args.out), args.tracking_uri, args.run_id)
    try:
        evaluation = read_evaluation(args.out)
    except ValueError as e:
        print(f"asr_core trial: {e}", file=sys.stderr)
        return _config_invalid(args.config, e, Path(args.out), args.tracking_uri, None)
    _limit_threads()
    return run_trial(cfg, Path(args.out), tracking_uri=args.tracking_uri, run_id=args.run_id, evaluation=evaluation)
