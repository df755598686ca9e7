"""One grid trial: train, then evaluate, inside one MLflow run.

This is the command every backend runs for a trial (:func:`asr_core.trial_contract.trial_command`)::

    python -m asr_core trial --config TRIAL_DIR/config.json --out TRIAL_DIR --tracking-uri URI --run-id RUN_ID

Exit codes are the contract with the schedulers (defined in :mod:`asr_core.trial_contract`):

* ``0``  trained and evaluated; the run is FINISHED.
* ``75`` (EX_TEMPFAIL) SIGUSR2 or SIGTERM arrived: training checkpointed (or evaluation was interrupted), the run is
  back to SCHEDULED with ``trial.preemptions`` incremented; run the same command again to continue.
* ``1``  failed; the run is FAILED with the error's last line in the tag ``trial.error``.
* ``2``  the config file is invalid; nothing ran. The run (when ``--run-id`` is given) is FAILED with
  ``trial.error`` = ``config <path> invalid: <reason>``, so ``orchestrate status`` names the reason instead of
  the trial looking lost; correct the config, then ``orchestrate retry`` runs it again.

Re-running a trial is always safe: training resumes from ``TRIAL_DIR/checkpoint.pt``, a finished training phase is
remembered in ``TRIAL_DIR/TRAINED`` and a finished trial in ``TRIAL_DIR/DONE``, so nothing is trained twice.

Every start of the job that has work to do is a *segment* (the first start, then one per resume). Each appends a
line to ``TRIAL_DIR/segments.jsonl`` (time, code version, host, scheduler job id) and sets the run's tags
``trial.segments`` (how many) and ``trial.code`` (every code version that ran a segment, in order of first use),
so a run resumed after a new commit names both commits. A segment run from a dirty work tree also leaves its diff
in ``TRIAL_DIR/code-<segment>.diff`` (:meth:`~asr_core.trial_contract.TrialFolder.segment_diff`) and in the
run's artifacts under ``code/`` (:data:`~asr_core.trial_contract.CODE_ARTIFACT_DIR`). ``TRIAL_DIR/progress.jsonl``
follows the job (``start``, ``train``, ``eval``, then ``preempted``, ``failed`` or ``done``) for ``orchestrate``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from asr_core.config import Config, ConfigError
from asr_core.provenance import CodeVersion, code_version
from asr_core.trial_contract import (
    CODE_ARTIFACT_DIR,
    ENV_JOB_ID,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    FAILED,
    FINISHED,
    RUNNING,
    SCHEDULED,
    TAG_CODE,
    TAG_ERROR,
    TAG_GIT_COMMIT,
    TAG_PREEMPTIONS,
    TAG_SEGMENTS,
    ProgressLog,
    TrialFolder,
    error_line,
    mark_run,
    read_segments,
)


class EvaluationInterrupted(Exception):
    """SIGUSR2/SIGTERM during evaluation: evaluation has no checkpoint, so it simply starts again on requeue."""


def _client(tracking_uri: str | None) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _preemptions(tracking_uri: str | None, run_id: str | None) -> int:
    if not run_id:
        return 0
    return int(_client(tracking_uri).get_run(run_id).data.tags.get(TAG_PREEMPTIONS, "0"))


# ---- segments ------------------------------------------------------------------------------------------------------
def _start_segment(folder: TrialFolder, version: CodeVersion) -> int:
    """Append this start's record to ``segments.jsonl``; returns its number (1 for the first start)."""
    n = len(read_segments(folder.path)) + 1
    rec = {"segment": n, "time": round(time.time(), 3), **version.to_dict(), "host": socket.gethostname(),
           "job_id": os.environ.get(ENV_JOB_ID)}
    with open(folder.segments, "a") as f:
        f.write(json.dumps(rec) + "\n")
    where = f" (job {rec['job_id']})" if rec["job_id"] else ""
    why = f" ({version.why})" if not version.known else ""
    print(f"[trial] segment {n}: code {version.label}{why} on {rec['host']}{where}", flush=True)
    if version.dirty:
        folder.segment_diff(n).write_text(version.diff, errors="surrogateescape")
    return n


def _record_segment(folder: TrialFolder, segment: int, version: CodeVersion, tracking_uri: str | None,
                    run_id: str) -> None:
    """Tag the run with the segment count and the code versions so far; attach a dirty tree's diff."""
    tags = _client(tracking_uri).get_run(run_id).data.tags
    labels = [c for c in tags.get(TAG_CODE, "").split(",") if c]
    if version.label not in labels:
        labels.append(version.label)
    new = {TAG_SEGMENTS: str(segment), TAG_CODE: ",".join(labels)}
    if version.commit and TAG_GIT_COMMIT not in tags:  # MLflow's own tag names the first segment's commit
        new[TAG_GIT_COMMIT] = version.commit
    mark_run(tracking_uri, run_id, RUNNING, new)
    diff = folder.segment_diff(segment)
    if version.dirty and diff.exists():
        try:
            _client(tracking_uri).log_artifact(run_id, str(diff), artifact_path=CODE_ARTIFACT_DIR)
        except Exception as e:  # noqa: BLE001 - the diff stays in the trial folder; training matters more
            print(f"[trial] warning: cannot attach {diff} to run {run_id} ({type(e).__name__}: {e}); the diff "
                  "stays in the trial folder", file=sys.stderr, flush=True)


