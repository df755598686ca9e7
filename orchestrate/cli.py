"""``orchestrate`` / ``python -m orchestrate``: plan, submit, status, resume, retry, cancel, bench.

A thin layer over the library. Every input is validated before anything is created or submitted; invalid input
exits with status 2 and a message naming the file, key or value and what is valid.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrate.backends.base import BackendError, load_profile
from orchestrate.grid import GridError, load_grid, plan_table
from orchestrate.ledger import STATES, Ledger, LedgerError, check_tracking_uri, counts, default_tracking_uri
from orchestrate.sweep import SweepDir, SweepError
from orchestrate.trial import Trial

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: exit 2 before anything changes."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orchestrate", description="Grids of training configurations → Ray Tune, "
                                "SLURM or Ray-on-SLURM, with MLflow as the ledger.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--sweep-root", default="runs", help="folder holding sweeps and the default sqlite ledger "
                        "(default: ./runs)")
        sp.add_argument("--tracking-uri", default=None, help="MLflow URI: sqlite:///PATH or http://HOST:PORT "
                        "(default: sqlite:///SWEEP_ROOT/mlflow.db, or the sweep's own)")

    sp = sub.add_parser("plan", help="expand a grid: trials per sub-grid (no side effects)")
    sp.add_argument("grid")
    sp.add_argument("--json", action="store_true", help="list key, sub-grids, seed and config of every trial")
    sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    sp = sub.add_parser("submit", help="create the sweep's runs and submit every trial not finished yet")
    sp.add_argument("grid")
    sp.add_argument("--backend", required=True, choices=("local", "slurm", "ray-slurm"))
    sp.add_argument("--profile", default=None, help="cluster profile: slurm/profiles/NAME.yaml or a path")
    sp.add_argument("--sweep", default=None, help="sweep name (default: the grid's name)")
    sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a base field of every trial, e.g. data.train=podcast:/data/train")
    sp.add_argument("--no-check-data", action="store_true", help="skip checking that data paths exist here")
    common(sp)

    for name, text in (("status", "counts by state and the failed trials"),
                       ("resume", "re-attach live jobs, resubmit lost and failed ones, skip finished ones"),
                       ("retry", "resubmit the failed trials"), ("cancel", "cancel the sweep's live jobs")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("sweep")
        common(sp)
        if name == "status":
            sp.add_argument("--json", action="store_true", help="one JSON object per trial run")
        if name == "retry":
            sp.add_argument("--failed", action="store_true", required=True, help="resubmit FAILED/KILLED trials")

    sp = sub.add_parser("bench", help="time plan, submit and status against their goals")
    sp.add_argument("--skip-slurm", action="store_true", help="skip the SLURM submission timing")
    common(sp)
    return p


# ---- commands ------------------------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid, args.overrides)
    if args.json:
        json.dump({"grid": grid.name, "subgrids": [s.__dict__ for s in grid.subgrids],
                   "trials": [t.to_dict() for t in grid.trials]}, sys.stdout, indent=1)
        print()
    else:
        print(plan_table(grid))
    return 0


def _data_paths(trials: list[Trial]) -> dict[str, str]:
    """{path: 'trial field'} of every local data path the trials read."""
    out: dict[str, str] = {}
    for t in trials:
        spec = t.config.data.train
        if spec:
            out.setdefault(spec.split(":", 1)[-1], "data.train")
        for ds in t.config.eval.datasets:
            out.setdefault(ds.split("=", 1)[1].split(":", 1)[-1], "eval.datasets")
    return out


def cmd_submit(args: argparse.Namespace) -> int:
    from orchestrate.dispatch import new_manifest, run_sweep

    grid = load_grid(args.grid, args.overrides)
    profile = load_profile(args.profile)
    sweep = SweepDir(args.sweep_root, args.sweep or grid.name)
    uri = args.tracking_uri or (sweep.read_manifest().tracking_uri if sweep.exists()
                                else default_tracking_uri(args.sweep_root))
    trials = list(grid.trials)
    if not args.no_check_data:
        missing = {p: k for p, k in _data_paths(trials).items() if not Path(p).exists()}
        if missing:
            raise UsageError("data not found: " + ", ".join(f"{p} ({k})" for p, k in sorted(missing.items()))
                             + "; fix the grid or --set the path, or pass --no-check-data if only the compute "
                               "nodes see it")
    if sweep.exists():
        old = sweep.read_manifest()
        if old.backend != args.backend:
            raise UsageError(f"sweep {sweep.name!r} exists with backend {old.backend!r}; use `orchestrate resume "
                             f"{sweep.name}` or give another --sweep name")
        if old.tracking_uri != uri:
            raise UsageError(f"sweep {sweep.name!r} is ledgered in {old.tracking_uri}, not {uri}; drop "
                             "--tracking-uri or give another --sweep name")
        known = {t.key: t for t in sweep.read_trials()}
        trials = list(known.values()) + [t for t in trials if t.key not in known]
    check_tracking_uri(uri)
    manifest = new_manifest(sweep.name, Path(args.grid).resolve(), args.backend, args.profile or "", uri,
                            tuple(args.overrides))
    from orchestrate.backends import make_backend

    make_backend(args.backend, sweep, uri, profile).validate()
    sweep.write_manifest(manifest)
    sweep.write_trials(trials)
    plan = run_sweep(sweep, manifest, trials, profile, include_failed=False, what="submit")
    print(f"sweep {sweep.name}: {plan.summary()}")
    print(f"  folder {sweep.path}\n  ledger {uri}\n  status: orchestrate status {sweep.name} "
          f"--sweep-root {args.sweep_root}")
    return 0


def _open(args: argparse.Namespace) -> tuple[SweepDir, Any, list[Trial]]:
    sweep = SweepDir(args.sweep_root, args.sweep)
    manifest = sweep.read_manifest()
    if args.tracking_uri:
        manifest = manifest.__class__(**{**manifest.__dict__, "tracking_uri": args.tracking_uri})
    check_tracking_uri(manifest.tracking_uri)
    return sweep, manifest, sweep.read_trials()


def cmd_status(args: argparse.Namespace) -> int:
    sweep, manifest, trials = _open(args)
    ledger = Ledger(manifest.tracking_uri, manifest.name)
    runs = ledger.trial_runs()
    if args.json:
        for r in runs.values():
            print(json.dumps(r.__dict__))
        return 0
    c = counts(runs.values(), len(trials))
    print(f"sweep {sweep.name} ({manifest.backend}, {len(trials)} trials, ledger {manifest.tracking_uri})")
    width = max(len(s) for s in c)
    for state in (*STATES, "MISSING"):
        if c.get(state):
            print(f"  {state:<{width}}  {c[state]:>5}")
    bad = [r for r in runs.values() if r.status in ("FAILED", "KILLED")]
    if bad:
        print(f"\n{len(bad)} failed or killed:")
        lw = max(len(r.label) for r in bad)
        for r in sorted(bad, key=lambda r: r.label):
            print(f"  {r.label:<{lw}}  {r.key}  {r.status:<6}  job {r.job_id or '-':<10}  {r.error or '-'}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrate.dispatch import run_sweep

    sweep, manifest, trials = _open(args)
    profile = load_profile(manifest.profile or None)
    plan = run_sweep(sweep, manifest, trials, profile, include_failed=True,
                     only_failed=args.command == "retry", what=args.command)
    print(f"sweep {sweep.name}: {plan.summary()}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrate.dispatch import cancel_sweep

    sweep, manifest, _ = _open(args)
    job_ids = cancel_sweep(sweep, manifest, load_profile(manifest.profile or None))
    print(f"sweep {sweep.name}: cancelled {len(job_ids)} jobs")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from orchestrate.bench import run_bench

    return run_bench(skip_slurm=args.skip_slurm)


COMMANDS = {"plan": cmd_plan, "submit": cmd_submit, "status": cmd_status, "resume": cmd_resume,
            "retry": cmd_resume, "cancel": cmd_cancel, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (GridError, UsageError, BackendError, LedgerError, SweepError) as e:
        print(f"orchestrate {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
