"""Where the ledger (MLflow) is: one rule for every command of the three groups.

:func:`tracking_uri` is the rule: ``--tracking-uri`` if given; else, for a command on a sweep, the URI its sweep
folder recorded (``SWEEP_ROOT/SWEEP/sweep.json``, which the sweep's jobs read); else ``MLFLOW_TRACKING_URI``; else
the local default ``sqlite:///SWEEP_ROOT/mlflow.db`` (``SWEEP_ROOT`` is ``./runs`` unless ``--sweep-root`` says
otherwise). The trainer's standalone commands (``train``, ``evaluate``, ``score``, ``lm``, ...) have no local
default: without a URI they record nothing in MLflow.

A command that only looks something up (``status``, ``report``, ``compare``) calls :func:`missing_ledger` first: a
``sqlite:`` file that does not exist is said, never created as a side effect of the lookup.

Torch-free and MLflow-free: ``orchestrate``, ``analysis`` and ``asr_core`` all import it.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

ENV = "MLFLOW_TRACKING_URI"
DEFAULT_SWEEP_ROOT = "runs"
DEFAULT_EXPERIMENT = "asr_core"  # the MLflow experiment of a model trained alone (python -m asr_core train, no --sweep)
SWEEP_ROOT_ENV = "ASR_STUDY_SWEEP_ROOT"  # the folder sweeps live in, for every command run from anywhere
LEDGER_FILE = "mlflow.db"
SWEEP_MANIFEST = "sweep.json"  # the sweep folder's manifest (written by orchestrate.sweep.folder); its "tracking_uri"
RULE = (f"--tracking-uri, else the sweep folder's recorded URI, else ${ENV}, else "
        f"sqlite:///SWEEP_ROOT/{LEDGER_FILE} (SWEEP_ROOT: --sweep-root, else ${SWEEP_ROOT_ENV}, else "
        f"./{DEFAULT_SWEEP_ROOT})")


def default_sweep_root() -> str:
    """The folder sweeps live in when no ``--sweep-root`` is given: ``$ASR_STUDY_SWEEP_ROOT``, else ``./runs``."""
    return os.environ.get(SWEEP_ROOT_ENV, "").strip() or DEFAULT_SWEEP_ROOT


def default_tracking_uri(sweep_root: str | Path = DEFAULT_SWEEP_ROOT) -> str:
    """The local default: a sqlite file in the sweep root, ``sqlite:///<root>/mlflow.db`` (an absolute path)."""
    return f"sqlite:///{Path(sweep_root).resolve() / LEDGER_FILE}"


def recorded_tracking_uri(sweep_root: str | Path, sweep: str) -> str | None:
    """The URI the sweep folder ``<sweep_root>/<sweep>`` recorded, or None where there is no such folder or its
    manifest names none (an unreadable manifest is the sweep commands' to report, not this lookup's)."""
    path = Path(sweep_root) / sweep / SWEEP_MANIFEST
    try:
        uri = json.loads(path.read_text(encoding="utf-8")).get("tracking_uri")
    except (OSError, ValueError, AttributeError):
        return None
    return uri if isinstance(uri, str) and uri else None


def tracking_uri(given: str | None, *, sweep_root: str | Path | None = None, sweep: str | None = None,
                 local_default: bool = True) -> str | None:
    """The ledger's address by the one rule (see the module docstring). ``sweep``: the sweep the command acts on
    (its folder's recorded URI comes before the environment); ``local_default=False``: None instead of the local
    sqlite file (the trainer's standalone commands)."""
    if given:
        return given
    root = Path(sweep_root if sweep_root is not None else default_sweep_root())
    if sweep:
        recorded = recorded_tracking_uri(root, sweep)
        if recorded:
            return recorded
    env = os.environ.get(ENV, "").strip()
    if env:
        return env
    return default_tracking_uri(root) if local_default else None


DASHBOARD_HOST = "127.0.0.1"  # `asr-study dashboard` serves a local sweep's ledger here only
DASHBOARD_PORT = 5000  # its default port


def dashboard_command(sweep: str, sweep_root: str | Path | None = None) -> str:
    """The command that serves a sweep's ledger in the MLflow UI and prints the address of its saved view
    (``asr-study dashboard``); ``sweep_root`` spelled out (absolute) when given."""
    root = f" --sweep-root {shlex.quote(str(Path(sweep_root).resolve()))}" if sweep_root is not None else ""
    return f"asr-study dashboard {sweep}{root}"


def mlflow_http(max_retries: int, backoff_factor: float, timeout_s: float) -> dict[str, str]:
    """MLflow's own HTTP retry settings (environment variables) for these bounds; its defaults retry 7 times with
    exponential back-off, minutes against a server that stopped answering."""
    return {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(max_retries),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": f"{backoff_factor:g}",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": f"{timeout_s:g}"}


def bound_mlflow_http(settings: dict[str, str]) -> None:
    """Set ``settings`` (:func:`mlflow_http`) in this process, each unless the user set it. Process-wide: only
    commands call it, each with its own bounds."""
    for var, value in settings.items():
        os.environ.setdefault(var, value)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, or None for any other kind of store."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")  # what MLflow 3 can track in


def bad_uri(uri: str) -> str | None:
    """Why ``uri`` cannot be a ledger (a plain folder, ``file:``, an unknown scheme), as one line naming it and what
    is valid; None when MLflow can track in it."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme in SCHEMES:
        return None
    return (f"tracking URI {uri!r} is not one MLflow tracks in; valid: sqlite:///PATH/mlflow.db, http(s)://HOST:PORT "
            f"(an mlflow server) or a database URI ({', '.join(SCHEMES[3:6])})")


def missing_ledger(uri: str) -> str | None:
    """Why a lookup at ``uri`` cannot find anything without creating a file (a ``sqlite:`` file that does not exist:
    MLflow would create it), as one line naming the file and the rule; None when there is something to read."""
    path = sqlite_file(uri)
    if path is None or path.is_file():
        return None
    return (f"no ledger at {uri}: {path} does not exist (nothing was created). The ledger is found by "
            f"{RULE}; name the one the sweep was submitted to")
