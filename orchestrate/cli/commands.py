"""``orchestrate`` / ``python -m orchestrate``: plan, submit, status, resume, retry, cancel, evaluate, show, logs,
bench.

A thin layer over the library. Every input is validated before anything is created or submitted; invalid input
exits with status 2 and a message naming the file, key or value and what is valid; so does an unreadable sweep file
(naming it and how to restore it; ``cancel`` still stops what it can find first). Every command that changes a sweep
takes its lock before it reads the sweep's files (:meth:`orchestrate.sweep.folder.SweepDir.lock`), so none writes back a
copy read before another command changed them: a busy sweep exits 2 having changed no file. Exit 3
(:data:`EXIT_TRACKER`): a blocking (local) sweep's trials ran, but MLflow did not answer at the end; their results
wait in their folders and the message names the command that ships them.

One ledger per sweep: the jobs read the tracking URI from ``sweep.json``, so ``resume``, ``retry``, ``cancel`` and
``status`` refuse a ``--tracking-uri`` that differs from it (exit 2, naming both). A cluster backend (``slurm``,
``ray-slurm``) refuses a ``sqlite:`` ledger, explicit or the default: its jobs would write one sqlite file from many
hosts over a network filesystem. ``--allow-sqlite`` (recorded in the manifest) accepts it where every job runs on
the submitting host.
"""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import nullcontext
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from asr_core.contract.trial import EXIT_USAGE
from orchestrate.backends.base import BackendError, StoppedBySignal
from orchestrate.plan.profile import load_profile
from orchestrate.cli.parser import build_parser
from orchestrate.cli.checks import (SERVER_HINT, UsageError, check_data, check_shared_ledger, execution_overrides,
                                    same_uri, submit_input)
from orchestrate.plan.decode_file import DecodeFileError
from orchestrate.plan.evaluations import EvaluationError
from orchestrate.sweep.where import WhereError
from orchestrate.plan.grid import Grid, GridError, load_grid, plan_table
from orchestrate.ledger.ledger import Ledger, LedgerError
from orchestrate.ledger.store import check_tracking_uri
from orchestrate.cli.show import show_trial
from orchestrate.sweep.folder import DEFAULT_MAX_FAILURES, Manifest, SweepDir, SweepError, SweepFileError, new_sweep_id
from orchestrate.sweep.trial import Trial

if TYPE_CHECKING:
    from asr_core.contract.provenance import CodeVersion
    from orchestrate.dispatch.dispatch import Plan


EXIT_TRACKER = 3  # the work is done and on disk, but MLflow did not answer at the end: run what the message says later


# ---- commands ------------------------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid, args.overrides)
    if args.estimate or args.calibration or args.profile or args.trials:
        return _plan_estimate(args, grid)
    if args.json:
        json.dump({"grid": grid.name, "subgrids": [s.__dict__ for s in grid.subgrids],
                   "trials": [t.to_dict() for t in grid.trials]}, sys.stdout, indent=1)
        print()
    else:
        print(plan_table(grid))
    return 0


def _plan_estimate(args: argparse.Namespace, grid: "Grid") -> int:
    """``plan --estimate``: :mod:`orchestrate.budget.estimate` printed as tables (or JSON)."""
    from orchestrate.budget.calibration import EstimateError, load_calibration
    from orchestrate.budget.estimate import estimate_grid, estimate_json, estimate_table

    if not args.estimate:
        raise UsageError("--calibration, --profile and --trials go with --estimate")
    try:
        profile = load_profile(args.profile) if args.profile else None
        cal = load_calibration(args.calibration or (profile.calibration if profile else None))
        est = estimate_grid(grid, cal, profile)
    except EstimateError as e:
        raise UsageError(str(e)) from None
    if args.json:
        json.dump(estimate_json(est), sys.stdout, indent=1)
        print()
    else:
        print(estimate_table(est, trials=args.trials))
    return 0


def _code() -> "CodeVersion":
    from asr_core.contract.provenance import code_version

    return code_version()


