"""The command line of ``python -m asr_core train`` (:func:`parser`), in a module that imports no torch: ``--help``,
a usage error and shell completion (``asr-study core train <Tab>``) build it alone; :func:`cli` parses, then runs
:func:`asr_core.training.train.run_cli`."""

from __future__ import annotations

import argparse

from asr_core.contract.options import renamed
from asr_core.contract.tracking import DEFAULT_EXPERIMENT


def parser() -> argparse.ArgumentParser:
    """``train CONFIG [--set KEY=VALUE ...] [--out DIR] [--tracking-uri URI] [--run-id ID] [--sweep NAME]``."""
    ap = argparse.ArgumentParser(prog="python -m asr_core train", description="Train (or resume) one model.")
    ap.add_argument("config", help="YAML config (may start from 'preset: NAME') or a preset name")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=None, help="run folder (default runs/<trial key>)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI; "
                    "neither: nothing is logged to MLflow)")
    ap.add_argument("--run-id", default=None, help="continue this MLflow run")
    renamed(ap, "--experiment", ap.add_argument("--sweep", dest="experiment", default=None, help=f"the sweep (MLflow "
                                                f"experiment) of a new run (default {DEFAULT_EXPERIMENT})"))
    return ap


def cli(argv: list[str]) -> int:
    """Parse ``argv`` (exit 2 on bad input), then train."""
    args = parser().parse_args(argv)
    from asr_core.training.train import run_cli

    return run_cli(args)
