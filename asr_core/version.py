"""What every ``--version`` prints: the package's version and, run from a git checkout, the commit of the code.

``asr-study 0.1.0 (commit 1a2b3c4d5e6f+dirty.0f1e2d3c, /path/to/checkout)`` in a checkout (the label is
:func:`asr_core.runtime.provenance.code_version`'s, the one the ledger records), ``asr-study 0.1.0 (installed
package)`` from a wheel. The version is the installed distribution's; a checkout that was never installed reads its
``pyproject.toml``.
"""

from __future__ import annotations

import argparse
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

DISTRIBUTION = "long-context-asr-study"  # [project] name in pyproject.toml
UNKNOWN = "unknown"


def package_version() -> str:
    """The installed distribution's version, else the checkout's ``pyproject.toml``'s, else ``unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN


def version_line(prog: str) -> str:
    """``PROG VERSION (commit LABEL, CHECKOUT)``, or ``(installed package)`` where the code is no checkout."""
    from asr_core.runtime.provenance import code_version

    code = code_version()
    if code.known:
        where = f"commit {code.label}, {code.root}"
    elif {"site-packages", "dist-packages"} & set(Path(__file__).resolve().parts):
        where = "installed package"
    else:  # e.g. a checkout without git: say why the commit is not known
        where = f"commit unknown: {code.why}"
    return f"{prog} {package_version()} ({where})"


class ShowVersion(argparse.Action):
    """``--version`` for an argparse parser: prints :func:`version_line` of the parser's program and exits 0.
    Computed when asked (``git status`` is not run by every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "print the version and the code's commit, then exit"
                 ) -> None:  # noqa: A002 - argparse's own keyword
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_line(parser.prog))
        parser.exit()
