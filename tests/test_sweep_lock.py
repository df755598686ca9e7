"""Lock first, one ledger: every command that changes a sweep takes its lock before it writes anything.

* Two ``submit``s of one sweep at once (real SLURM test cluster, real ``mlflow server``): one proceeds; the other
  exits 2 with the busy message, having changed no file of the sweep folder (bytes and mtimes compared). The first
  is frozen (SIGSTOP) while it holds the lock, so the second surely runs while the first is inside.
* A filesystem without ``flock`` (simulated: ``flock`` answers ENOLCK, as on Lustre without ``-o flock``) gives a
  clear error saying what to do, and leaves no folder behind.
* A ``--tracking-uri`` on resume/retry/cancel/status that differs from the sweep's own is refused (exit 2, naming
  both): the jobs read the URI from ``sweep.json``, so a second ledger would split the sweep's record.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from orchestrate.cli.commands import main
from orchestrate.sweep.folder import SweepDir
from tests.folder_snapshot import snapshot
from tests.plugins.mlflow_server import MlflowServer
from tests.test_backend import ONE_TRIAL, cluster_env, smoke_corpus, write_profile

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

pytestmark = pytest.mark.timeout(600)

EXIT_USAGE = 2
EXIT_FAULT = 137  # ORCHESTRATE_FAULT=after-runs: the submitter dies right after creating the runs
CLI_TIMEOUT_S = 300


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=CLI_TIMEOUT_S)


def one_trial_grid(tmp_path: Path, corpus: Path, steps: int = 4) -> Path:
    grid = tmp_path / "one.yaml"
    grid.write_text(textwrap.dedent(ONE_TRIAL % (corpus, steps)))
    return grid


def local_sweep(tmp_path: Path, corpus: Path, name: str) -> tuple[Path, SweepDir]:
    """A local sweep whose runs exist (default sqlite ledger) and whose submitter died before any trainer started."""
    root = tmp_path / "runs"
    p = cli("submit", str(one_trial_grid(tmp_path, corpus)), "--backend", "local", "--sweep-root", str(root),
            "--sweep", name, env={"ORCHESTRATE_FAULT": "after-runs"})
    assert p.returncode == EXIT_FAULT, p.stderr
    return root, SweepDir(root, name)


@pytest.mark.slurm
def test_two_submits_at_once_one_proceeds_the_other_exits_2_having_changed_no_file(
        tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest) -> None:
    uri = cluster_env(request)
    name = f"busy-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "runs"
    args = [sys.executable, "-m", "orchestrate", "submit", str(one_trial_grid(tmp_path, smoke_corpus)), "--backend",
            "slurm", "--profile", str(write_profile(tmp_path, "a100:1")), "--sweep-root", str(root), "--sweep", name,
            "--tracking-uri", uri]
    sweep = SweepDir(root, name)
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = sweep.path / "lock"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            if lock.exists() and re.search(rf"\bpid {first.pid}\b", lock.read_text(errors="replace")):
                break
            time.sleep(0.002)
        assert first.poll() is None, f"the first submit ended before it was seen holding the lock: {first.stderr}"
        os.kill(first.pid, signal.SIGSTOP)  # frozen inside the lock: whatever the second does, it does meanwhile
        try:
            before = snapshot(sweep.path)
            second = subprocess.run(args, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
            after = snapshot(sweep.path)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == EXIT_USAGE, second.stderr
        assert "is busy" in second.stderr and re.search(rf"submit by pid {first.pid}\b", second.stderr), second.stderr
        assert after == before, sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        out, err = first.communicate(timeout=CLI_TIMEOUT_S)
        assert first.returncode == 0, err
        assert "1 new" in out and len(sweep.submissions()) == 1
    finally:
        if first.poll() is None:
            first.kill()
        cli("cancel", name, "--sweep-root", str(root))  # frees the cluster: the trial itself is not under test


@pytest.mark.slow
def test_a_filesystem_without_flock_is_refused_saying_what_to_do_simulated(
        tmp_path: Path, smoke_corpus: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``flock`` answering ENOLCK (NFS without lockd) or ENOSYS (Lustre without ``-o flock``) is simulated: such a
    mount cannot be made here."""
    root, sweep = local_sweep(tmp_path, smoke_corpus, "nolocks")
    before = snapshot(sweep.path)
    grid = one_trial_grid(tmp_path, smoke_corpus)
    for err in (errno.ENOLCK, errno.ENOSYS):
        def no_flock(fd: int, op: int, err: int = err) -> None:
            raise OSError(err, os.strerror(err))

        monkeypatch.setattr(fcntl, "flock", no_flock)
        for argv in (["resume", "nolocks"], ["cancel", "nolocks"], ["retry", "nolocks", "--failed"],
                     ["submit", str(grid), "--backend", "local", "--sweep", "nolocks"],
                     ["submit", str(grid), "--backend", "local", "--sweep", "fresh"]):
            assert main([*argv, "--sweep-root", str(root)]) == EXIT_USAGE, argv
            msg = capsys.readouterr().err
            assert "no file locks" in msg and "-o flock" in msg and "--sweep-root" in msg, msg
            assert str(sweep.path.parent) in msg, msg
        assert snapshot(sweep.path) == before
        assert not SweepDir(root, "fresh").path.exists()  # a new sweep leaves no folder or lock file behind


def test_a_different_tracking_uri_is_refused_naming_both(tmp_path: Path, smoke_corpus: Path,
                                                         mlflow_server: MlflowServer,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep is ledgered in its own sqlite file; a reachable server given on the command line would take a
    second ledger (its runs created there, while the jobs write to sweep.json's)."""
    name = f"oneledger-{uuid.uuid4().hex[:8]}"
    root, sweep = local_sweep(tmp_path, smoke_corpus, name)
    own = sweep.read_manifest().tracking_uri
    before = snapshot(sweep.path)
    for argv in (["resume", name], ["retry", name, "--failed"], ["cancel", name], ["status", name]):
        assert main([*argv, "--sweep-root", str(root), "--tracking-uri", mlflow_server.uri]) == EXIT_USAGE, argv
        msg = capsys.readouterr().err
        assert own in msg and mlflow_server.uri in msg and "sweep.json" in msg, msg
    assert snapshot(sweep.path) == before
    assert mlflow_server.client().get_experiment_by_name(name) is None  # no second ledger was started
    # the sweep's own URI, given explicitly, is the same ledger
    assert main(["status", name, "--sweep-root", str(root), "--tracking-uri", own, "--no-reconcile"]) == 0
