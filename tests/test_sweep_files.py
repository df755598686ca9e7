"""The sweep's own files: ``sweep.json`` and ``trials.json`` (real files, real commands, a real ledger).

* An unreadable one (truncated, empty, not JSON, the wrong shape) makes every command that opens the sweep
  (``submit``, ``status``, ``resume``, ``retry``, ``cancel``, ``evaluate``; ``plan`` and ``bench`` open none) exit 2
  with one line naming the file and what to do, never a traceback; ``cancel`` still marks the trial folders it finds.
* Writes are atomic and keep the version before as ``<file>.bak``, which the message offers.
* A lost update: two ``submit``s of different grids into one sweep at once, the first held on its first call to a
  slow MLflow (a proxy in front of the session's real ``mlflow server`` that holds the first connection until the
  test lets it go). The second either waits for nothing and runs, or finds the sweep busy; either way ``trials.json``
  afterwards lists every trial folder and every run the two created (before, the first wrote back the copy it had
  read before the second ran: 4 folders, 4 runs, 2 trials listed).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import SweepDir
from tests.plugins.mlflow_server import MlflowServer

pytestmark = pytest.mark.timeout(300)

EXIT_USAGE = 2
EXIT_FAULT = 137  # ORCHESTRATE_FAULT=after-runs: the submitter dies right after creating the runs
GRID = """
name: files
seeds: [%s]
base:
  preset: tiny
  data: {train: "podcast:/nonexistent/train", context_s: 5.12}
  train: {max_steps: 4, device: cpu, precision: fp32}
subgrids:
  only: {}
