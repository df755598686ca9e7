"""The trial contract: everything a backend of ``orchestrate`` and the trial job (``python -m asr_core trial``)
agree on, defined once. Both sides import this module; neither re-derives the other's formats.

========================  ===========================================================================================
what                      here
========================  ===========================================================================================
the command               :func:`trial_command` (``python -m asr_core trial --config … --out … --tracking-uri …
                          --run-id …``), run with ``cwd`` = the sweep's workdir and :data:`ENV_JOB_ID` set
the config it reads       :data:`CONFIG_FILE` in the trial folder, written by :func:`write_config`
exit codes                :data:`EXIT_OK` 0, :data:`EXIT_FAILED` 1, :data:`EXIT_USAGE` 2, :data:`EXIT_PREEMPTED` 75,
                          :data:`EXIT_FENCED` 73, :data:`EXIT_CANCELLED` 77, :data:`EXIT_DIVERGED` 65
run states                :data:`SCHEDULED` … :data:`KILLED` (MLflow's), who writes which: see :data:`STATES`; the
                          job writes them through its outbox (:mod:`asr_core.runtime.outbox`, folder :data:`OUTBOX_DIR`)
tags                      ``TAG_*`` below: the ledger writes the ``sweep.*`` and identity tags at submission, the
                          job writes :data:`TAG_ERROR`, :data:`TAG_PREEMPTIONS`, :data:`TAG_CHECKPOINT`,
                          :data:`TAG_CODE`, :data:`TAG_SEGMENTS`, :data:`TAG_DATA_FINGERPRINT` and
                          :func:`eval_fingerprint_tag`
trial-folder files        :class:`TrialFolder`; the markers' writers :func:`mark_done`, :func:`mark_cancelled`,
                          :func:`mark_evaluated` (atomic: :mod:`asr_core.contract.atomic`); the ``TRAINED`` record's
                          writer and reader: :mod:`asr_core.contract.folder.trained`
progress                  :class:`ProgressLog` (JSON lines) and :func:`read_progress`; never parsed from log text
segments and outcomes     :func:`asr_core.contract.folder.segments.read_segments` (one line per start of the job),
                          :func:`record_attempt` / :func:`read_attempts` / :func:`failures` / :func:`preemptions`
                          (one line per ended segment)
========================  ===========================================================================================
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from asr_core.contract.atomic import write_atomic


class StoredConfig(Protocol):
    """What the contract needs of a config (:class:`asr_core.config.Config`, which the contract does not import: the
    config reads the contract): its plain-data form."""

    def to_dict(self) -> dict[str, Any]: ...

# ---- exit codes of the trial job ---------------------------------------------------------------------------------
EXIT_OK = 0  # trained and evaluated; the run is FINISHED
EXIT_FAILED = 1  # failed; the run is FAILED with TAG_ERROR set
EXIT_USAGE = 2  # the config file is invalid; nothing ran
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: SIGUSR2/SIGTERM arrived, checkpointed; run the same command again
EXIT_FENCED = 73  # another live trainer holds the trial's lease: this one exited having changed nothing
EXIT_CANCELLED = 77  # the trial was cancelled (`orchestrate cancel`): checkpointed if it trained, never requeued
EXIT_DIVERGED = 65  # train.max_nonfinite_steps non-finite losses in a row: FAILED, the last finite checkpoint kept

# ---- run states (MLflow's RunStatus names) --------------------------------------------------------------------------
SCHEDULED = "SCHEDULED"  # created at submission (ledger), or written back by a preempted job
RUNNING = "RUNNING"  # written by the job when training (re)starts
FINISHED = "FINISHED"  # written by the job after evaluation
FAILED = "FAILED"  # written by the job (or its SLURM task when the job could not start)
KILLED = "KILLED"  # written by the ledger on `orchestrate cancel`, and by a job that finds CANCELLED
STATES = (SCHEDULED, RUNNING, FINISHED, FAILED, KILLED)  # the order `status` prints them
ENDED = (FINISHED, FAILED, KILLED)

# ---- tags ---------------------------------------------------------------------------------------------------------
TAG_ROLE = "sweep.role"  # ROLE_PARENT on the sweep's parent run, ROLE_TRIAL on each trial run
ROLE_PARENT = "parent"
ROLE_TRIAL = "trial"
ROLE_EXTERNAL = "external"  # another system's scores on the sweep's test sets (``python -m asr_core score``)
TAG_SYSTEM = "external.system"  # that system's name, on a ROLE_EXTERNAL run
TAG_SWEEP_GRID = "sweep.grid"
TAG_SWEEP_BACKEND = "sweep.backend"
TAG_SWEEP_ID = "sweep.id"  # on the experiment: the id of the sweep folder that owns it
TAG_SWEEP_ROOT = "sweep.root"  # on the experiment: that folder, for the message naming the owner
TAG_PARENT_RUN = "mlflow.parentRunId"
TAG_KEY = "trial.key"
TAG_LABEL = "trial.label"
TAG_SUBGRIDS = "trial.subgrids"  # comma-separated
TAG_SEED = "trial.seed"
TAG_BACKEND = "trial.backend"
TAG_JOB_ID = "trial.job_id"
TAG_ERROR = "trial.error"  # the last line of the error of a FAILED run ("" once resubmitted)
TAG_PREEMPTIONS = "trial.preemptions"  # how often the job checkpointed and asked to be run again
TAG_CHECKPOINT = "trial.checkpoint"  # absolute path of the checkpoint
TAG_CODE = "trial.code"  # every code version that ran a segment of the trial, comma-separated, in order
TAG_SEGMENTS = "trial.segments"  # how many times the job started (first start + resumes)
TAG_KERNELS = "trial.kernels"  # every CPU kernel level (ATEN_CPU_CAPABILITY) a segment trained with, in order
TAG_CPU = "trial.cpu"  # the newest segment's CPU model
TAG_RECEPTIVE_FIELD = "model.receptive_field_s"  # seconds each side (asr_core.model.receptive); "window": unbanded
TAG_DATA_FINGERPRINT = "trial.data.fingerprint"  # content fingerprint of the training data (name=fingerprint)
TAG_GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own, shown in its UI: the first segment's commit
CODE_ARTIFACT_DIR = "code"  # the run's artifact folder for the diffs of segments run from a dirty work tree


def eval_fingerprint_tag(dataset: str) -> str:
    """``eval.<NAME>.fingerprint``: the content fingerprint of an evaluation dataset, written by the evaluator."""
    return f"eval.{dataset}.fingerprint"

MAX_TAG_CHARS = 4000

ENV_JOB_ID = "ORCHESTRATE_JOB_ID"  # the scheduler's id of the job running the trial (recorded per segment)


# ---- trial folder -------------------------------------------------------------------------------------------------
CONFIG_FILE = "config.json"
CHECKPOINT_FILE = "checkpoint.pt"
TRAINED_FILE = "TRAINED"  # JSON {"checkpoint", "steps"}: training finished, evaluation may not have
DONE_FILE = "DONE"  # the trial finished; nothing runs again
LOG_FILE = "trial.log"  # the job's stdout and stderr, appended per segment
PROGRESS_FILE = "progress.jsonl"
SEGMENTS_FILE = "segments.jsonl"  # one JSON line per start of the job: time, code version, host, job id
EVAL_DIR = "eval"  # the evaluator's per-recording tables (also the run's artifact folder for them)
# the evaluation finished (JSON {"datasets": [names]}): a later segment (one stopped while measuring the heads, or
# between this and DONE) does not evaluate again. Written and read by the trial job only.
EVALUATED_FILE = "EVALUATED"
HEADS_DIR = "heads"  # head-similarity matrices and figures (eval.head_diversity; also the run's artifact folder)
TOKENIZER_FILE = "tokenizer.model"  # the BPE model a trial learned (also inside the checkpoint)
OUTBOX_DIR = "outbox"  # what the job has to tell MLflow, appended first here and shipped in the background
LEASE_DIR = "lease"  # the fence: one file per lease generation; the newest live one names the trainer that may run
ATTEMPTS_FILE = "attempts.jsonl"  # one JSON line per ended segment (or lost job): its outcome, for the failure budget
CANCELLED_FILE = "CANCELLED"  # written by `orchestrate cancel`: the trial ends KILLED, whatever its trainer does


@dataclass(frozen=True)
class TrialFolder:
    """``<sweep>/trials/<key>/``: the trial's first record; MLflow is fed from what the job does here."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT_FILE

    @property
    def trained(self) -> Path:
        return self.path / TRAINED_FILE

    @property
    def evaluated(self) -> Path:
        return self.path / EVALUATED_FILE

    @property
    def heads(self) -> Path:
        return self.path / HEADS_DIR

    @property
    def done(self) -> Path:
        return self.path / DONE_FILE

    @property
    def log(self) -> Path:
        return self.path / LOG_FILE

    @property
    def progress(self) -> Path:
        return self.path / PROGRESS_FILE

    @property
    def segments(self) -> Path:
        return self.path / SEGMENTS_FILE

    @property
    def eval_dir(self) -> Path:
        return self.path / EVAL_DIR

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER_FILE

    @property
    def outbox_dir(self) -> Path:
        return self.path / OUTBOX_DIR

    @property
    def lease_dir(self) -> Path:
        return self.path / LEASE_DIR

    @property
    def attempts(self) -> Path:
        return self.path / ATTEMPTS_FILE

    @property
    def cancelled(self) -> Path:
        return self.path / CANCELLED_FILE

    def segment_diff(self, segment: int) -> Path:
        """The uncommitted changes of the code that ran segment ``segment`` (1-based), when its tree was dirty."""
        return self.path / f"code-{segment}.diff"


