"""docs/own-sweep.md, run as a reader would: from an empty folder, every ``sh`` block in order (a block after
``<!-- not run -->`` is left out), every ``yaml`` block after ``<!-- file: NAME -->`` written to NAME where it
stands; then the page's dashboard command, which waits for Ctrl-C, is started on a free port: its URL answers 200 and
SIGINT ends it with exit 130, the MLflow server stopped.

Slow: a tiny corpus, two models of four steps, their evaluations and the report; about a minute and a half on 2
busy cores (the commands run as the page's reader runs them: in subprocesses, the checkout first on PYTHONPATH).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "own-sweep.md"
NOT_RUN = "<!-- not run -->"
FILE = re.compile(r"<!-- file: (\S+) -->")
URL = re.compile(r"^(http://127\.0\.0\.1:\d+/#/experiments/\d+/runs\?viewStateShareKey=\S+)$", re.M)
COMMAND_TIMEOUT_S = 300
DASHBOARD_TIMEOUT_S = 180  # a cold start of mlflow server on 2 busy cores has taken 40 s

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def page_steps(page: Path = PAGE) -> list[tuple[str, str, str]]:
    """The page's fenced blocks in order: (kind, marker above, body); kind ``run``, ``skip`` (a ``sh`` block after
    the not-run marker) or ``file`` (a ``yaml`` block after a file marker, the marker naming the file)."""
    lines = page.read_text().splitlines()
    steps, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            language = lines[i][3:].strip()
            above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            body = "\n".join(lines[i + 1:j]) + "\n"
            if language == "sh":
                steps.append(("skip" if above == NOT_RUN else "run", above, body))
            elif language == "yaml" and FILE.fullmatch(above):
                steps.append(("file", FILE.fullmatch(above).group(1), body))
            i = j
        i += 1
    return steps


def reader_env() -> dict[str, str]:
    """A reader's shell: this environment's commands first on PATH, the checkout on PYTHONPATH, no sweep root or
    tracking URI of the test machine's, one thread per process."""
    env = {k: v for k, v in os.environ.items() if k not in ("ASR_STUDY_SWEEP_ROOT", "MLFLOW_TRACKING_URI",
                                                            "_ARGCOMPLETE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_page_marks_its_blocks() -> None:
    steps = page_steps()
    kinds = [k for k, _, _ in steps]
    assert kinds.count("file") == 3 and kinds.count("skip") == 1 and kinds.count("run") >= 5, steps
    skipped = [body for k, _, body in steps if k == "skip"]
    assert skipped[0].strip().startswith("asr-study dashboard "), skipped


def dashboard_command(steps: list[tuple[str, str, str]]) -> str:
    """The page's (not run) dashboard command."""
    return next(body.strip() for kind, _, body in steps if kind == "skip" and "asr-study dashboard" in body)


def test_the_page_runs_from_an_empty_folder(tmp_path: Path) -> None:
    env = reader_env()
    steps = page_steps()
    t0 = time.monotonic()
    for kind, above, body in steps:
        if kind == "file":
            (tmp_path / above).write_text(body)
        elif kind == "run":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            assert done.returncode == 0, (f"docs/own-sweep.md: the block\n{body}exited {done.returncode}:\n"
                                          f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            if "--spec dev-set.yaml" in body:  # a plain test set: one job per finished model
                assert "2 evaluation jobs" in done.stdout and "2 new evaluation jobs" in done.stdout, done.stdout
            if "analysis report" in body:
                assert "http://127.0.0.1:5000/#/experiments/" in done.stdout, done.stdout
                assert "asr-study dashboard mine" in done.stdout, done.stdout
    assert (tmp_path / "report" / "index.html").is_file()
    wer = (tmp_path / "report" / "wer.csv").read_text()
    assert all(f",{name}," in wer for name in ("test", "shifted", "dev")), wer[:2000]
    print(f"the page's commands took {time.monotonic() - t0:.0f} s")

    port = free_port()
    command = f"{dashboard_command(steps)} --port {port}"
    process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        url = _wait_for_url(process)
        assert url.startswith(f"http://127.0.0.1:{port}/#/experiments/"), url
        assert requests.get(url, timeout=30).status_code == 200
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        (Path(tempfile.gettempdir()) / f"asr-study-dashboard-mine-{port}.log").unlink(missing_ok=True)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err, err
    with pytest.raises(requests.ConnectionError):  # the server went with it
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)
    print(f"the page and its dashboard took {time.monotonic() - t0:.0f} s")


def _wait_for_url(process: subprocess.Popen[str]) -> str:
    """The URL line the dashboard prints once its server answers (its stdout read line by line)."""
    assert process.stdout is not None
    deadline = time.monotonic() + DASHBOARD_TIMEOUT_S
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break  # the process ended
        seen.append(line)
        match = URL.match(line.strip())
        if match:
            return match.group(1)
    process.kill()
    _, err = process.communicate()
    pytest.fail(f"the dashboard printed no URL:\n{''.join(seen)}\n{err[-3000:]}")