def cmd_submit(args: argparse.Namespace) -> int:
    from orchestrate.dispatch.dispatch import new_manifest, run_sweep

    grid = load_grid(args.grid, args.overrides)
    profile = load_profile(args.profile)
    sweep = SweepDir(args.sweep_root, args.sweep or grid.name)
    if args.dry_run:
        from orchestrate.cli.dry_run import submit_preview

        return submit_preview(args, grid, profile, sweep)
    with sweep.lock("submit"):  # before sweep.json and trials.json are read: no stale copy is written back
        checked = submit_input(args, grid.trials, profile, sweep)
        old, uri, trials, backend = checked.old, checked.uri, checked.trials, checked.backend
        check_tracking_uri(uri)
        sweep_id = (old.sweep_id if old is not None else "") or new_sweep_id()
        # before anything is written; a folder that existed may adopt an experiment made before sweeps had ids
        Ledger(uri, sweep.name).check_owner(sweep_id, str(sweep.path), adopt=old is not None)
        max_failures = args.max_failures or (old.max_failures if old is not None else DEFAULT_MAX_FAILURES)
        manifest = new_manifest(sweep.name, Path(grid.path).resolve(), args.backend, args.profile or "", uri,
                                tuple(args.overrides), sweep_id=sweep_id, code=old.code if old is not None else (),
                                max_failures=max_failures, allow_sqlite=checked.allow_sqlite)
        if old is not None:  # the sweep keeps its birth date; a later submit's settings and folder are today's
            manifest = dataclasses.replace(manifest, created=old.created)
        plan = run_sweep(sweep, manifest, trials, profile, include_failed=False, what="submit", write=True,
                         adopt=old is not None, backend=backend, code=_code(), expand=_evaluations_of(sweep))
    from orchestrate.budget.recorded import record_estimate

    record_estimate(sweep.path, grid, profile, args.backend)  # for status: GPU-hours spent against it
    print(f"sweep {sweep.name}: {plan.summary()}")
    print(f"  folder {sweep.path}\n  ledger {uri}\n  status: {sweep.command('status')}")
    return _behind(args, plan, sweep)


def _evaluations_of(sweep: SweepDir):  # noqa: ANN202 - a closure for run_sweep's expand
    """What ``run_sweep`` calls under the lock: the sweep's trials with the evaluation jobs their trained models
    need for the grid's eval section (:func:`orchestrate.plan.evaluations.plan_default`)."""
    from orchestrate.plan.evaluations import plan_default

    return lambda trials: plan_default(sweep, trials)


def _sweep(args: argparse.Namespace) -> SweepDir:
    """The sweep ``args`` name, which must exist (so that taking its lock creates no folder). Not under the sweep
    root but a ``--tracking-uri`` given: the folder the ledger recorded for the sweep (its experiment's
    ``sweep.root`` tag), when that folder holds it; then ``args.sweep_root`` is that folder's root, so every command
    printed after carries it."""
    sweep = SweepDir(args.sweep_root, args.sweep)
    if not sweep.exists():
        found = _recorded_sweep(args)
        if found is not None:
            args.sweep_root = found.path.parent
            return found
        sweep.read_manifest()  # raises SweepError saying there is no such sweep
    return sweep


def _recorded_sweep(args: argparse.Namespace) -> SweepDir | None:
    """The sweep folder the ledger at ``--tracking-uri`` recorded for the sweep (one lookup, no mlflow import), if
    it holds that sweep's manifest; None without a ``--tracking-uri``, an answer or such a folder."""
    uri = getattr(args, "tracking_uri", None)
    if not uri:
        return None
    from orchestrate.ledger.probe import ledger_probe

    probe = ledger_probe(uri, args.sweep)
    if not probe.owner_root:
        return None
    folder = Path(probe.owner_root)
    found = SweepDir(folder.parent, args.sweep)
    if found.path.resolve() != folder.resolve() or not found.exists():
        return None
    print(f"[orchestrate] sweep {args.sweep!r} found in {folder} (the folder {uri} recorded for it)", file=sys.stderr)
    return found