def trial_command(trial_dir: Path, tracking_uri: str, run_id: str, python: str | None = None) -> list[str]:
    """The command every backend runs for a trial."""
    return [python or sys.executable, "-m", "asr_core", "trial", "--config", str(Path(trial_dir) / CONFIG_FILE),
            "--out", str(trial_dir), "--tracking-uri", tracking_uri, "--run-id", run_id]


def config_json(d: Any) -> str:
    """JSON that YAML 1.1 readers parse to the same values too: PyYAML reads ``1e-06`` as a string, so exponent
    floats are written ``1.0e-06`` (still valid JSON)."""
    if isinstance(d, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {config_json(v)}" for k, v in d.items()) + "}"
    if isinstance(d, (list, tuple)):
        return "[" + ", ".join(config_json(v) for v in d) + "]"
    if isinstance(d, float):
        text = repr(d)
        if "e" in text and "." not in text.split("e")[0]:
            mant, exp = text.split("e")
            text = f"{mant}.0e{exp}"
        return text
    return json.dumps(d)


def write_config(trial_dir: Path, cfg: StoredConfig) -> Path:
    """Write (atomically) the config the job reads, unless the file already holds exactly it; returns its path."""
    folder = TrialFolder(Path(trial_dir))
    folder.path.mkdir(parents=True, exist_ok=True)
    text = config_json(cfg.to_dict()) + "\n"
    if folder.config.exists() and folder.config.read_text() == text:
        return folder.config
    return write_atomic(folder.config, text)


