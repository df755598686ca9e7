"""The ledger line of ``status``: one cheap lookup of the sweep's experiment
(:func:`orchestrate.ledger.probe.ledger_probe`) tells whether MLflow answers and whether this folder owns it; when
the trial folders say the ledger is behind and MLflow answers, it is reconciled
(:func:`orchestrate.ledger.reconcile.reconcile_ledger`, under the sweep's lock, within a deadline) and the line says
so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asr_core.contract.tracking import bound_mlflow_http, mlflow_http
from orchestrate.ledger.probe import check_owner, ledger_probe
from orchestrate.ledger.reconcile import behind, read_sync, reconcile_ledger
from orchestrate.sweep.folder import Manifest, SweepDir, SweepError
from orchestrate.sweep.trial_state import FolderState
from orchestrate.status.trial_status import SchedulerView

__all__ = ["ledger_line"]

# MLflow's own HTTP retries while status reconciles (unless set by the user): fail within seconds, not minutes
_MLFLOW_BOUNDS = mlflow_http(max_retries=2, backoff_factor=1, timeout_s=10)


def ledger_line(sweep: SweepDir, manifest: Manifest, trials: Sequence[Any], states: Mapping[str, FolderState],
                view: SchedulerView, *, reconcile: bool, deadline_s: float, max_failures: int) -> str:
    """The ledger line: in step, behind (and why nothing was done), or what reconciliation did."""
    held = set(view.held) if view.known else {t.key for t in trials}  # unknown: treat every trial as possibly held
    evaluations = {t.key for t in trials if getattr(t, "is_evaluation", False)}
    lag = behind(states, read_sync(sweep), held, max_failures, evaluations)
    pending = sum(fs.pending for fs in states.values())
    outbox = sum(1 for fs in states.values() if fs.pending)
    head = (f"{outbox} trials hold {pending} outbox records not yet in MLflow" if outbox
            else "no outbox records waiting")
    probe = ledger_probe(manifest.tracking_uri, manifest.name)
    check_owner(probe, manifest, sweep)
    if not lag:
        down = f" (MLflow unreachable: {probe.error})" if probe.answered is False else ""
        return f"ledger: {head}; " + ("their jobs ship them" if outbox else "in step with the trial folders") + down
    if probe.answered is False:
        return (f"ledger: {head}; behind by {len(lag)} trials (MLflow unreachable: {probe.error}); the counts "
                "above are the trial folders'")
    if probe.deleted:
        return (f"ledger: {head}; behind by {len(lag)} trials, and the sweep's experiment is deleted in "
                f"{manifest.tracking_uri}: restore it, then run status or resume")
    if not reconcile:
        return f"ledger: {head}; behind by {len(lag)} trials (not reconciled: --no-reconcile)"
    bound_mlflow_http(_MLFLOW_BOUNDS)  # a server that stops answering now must not hold status for minutes
    from orchestrate.ledger.ledger import Ledger, SweepOwnershipError

    try:
        with sweep.lock("status (reconciling the ledger)"):
            ledger = Ledger(manifest.tracking_uri, manifest.name)
            try:
                ledger.check_owner(manifest.sweep_id, str(sweep.path), adopt=True)
            except SweepOwnershipError:
                raise
            except Exception as e:  # noqa: BLE001 - MLflow stopped answering since the probe: report, go on
                return (f"ledger: {head}; behind by {len(lag)} trials (MLflow unreachable: {type(e).__name__}: "
                        f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''})")
            result = reconcile_ledger(ledger, sweep, trials, states, deadline_s=deadline_s, held=held,
                                      max_failures=max_failures)
    except SweepError as e:
        return f"ledger: {head}; behind by {len(lag)} trials (not reconciled: {e})"
    return f"ledger: {head}; reconciled (bounded at {deadline_s:g} s): {result.describe()}"