"""
DECODE = "name: beam4\nlm: null\nbeta: 0.5\nbeam_width: 4\n"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=240)


def write_grid(tmp_path: Path, seeds: str, name: str = "grid.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(GRID % seeds))
    return p


def submit_args(grid: Path, root: Path, name: str, uri: str | None = None) -> list[str]:
    return ["submit", str(grid), "--backend", "local", "--sweep-root", str(root), "--sweep", name,
            "--no-check-data", *(["--tracking-uri", uri] if uri else [])]


@pytest.fixture(scope="module")
def made_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """(folder holding the grid, the sweep root, the sweep's folder, its name): two trials whose runs exist in the
    default sqlite ledger, submitted by a command that died right after creating them."""
    tmp = tmp_path_factory.mktemp("files")
    root, name = tmp / "runs", "files"
    p = cli(*submit_args(write_grid(tmp, "1, 2"), root, name), env={"ORCHESTRATE_FAULT": "after-runs"}, cwd=tmp)
    assert p.returncode == EXIT_FAULT, p.stderr
    return tmp, root, SweepDir(root, name).path, name


def commands(tmp: Path, root: Path, name: str) -> list[list[str]]:
    """Every command that opens a sweep (cli.COMMANDS less plan and bench, which open none)."""
    spec = tmp / "decode.yaml"
    spec.write_text(DECODE)
    grid = tmp / "grid.yaml"
    return [[*submit_args(grid, root, name)], ["status", name], ["resume", name], ["retry", name, "--failed"],
            ["cancel", name], ["evaluate", name, "--spec", str(spec)]]


BROKEN = {"truncated": lambda text: text[: len(text) // 2], "empty": lambda text: "",
          "not JSON": lambda text: "\0\0\0\0", "wrong shape": lambda text: "[1, 2]"}


@pytest.mark.parametrize("how", list(BROKEN))
@pytest.mark.parametrize("file", ["sweep.json", "trials.json"])
def test_every_command_on_an_unreadable_sweep_file_exits_2_naming_it(
        made_sweep: tuple[Path, Path, Path, str], file: str, how: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    tmp, root, folder, name = made_sweep
    monkeypatch.chdir(tmp)
    path = folder / file
    good = path.read_text()
    path.write_text(BROKEN[how](good))
    try:
        for argv in commands(tmp, root, name):
            argv = [*argv, "--sweep-root", str(root)] if argv[0] != "submit" else argv
            code = main(argv)
            err = capsys.readouterr().err
            assert code == EXIT_USAGE, (argv, code, err)
            assert "Traceback" not in err, err
            naming = [ln for ln in err.splitlines() if str(path) in ln]
            assert len(naming) == 1, (argv, err)
            assert f"orchestrate {argv[0]}: " in naming[0] and "restore" in naming[0], naming[0]
        assert all((folder / "trials" / k / "CANCELLED").exists() for k in os.listdir(folder / "trials"))
    finally:
        path.write_text(good)
        for k in os.listdir(folder / "trials"):  # the next case starts from uncancelled trials
            (folder / "trials" / k / "CANCELLED").unlink(missing_ok=True)


def test_a_write_keeps_the_version_before_and_the_message_offers_it(
        made_sweep: tuple[Path, Path, Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    tmp, root, folder, name = made_sweep
    sweep = SweepDir(root, name)
    manifest = sweep.read_manifest()
    sweep.write_manifest(manifest)  # the version before is kept
    good = (folder / "sweep.json").read_text()
    assert json.loads((folder / "sweep.json.bak").read_text()) == json.loads(good)
    (folder / "sweep.json").write_text(good[:10])
    try:
        assert main(["status", name, "--sweep-root", str(root)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"cp {folder / 'sweep.json.bak'} {folder / 'sweep.json'}" in err, err
    finally:
        (folder / "sweep.json").write_text(good)


class HoldFirst:
    """A TCP proxy in front of ``upstream`` that holds the first connection after :meth:`arm` (nothing is forwarded
    either way) until :meth:`release`; every other connection passes at once. ``held`` is set when it arrived."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.held, self._go = threading.Event(), threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._armed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self._armed = True

    def release(self) -> None:
        self._go.set()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            first, self._armed = self._armed, False
            threading.Thread(target=self._serve, args=(conn, first), daemon=True).start()

    def _serve(self, conn: socket.socket, first: bool) -> None:
        if first:
            self.held.set()
            self._go.wait(200)
        up = socket.create_connection(("127.0.0.1", self.upstream))

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
        pipe(conn, up)

    def close(self) -> None:
        self._go.set()
        self.sock.close()


def test_two_submits_close_together_lose_no_trial(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    """The sweep exists (one trial); then two submits of two trials each. The slow MLflow is a proxy holding the first
    one's first connection (:class:`HoldFirst`); every submit dies right after creating its runs
    (``ORCHESTRATE_FAULT=after-runs``), so no trainer runs."""
    name = f"race-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "runs"
    proxy = HoldFirst(mlflow_server.port)
    uri = f"http://127.0.0.1:{proxy.port}"
    env = {**os.environ, "ORCHESTRATE_FAULT": "after-runs"}
    made = cli(*submit_args(write_grid(tmp_path, "1", "made.yaml"), root, name, uri), env=env, cwd=tmp_path)
    assert made.returncode == EXIT_FAULT, made.stderr
    proxy.arm()
    first = subprocess.Popen([sys.executable, "-m", "orchestrate",
                              *submit_args(write_grid(tmp_path, "2, 3", "a.yaml"), root, name, uri)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proxy.held.wait(120), "the first submit never called MLflow"
        second = cli(*submit_args(write_grid(tmp_path, "4, 5", "b.yaml"), root, name, uri),
                     env={"ORCHESTRATE_FAULT": "after-runs"}, cwd=tmp_path)
        assert second.returncode == EXIT_FAULT or (second.returncode == EXIT_USAGE and "is busy" in second.stderr), \
            second.stderr
        proxy.release()
        _, err = first.communicate(timeout=240)
        assert first.returncode in (EXIT_FAULT, EXIT_USAGE), err
    finally:
        proxy.close()
        if first.poll() is None:
            first.kill()
    sweep = SweepDir(root, name)
    listed = {t.key for t in sweep.read_trials()}
    folders = {p.name for p in (sweep.path / "trials").iterdir()}
    runs = set(Ledger(mlflow_server.uri, name).trial_runs())
    assert folders <= listed and runs <= listed, (sorted(listed), sorted(folders), sorted(runs))
    assert len(listed) == 1 + 2 * sum(p.returncode == EXIT_FAULT for p in (first, second)), (listed, second.stderr)