def error_line(text: str, default: str = "error") -> str:
    """The last non-blank line of an error's text (what :data:`TAG_ERROR` records), or ``default`` when it has
    none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else default


def mark_run(tracking_uri: str | None, run_id: str | None, status: str, tags: dict[str, str] | None = None) -> None:
    """Set a trial run's status (one of :data:`STATES`) and tags at once, synchronously; a no-op without a run. For
    the scheduler's side (a SLURM task whose job could not start); the job itself writes through its outbox.

    Writes through ``MlflowClient`` only (never a fluent active run), so no exit hook of MLflow's can overwrite it."""
    if not run_id:
        return
    if status not in STATES:
        raise ValueError(f"unknown run state {status!r}; valid: {', '.join(STATES)}")
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if tags:
        client.log_batch(run_id, tags=[RunTag(k, str(v)[:MAX_TAG_CHARS]) for k, v in tags.items()])
    if status in (SCHEDULED, RUNNING):
        client.update_run(run_id, status=status)
    else:
        client.set_terminated(run_id, status=status)


def append_json_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line with one ``write`` (see :func:`append_json_lines`)."""
    append_json_lines(path, [record])


def append_json_lines(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append ``records`` as JSON lines with one ``write``. A line cut short by a crash (no newline at the end of
    the file) is closed first, so the new records are never glued onto it and lost."""
    line = "".join(json.dumps(record) + "\n" for record in records)
    if not line:
        return
    with open(path, "ab+") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())


# ---- markers: each written whole or not at all (a full disk leaves the old marker or none) -------------------------
def mark_done(trial_dir: Path | str) -> None:
    """Write :data:`DONE_FILE`: the trial finished; nothing runs again."""
    write_atomic(TrialFolder(Path(trial_dir)).done, "finished\n")


def mark_evaluated(trial_dir: Path | str, record: str) -> None:
    """Write :data:`EVALUATED_FILE` with ``record`` (:func:`asr_core.contract.evaluation.evaluated_record`)."""
    write_atomic(TrialFolder(Path(trial_dir)).evaluated, record)


def mark_cancelled(trial_dir: Path | str, by: str, at: float | None = None) -> None:
    """Write :data:`CANCELLED_FILE` (JSON {"time", "by"}; ``at`` defaults to now). The folder must exist."""
    write_atomic(TrialFolder(Path(trial_dir)).cancelled,
                 json.dumps({"time": round(time.time(), 3) if at is None else at, "by": by}) + "\n")


