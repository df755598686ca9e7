"""The command line of ``orchestrate``: every subcommand, its options and its one-line description
(:func:`build_parser`); :mod:`orchestrate.cli.commands` runs what it parses."""

from __future__ import annotations

import argparse

from asr_core.contract.options import renamed
from asr_core.contract.tracking import DEFAULT_SWEEP_ROOT, ENV, SWEEP_ROOT_ENV, default_sweep_root
from asr_core.contract.command import ShowVersion
from orchestrate.cli.logs import add_arguments as logs_arguments
from orchestrate.cli.show import add_arguments as show_arguments
from orchestrate.sweep.folder import DEFAULT_MAX_FAILURES

def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``orchestrate`` subcommand, each with its one-line description."""
    p = argparse.ArgumentParser(prog="orchestrate", description="Grids of training configurations → Ray Tune, "
                                "SLURM or Ray-on-SLURM, with MLflow as the ledger.")
    p.add_argument("--version", action=ShowVersion)
    sub = p.add_subparsers(dest="command", required=True)

    def sweep_settings(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--max-failures", type=positive_int, default=None, metavar="N",
                        help=f"failures (its own error, killed by the system, lost) after which a trial stays FAILED "
                             f"and is not resubmitted; `retry --failed` resets the count (default: the sweep's "
                             f"setting, {DEFAULT_MAX_FAILURES} for a new sweep)")
        sp.add_argument("--allow-sqlite", action="store_true",
                        help="let a cluster backend (slurm, ray-slurm) use a sqlite: ledger; only safe when every "
                             "job runs on this host (recorded in the sweep)")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--sweep-root", default=default_sweep_root(), help="folder holding sweeps and the default "
                        f"sqlite ledger (default: ${SWEEP_ROOT_ENV}, else ./{DEFAULT_SWEEP_ROOT})")
        sp.add_argument("--tracking-uri", default=None, help="MLflow URI: sqlite:///PATH or http://HOST:PORT "
                        f"(default: the sweep's own, else ${ENV}, else sqlite:///SWEEP_ROOT/mlflow.db)")

    sp = sub.add_parser("plan", help="expand a grid: trials per sub-grid (no side effects); --estimate: GPU-hours")
    sp.add_argument("grid")
    sp.add_argument("--json", action="store_true", help="list key, sub-grids, seed and config of every trial "
                    "(with --estimate: the estimate of every trial)")
    sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sp.add_argument("--estimate", action="store_true",
                    help="GPU-hours per trial, sub-grid and grid: the trainer's planner replayed over the training "
                         "corpus's durations (assumed where it is not on disk) at a calibration's speed")
    sp.add_argument("--calibration", default=None, metavar="FILE",
                    help="with --estimate: a file from `python -m asr_core bench calibrate`, or a built-in one by "
                         "name: a100-paper (the default, derived from paper 000) or h100-measured (bench calibrate "
                         "on one H100, 8 loader threads)")
    sp.add_argument("--profile", default=None,
                    help="with --estimate: cluster profile (slurm/profiles/NAME.yaml or a path): requeues under its "
                         "time limit, wall time at its max_parallel, its loader threads")
    sp.add_argument("--trials", action="store_true", help="with --estimate: one row per trial too")

    sp = sub.add_parser("submit", help="create the sweep's runs and submit every trial not finished yet")
    sp.add_argument("grid")
    sp.add_argument("--backend", required=True, choices=("local", "slurm", "ray-slurm"))
    sp.add_argument("--profile", default=None, help="cluster profile: slurm/profiles/NAME.yaml or a path")
    sp.add_argument("--sweep", default=None, help="sweep name (default: the grid's name)")
    sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a base field of every trial, e.g. data.train=podcast:/data/train")
    sp.add_argument("--no-check-data", action="store_true", help="skip checking that data paths exist here")
    sp.add_argument("--dry-run", action="store_true", help="print what would be submitted; create, submit and "
                    "write nothing (no folder, run, job or lock file)")
    sweep_settings(sp)
    common(sp)

    for name, text in (("status", "counts by state and the failed trials"),
                       ("resume", "re-attach live jobs, resubmit lost, preempted and failed ones within the failure "
                                  "budget, skip finished and cancelled ones"),
                       ("retry", "start failed trials (their failure count reset) or cancelled ones again"),
                       ("cancel", "cancel the sweep for good: unfinished trials end KILLED (retry --cancelled "
                                  "starts them again)")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("sweep")
        common(sp)
        if name == "status":
            from orchestrate.status.status import add_arguments

            sp.add_argument("--json", action="store_true", help="one JSON object per trial")
            add_arguments(sp)
        if name == "cancel":
            sp.add_argument("--yes", "-y", action="store_true",
                            help="cancel a whole sweep without asking (it asks only on a terminal)")
            sp.add_argument("--offline", action="store_true",
                            help="leave MLflow alone (the default when it does not answer): the jobs are stopped and "
                                 "the folders marked; the next command that reaches MLflow marks the runs KILLED")
        if name in ("resume", "retry", "cancel"):
            sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                            help="only the models and evaluation jobs that match: a config field "
                                 "(data.context_s=10.24), subgrid=NAME, key=KEY (a model with its evaluation jobs, "
                                 "or one job) or evaluation=NAME (its jobs; none: the models); repeat a key for "
                                 "alternatives, other keys must all hold")
        if name == "retry":
            sp.add_argument("--failed", action="store_true",
                            help="start FAILED trials again, also those past --max-failures (their count is reset)")
            sp.add_argument("--cancelled", action="store_true",
                            help="start cancelled trials again, from their checkpoints")
        if name in ("resume", "retry"):
            sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                            help="change how unfinished trials run or where their data lies, under the same keys "
                                 "(e.g. data.num_workers=8, data.train=podcasts=podcast:/scratch/podcasts); "
                                 "anything that would change a trial's key is refused")
            sp.add_argument("--no-check-data", action="store_true",
                            help="skip checking that data paths given with --set exist here")
            sweep_settings(sp)
            sp.add_argument("--dry-run", action="store_true",
                            help="print which trials would be resubmitted and why (lost, preempted, failed, "
                                 "cancelled), from the sweep's folders; submit and write nothing (no lock, no "
                                 "ledger)")

    sp = sub.add_parser("evaluate", help="decode finished trials by beam search (with an LM or without), window "
                        "fusion or other windows as jobs on the sweep's backend; results go into each trial's run as "
                        "wer_<name>/...; or add plain test sets to each trial's own evaluation (wer/<dataset>)")
    sp.add_argument("sweep")
    what = sp.add_mutually_exclusive_group(required=True)
    renamed(what, "--decode", what.add_argument(
        "--spec", metavar="FILE", help="evaluation spec (YAML, or a packaged one by name, e.g. decode-lm): name, lm, "
        "alpha, beta, beam_width, lm_context, prompt, datasets, snrs, stride (or name and fusion, or window_s; or only "
        "datasets and snrs: plain test sets, decoded as each model's own evaluation into the main WER table); run as "
        "evaluation jobs of the sweep (one per trained model lacking it: same backend, max_parallel, status, cancel "
        "and retry)"))
    sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="only trials whose config has this value (e.g. data.context_s=10.24, model.heads=6) or "
                         "sub-grid (subgrid=NAME); repeat a key for alternatives, other keys must all hold")
    sp.add_argument("--dry-run", action="store_true", help="print what would be decoded; submit and write nothing")
    common(sp)

    sp = sub.add_parser("show", help="one trial whole: status, folder, log, config, segments, attempts, runs, WERs")
    sp.add_argument("sweep")
    show_arguments(sp)
    common(sp)

    sp = sub.add_parser("logs", help="one trial's log, progress bars shown at their last state; -f follows it")
    sp.add_argument("sweep")
    logs_arguments(sp)
    common(sp)

    sp = sub.add_parser("bench", help="time plan, submit and status against their goals")
    sp.add_argument("--skip-slurm", action="store_true", help="skip the SLURM submission timing")
    sp.add_argument("--tracking-uri", default=None, help=f"an mlflow server (http://HOST:PORT) to time the "
                    f"submission against (default: ${ENV} when it names one, else one started for the bench)")
    for choice in sub._choices_actions:  # each subcommand's --help opens with its one line; a sweep is SWEEP
        cmd = sub.choices[choice.dest]
        cmd.description = cmd.description or choice.help
        for a in cmd._actions:
            a.metavar = "SWEEP" if a.dest == "sweep" and not a.option_strings else a.metavar
    return p


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; valid: a whole number of at least 1")
    return n
