"""``asr-study dashboard SWEEP [--sweep-root R] [--port P]``: a sweep's runs in the MLflow UI, in one command.

The sweep is found as every sweep command finds it (``SWEEP_ROOT/SWEEP/sweep.json``; the root is ``--sweep-root``,
else ``$ASR_STUDY_SWEEP_ROOT``, else ``./runs``), and its ledger is the tracking URI its manifest recorded:

* a local store (a local sweep's ``sqlite:///SWEEP_ROOT/mlflow.db``, or a database URI): ``mlflow server`` is
  started on it, bound to 127.0.0.1 (its own process group; its log in the temporary folder), and once it answers
  the full address of the sweep's saved view of the runs table (``http://127.0.0.1:PORT/#/experiments/ID/runs?
  viewStateShareKey=sweep-wer``, the view :mod:`asr_core.contract.ledger` describes) is printed. The command stays
  in the foreground until Ctrl-C, which stops the server and exits 130 with one line.
* an MLflow server (``http(s)://``): nothing is started; the address of the saved view on that server is printed,
  exit 0.

Bad input exits 2 with one line: an unknown sweep (naming it, the root searched, the sweeps there and how to set the
root), a port in use or out of range, a ledger file that does not exist, a sweep with no experiment in its ledger.
A server that does not answer (the remote one, or the local one not starting) exits 1 naming it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import NoReturn

from asr_core.contract.ledger import view_link
from asr_core.contract.tracking import (DASHBOARD_HOST, DASHBOARD_PORT, SWEEP_MANIFEST, SWEEP_ROOT_ENV,
                                        default_sweep_root, missing_ledger, sqlite_file)
from asr_core.contract.command import ShowVersion, guarded
from asr_core.runtime.signals import stop_group

PROG = "asr-study dashboard"
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 1
START_TIMEOUT_S = 180.0  # a cold start of mlflow on 2 busy cores (imports, migrations check) has taken 40 s
STOP_TIMEOUT_S = 10.0  # how long the server gets to stop on TERM before it is killed


class DashboardError(Exception):
    """Bad input or a ledger that cannot be shown; ``code`` is the exit status, the message one line."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def port_number(text: str) -> int:
    """``--port``: an integer 1-65535 (argparse says the value and exits 2 otherwise)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; valid: 1-65535")
    return port


def parser() -> argparse.ArgumentParser:
    """The command line: SWEEP, ``--sweep-root``, ``--port`` (and ``--version``)."""
    p = argparse.ArgumentParser(prog=PROG, description="Open a sweep's runs in the MLflow UI: a local sweep's "
                                "ledger is served by `mlflow server` on 127.0.0.1 until Ctrl-C; for a sweep "
                                "tracked by an MLflow server, its address is printed. Either way the full URL of "
                                "the sweep's saved view (every run with its WER columns) is printed.")
    p.add_argument("--version", action=ShowVersion)
    p.add_argument("sweep", metavar="SWEEP", help="the sweep's name (its folder under the sweep root)")
    p.add_argument("--sweep-root", default=default_sweep_root(), help="the folder sweeps live in (default: "
                   f"${SWEEP_ROOT_ENV}, else ./runs)")
    p.add_argument("--port", type=port_number, default=DASHBOARD_PORT, help="the port of 127.0.0.1 to serve on "
                   f"(default {DASHBOARD_PORT}); not used for a sweep tracked by an MLflow server")
    return p


def sweep_ledger(root: Path, name: str) -> tuple[str, str]:
    """(tracking URI, experiment name) the sweep ``root/name`` recorded, or :class:`DashboardError` naming the
    sweep and the root."""
    from orchestrate.sweep.folder import SweepDir, SweepError

    try:
        sweep = SweepDir(root, name)
        if not sweep.exists():
            there = sorted(d.name for d in root.glob("*") if (d / SWEEP_MANIFEST).is_file())[:10]
            listed = (f"the sweeps there: {', '.join(there)}" if there else
                      "it holds no sweep" if root.is_dir() else "that folder does not exist")
            raise DashboardError(f"no sweep {name!r} under {root.resolve()} (no {sweep.manifest_path}); {listed}. "
                                 f"Pass --sweep-root FOLDER or set ${SWEEP_ROOT_ENV} to the folder it was "
                                 f"submitted to")
        manifest = sweep.read_manifest()
    except SweepError as e:
        raise DashboardError(str(e)) from None
    return manifest.tracking_uri, manifest.name


def experiment_id(uri: str, experiment: str) -> str:
    """The id of ``experiment`` in the ledger at ``uri``, or :class:`DashboardError` saying why there is none."""
    from orchestrate.ledger.probe import ledger_probe

    missing = missing_ledger(uri)
    if missing:
        raise DashboardError(missing)
    probe = ledger_probe(uri, experiment)
    if probe.answered is None:  # a database server: asked through MLflow itself
        from mlflow.tracking import MlflowClient

        exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
        if exp is None:
            _no_experiment(uri, experiment)
        return str(exp.experiment_id)
    if probe.answered is False:
        raise DashboardError(f"the ledger {uri} does not answer ({probe.error}); start it, or check the address",
                             EXIT_UNAVAILABLE)
    if not probe.exists or not probe.experiment_id:
        _no_experiment(uri, experiment)
    return probe.experiment_id


def _no_experiment(uri: str, experiment: str) -> NoReturn:
    raise DashboardError(f"the ledger {uri} has no experiment {experiment!r} (deleted, or the sweep was never "
                         f"submitted to it); submit the sweep again")


def check_port(port: int) -> None:
    """:class:`DashboardError` naming ``port`` when something listens on it (or it cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((DASHBOARD_HOST, port))
        except OSError as e:
            raise DashboardError(f"port {port} of {DASHBOARD_HOST} is in use ({e.strerror or e}); valid: a free "
                                 f"port, e.g. --port {free_port()}") from None


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((DASHBOARD_HOST, 0))
        return int(s.getsockname()[1])


def mlflow_command(uri: str, port: int, artifacts: Path) -> list[str]:
    """``mlflow server`` on ``uri`` bound to 127.0.0.1:``port``, one worker (this environment's ``mlflow``)."""
    mlflow = Path(sys.executable).parent / "mlflow"
    exe = [str(mlflow)] if mlflow.is_file() else [sys.executable, "-m", "mlflow"]
    return [*exe, "server", "--backend-store-uri", uri, "--host", DASHBOARD_HOST, "--port", str(port),
            "--workers", "1", "--artifacts-destination", str(artifacts)]


def wait_answering(base: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``base/health`` answers 200; :class:`DashboardError` (exit 1) when the server exits or does not answer
    within :data:`START_TIMEOUT_S`."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise DashboardError(f"mlflow server exited {process.returncode} before answering (log {log}): {tail}",
                                 EXIT_UNAVAILABLE)
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:  # noqa: S310 - our own server
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise DashboardError(f"mlflow server on {base} did not answer within {START_TIMEOUT_S:.0f} s (log {log})",
                         EXIT_UNAVAILABLE)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # TERM ends the dashboard as Ctrl-C does: the server stopped first


def serve(uri: str, port: int, link: str, name: str) -> int:
    """Start ``mlflow server`` on ``uri``, print the address of ``link`` once it answers, and wait for Ctrl-C (the
    server stopped in every case). Returns only when the server ends by itself (exit 1)."""
    db = sqlite_file(uri)
    artifacts = (db.parent if db is not None else Path(tempfile.gettempdir())) / "artifacts"
    log = Path(tempfile.gettempdir()) / f"asr-study-dashboard-{name}-{port}.log"
    base = f"http://{DASHBOARD_HOST}:{port}"
    print(f"starting MLflow on {base} for {uri} (log {log}) ...", file=sys.stderr, flush=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
                                                                               "false")}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where it was inherited ignored (`cmd &`)
    signal.signal(signal.SIGTERM, _interrupt)
    with open(log, "wb") as fh:
        process = subprocess.Popen(mlflow_command(uri, port, artifacts), stdout=fh, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        wait_answering(base, process, log)
        print(f"sweep {name}: every run with its WER columns (the saved view):\n{base}/{link}", flush=True)
        print(f"serving {uri} on {base} until Ctrl-C", file=sys.stderr, flush=True)
        code = process.wait()
        print(f"{PROG}: mlflow server exited {code} (log {log})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        stop_group(process, STOP_TIMEOUT_S)


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        uri, experiment = sweep_ledger(Path(args.sweep_root), args.sweep)
        remote = uri.startswith(("http://", "https://"))
        if not remote:
            check_port(args.port)  # before anything is looked up: a port in use is said at once
        link = view_link(experiment_id(uri, experiment))
        if remote:
            print(f"sweep {args.sweep} is tracked by the MLflow server {uri}; every run with its WER columns "
                  f"(the saved view):\n{uri.rstrip('/')}/{link}")
            return 0
        return serve(uri, args.port, link, args.sweep)
    except DashboardError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.code


def main(argv: list[str] | None = None) -> int:
    """The command (a bug: one line naming its log; Ctrl-C: exit 130, the server stopped)."""
    return guarded(PROG, _main, argv)
