"""MLflow as the sweep's ledger (schema: docs/ARCHITECTURE.md, "MLflow ledger schema").

One experiment per sweep (named after it), a parent run (``sweep.role=parent``), and one child run per trial
created SCHEDULED at submission, tagged ``trial.key`` and friends; the trial job continues that run. Every lookup is
one paged ``search_runs`` with a tag filter, never a call per run, so ``status`` stays fast for hundreds of trials.

A sweep owns its experiment: the experiment carries the id of the sweep folder that created it (``sweep.id``) and
that folder's path (``sweep.root``). Names are chosen by people and collide (two users, or one user twice, submitting
``paper`` to one shared server); the id is what tells two sweeps of one name apart, so that one sweep's ``resume``
never takes the other's unfinished runs for lost and its ``cancel`` never kills them. An experiment made before
sweeps had ids carries no owner; one that holds trial runs is adopted only by a caller that says the sweep folder is
that sweep's own (``adopt=True``: the folder existed before the command), never by a brand-new folder that happens
to reuse the name. Run states and tag names are the trial contract's (:mod:`asr_core.contract.trial`), shared with
the trial job.

A trial run's *name* is for the eye only (:func:`run_names`): short enough for the UI's Run Name column, where the
full label (tag ``trial.label``, what the analysis reads) is cut; nothing finds a run by its name.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlparse

from asr_core.contract.tracking import sqlite_file
from asr_core.contract.trial import (ENDED, FINISHED, ROLE_PARENT, ROLE_TRIAL, RUNNING, SCHEDULED, STATES,
                                     TAG_BACKEND, TAG_CODE, TAG_ERROR, TAG_JOB_ID, TAG_KEY, TAG_LABEL,
                                     TAG_PARENT_RUN, TAG_PREEMPTIONS, TAG_ROLE, TAG_SEED, TAG_SEGMENTS, TAG_SUBGRIDS,
                                     TAG_SWEEP_BACKEND, TAG_SWEEP_GRID, TAG_SWEEP_ID, TAG_SWEEP_ROOT)
from orchestrate.ledger.store import ClientStore, enable_wal, sqlite_sync_normal
from orchestrate.ledger.mlflow_rest import Experiment, LedgerError, MlflowRest, UncertainWrite
from orchestrate.sweep.trial import POSENC_SHORT, Trial

__all__ = ["STATES", "Ledger", "LedgerError", "SweepOwnershipError", "TrialRun", "counts", "run_names", "wait_for"]

RUN_NAME_CHARS = 19  # what MLflow 3's Run Name column (190 px) shows of a flat list (the saved view); nested: 14


def _encoding(trial: Trial) -> str:
    m = trial.config.model
    if m.posenc != "rotary":
        return POSENC_SHORT.get(m.posenc, m.posenc)
    theta = m.rotary_theta
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(theta) >= div:
            return f"rope{theta / div:g}{suffix}"
    return f"rope{theta:g}"


def run_names(trials: Sequence[Trial]) -> dict[str, str]:
    """{key: run name} of the training trials among ``trials`` (a sweep's): the context and the seed, and the
    positional encoding, the size (layers and width) and the heads only where a trial differs from the sweep's most
    common value of them (as Ray Tune names a trial by its searched values only), e.g. ``82s s2`` for the main
    model, ``82s sin s2`` and ``82s 3x2048 16h s2`` (layers x width, heads) for others; so that a name fits the UI's
    Run Name column (about :data:`RUN_NAME_CHARS` characters) where the label ``ctx82s-rope1.5M-6L768d6h-s2`` is
    cut. Names two trials share get the key's first 6 digits (as labels do). Evaluation jobs keep their label."""
    parts: dict[str, tuple[str, ...]] = {}
    for t in trials:
        if t.is_evaluation:
            continue
        m, ctx = t.config.model, t.config.data.context_s
        parts[t.key] = (f"{ctx:.0f}s" if ctx >= 1 else f"{ctx:g}s", _encoding(t), f"{m.layers}x{m.d_model}",
                        f"{m.heads}h", f"s{t.seed}")
    usual = {i: Counter(p[i] for p in parts.values()).most_common(1)[0][0] for i in (1, 2, 3)} if parts else {}
    names = {k: " ".join([p[0], *(p[i] for i in (1, 2, 3) if p[i] != usual[i]), p[4]]) for k, p in parts.items()}
    seen = Counter(names.values())
    return {k: f"{n} {k[:6]}" if seen[n] > 1 else n for k, n in names.items()}


class SweepOwnershipError(LedgerError):
    """The experiment named after the sweep belongs to another sweep folder; the message names that folder and how
    to choose another name."""


@dataclass(frozen=True)
class TrialRun:
    """What the ledger knows of one trial (one child run)."""

    run_id: str
    key: str
    label: str
    status: str
    job_id: str  # "" until the backend has submitted it
    backend: str
    subgrids: str
    error: str  # last line of the error for FAILED runs
    preemptions: int
    code: str = ""  # code label of each segment that ran the trial, comma-separated, in order ("" before the first)
    segments: int = 0  # how many times the job started (first start + resumes)

    @property
    def code_labels(self) -> tuple[str, ...]:
        """The distinct code labels that ran the trial, in the order they first ran it."""
        return tuple(dict.fromkeys(c.strip() for c in self.code.split(",") if c.strip()))

    @property
    def mixed_code(self) -> bool:
        """True when segments of the trial ran different code (a resume after the code changed)."""
        return len(self.code_labels) > 1


_ADOPT_PROBE = 1  # trial runs an untagged experiment must hold before only its own sweep folder may adopt it


def _tag_int(tags: dict[str, str], name: str) -> int:
    """An integer tag written by the trial job; 0 when absent or unreadable (one odd run must not break ``status``)."""
    try:
        return int(tags.get(name, "0") or 0)
    except ValueError:
        return 0


class Ledger:
    """The sweep ``name`` in the MLflow tracking store at ``tracking_uri``.

    An ``http(s)://`` server is spoken to through its REST API (:mod:`orchestrate.ledger.mlflow_rest`: no mlflow import,
    pooled connections, calls in parallel); a ``sqlite:`` file through ``MlflowClient``."""

    def __init__(self, tracking_uri: str, name: str) -> None:
        if tracking_uri.startswith("sqlite:"):
            sqlite_sync_normal()
        self.uri = tracking_uri
        self.name = name
        self._experiment_id: str | None = None
        self._rest = urlparse(tracking_uri).scheme in ("http", "https")

    @cached_property
    def client(self) -> Any:
        """An ``MlflowClient`` of the tracking URI, made on first use: making one creates a sqlite database that
        does not exist yet, which :meth:`check_owner` must not do. The ledger itself uses it for ``sqlite:`` only."""
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    @cached_property
    def store(self) -> MlflowRest | ClientStore:
        """What the ledger's calls go to: the REST API of a server, or ``MlflowClient`` on a sqlite file."""
        return MlflowRest(self.uri) if self._rest else ClientStore(lambda: self.client)

    # ---- the sweep --------------------------------------------------------------------------------------------------
    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.store.get_experiment_by_name(self.name)
            if exp is None:
                raise LedgerError(f"no sweep {self.name!r} in {self.uri}; submit it first")
            if exp.lifecycle_stage != "active":
                raise self._deleted_error(exp)
            self._experiment_id = exp.experiment_id
        return self._experiment_id

    def check_owner(self, sweep_id: str, root: str, *, adopt: bool = False) -> None:
        """Raise :class:`SweepOwnershipError` when this sweep folder may not use the experiment named after it, and
        :class:`LedgerError` when that experiment was deleted.

        The folder may not use it when the experiment belongs to another sweep folder (its ``sweep.id`` tag is not
        ``sweep_id``), or when it was made before sweeps had ids (no ``sweep.id`` tag), holds trial runs and
        ``adopt`` is False. Pass ``adopt=True`` only when the sweep folder existed before this command, i.e. it is
        the folder of the sweep that made the experiment; a brand-new folder must not take over an older sweep's
        runs (its ``resume`` would resubmit them). An untagged experiment without trial runs may always be adopted.

        Read-only: an experiment that does not exist yet passes, and a sqlite ledger whose file does not exist yet is
        not created. ``sweep_id`` "" stands for a sweep folder without an id (itself from before sweep ids), which
        owns no tagged experiment and adopts nothing. ``root`` is this sweep's folder, named in the message.
        """
        db = sqlite_file(self.uri)
        if db is not None and not db.exists():
            return
        exp = self.store.get_experiment_by_name(self.name)
        if exp is not None:
            self._check(exp, sweep_id, root, adopt=adopt)

    def ensure_sweep(self, grid: str, backend: str, sweep_id: str = "", root: str = "", *,
                     adopt: bool = False, datasets: Iterable[str] = ()) -> str:
        """Create (or claim) the sweep's experiment and its parent run; returns the parent run's id.

        With ``datasets`` (the names the trials evaluate on), an experiment without the saved view of the runs table
        gets it (:mod:`asr_core.contract.ledger`: the clean WER column of each dataset, every trial listed flat) and a
        description line linking to it, so the MLflow UI shows the sweep's WERs from the first submission on; a view
        already there (a report's, or a person's edit of it) is left as it is.

        Called by the submitting process under the sweep's lock, before any job. A new experiment is created with
        ``sweep.id`` = ``sweep_id`` and ``sweep.root`` = ``root``; an existing one must be this sweep's
        (:meth:`check_owner`, with the same ``adopt``); one made before sweeps had ids is adopted (tagged with both)
        when it holds no trial runs or ``adopt`` is True. ``sweep_id`` "" (a sweep folder without an id) only checks
        that no other sweep owns the experiment and claims nothing.
        """
        self._experiment_id = self._claim(sweep_id, root, adopt)
        parent = self.parent_run_id()
        if parent is None:
            tags = {TAG_ROLE: ROLE_PARENT, TAG_SWEEP_GRID: grid, TAG_SWEEP_BACKEND: backend}
            parent = self._create_once(self.parent_run_id,
                                       lambda: self.store.create_run(self.experiment_id, self.name, tags).run_id)
        self._save_view(datasets)
        return parent

    def _save_view(self, datasets: Iterable[str]) -> None:
        from asr_core.contract import ledger as sv

        metrics = sv.headline_metrics(datasets)
        exp = self.store.get_experiment_by_name(self.name) if metrics else None
        if exp is None or sv.VIEW_TAG_PREFIX + sv.VIEW_ID in exp.tags:
            return
        now = int(time.time() * 1000)
        view = sv.view_link(self.experiment_id)
        self.store.set_experiment_tag(self.experiment_id, sv.VIEW_TAG_PREFIX + sv.VIEW_ID,
                                      sv.saved_view_value(metrics, created_ms=now, now_ms=now))
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        line = sv.note_line(view, None, when, source="python -m orchestrate submit")
        self.store.set_experiment_tag(self.experiment_id, sv.NOTE_TAG,
                                      sv.with_note_line(exp.tags.get(sv.NOTE_TAG, ""), line))

    def _claim(self, sweep_id: str, root: str, adopt: bool) -> str:
        """The experiment's id, creating it tagged with ``sweep_id``/``root`` or adopting an untagged one."""
        owner_tags = {TAG_SWEEP_ID: sweep_id, TAG_SWEEP_ROOT: root} if sweep_id else {}
        exp = self.store.get_experiment_by_name(self.name)
        if exp is None:
            experiment_id = self.store.create_experiment(self.name, owner_tags or None)
            if experiment_id is not None:
                enable_wal(self.uri)
                return experiment_id
            exp = self.store.get_experiment_by_name(self.name)  # another submitter created it just now
            if exp is None:
                raise LedgerError(f"{self.uri} says an experiment {self.name!r} exists but does not return it; "
                                  "run the command again, or submit under another name with `--sweep NAME`")
        self._check(exp, sweep_id, root, adopt=adopt)
        if sweep_id and (exp.tags.get(TAG_SWEEP_ID) != sweep_id or exp.tags.get(TAG_SWEEP_ROOT) != root):
            # Adopt an experiment made before sweeps had ids, or record where the (moved) folder is now.
            for k, v in owner_tags.items():
                self.store.set_experiment_tag(exp.experiment_id, k, v)
            # Two folders adopting one untagged experiment at once: the one whose tag stuck goes on.
            again = self.store.get_experiment_by_name(self.name)
            if again is not None:
                self._check(again, sweep_id, root, adopt=adopt)
        return exp.experiment_id

    def _check(self, exp: Experiment, sweep_id: str, root: str, *, adopt: bool) -> None:
        """Raise unless the folder ``sweep_id``/``root`` may use ``exp`` (the rules of :meth:`check_owner`)."""
        if exp.lifecycle_stage != "active":
            raise self._deleted_error(exp)
        owner = exp.tags.get(TAG_SWEEP_ID)
        if owner is None:
            if sweep_id and not adopt and self._holds_trial_runs(exp.experiment_id):
                raise SweepOwnershipError(
                    f"experiment {self.name!r} in {self.uri} predates sweep ids and holds {_ADOPT_PROBE} or more "
                    f"trial runs of the sweep that made it; this sweep folder ({root or 'no folder given'}) is new, "
                    "and taking the experiment over would make its resume resubmit that sweep's unfinished runs. "
                    "Run the command from that sweep's own folder (which then adopts the experiment), or submit "
                    "this one under another name with `--sweep NAME`")
            return
        if owner == sweep_id:
            return
        owner_root = exp.tags.get(TAG_SWEEP_ROOT) or "a folder it did not record"
        ours = f"sweep id {sweep_id}" if sweep_id else "no sweep id"
        raise SweepOwnershipError(
            f"experiment {self.name!r} in {self.uri} belongs to another sweep: the folder {owner_root} (sweep id "
            f"{owner}), not this one ({root or 'this folder'}, {ours}); sweeps sharing one experiment would resume "
            f"and cancel each other's runs. Submit this one under another name with `--sweep NAME`, or run "
            f"status/resume/cancel from {owner_root}")

    def _holds_trial_runs(self, experiment_id: str) -> bool:
        """Whether the experiment holds at least one trial run (one search for a single run)."""
        runs, _ = self.store.search_runs([experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",
                                         max_results=_ADOPT_PROBE)
        return len(runs) >= _ADOPT_PROBE

    def _deleted_error(self, exp: Experiment) -> LedgerError:
        eid = exp.experiment_id
        gc = (f"`mlflow gc --backend-store-uri {self.uri} --experiment-ids {eid}`" if sqlite_file(self.uri)
              else f"`mlflow gc --backend-store-uri STORE --experiment-ids {eid}` with the server's backend store")
        owner = exp.tags.get(TAG_SWEEP_ROOT)
        return LedgerError(
            f"experiment {self.name!r} (id {eid}) in {self.uri} is deleted"
            + (f" (it was the sweep in {owner})" if owner else "")
            + "; MLflow keeps a deleted experiment's name taken. Restore it (`MLFLOW_TRACKING_URI="
            f"{self.uri} mlflow experiments restore --experiment-id {eid}`), delete it for good ({gc}), or submit "
            "under another name with `--sweep NAME`")

    def parent_run_id(self) -> str | None:
        runs, _ = self.store.search_runs([self.experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_PARENT}'",
                                         max_results=10, order_by=["attributes.start_time ASC"])
        return runs[0].run_id if runs else None

    @staticmethod
    def _create_once(find: Callable[[], str | None], create: Callable[[], str]) -> str:
        """``create()``; when the server may or may not have carried it out (the connection broke after the
        request went out), the run ``find()`` finds, and only if there is none ``create()`` again. A run created
        twice for one trial would leave its job continuing one run while the ledger reads the other."""
        try:
            return create()
        except UncertainWrite:
            return find() or create()

    # ---- trials -----------------------------------------------------------------------------------------------------
    def trial_runs(self) -> dict[str, TrialRun]:
        """Every child run by trial key (one paged search). If a key appears twice the oldest run wins."""
        out: dict[str, TrialRun] = {}
        runs = self.store.search_all_runs([self.experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",
                                          order_by=["attributes.start_time ASC"])
        for r in runs:
            tags = r.tags
            key = tags.get(TAG_KEY, "")
            if not key or key in out:
                continue
            out[key] = TrialRun(run_id=r.run_id, key=key, label=tags.get(TAG_LABEL, r.run_name or ""),
                                status=r.status, job_id=tags.get(TAG_JOB_ID, ""),
                                backend=tags.get(TAG_BACKEND, ""), subgrids=tags.get(TAG_SUBGRIDS, ""),
                                error=tags.get(TAG_ERROR, ""), preemptions=_tag_int(tags, TAG_PREEMPTIONS),
                                code=tags.get(TAG_CODE, ""), segments=_tag_int(tags, TAG_SEGMENTS))
        return out

    def _find_trial_run(self, key: str) -> str | None:
        """The oldest trial run of ``key``, or None (one search)."""
        runs, _ = self.store.search_runs(
            [self.experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}' and tags.`{TAG_KEY}` = '{key}'",
            max_results=1, order_by=["attributes.start_time ASC"])
        return runs[0].run_id if runs else None

    def create_trial_runs(self, parent_id: str, trials: Iterable[Trial], backend: str,
                          sweep: Sequence[Trial] | None = None) -> dict[str, str]:
        """Create a SCHEDULED child run for every trial whose key has none yet; returns {key: run_id} of all trials.
        Runs are named by :func:`run_names` over ``sweep`` (the sweep's trials; default ``trials``), so that a run
        added later says what it is among the others.

        Two calls per new run, runs in parallel on a server: the run with its identity tags, and SCHEDULED (MLflow
        creates every run RUNNING). The config's params are logged by the trial job when it first starts (its
        outbox), and the job id by each segment: submission stays within seconds for hundreds of trials, and a run
        never holds params of a config that did not run. Idempotent: keys already in the ledger keep their run (the
        caller holds the sweep lock, so no other submitter races us between the lookup and the creation).
        """
        existing = self.trial_runs()
        trials = list(trials)
        todo = [t for t in trials if t.key not in existing]
        names = run_names(list(sweep) if sweep is not None else trials)
        out = {k: r.run_id for k, r in existing.items()}
        experiment_id = self.experiment_id

        def create(t: Trial) -> tuple[str, str]:
            tags = {TAG_PARENT_RUN: parent_id, TAG_ROLE: ROLE_TRIAL, TAG_KEY: t.key,
                    TAG_SUBGRIDS: ",".join(t.subgrids), TAG_LABEL: t.label, TAG_SEED: str(t.seed),
                    TAG_BACKEND: backend, TAG_JOB_ID: ""}
            run_id = self._create_once(lambda: self._find_trial_run(t.key),
                                       lambda: self.store.create_run(experiment_id, names.get(t.key, t.label),
                                                                     tags).run_id)
            self.store.update_run(run_id, SCHEDULED)
            return t.key, run_id

        out.update(self.store.map(create, todo))
        return out

    def join_subgrids(self, trials: Iterable[Trial], runs: Mapping[str, TrialRun]) -> int:
        """Tag each run of ``runs`` (by key) with its trial's sub-grids where they differ: a trial the sweep had that
        a later grid shares has joined that grid's sub-grids (:func:`orchestrate.sweep.folder.merge_trials`), and the
        report reads a configuration's seeds by sub-grid. Returns how many runs were tagged."""
        stale = {runs[t.key].run_id: {TAG_SUBGRIDS: ",".join(t.subgrids)} for t in trials
                 if t.key in runs and runs[t.key].subgrids != ",".join(t.subgrids)}
        if stale:
            self.tag_runs(stale)
        return len(stale)

    def tag_runs(self, tags_by_run: dict[str, dict[str, str]]) -> None:
        """Set tags on many runs (one batch call per run; in parallel on a server)."""
        self.store.map(lambda item: self.store.log_batch(item[0], tags=item[1]), list(tags_by_run.items()))

    def set_status(self, run_ids: Iterable[str], status: str, tags: dict[str, str] | None = None) -> None:
        """Move runs to ``status`` (SCHEDULED to queue again, KILLED on cancel), optionally with tags."""
        if status not in STATES:
            raise ValueError(f"unknown run state {status!r}; valid: {', '.join(STATES)}")

        def one(run_id: str) -> None:
            if tags:
                self.store.log_batch(run_id, tags=tags)
            if status in (SCHEDULED, RUNNING):
                self.store.update_run(run_id, status)
            else:
                self.store.set_terminated(run_id, status)

        self.store.map(one, list(run_ids))

    def finish_parent(self) -> None:
        parent = self.parent_run_id()
        if parent is not None:
            self.store.set_terminated(parent, FINISHED)


def counts(runs: Iterable[TrialRun], expected: int) -> dict[str, int]:
    """Trials per state; trials of the sweep with no run yet count as MISSING."""
    out = {s: 0 for s in STATES}
    n = 0
    for r in runs:
        out[r.status] = out.get(r.status, 0) + 1
        n += 1
    out["MISSING"] = max(0, expected - n)
    return out


def wait_for(ledger: Ledger, keys: Iterable[str], states: tuple[str, ...] = ENDED,
             timeout: float = 600.0, poll: float = 2.0) -> dict[str, TrialRun]:
    """Poll until every key's run is in one of ``states``; returns the runs (raises TimeoutError with the rest)."""
    keys = set(keys)
    deadline = time.monotonic() + timeout
    while True:
        runs = ledger.trial_runs()
        left = [k for k in keys if k not in runs or runs[k].status not in states]
        if not left:
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} trials not done after {timeout:.0f}s: "
                               + ", ".join(f"{runs[k].label if k in runs else k}={runs[k].status if k in runs else 'MISSING'}"
                                           for k in sorted(left)[:10]))
        time.sleep(poll)
