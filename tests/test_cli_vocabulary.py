"""One vocabulary for the options of the three groups (:mod:`asr_core.contract.options`): every parser of
``asr_core``, ``orchestrate`` and ``analysis`` is walked; each subcommand has a description, no visible option uses
a retired spelling, and the old spellings still work as hidden aliases that say the new name.

The parsers are caught where each command calls ``parse_args`` (nothing runs past it), so the walk sees the parsers
the commands really build, in one process, in seconds.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator

import pytest

from asr_core.contract.options import RETIRED, RETIRED_POSITIONALS


class _Caught(BaseException):  # not an Exception: the commands' crash guard lets it through
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _catch(entry: Callable[[list[str]], object], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``entry`` builds, taken at its ``parse_args`` call."""

    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        raise _Caught(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", caught)
        try:
            entry(["x"])
        except _Caught as c:
            return c.parser
    raise AssertionError(f"{entry} returned without parsing its arguments")


def _entry(target: str) -> Callable[[list[str]], object]:
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _leaves(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, str]]:
    """The parser and each subcommand's parser (recursively), each with the line its parent lists it by."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser, parser.description or ""
        return
    listed = {c.dest: c.help for c in subs[0]._choices_actions}
    for name, child in subs[0].choices.items():
        assert listed.get(name), f"{parser.prog}: subcommand {name!r} has no line in --help"
        yield from _leaves(child)


def _asr_core_entries() -> dict[str, Callable[[list[str]], object]]:
    from asr_core.__main__ import COMMANDS
    from asr_core.bench import BENCHES, TEXTS
    from asr_core.lm.cli import SUBCOMMANDS

    out: dict[str, Callable[[list[str]], object]] = {}
    for name, (module, text) in COMMANDS.items():
        assert text.strip(), f"python -m asr_core {name}: no line in --help"
        if name not in ("bench", "lm"):
            out[f"asr_core {name}"] = importlib.import_module(module).cli
    for name, module in BENCHES.items():
        assert TEXTS[name].strip(), f"python -m asr_core bench {name}: no line in --help"
        out[f"asr_core bench {name}"] = importlib.import_module(module).cli
    for name, (func, text) in SUBCOMMANDS.items():
        assert text.strip(), f"python -m asr_core lm {name}: no line in --help"
        out[f"asr_core lm {name}"] = func
    return out


GROUPS = {"orchestrate": "orchestrate.cli:main", "analysis": "analysis.__main__:main",
          "loadtest": "orchestrate.tools.loadtest:main", "dashboard": "asr_study.sweep_dashboard:main"}


def _every_parser(monkeypatch: pytest.MonkeyPatch) -> list[argparse.ArgumentParser]:
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(key, "1")  # analysis sets them if unset; keep the test process's environment as it was
    entries = {**{k: _entry(v) for k, v in GROUPS.items()}, **_asr_core_entries()}
    parsers = []
    for name, entry in entries.items():
        parsers += [p for p, _ in _leaves(_catch(entry, monkeypatch))]
    return parsers


def test_every_subcommand_has_a_description_and_no_retired_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    parsers = _every_parser(monkeypatch)
    assert len(parsers) >= 30, [p.prog for p in parsers]
    problems = []
    for p in parsers:
        if not (p.description or "").strip():
            problems.append(f"{p.prog}: no description in --help")
        for a in p._actions:
            if a.help == argparse.SUPPRESS:
                continue
            for opt in a.option_strings:
                if opt in RETIRED:
                    problems.append(f"{p.prog}: visible {opt} (use {RETIRED[opt]})")
            if not a.option_strings and str(a.metavar or a.dest).lower() in RETIRED_POSITIONALS:
                problems.append(f"{p.prog}: positional {a.metavar or a.dest} (use --out / SWEEP)")
    assert not problems, "\n".join(problems)


def test_orchestrate_bench_takes_no_option_it_ignores(monkeypatch: pytest.MonkeyPatch) -> None:
    top = _catch(_entry("orchestrate.cli:main"), monkeypatch)
    bench = next(p for p, _ in _leaves(top) if p.prog.endswith(" bench"))
    assert "--sweep-root" not in bench._option_string_actions


@pytest.mark.parametrize("target,old,new", [
    ("analysis.__main__:main", ["report", "--experiment", "s", "--out", "o", "--alpha", "0.01",
                                "--baseline-context", "20.48"],
     {"sweep_by_old_name": "s", "significance": 0.01, "baseline_context_s": 20.48}),
    ("analysis.__main__:main", ["compare", "s", "a", "b", "--alpha", "0.1"], {"significance": 0.1}),
    ("orchestrate.tools.loadtest:main", ["--uri", "http://h:1", "--experiment", "e"], {"uri": "http://h:1",
                                                                                         "experiment": "e"}),
    ("asr_core.lm.tune:cli", ["ck", "--lm", "l", "--data", "d=podcast:x", "--alpha", "0.5", "--beta", "1"],
     {"alpha": "0.5", "beta": "1"}),
    ("asr_core.data.prepare:cli", ["podcast:x", "OUTDIR"], {"_out_positional": "OUTDIR"}),
    ("orchestrate.cli:main", ["evaluate", "s", "--decode", "f.yaml"], {"spec": "f.yaml"}),
])
def test_old_spellings_still_work_and_say_the_new_name(target: str, old: list[str], new: dict[str, object],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    parser = _catch(_entry(target), monkeypatch)
    args = parser.parse_args(old)
    for key, value in new.items():
        assert getattr(args, key) == value, key
    err = capsys.readouterr().err
    assert "deprecated; use" in err or "_out_positional" in new, err
