"""One grid trial: train, then evaluate, inside one MLflow run.

This is the command every backend runs for a trial::

    python -m asr_core trial --config TRIAL_DIR/config.json --out TRIAL_DIR --tracking-uri URI --run-id RUN_ID

Exit codes are the contract with the schedulers:

* ``0``  trained and evaluated; the run is FINISHED.
* ``75`` (EX_TEMPFAIL) SIGUSR2 or SIGTERM arrived: training checkpointed (or evaluation was interrupted), the run is
  back to SCHEDULED with ``trial.preemptions`` incremented; run the same command again to continue.
* ``1``  failed; the run is FAILED with the error's last line in the tag ``trial.error``.

Re-running a trial is always safe: training resumes from ``TRIAL_DIR/checkpoint.pt``, a finished training phase is
remembered in ``TRIAL_DIR/TRAINED`` and a finished trial in ``TRIAL_DIR/DONE``, so nothing is trained twice.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from asr_core.config import Config, ConfigError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 75


class EvaluationInterrupted(Exception):
    """SIGUSR2/SIGTERM during evaluation: evaluation has no checkpoint, so it simply starts again on requeue."""


def _client(tracking_uri: str | None) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _mark(tracking_uri: str | None, run_id: str | None, status: str, tags: dict[str, str] | None = None) -> None:
    """Set the run's status (FINISHED, FAILED, SCHEDULED) and tags; a no-op without a run.

    The trainer and the evaluator write through ``MlflowClient`` only and never open a fluent (active) run, so no
    exit hook of MLflow's can overwrite the status written here."""
    if not run_id:
        return
    client = _client(tracking_uri)
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, v)
    if status == "SCHEDULED":
        client.update_run(run_id, status="SCHEDULED")
    else:
        client.set_terminated(run_id, status=status)


def _preemptions(tracking_uri: str | None, run_id: str | None) -> int:
    if not run_id:
        return 0
    return int(_client(tracking_uri).get_run(run_id).data.tags.get("trial.preemptions", "0"))


def run_trial(cfg: Config, out_dir: Path, *, tracking_uri: str | None = None, run_id: str | None = None) -> int:
    """Train ``cfg`` into ``out_dir`` and evaluate it on ``cfg.eval.datasets``; returns the exit code above."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done, trained = out_dir / "DONE", out_dir / "TRAINED"
    if done.exists():
        print(f"[trial] {out_dir} already finished; nothing to do", flush=True)
        _mark(tracking_uri, run_id, "FINISHED")
        return EXIT_OK

    from asr_core.train import Preempted, train

    try:
        if trained.exists():
            checkpoint = Path(json.loads(trained.read_text())["checkpoint"])
            print(f"[trial] training already finished ({checkpoint}); evaluating", flush=True)
        else:
            result = train(cfg, out_dir, tracking_uri=tracking_uri, run_id=run_id, end_run=False)
            run_id = run_id or result.run_id
            checkpoint = Path(result.checkpoint)
            trained.write_text(json.dumps({"checkpoint": str(checkpoint), "steps": result.steps}))
        if cfg.eval.datasets:
            _evaluate_interruptibly(cfg, checkpoint, out_dir, tracking_uri, run_id)
    except (Preempted, EvaluationInterrupted) as e:
        n = _preemptions(tracking_uri, run_id) + 1
        print(f"[trial] preempted ({e or type(e).__name__}); checkpointed, exit {EXIT_PREEMPTED} to be requeued",
              flush=True)
        _mark(tracking_uri, run_id, "SCHEDULED", {"trial.preemptions": str(n)})
        return EXIT_PREEMPTED
    except Exception as e:  # noqa: BLE001 - every failure must reach the ledger
        traceback.print_exc()
        last = (f"{type(e).__name__}: {e}".strip().splitlines() or [type(e).__name__])[-1]
        _mark(tracking_uri, run_id, "FAILED", {"trial.error": last[:4000]})
        return EXIT_FAILED
    done.write_text("finished\n")
    _mark(tracking_uri, run_id, "FINISHED")
    print(f"[trial] finished: {out_dir}", flush=True)
    return EXIT_OK


def _evaluate_interruptibly(cfg: Config, checkpoint: Path, out_dir: Path, tracking_uri: str | None,
                            run_id: str | None) -> None:
    from asr_core.evaluate import evaluate

    def handler(signum: int, frame: FrameType | None) -> None:
        raise EvaluationInterrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        evaluate(checkpoint, list(cfg.eval.datasets), list(cfg.eval.snrs), stride=cfg.eval.stride,
                 batch_windows=cfg.eval.batch_windows, noise=cfg.eval.noise, tracking_uri=tracking_uri,
                 run_id=run_id, out_dir=out_dir / "eval")
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _limit_threads() -> None:
    """Use the CPUs the scheduler granted, not every core of the node: without cgroups, torch would start one
    thread per core in every job sharing the node. OMP_NUM_THREADS (set by Ray per trial, or by the user) wins."""
    import os

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
        return EXIT_USAGE
    _limit_threads()
    return run_trial(cfg, Path(args.out), tracking_uri=args.tracking_uri, run_id=args.run_id)