# ---- progress records ---------------------------------------------------------------------------------------------
PHASES = ("start", "train", "eval", "preempted", "failed", "cancelled", "done")


@dataclass(frozen=True)
class Progress:
    """One progress record: ``phase`` (one of :data:`PHASES`), ``done`` of ``total`` units (steps when training,
    recordings × conditions when evaluating), ``dataset`` while evaluating, ``time`` (Unix seconds)."""

    phase: str
    done: int = 0
    total: int = 0
    dataset: str = ""
    time: float = 0.0

    def describe(self) -> str:
        """``train 30/60``, ``eval test 4/12``, ``starting``, ``preempted``, ``failed``, ``cancelled``, ``done``."""
        if self.phase == "train":
            return f"train {self.done}/{self.total}"
        if self.phase == "eval":
            return f"eval {self.dataset} {self.done}/{self.total}".replace("  ", " ")
        return "starting" if self.phase == "start" else self.phase

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON line (``dataset`` only when there is one)."""
        d: dict[str, Any] = {"phase": self.phase, "done": self.done, "total": self.total, "time": self.time}
        if self.dataset:
            d["dataset"] = self.dataset
        return d


class ProgressLog:
    """Appends :class:`Progress` records, one JSON object per line, to ``TRIAL_DIR/progress.jsonl``.

    A record is one ``write`` of a whole line to a file opened for appending, so a reader never sees half a record
    except at the very end (which :func:`read_progress` skips)."""

    def __init__(self, trial_dir: Path | str | None) -> None:
        self.path = TrialFolder(Path(trial_dir)).progress if trial_dir is not None else None

    def write(self, phase: str, done: int = 0, total: int = 0, dataset: str = "") -> None:
        if self.path is None:
            return
        if phase not in PHASES:
            raise ValueError(f"unknown progress phase {phase!r}; valid: {', '.join(PHASES)}")
        rec = Progress(phase, int(done), int(total), dataset, round(time.time(), 3))
        try:
            append_json_line(self.path, rec.to_dict())
        except OSError as e:  # progress is for people watching; never let it stop training
            print(f"[trial] warning: cannot write progress to {self.path}: {e}", file=sys.stderr)


def write_progress(trial_dir: Path | str, records: Iterable[Progress]) -> None:
    """Append ``records`` to a trial folder's progress, as they are (times included), with one ``write``."""
    append_json_lines(TrialFolder(Path(trial_dir)).progress, [r.to_dict() for r in records])


def parse_progress(line: str) -> Progress | None:
    """One line of ``progress.jsonl`` as a record, or None for a line that is not one (cut by a tail window, or
    being written)."""
    try:
        d = json.loads(line)
        if isinstance(d, dict) and d.get("phase") in PHASES:
            return Progress(phase=d["phase"], done=int(d.get("done", 0)), total=int(d.get("total", 0)),
                            dataset=str(d.get("dataset", "")), time=float(d.get("time", 0.0)))
    except (ValueError, TypeError):
        pass
    return None


