"""What the commands check of their input before anything is created or submitted: data paths, ``--set`` overrides
that may change how trials run but never what they are, a ledger a backend can share; :class:`UsageError` for all
of them (exit 2, one line naming the file, key or value and what is valid)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrate.backends.base import Backend
from orchestrate.sweep.trial import Trial

if TYPE_CHECKING:
    from orchestrate.plan.profile import Profile
    from orchestrate.sweep.folder import Manifest, SweepDir

SERVER_HINT = ("`asr-study mlflow-server --dir /shared/mlflow --host 0.0.0.0 --detach`, or slurm/mlflow-server.sh with "
               "the same options in a checkout")


class UsageError(Exception):
    """Bad input: exit 2 before anything changes."""


def data_paths(trials: list[Trial]) -> dict[str, str]:
    """{path: 'trial field'} of every local data path the trials read."""
    from asr_core.contract.specs import CorpusError, split_named_spec, split_spec

    out: dict[str, str] = {}
    for t in trials:
        specs = [("data.train", t.config.data.train)] if t.config.data.train else []
        for name, spec in specs + [("eval.datasets", d) for d in t.config.eval.datasets]:
            try:
                fmt, path = split_spec(split_named_spec(spec)[1])
                # a prepared corpus is only one once its manifest is written (an unfinished preparation is not)
                out.setdefault(str(path / "prepared.json") if fmt == "prepared" else str(path), name)
            except CorpusError as e:
                raise UsageError(f"{name} of trial {t.label}: {e}") from None
    return out


def check_data(trials: list[Trial], workdir: Path) -> None:
    """Exit 2 naming every data path the trials read that does not exist (relative paths: from ``workdir``, the
    folder trials run in)."""
    missing = {p: k for p, k in data_paths(trials).items() if not (workdir / p).exists()}
    if missing:
        raise UsageError("data not found: " + ", ".join(f"{p} ({k})" for p, k in sorted(missing.items()))
                         + "; fix the grid or --set the path (a prepared corpus: finish `python -m asr_core "
                           "prepare`), or pass --no-check-data if only the compute nodes see it")


def execution_overrides(trials: list[Trial], overrides: list[str]) -> list[Trial]:
    """``trials`` with ``--set`` overrides applied, which may change how trials run and where their data lies, never
    what they are: an override that would change a trial's key raises :class:`UsageError` naming it."""
    if not overrides:
        return trials
    from asr_core.config.parse import ConfigError
    from asr_core.contract.identity import science

    out = []
    for t in trials:
        try:
            cfg = t.config.with_overrides(overrides)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        if cfg.key() != t.config.key():
            was, now = science(t.config), science(cfg)
            changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
            raise UsageError(f"--set {' '.join(overrides)} changes what trial {t.label} ({t.key}) is ("
                             f"{', '.join(changed)}), not only how it runs; resume takes execution settings and "
                             "data locations only. To run other experiments, submit a grid (they get new keys)")
        out.append(dataclasses.replace(t, config=cfg))
    return out


def check_shared_ledger(backend: Backend, uri: str, allow_sqlite: bool, source: str) -> None:
    """Refuse a sqlite ledger (``uri``, which ``source`` names) for a backend whose jobs run on many hosts, unless
    ``allow_sqlite``."""
    if not backend.many_hosts or not uri.startswith("sqlite:") or allow_sqlite:
        return
    raise UsageError(
        f"--backend {backend.name} with the sqlite ledger {uri} ({source}): its jobs run on many hosts and would all "
        "write that one file over a network filesystem, where sqlite's locks fail (runs lost, the database "
        f"corrupted). Start an MLflow server on the login node ({SERVER_HINT}) and pass --tracking-uri "
        "http://LOGIN-NODE:5000, or pass --allow-sqlite if every job runs on this host")


def same_uri(a: str, b: str) -> bool:
    """Whether two tracking URIs name the same ledger (a trailing slash aside)."""
    return a.rstrip("/") == b.rstrip("/")


@dataclasses.dataclass(frozen=True)
class SubmitInput:
    """What ``submit`` (and ``submit --dry-run``) settled before anything is written: the sweep's manifest if it
    exists, the ledger's address, the trials (the grid's, merged into the sweep's), the backend, and whether a
    sqlite ledger is allowed."""

    old: "Manifest | None"
    uri: str
    trials: list[Trial]
    backend: Backend
    allow_sqlite: bool


def submit_input(args: Any, grid_trials: list[Trial], profile: "Profile", sweep: "SweepDir") -> SubmitInput:
    """The checks ``submit`` makes of its input before it writes anything (the data the grid reads, a backend or a
    ledger other than the sweep's, a sqlite ledger a cluster backend would share), and what they settle;
    :class:`UsageError` for bad input. Reads the sweep's files: ``submit`` calls it under the sweep's lock."""
    from asr_core.contract.tracking import ENV, tracking_uri
    from orchestrate.backends import make_backend
    from orchestrate.sweep.folder import merge_trials

    old = sweep.read_manifest() if sweep.exists() else None
    uri = args.tracking_uri or (old.tracking_uri if old else tracking_uri(None, sweep_root=args.sweep_root))
    trials = list(grid_trials)
    if not args.no_check_data:
        check_data(trials, Path.cwd())
    if old is not None:
        if old.backend != args.backend:
            raise UsageError(f"sweep {sweep.name!r} exists with backend {old.backend!r}; use `orchestrate resume "
                             f"{sweep.name}` or give another --sweep name")
        if not same_uri(old.tracking_uri, uri):
            raise UsageError(f"sweep {sweep.name!r} is ledgered in {old.tracking_uri}, not {uri}; drop "
                             "--tracking-uri or give another --sweep name")
        trials = merge_trials(sweep.read_trials(), trials)
    allow_sqlite = args.allow_sqlite or (old is not None and old.allow_sqlite)
    backend = make_backend(args.backend, sweep, uri, profile)
    check_shared_ledger(backend, uri, allow_sqlite, "given with --tracking-uri" if args.tracking_uri else
                        "the sweep's" if old is not None else f"from ${ENV}" if uri == os.environ.get(ENV) else
                        "the default without --tracking-uri")
    return SubmitInput(old, uri, trials, backend, allow_sqlite)
