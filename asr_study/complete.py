"""Shell completion of ``asr-study`` (argcomplete), delegated to the parser of the command being typed.

The groups build their parsers where they run (each ``asr_core`` command inside its ``cli(argv)``), so the
completion runs the group as if the words before the cursor were its arguments, and the first parser that is asked
to parse them answers instead: argcomplete is pointed at the words that parser owns (``_ARGCOMPLETE`` is the index of
the parser's program word) and completes its options, choices and subcommands. The levels that dispatch by hand
(``core``, ``core lm``, ``core bench``) complete from their tables of commands. A group completes nothing before
its parser would parse (they only import and dispatch), and argcomplete ends the process once it has answered.

Enable it in bash or zsh with ``eval "$(register-python-argcomplete asr-study orchestrate)"`` (both scripts: a name
not registered completes file names, as `orchestrate pl<Tab>` did). Completion imports nothing heavy (no torch):
the levels that dispatch by hand are read from tables that import none.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Collection
from typing import Any

ARGCOMPLETE = "_ARGCOMPLETE"  # set by the shell hook: 1 + the index of the program's word in the command line
OPTION = re.compile(r"^ {2}(--[a-z][a-z-]*)( [A-Z]+)?", re.M)  # an option line of mlflow-server.sh --help


# the subcommands of ``core lm`` (asr_core.lm.cli.SUBCOMMANDS, whose package imports torch; a test keeps them equal)
LM_SUBCOMMANDS = ("text", "train", "prompt", "ppl", "tune")


def hand_dispatched(words: tuple[str, ...]) -> Collection[str] | None:
    """The command names of the level that dispatches by hand after ``words`` (``core``, ``core lm``, ``core
    bench``), or None; each table is imported only for its own level, and none imports torch."""
    if words == ("core",):
        from asr_core.__main__ import COMMANDS

        return tuple(COMMANDS)
    if words == ("core", "bench"):
        from asr_core.bench import BENCHES

        return tuple(BENCHES)
    return LM_SUBCOMMANDS if words == ("core", "lm") else None


def names_parser(prog: str, names: Collection[str], *, version: bool) -> argparse.ArgumentParser:
    """A parser that only knows the subcommand names of a hand-dispatching level (and ``--version``)."""
    p = argparse.ArgumentParser(prog=prog)
    if version:
        p.add_argument("--version", action="store_true")
    sub = p.add_subparsers(dest="command")
    for name in names:
        sub.add_parser(name)
    return p


def server_parser() -> argparse.ArgumentParser:
    """mlflow-server.sh's options, read from its own ``--help`` header, plus ``--path``."""
    from orchestrate.assets import server_script

    p = argparse.ArgumentParser(prog="mlflow-server")
    p.add_argument("--path", action="store_true")
    try:
        header = server_script().read_text()
    except OSError:
        return p
    for name, value in OPTION.findall("\n".join(ln[2:] for ln in header.splitlines() if ln.startswith("# "))):
        if name != "--help":
            p.add_argument(name, **({"metavar": value.strip()} if value else {"action": "store_true"}))
    return p


def complete(top: argparse.ArgumentParser, groups: Collection[str], server: str,
             group_main: Callable[[str], Callable[[list[str]], int]]) -> None:
    """Answer the shell's completion request (``COMP_LINE``/``COMP_POINT``) and end the process. ``top`` is the
    console command's parser, ``groups`` the names ``group_main(name)`` runs, ``server`` the server's subcommand."""
    import argcomplete

    start = int(os.environ[ARGCOMPLETE]) - 1  # the program's word (after ``python -m`` where so run)
    words = argcomplete.split_line(os.environ["COMP_LINE"], int(os.environ["COMP_POINT"]))[3][start:]
    # words: the program, then each complete word before the cursor (the one being typed is not among them)

    def answer(parser: argparse.ArgumentParser, owned: int) -> None:
        """argcomplete on ``parser`` over the last ``owned`` complete words (its program word before them)."""
        os.environ[ARGCOMPLETE] = str(start + len(words) - owned)
        argcomplete.autocomplete(parser)  # writes the completions and exits

    group = words[1] if len(words) > 1 else None
    if group == server:
        answer(server_parser(), len(words) - 2)
    elif group not in groups:
        answer(top, len(words) - 1)  # the group's name (or --version) is being typed
    level = hand_dispatched(tuple(words[1:]))
    if level is not None:
        answer(names_parser(words[-1], level, version=len(words) == 2), 0)
    original = argparse.ArgumentParser.parse_args

    def answering(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        answer(self, len(args) if args is not None else 0)
        return original(self, args, namespace)  # not reached: argcomplete has exited

    argparse.ArgumentParser.parse_args = answering  # type: ignore[method-assign]
    os.environ["ASR_STUDY_COMPLETING"] = "1"  # a group that completes by itself (orchestrate's script) leaves it here
    try:
        group_main(str(group))(words[2:])
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    os._exit(0)  # the group dispatched to no parser: nothing to complete