def _read(args: argparse.Namespace) -> tuple[SweepDir, Manifest]:
    """The sweep folder and its manifest; a ``--tracking-uri`` other than the manifest's is refused: the jobs read
    the manifest's, so a second one would split the ledger. A command that may write the sweep's files calls it
    under the sweep's lock."""
    sweep = _sweep(args)
    manifest = sweep.read_manifest()
    if args.tracking_uri and not same_uri(args.tracking_uri, manifest.tracking_uri):
        raise UsageError(f"sweep {sweep.name!r} is ledgered in {manifest.tracking_uri} (its sweep.json, which its "
                         f"jobs read), not {args.tracking_uri}; a second ledger would split the sweep's record. "
                         "Drop --tracking-uri (the sweep's own is used), or submit the grid under another --sweep "
                         "name to ledger it elsewhere")
    return sweep, manifest


def _refuse_other_uri(args: argparse.Namespace) -> None:
    """Before the lock is taken, the read-only checks that refuse a command (another ``--tracking-uri``; a ledger
    that answers and belongs to another sweep folder): a refused command changes nothing, not even the lock file."""
    from orchestrate.ledger.probe import check_owner, ledger_probe

    try:
        sweep, manifest = _read(args)
    except SweepFileError:
        return  # said under the lock (where cancel first stops what it finds)
    check_owner(ledger_probe(manifest.tracking_uri, manifest.name), manifest, sweep)


def _open(args: argparse.Namespace) -> tuple[SweepDir, Manifest, list[Trial]]:
    sweep, manifest = _read(args)
    check_tracking_uri(manifest.tracking_uri, hint=f"start the sweep's server again ({SERVER_HINT}; its folder and "
                       "port); the sweep's jobs write to this URI (its sweep.json), so no other can stand in"
                       + ("; `orchestrate cancel --offline` stops the sweep without it" if args.command != "cancel"
                          else ""))
    Ledger(manifest.tracking_uri, manifest.name).check_owner(manifest.sweep_id, str(sweep.path), adopt=True)
    return sweep, manifest, sweep.read_trials()


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrate.status.status import show_status
    from orchestrate.ledger.probe import check_owner, ledger_probe

    sweep, manifest = _read(args)
    # status reads the trial folders and works while MLflow is down; a ledger that answers must be this sweep's
    check_owner(ledger_probe(manifest.tracking_uri, manifest.name), manifest, sweep)
    return show_status(args, sweep, manifest)


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrate.backends import make_backend
    from orchestrate.dispatch.dispatch import run_sweep

    retry: tuple[str, ...] = ()
    if args.command == "retry":
        retry = tuple(w for w in ("failed", "cancelled") if getattr(args, w))
        if not retry:
            raise UsageError("retry what? pass --failed (failed trials, their failure count reset), --cancelled "
                             "(cancelled trials, from their checkpoints), or both")
    if args.dry_run:  # no lock, no ledger, nothing written (orchestrate.cli.dry_run)
        from orchestrate.cli.dry_run import preview

        return preview(args, *_read(args), retry, _selected(args.where))
    _refuse_other_uri(args)
    with _sweep(args).lock(args.command):  # before the sweep's files are read: no stale copy is written back
        sweep, manifest, trials = _open(args)
        profile = load_profile(manifest.profile or None)
        if not manifest.sweep_id:  # a folder made before sweeps had ids gets one now, and claims its experiment
            manifest = dataclasses.replace(manifest, sweep_id=new_sweep_id())
        if args.max_failures:
            manifest = dataclasses.replace(manifest, max_failures=args.max_failures)
        if args.allow_sqlite:
            manifest = dataclasses.replace(manifest, allow_sqlite=True)
        backend = make_backend(manifest.backend, sweep, manifest.tracking_uri, profile)
        check_shared_ledger(backend, manifest.tracking_uri, manifest.allow_sqlite, "the sweep's, in its sweep.json")
        changed = execution_overrides(trials, args.overrides)
        if changed is not trials and not args.no_check_data:
            check_data(changed, Path(manifest.workdir or Path.cwd()))
        if changed is not trials:
            manifest = dataclasses.replace(manifest, overrides=manifest.overrides + tuple(args.overrides))
        plan = run_sweep(sweep, manifest, changed, profile, include_failed=True, retry=retry, what=args.command,
                         write=True, adopt=True, backend=backend, code=_code(), expand=_evaluations_of(sweep),
                         only=_selected(args.where))
    print(f"sweep {sweep.name}: {plan.summary()}")
    return _behind(args, plan, sweep)


