"""The option vocabulary every command of the three groups (``asr_core``, ``orchestrate``, ``analysis``) speaks.

* a sweep (an MLflow experiment) is the positional ``SWEEP`` where a command acts on one, ``--sweep`` where it is
  optional; ``--sweep-root`` is the folder sweeps live in;
* outputs are ``--out``; the ledger is ``--tracking-uri`` (found by :mod:`asr_core.contract.tracking`'s rule);
* audio contexts are seconds, ``--context-s`` (one) and ``--contexts-s`` (a list); an LM's context is tokens,
  ``--lm-context`` / ``--lm-contexts``;
* the LM's weight in beam search is ``--lm-weight`` and its bonus per token ``--token-bonus``; the significance
  level of a test is ``--significance`` (``--level`` is a confidence level).

Old spellings keep working as hidden aliases (:func:`renamed`) that say on stderr, in one line, what to use
instead. :data:`RETIRED` lists them; a test walks every parser and refuses any of them in visible help.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

# old spelling -> the option to use; none of these may appear in a command's visible --help
RETIRED: dict[str, str] = {
    "--experiment": "SWEEP / --sweep",
    "--alpha": "--lm-weight (beam search) or --significance (tests)",
    "--beta": "--token-bonus",
    "--baseline-context": "--baseline-context-s",
    "--context": "--context-s (seconds) or --lm-contexts (tokens)",
    "--contexts": "--contexts-s",
    "--keep": "--out",
    "--dir": "--out",
    "--uri": "--tracking-uri",
    "--decode": "--spec",
}
# positional names a command may not use for what has an option (an output folder is --out)
RETIRED_POSITIONALS = ("out", "experiment")
ALIAS_SUFFIX = "_by_old_name"


class _Renamed(argparse.Action):
    """An old spelling: stores into the new option's destination and says the new name on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        deprecated(parser.prog, option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated(prog: str, old: str, new: str) -> None:
    """The one deprecation line: ``PROG: OLD is deprecated; use NEW``."""
    print(f"{prog}: {old} is deprecated; use {new} (the old spelling still works for now)", file=sys.stderr)


def renamed(parser: argparse.ArgumentParser | Any, old: str, new: argparse.Action) -> argparse.Action:
    """Add ``old`` as a hidden alias of the option ``new`` (the action ``add_argument`` returned); ``parser`` may be
    an argument group or a mutually exclusive group; ``new`` may be an optional positional (``SWEEP``, given
    ``nargs="?"``), read with :func:`positional` after parsing. Its default is the new option's alone."""
    name = new.option_strings[0] if new.option_strings else f"the positional {new.metavar or new.dest.upper()}"
    # argparse sets an absent optional positional to its default after the options: the alias keeps its own dest
    dest = new.dest if new.option_strings else f"{new.dest}{ALIAS_SUFFIX}"
    kwargs: dict[str, Any] = {"dest": dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS,
                              "action": _Renamed, "new": name}
    if new.nargs == 0:  # a flag
        kwargs.update(nargs=0, const=new.const)
    else:  # an optional positional (nargs "?") becomes an option taking one value
        kwargs.update(type=new.type, nargs=None if not new.option_strings else new.nargs, metavar=new.metavar,
                      choices=new.choices)
    return parser.add_argument(old, **kwargs)


def positional(args: argparse.Namespace, dest: str) -> Any:
    """An optional positional's value, or its renamed option's (:func:`renamed`), or None."""
    value = getattr(args, dest, None)
    return value if value is not None else getattr(args, f"{dest}{ALIAS_SUFFIX}", None)


def positional_alias(parser: argparse.ArgumentParser, name: str, new: str) -> argparse.Action:
    """A hidden optional positional ``name`` kept where the option ``new`` replaced it (``prepare SPEC OUT`` became
    ``prepare SPEC --out OUT``); :func:`take_positional` moves its value over after parsing."""
    return parser.add_argument(f"_{name}_positional", nargs="?", default=None, help=argparse.SUPPRESS,
                               metavar=name.upper())


def take_positional(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str, new: str,
                    dest: str | None = None, required: bool = True) -> None:
    """After :func:`positional_alias`: the old positional's value into ``dest`` (with the deprecation line), both
    given is an error, neither an error naming ``new`` when ``required`` (argparse's exit 2)."""
    dest = dest or name
    old = getattr(args, f"_{name}_positional", None)
    if old is not None:
        if getattr(args, dest, None) not in (None, old):
            parser.error(f"give {new} once (the positional {name.upper()} is its old spelling)")
        deprecated(parser.prog, f"the positional {name.upper()}", new)
        kind = next((a.type for a in parser._actions if a.dest == dest and a.option_strings), None)
        setattr(args, dest, kind(old) if callable(kind) else old)
    if required and getattr(args, dest, None) is None:
        parser.error(f"the following arguments are required: {new}")
