"""The command line of ``orchestrate``, the top of the package: the commands (:mod:`~orchestrate.cli.commands`),
their parser (:mod:`~orchestrate.cli.parser`), the checks of their input (:mod:`~orchestrate.cli.checks`), the dry
runs (:mod:`~orchestrate.cli.dry_run`), ``show`` and ``logs``. It reads every folder below it; none reads it.

:func:`main` is here because the installed ``orchestrate`` script names ``orchestrate.cli:main``
(``pyproject.toml``), as scripts installed by earlier versions do."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """``orchestrate ARGS``: :func:`orchestrate.cli.commands.main`."""
    from orchestrate.cli.commands import main as run

    return run(argv)