# ---- the job -------------------------------------------------------------------------------------------------------
def run_trial(cfg: Config, out_dir: Path, *, tracking_uri: str | None = None, run_id: str | None = None) -> int:
    """Train ``cfg`` into ``out_dir`` and evaluate it on ``cfg.eval.datasets``; returns the exit code above."""
    folder = TrialFolder(Path(out_dir))
    folder.path.mkdir(parents=True, exist_ok=True)
    if folder.done.exists():  # not a segment: nothing of the trial runs
        print(f"[trial] {folder.path} already finished; nothing to do", flush=True)
        mark_run(tracking_uri, run_id, FINISHED)
        return EXIT_OK

    progress = ProgressLog(folder.path)
    progress.write("start")
    version = code_version()

    from asr_core.train import Preempted, train

    try:
        segment = _start_segment(folder, version)
        if run_id:
            _record_segment(folder, segment, version, tracking_uri, run_id)
        if folder.trained.exists():
            checkpoint = Path(json.loads(folder.trained.read_text())["checkpoint"])
            print(f"[trial] training already finished ({checkpoint}); evaluating", flush=True)
        else:
            result = train(cfg, folder.path, tracking_uri=tracking_uri, run_id=run_id, end_run=False,
                           progress=progress)
            if not run_id and result.run_id:  # the trainer created the run: record this segment on it now
                run_id = result.run_id
                _record_segment(folder, segment, version, tracking_uri, run_id)
            checkpoint = Path(result.checkpoint)
            folder.trained.write_text(json.dumps({"checkpoint": str(checkpoint), "steps": result.steps}))
        if cfg.eval.datasets:
            _evaluate_interruptibly(cfg, checkpoint, folder.path, tracking_uri, run_id, progress)
    except (Preempted, EvaluationInterrupted) as e:
        n = _preemptions(tracking_uri, run_id) + 1
        print(f"[trial] preempted ({e or type(e).__name__}); checkpointed, exit {EXIT_PREEMPTED} to be requeued",
              flush=True)
        progress.write("preempted")
        mark_run(tracking_uri, run_id, SCHEDULED, {TAG_PREEMPTIONS: str(n)})
        return EXIT_PREEMPTED
    except Exception as e:  # noqa: BLE001 - every failure must reach the ledger
        traceback.print_exc()
        progress.write("failed")
        last = error_line(f"{type(e).__name__}: {e}", type(e).__name__)
        mark_run(tracking_uri, run_id, FAILED, {TAG_ERROR: last})
        return EXIT_FAILED
    folder.done.write_text("finished\n")
    progress.write("done")
    mark_run(tracking_uri, run_id, FINISHED)
    print(f"[trial] finished: {folder.path}", flush=True)
    return EXIT_OK


def _evaluate_interruptibly(cfg: Config, checkpoint: Path, out_dir: Path, tracking_uri: str | None,
                            run_id: str | None, progress: ProgressLog) -> None:
    from asr_core.evaluate import evaluate

    def handler(signum: int, frame: FrameType | None) -> None:
        raise EvaluationInterrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        evaluate(checkpoint, list(cfg.eval.datasets), list(cfg.eval.snrs), stride=cfg.eval.stride,
                 batch_windows=cfg.eval.batch_windows, noise=cfg.eval.noise, tracking_uri=tracking_uri,
                 run_id=run_id, out_dir=TrialFolder(out_dir).eval_dir, progress=progress)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _config_invalid(config: str, error: Exception, out_dir: Path, tracking_uri: str | None,
                    run_id: str | None) -> None:
    """Record an invalid config: the run FAILED with the reason (left SCHEDULED, it would look lost and every
    ``resume`` would submit it again without saying why it never starts) and a ``failed`` progress record when the
    trial folder exists. A ledger that cannot be written is reported, never raised: the exit code still says what
    happened."""
    if out_dir.is_dir():
        ProgressLog(out_dir).write("failed")
    if not run_id:
        return
    reason = error_line(str(error), type(error).__name__)
    reason = reason.removeprefix(f"{config}: ")  # the config's own message may start with its path too
    try:
        mark_run(tracking_uri, run_id, FAILED, {TAG_ERROR: f"config {config} invalid: {reason}"})
    except Exception as e:  # noqa: BLE001 - the usage error above is what the person must see
        print(f"asr_core trial: cannot mark run {run_id} FAILED in {tracking_uri} ({type(e).__name__}: {e}); "
              "it stays as it was", file=sys.stderr)


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
    try:
        cfg = Config.from_yaml(args.config, args.overrides)
    except ConfigError as e:
        print(f"asr_core trial: {e}", file=sys.stderr)
        _config_invalid(args.config, e, Path(args.out), args.tracking_uri, args.run_id)
        return EXIT_USAGE
    _limit_threads()
    return run_trial(cfg, Path(args.out), tracking_uri=args.tracking_uri, run_id=args.run_id)
