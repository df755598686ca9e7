"""A dead tracker in analysis: every subcommand that reads the tracker (``report``, ``compare``) gives up within
30 s with exit 3 and one line naming the URI, for a closed port and for a port that accepts and never answers (a
real listening socket)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

GIVE_UP_S = 30.0  # the promise
TIMEOUT_S = 60  # the old code retried for minutes: fail here rather than block the suite


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (the connections are held open until the test ends)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _analysis(command: str, uri: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    args = (["report", "sweep", "--out", str(tmp_path / "report")] if command == "report"
            else ["compare", "sweep", "10.24", "20.48"])
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "analysis", *args, "--tracking-uri", uri], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    return r, time.monotonic() - t0


def _assert_gave_up(r: subprocess.CompletedProcess[str], took: float, uri: str) -> None:
    err = r.stderr.strip().splitlines()
    assert r.returncode == 3, f"exit {r.returncode}: {r.stderr[-1500:]}"
    assert len(err) == 1, f"expected one line, got {len(err)}: {r.stderr[-1500:]}"
    assert uri in err[0] and "unreachable" in err[0], err[0]
    assert took < GIVE_UP_S, took


@pytest.mark.parametrize("command", ["report", "compare"])
def test_analysis_gives_up_on_a_closed_port(command: str, tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    _assert_gave_up(*_analysis(command, uri, tmp_path), uri)


@pytest.mark.parametrize("command", ["report", "compare"])
def test_analysis_gives_up_on_a_port_that_never_answers(command: str, tmp_path: Path, silent_port: int) -> None:
    uri = f"http://127.0.0.1:{silent_port}"
    _assert_gave_up(*_analysis(command, uri, tmp_path), uri)