def progress_tail(trial_dir: Path | str, tail_bytes: int = 4096) -> list[Progress]:
    """The complete records in the last ``tail_bytes`` of a trial folder's ``progress.jsonl``, oldest first."""
    try:
        with open(TrialFolder(Path(trial_dir)).progress, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [rec for line in lines if (rec := parse_progress(line)) is not None]


def read_progress(trial_dir: Path | str, tail_bytes: int = 4096) -> Progress | None:
    """The last complete record of a trial folder, or None when the job has written none."""
    recs = progress_tail(trial_dir, tail_bytes)
    return recs[-1] if recs else None


def progress_records(trial_dir: Path | str) -> list[Progress]:
    """Every complete record of a trial folder, oldest first. Each start of the job writes ``start``; the trainer
    then writes a ``train`` record at the step it starts from (0, or the checkpoint's step when it resumes)."""
    try:
        text = TrialFolder(Path(trial_dir)).progress.read_text(errors="replace")
    except OSError:
        return []
    return [rec for line in text.splitlines() if (rec := parse_progress(line)) is not None]


# ---- attempts: how each segment ended (the failure budget) --------------------------------------------------------
OUTCOME_FINISHED = "finished"  # the job: trained and evaluated
OUTCOME_PREEMPTED = "preempted"  # the job: checkpointed after USR2/TERM, to be requeued (not a failure)
OUTCOME_FAILED = "failed"  # the job: its own error (reason = the error's last line)
OUTCOME_DIVERGED = "diverged"  # the job: train.max_nonfinite_steps non-finite losses in a row (EXIT_DIVERGED)
OUTCOME_KILLED = "killed"  # the system ended it: a signal (SIGKILL: out of memory), OUT_OF_MEMORY, TIMEOUT, NODE_FAIL
OUTCOME_LOST = "lost"  # it ended without a word and the scheduler cannot say how (no accounting)
OUTCOME_FENCED = "fenced"  # a second trainer found the lease held and exited (not a failure)
OUTCOME_CANCELLED = "cancelled"  # `orchestrate cancel` (not a failure; only `retry --cancelled` runs it again)
OUTCOME_RESET = "reset"  # `retry --failed`: failures before this line no longer count
OUTCOMES = (OUTCOME_FINISHED, OUTCOME_PREEMPTED, OUTCOME_FAILED, OUTCOME_DIVERGED, OUTCOME_KILLED, OUTCOME_LOST,
            OUTCOME_FENCED, OUTCOME_CANCELLED, OUTCOME_RESET)
FAILURE_OUTCOMES = (OUTCOME_FAILED, OUTCOME_DIVERGED, OUTCOME_KILLED, OUTCOME_LOST)  # what `max_failures` counts


@dataclass(frozen=True)
class Attempt:
    """How one segment of a trial ended (or a job that never started one: ``segment`` None).

    ``by`` says who recorded it: ``job`` (the trial process itself), ``task`` (the scheduler task that ran it and saw
    it die), ``resume`` (reconciliation, from the scheduler's accounting) or ``retry``. A segment's outcome is
    recorded once: (segment, job id) identifies it, so two ``resume`` calls never count one failure twice."""

    outcome: str
    reason: str = ""
    segment: int | None = None
    job_id: str = ""
    time: float = 0.0
    by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reason": self.reason, "segment": self.segment, "job_id": self.job_id,
                "time": self.time, "by": self.by}


def read_attempts(trial_dir: Path | str) -> list[Attempt]:
    """Every attempt recorded in a trial folder, oldest first (a line cut short by a crash is skipped)."""
    try:
        text = TrialFolder(Path(trial_dir)).attempts.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(d, dict) or d.get("outcome") not in OUTCOMES:
            continue
        seg = d.get("segment")
        out.append(Attempt(outcome=d["outcome"], reason=str(d.get("reason") or ""),
                           segment=int(seg) if isinstance(seg, int) else None, job_id=str(d.get("job_id") or ""),
                           time=float(d.get("time") or 0.0), by=str(d.get("by") or "")))
    return out


def attempt_recorded(attempts: list[Attempt], segment: int | None, job_id: str) -> bool:
    """Whether the outcome of (segment, job id) is already recorded (resets never count as outcomes)."""
    return any(a.outcome != OUTCOME_RESET and a.segment == segment and (segment is not None or a.job_id == job_id)
               for a in attempts)


def record_attempt(trial_dir: Path | str, outcome: str, reason: str = "", *, segment: int | None = None,
                   job_id: str = "", by: str = "") -> Attempt | None:
    """Append an attempt unless (segment, job id) already has one; returns it, or None when it was recorded before.

    One ``write`` of one whole line to a file opened for appending, like :class:`ProgressLog`."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown attempt outcome {outcome!r}; valid: {', '.join(OUTCOMES)}")
    if outcome != OUTCOME_RESET and attempt_recorded(read_attempts(trial_dir), segment, job_id):
        return None
    a = Attempt(outcome, error_line(reason, "") if reason else "", segment, job_id or "", round(time.time(), 3), by)
    Path(trial_dir).mkdir(parents=True, exist_ok=True)
    write_attempts(trial_dir, [a])
    return a


def write_attempts(trial_dir: Path | str, attempts: Iterable[Attempt]) -> None:
    """Append ``attempts`` to a trial folder's ``attempts.jsonl`` as they are, with one ``write``
    (:func:`record_attempt` is the writer that records an outcome once)."""
    append_json_lines(TrialFolder(Path(trial_dir)).attempts, [a.to_dict() for a in attempts])


def preemptions(attempts: list[Attempt]) -> int:
    """How often the trial checkpointed on a stop signal and asked to be run again (what
    :data:`TAG_PREEMPTIONS` records): counted from the folder, never read back from MLflow."""
    return sum(a.outcome == OUTCOME_PREEMPTED for a in attempts)


def failures(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts that count against ``max_failures``: failures since the last reset."""
    last_reset = max((i for i, a in enumerate(attempts) if a.outcome == OUTCOME_RESET), default=-1)
    return [a for a in attempts[last_reset + 1:] if a.outcome in FAILURE_OUTCOMES]
