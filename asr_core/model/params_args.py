"""The command line of ``python -m asr_core params`` (:func:`parser`), in a module that imports no torch: ``--help``
and shell completion build it alone; :func:`cli` parses, then counts (:func:`asr_core.model.size.run_cli`)."""

from __future__ import annotations

import argparse

DESCRIPTION = "``python -m asr_core params CONFIG.yaml [--set k=v ...]``: parameter counts per module and in total."


def parser() -> argparse.ArgumentParser:
    """``params CONFIG [--set KEY=VALUE ...]``."""
    ap = argparse.ArgumentParser(prog="python -m asr_core params", description=DESCRIPTION)
    ap.add_argument("config", help="YAML config file or preset name")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    return ap


def cli(argv: list[str]) -> int:
    """Parse ``argv`` (exit 2 on bad input), then print the counts."""
    args = parser().parse_args(argv)
    from asr_core.model.size import run_cli

    return run_cli(args)
