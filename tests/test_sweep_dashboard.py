"""``asr-study dashboard SWEEP``: bad input exits 2 with one line naming what is wrong and what is valid, and a sweep
tracked by an MLflow server gets that server's address of its saved view without anything being started.

Fast and local: sweep folders are written by hand (a manifest), the "MLflow server" is a stub answering the one
request the lookup makes. Serving a real local sweep (the URL answers 200, Ctrl-C exits 130) is tested on the sweep
of docs/own-sweep.md (tests/test_own_sweep.py).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from asr_study.cli import main
from orchestrate.sweep.folder import Manifest, SweepDir


def _sweep(root: Path, name: str, uri: str) -> SweepDir:
    sweep = SweepDir(root, name)
    sweep.write_manifest(Manifest(name=name, grid="g.yaml", backend="local", profile="", tracking_uri=uri))
    return sweep


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(["dashboard", *argv])
    except SystemExit as e:  # argparse's usage errors
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_an_unknown_sweep_exits_2_naming_it_the_root_and_how_to_set_it(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _sweep(tmp_path, "mine", f"sqlite:///{tmp_path}/mlflow.db")
    rc, out, err = _run(["other", "--sweep-root", str(tmp_path)], capsys)
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "'other'" in err and str(tmp_path) in err and "mine" in err and "ASR_STUDY_SWEEP_ROOT" in err, err


def test_the_root_comes_from_the_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASR_STUDY_SWEEP_ROOT", str(tmp_path / "elsewhere"))
    rc, _, err = _run(["mine"], capsys)
    assert rc == 2 and str(tmp_path / "elsewhere") in err and "does not exist" in err, err


def test_a_port_in_use_exits_2_naming_the_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _sweep(tmp_path, "mine", f"sqlite:///{tmp_path}/mlflow.db")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, out, err = _run(["mine", "--sweep-root", str(tmp_path), "--port", str(port)], capsys)
    assert rc == 2 and not out and f"port {port}" in err and "in use" in err and "--port" in err, err


@pytest.mark.parametrize("port", ["0", "70000", "http"])
def test_a_port_that_is_no_port_exits_2_naming_it(port: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["mine", "--sweep-root", str(tmp_path), "--port", port], capsys)
    assert rc == 2 and f"'{port}' is not a port number; valid: 1-65535" in err, err


def test_a_missing_ledger_file_is_said_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "gone" / "mlflow.db"
    _sweep(tmp_path, "mine", f"sqlite:///{db}")
    rc, out, err = _run(["mine", "--sweep-root", str(tmp_path)], capsys)
    assert rc == 2 and not out and str(db) in err and "does not exist" in err, err
    assert not db.exists()


def test_an_invalid_sweep_name_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["../x", "--sweep-root", str(tmp_path)], capsys)
    assert rc == 2 and "invalid sweep name '../x'" in err, err


class _Experiments(BaseHTTPRequestHandler):
    """The one request the lookup makes: experiment 'mine' is id 7, anything else does not exist."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        found = "experiment_name=mine" in self.path
        body = (json.dumps({"experiment": {"experiment_id": "7", "name": "mine", "lifecycle_stage": "active"}})
                if found else json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST"}))
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Experiments)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_sweep_on_a_server_gets_its_url_and_nothing_starts(tmp_path: Path, stub_server: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _sweep(tmp_path, "mine", stub_server + "/")
    rc, out, err = _run(["mine", "--sweep-root", str(tmp_path)], capsys)
    assert rc == 0, err
    assert out.splitlines()[-1] == f"{stub_server}/#/experiments/7/runs?viewStateShareKey=sweep-wer", out
    assert "starting" not in err


def test_a_sweep_whose_experiment_is_gone_exits_2(tmp_path: Path, stub_server: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _sweep(tmp_path, "other", stub_server)
    rc, out, err = _run(["other", "--sweep-root", str(tmp_path)], capsys)
    assert rc == 2 and not out and "no experiment 'other'" in err and stub_server in err, err


def test_a_server_that_does_not_answer_exits_1_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nobody listens there
    _sweep(tmp_path, "mine", f"http://127.0.0.1:{port}")
    rc, out, err = _run(["mine", "--sweep-root", str(tmp_path)], capsys)
    assert rc == 1 and not out and f"http://127.0.0.1:{port}" in err and "does not answer" in err, err