def _behind(args: argparse.Namespace, plan: "Plan", sweep: SweepDir) -> int:
    """0, or :data:`EXIT_TRACKER` and a line saying what to run once MLflow answers when a blocking backend's trials
    ran but the ledger could not be read at the end (their results wait in their folders' outboxes)."""
    if not plan.ledger_behind:
        return 0
    print(f"orchestrate {args.command}: the trials ran and their results are in their folders (outboxes), but "
          f"{plan.ledger_behind}; once MLflow answers, `{sweep.command('status')}` ships them and brings the runs "
          "up to date", file=sys.stderr)
    return EXIT_TRACKER


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrate.dispatch.cancel import cancel, confirmed

    _refuse_other_uri(args)
    if not args.where and not args.yes and not confirmed(_sweep(args)):
        return 1
    print(cancel(_sweep(args), lambda: _read(args)[1], _selected(args.where), offline=args.offline))
    return 0


def _selected(where: list[str]) -> "Callable[[Trial], bool] | None":
    """What ``--where`` selects, as a test of a trial (None without it: everything)."""
    if not where:
        return None
    from orchestrate.sweep.where import matches, parse_where

    w = parse_where(where)
    return lambda t: matches(t, w)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``evaluate SWEEP --spec FILE`` (``--decode FILE`` is the same): one evaluation job per trained model
    (``--where``) that lacks the spec's conditions under its name, submitted with the sweep's other jobs
    (:func:`orchestrate.dispatch.dispatch.run_sweep`: the same backend, ``max_parallel``, ``status``, ``cancel`` and
    ``retry``); the models' keys, folders and training state are never touched. A spec of plain test sets
    (``datasets`` only) adds them to each model's own evaluation (metrics ``wer/...``), as ``submit`` does when the
    grid's eval section gains them."""
    from asr_core.contract.evaluation import describe_conditions
    from orchestrate.backends import make_backend
    from orchestrate.plan.decode_file import load_decode_file
    from orchestrate.dispatch.dispatch import run_sweep
    from orchestrate.plan.evaluations import EvaluationName, decoded_before, missing_data, plan_named, plan_plain
    from orchestrate.sweep.where import matches, parse_where

    spec = load_decode_file(args.spec)
    where = parse_where(args.where)
    _refuse_other_uri(args)
    with nullcontext() if args.dry_run else _sweep(args).lock(f"evaluate {spec.name}"):  # before the files are read
        sweep, manifest, trials = _open(args)
        profile = load_profile(manifest.profile or None)
        backend = make_backend(manifest.backend, sweep, manifest.tracking_uri, profile)
        check_shared_ledger(backend, manifest.tracking_uri, manifest.allow_sqlite, "the sweep's, in its sweep.json")
        setting = {} if spec.plain else spec.setting()
        names = EvaluationName(sweep, spec.name)
        if not spec.plain:  # plain test sets: each model's own evaluation, at the setting it ran
            names.check_setting(spec, setting)
        decoder = {k: v for k, v in spec.to_dict().items() if k not in ("name", "datasets", "snrs", "source")}
        models = [t for t in trials if not t.is_evaluation and matches(t, where)]
        have = {} if spec.plain else decoded_before(manifest.tracking_uri, manifest.name, spec.decoders, models)
        workdir = Path(manifest.workdir or Path.cwd())
        planned: dict[str, list[Trial]] = {}
        waiting = "not trained or evaluated yet (evaluate again once they are)" if spec.plain else "not trained yet"

        def expand(ts: list[Trial]) -> list[Trial]:
            if spec.plain:
                out, planned["added"], planned["untrained"] = plan_plain(sweep, ts, models, spec.datasets, spec.snrs)
            else:
                out, planned["added"], planned["untrained"] = plan_named(sweep, ts, models, spec.name, setting,
                                                                         spec.datasets, spec.snrs, decoder, have)
            missing = missing_data(planned["added"], workdir)
            if missing:
                raise UsageError("data not found: " + ", ".join(f"{p} (evaluation job {k})" for p, k in
                                                                sorted(missing.items()))
                                 + f"; give the datasets in {spec.source} ('datasets'), or move the data back")
            return out

        if args.dry_run:
            expand(trials)
            print(f"sweep {sweep.name}, evaluation {spec.name} (dry run, nothing submitted): {len(planned['added'])} "
                  f"evaluation jobs, {len(models) - len(planned['added']) - len(planned['untrained'])} models "
                  f"evaluated already, {len(planned['untrained'])} {waiting}, {len(trials) - len(models)} not "
                  "matching --where or evaluation jobs")
            for t in planned["added"]:
                print(f"  {t.label} ({t.key}): {describe_conditions(t.evaluation['conditions'])}")
            return 0

        def claim_and_expand(ts: list[Trial]) -> list[Trial]:
            out = expand(ts)
            if not spec.plain and names.check_setting(spec, setting):  # again under the lock: another command may have claimed it
                names.claim(spec, setting)
            return out

        plan = run_sweep(sweep, manifest, trials, profile, include_failed=False, what=f"evaluate {spec.name}",
                         write=True, adopt=True, backend=backend, code=_code(), expand=claim_and_expand,
                         only=lambda t: t.evaluation is not None and t.evaluation["name"] == spec.name)
        print(f"sweep {sweep.name}, evaluation {spec.name}: {len(planned.get('added', []))} new evaluation jobs, "
              f"{len(planned.get('untrained', []))} models {waiting}; {plan.summary()}")
        results = "wer/... (the report's main WER table)" if spec.plain else \
            ", ".join(f"wer_{d}/..." for d in spec.decoders)
        print(f"  results: {results} in each model's run; status: {sweep.command('status')}")
        return _behind(args, plan, sweep)


