"""``asr-study GROUP ...``: one console command for the whole project.

Each group is the command it names, handed every argument after the group's name, so the long forms keep working
and say the same thing:

* ``asr-study core ...`` is ``python -m asr_core ...`` (the trainer: train, evaluate, score, prepare, ...);
* ``asr-study orchestrate ...`` is the ``orchestrate`` command (sweeps: plan, submit, status, logs, ...);
* ``asr-study analysis ...`` is ``python -m analysis ...`` (a sweep's report, pairwise comparisons);
* ``asr-study dashboard SWEEP`` serves a local sweep's ledger in the MLflow UI on 127.0.0.1 and prints the URL of
  its saved view, until Ctrl-C (:mod:`asr_study.sweep_dashboard`);
* ``asr-study mlflow-server ...`` runs the packaged ``mlflow-server.sh`` (``slurm/mlflow-server.sh`` of a checkout)
  with the ``mlflow`` of this environment; ``asr-study mlflow-server --path`` prints where the script is.

``asr-study --version`` (and each group's ``--version``) prints the package version and, from a checkout, the
commit. Shell completion (argcomplete) is delegated to each group's own parser (:mod:`asr_study.complete`); enable
it with ``eval "$(register-python-argcomplete asr-study orchestrate)"``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from asr_core.contract.command import DEBUG_FLAG, ShowVersion

PROG = "asr-study"
# group -> (the module whose main(argv) runs it, its line in --help)
GROUPS: dict[str, tuple[str, str]] = {
    "core": ("asr_core.__main__", "the trainer: train, evaluate, heads, reach, score, prepare, synth, bench, lm, "
                                  "... (= python -m asr_core)"),
    "orchestrate": ("orchestrate.cli", "sweeps: plan, submit, status, resume, retry, cancel, evaluate, show, logs, "
                                       "bench (= orchestrate)"),
    "analysis": ("analysis.__main__", "a sweep's report and pairwise comparisons (= python -m analysis)"),
    "dashboard": ("asr_study.sweep_dashboard", "a sweep's runs in the MLflow UI: serves a local sweep's ledger on "
                                               "127.0.0.1 and prints the URL of its saved view"),
}
SERVER = "mlflow-server"
SERVER_HELP = "the MLflow server a cluster sweep logs to (the packaged slurm/mlflow-server.sh; --path prints it)"
EPILOG = """\
Each group takes the arguments of the command it names; `asr-study GROUP --help` lists them.
Shell completion: eval "$(register-python-argcomplete asr-study orchestrate)"."""


def parser() -> argparse.ArgumentParser:
    """The top level: ``--version`` and one subcommand per group (the groups parse their own arguments)."""
    p = argparse.ArgumentParser(prog=PROG, description="The experiment system of 'How Much Context Does My "
                                "Attention-Based ASR System Need?': one command, its groups.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=ShowVersion)
    p.add_argument(DEBUG_FLAG, action="store_true", help="let a bug's traceback through instead of one line and a "
                   "crash log (or set ASR_STUDY_DEBUG=1)")
    sub = p.add_subparsers(dest="group", metavar="GROUP", required=True)
    for name, (_, text) in [*GROUPS.items(), (SERVER, ("", SERVER_HELP))]:
        sp = sub.add_parser(name, help=text, add_help=False)
        sp.add_argument("args", nargs=argparse.REMAINDER)
    return p


def group_main(name: str) -> Callable[[list[str]], int]:
    """The ``main(argv)`` of a group (imported when asked: a group's imports cost only when it runs)."""
    return importlib.import_module(GROUPS[name][0]).main


def run_server(args: list[str]) -> int:
    """``mlflow-server``: the packaged script run with ``args`` (this process becomes it); ``--path`` prints it."""
    from orchestrate.assets import server_script

    script = server_script()
    if args[:1] == ["--path"]:
        print(script)
        return 0
    env = dict(os.environ)
    mlflow = Path(sys.executable).parent / "mlflow"  # this environment's: the one the project was installed with
    if "MLFLOW" not in env and mlflow.is_file():
        env["MLFLOW"] = str(mlflow)
    sys.stdout.flush()
    os.execvpe("bash", ["bash", str(script), *args], env)  # its signals, exit status and --detach are its own


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = parser()
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions: answered, then the process ends
        from asr_study.complete import complete

        complete(top, tuple(GROUPS), SERVER, group_main)
    debug = argv[:1] == [DEBUG_FLAG]  # `asr-study --debug GROUP ...`, as the crash message says: the group's own
    argv = argv[1:] if debug else argv
    if not argv or argv[0] not in (*GROUPS, SERVER):
        top.parse_args(argv)  # --help, --version, or exit 2 naming the valid groups
        return 2
    name, rest = argv[0], argv[1:]
    if name == SERVER:
        return run_server(rest)
    return int(group_main(name)([DEBUG_FLAG, *rest] if debug else rest) or 0)
