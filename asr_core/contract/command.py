"""What every command of the project does alike: ``--version`` and what a user sees of a bug.

**The crash guard.** What a user sees of a bug: one line naming a log file that holds the traceback, exit 1.

Every user error is caught where it is found and reported in one line (exit 2); an exception that reaches the top of
a command is therefore a bug. :func:`guarded` runs a command's ``main(argv)`` (``python -m asr_core``,
``orchestrate``, ``python -m analysis``, and so ``asr-study``, which calls them) and turns such an exception into::

    orchestrate: internal error (a bug): KeyError: 'x'; the traceback is in ~/.cache/long-context-asr-study/crash/...

The log (:func:`crash_dir`: ``$XDG_CACHE_HOME`` or ``~/.cache``, then ``long-context-asr-study/crash/``; the system's
temporary folder where that cannot be written) holds the command line, the folder it ran in, the Python and the
traceback. ``--debug`` as the first argument (``orchestrate --debug plan ...``) or :data:`DEBUG_ENV` set to anything
but ``0`` lets the traceback through as Python prints it. Ctrl-C ends a command with exit 130 and one line.

**The version.** What every ``--version`` prints: the package's version and, run from a git checkout, the
commit of the code.

``asr-study 0.1.0 (commit 1a2b3c4d5e6f+dirty.0f1e2d3c, /path/to/checkout)`` in a checkout (the label is
:func:`asr_core.contract.provenance.code_version`'s, the one the ledger records), ``asr-study 0.1.0 (installed
package)`` from a wheel. The version is the installed distribution's; a checkout that was never installed reads its
``pyproject.toml``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tomllib
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

DEBUG_ENV = "ASR_STUDY_DEBUG"
DEBUG_FLAG = "--debug"
EXIT_BUG = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports when the reader of the output left
PROJECT = "long-context-asr-study"


def crash_dir() -> Path:
    """Where crash logs go: ``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/long-context-asr-study/crash``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / PROJECT / "crash"


def debugging(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether tracebacks go through, ``argv`` without a leading ``--debug``)."""
    flag = argv[:1] == [DEBUG_FLAG]
    env = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    return flag or env, argv[1:] if flag else argv


def write_log(prog: str, argv: list[str], text: str) -> Path | None:
    """The crash log of ``prog`` holding ``text`` (the traceback), in :func:`crash_dir` or else the temporary folder;
    None when neither can be written."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{prog.replace(' ', '-')}-{stamp}-{os.getpid()}.log"
    head = (f"command: {prog} {' '.join(argv)}\nfolder: {os.getcwd()}\npython: {sys.version.split()[0]} "
            f"({sys.executable})\ntime: {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n\n")
    for folder in (crash_dir(), Path(tempfile.gettempdir()) / f"{PROJECT}-crash"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(head + text)
            return path
        except OSError:
            continue
    return None


def report_bug(prog: str, argv: list[str], error: BaseException) -> int:
    """Write the current exception's traceback to a log and print one line naming it; :data:`EXIT_BUG`."""
    text = traceback.format_exc()
    log = write_log(prog, argv, text)
    first = (str(error).strip().splitlines() or [""])[0][:200]
    what = f"{type(error).__name__}: {first}" if first else type(error).__name__
    if log is None:  # nowhere to keep it: show it rather than lose it
        sys.stderr.write(text)
        where = "the traceback is above (no folder for a crash log could be written)"
    else:
        where = f"the traceback is in {log}"
    print(f"{prog}: internal error (a bug, not your input): {what}; {where}. Please report it with that log; "
          f"{DEBUG_FLAG} as the first argument or {DEBUG_ENV}=1 shows the traceback here.", file=sys.stderr)
    return EXIT_BUG


def guarded(prog: str, main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """``main(argv)`` (``argv``: else ``sys.argv[1:]``), with a bug reported by :func:`report_bug` (exit 1) and
    Ctrl-C by one line (exit 130), unless :func:`debugging`. ``SystemExit`` (argparse's usage errors, exit 2) passes."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug, args = debugging(args)
    if debug:
        return main(args)
    try:
        return main(args)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``| head``): nothing more to say to it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 - the point: every bug ends in one line and a log
        return report_bug(prog, args, e)


# ---- --version -------------------------------------------------------------------------------------------------------
DISTRIBUTION = "long-context-asr-study"  # [project] name in pyproject.toml
UNKNOWN = "unknown"


def package_version() -> str:
    """The installed distribution's version, else the checkout's ``pyproject.toml``'s, else ``unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN


def version_line(prog: str) -> str:
    """``PROG VERSION (commit LABEL, CHECKOUT)``, or ``(installed package)`` where the code is no checkout."""
    from asr_core.contract.provenance import code_version

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