def cmd_logs(args: argparse.Namespace) -> int:
    """``logs SWEEP KEY [-f]``: the trial's log (:mod:`orchestrate.cli.logs`); an unknown sweep or KEY exits 2."""
    from orchestrate.cli.logs import show_log

    return show_log(args, _read(args)[0])


def cmd_bench(args: argparse.Namespace) -> int:
    from orchestrate.tools.bench import run_bench

    return run_bench(skip_slurm=args.skip_slurm, tracking_uri=args.tracking_uri)


COMMANDS = {"plan": cmd_plan, "submit": cmd_submit, "status": cmd_status, "resume": cmd_resume,
            "retry": cmd_resume, "cancel": cmd_cancel, "evaluate": cmd_evaluate,
            "show": lambda args: show_trial(args, *_read(args)), "logs": cmd_logs, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    from asr_core.contract.command import guarded  # a bug: one line naming its log, exit 1

    return guarded("orchestrate", _main, argv)


def _main(argv: list[str]) -> int:
    parser = build_parser()
    if os.environ.get("_ARGCOMPLETE") and not os.environ.get("ASR_STUDY_COMPLETING"):
        # the `orchestrate` script's own completion (eval "$(register-python-argcomplete orchestrate)"); under
        # `asr-study orchestrate` the console's completion asks this parser itself (asr_study.complete)
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except StoppedBySignal as e:  # Ctrl-C of a foreground sweep: 130, as every command (asr_core.contract.command)
        print(f"orchestrate {args.command}: {e}", file=sys.stderr)
        return 128 + e.signum
    except (GridError, UsageError, BackendError, LedgerError, SweepError, DecodeFileError, WhereError,
            EvaluationError) as e:
        print(f"orchestrate {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
