"""One cheap lookup of a sweep's experiment (sqlite3 or one HTTP request, no mlflow import): whether MLflow answers
and whether this folder owns it (:func:`ledger_probe`, :func:`check_owner`), for ``status``'s ledger line
(:mod:`orchestrate.status.status.ledger_line`), ``submit --dry-run``, ``show`` and the dashboard.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from asr_core.contract.tracking import sqlite_file
from asr_core.contract.trial import TAG_SWEEP_ID, TAG_SWEEP_ROOT
from orchestrate.ledger.mlflow_rest import LedgerError, auth_header
from orchestrate.sweep.folder import Manifest, SweepDir

__all__ = ["LedgerProbe", "check_owner", "ledger_probe"]

PROBE_TIMEOUT_S = 3.0  # how long the lookup of the sweep's experiment waits for an mlflow server


# ---- the ledger, lightly -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerProbe:
    """What one cheap lookup of the sweep's experiment said. ``answered``: MLflow answered (None: a store this
    lookup cannot read, e.g. a database server; then reconciliation simply tries)."""

    answered: bool | None
    error: str = ""
    exists: bool = False
    deleted: bool = False
    owner: str | None = None  # the experiment's sweep.id tag (None: untagged, made before sweeps had ids)
    owner_root: str = ""
    experiment_id: str = ""  # the experiment's id where it exists (its routes in the UI: #/experiments/ID/...)


def _credentials() -> dict[str, str]:
    """The ``Authorization`` header an MLflow client would send (:func:`orchestrate.ledger.mlflow_rest.auth_header`);
    none when the credentials file is unreadable (the probe then reports what the server answers)."""
    try:
        header = auth_header()
    except LedgerError:
        return {}
    return {"Authorization": header} if header else {}


def _probe_http(uri: str, name: str, timeout: float) -> LedgerProbe:
    url = (uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?"
           + urllib.parse.urlencode({"experiment_name": name}))
    req = urllib.request.Request(url, headers=_credentials())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the sweep's own server
            exp = json.loads(r.read().decode()).get("experiment") or {}
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        if e.code == 404 and "RESOURCE_DOES_NOT_EXIST" in body:
            return LedgerProbe(answered=True)
        return LedgerProbe(answered=False, error=f"{url.split('?')[0]} answered HTTP {e.code}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return LedgerProbe(answered=False, error=f"{uri}: {getattr(e, 'reason', e)}")
    tags = {t.get("key"): t.get("value") for t in exp.get("tags") or []}
    return LedgerProbe(answered=True, exists=True, deleted=exp.get("lifecycle_stage") == "deleted",
                       owner=tags.get(TAG_SWEEP_ID), owner_root=tags.get(TAG_SWEEP_ROOT) or "",
                       experiment_id=str(exp.get("experiment_id") or ""))


def _probe_sqlite(uri: str, name: str, timeout: float) -> LedgerProbe:
    path = sqlite_file(uri) or Path(uri)  # a sqlite:/// URI (the caller checked)
    if not path.exists():
        return LedgerProbe(answered=False, error=f"{path} does not exist")
    try:
        con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout)
        try:
            row = con.execute("SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ? "
                              "ORDER BY experiment_id LIMIT 1", (name,)).fetchone()
            if row is None:
                return LedgerProbe(answered=True)
            tags = dict(con.execute("SELECT key, value FROM experiment_tags WHERE experiment_id = ?", (row[0],)))
        finally:
            con.close()
    except sqlite3.Error as e:
        return LedgerProbe(answered=False, error=f"{path}: {e}")
    return LedgerProbe(answered=True, exists=True, deleted=row[1] == "deleted", owner=tags.get(TAG_SWEEP_ID),
                       owner_root=tags.get(TAG_SWEEP_ROOT) or "", experiment_id=str(row[0]))


def ledger_probe(uri: str, name: str, timeout: float = PROBE_TIMEOUT_S) -> LedgerProbe:
    """Look the sweep's experiment up without importing mlflow: one HTTP request to an mlflow server, or one
    read-only sqlite3 query of a sqlite ledger."""
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        return _probe_http(uri, name, timeout)
    if uri.startswith("sqlite:///"):
        return _probe_sqlite(uri, name, timeout)
    return LedgerProbe(answered=None)


def check_owner(probe: LedgerProbe, manifest: Manifest, sweep: SweepDir) -> None:
    """Raise :class:`orchestrate.ledger.ledger.SweepOwnershipError` when the sweep's experiment belongs to another sweep
    folder (the rule of :meth:`orchestrate.ledger.ledger.Ledger.check_owner` for a folder that existed: untagged
    experiments may be adopted)."""
    if not probe.exists or probe.owner is None or probe.owner == manifest.sweep_id:
        return
    from orchestrate.ledger.ledger import SweepOwnershipError

    owner_root = probe.owner_root or "a folder it did not record"
    ours = f"sweep id {manifest.sweep_id}" if manifest.sweep_id else "no sweep id"
    raise SweepOwnershipError(
        f"experiment {manifest.name!r} in {manifest.tracking_uri} belongs to another sweep: the folder {owner_root} "
        f"(sweep id {probe.owner}), not this one ({sweep.path}, {ours}); sweeps sharing one experiment would resume "
        f"and cancel each other's runs. Submit this one under another name with `--sweep NAME`, or run "
        f"status/resume/cancel from {owner_root}")
