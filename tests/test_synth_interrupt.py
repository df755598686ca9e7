"""``python -m asr_core synth`` stops promptly on Ctrl-C: SIGINT to its process group (as a terminal sends it, the
workers and their espeak-ng included) while it renders ends it within a few seconds, with exit 130, no traceback and
one line saying how much of the corpus is complete and what to do with the folder; nothing half-written is left
beside the complete recordings, and the corpus is not marked complete."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_ctrl_c_stops_synth_within_seconds_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "asr_core", "synth", "--out", str(out), "--hours", "2", "--seed",
                             "1", "--jobs", "2", "--min-minutes", "0.5", "--max-minutes", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(out.glob("*/*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # until the first recording is written: the workers are busy
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert took < 5, f"took {took:.1f} s to stop"
    assert "Traceback" not in err, err[-2000:]
    said = [ln for ln in err.splitlines() if "interrupted" in ln]
    assert len(said) == 1 and err.rstrip().splitlines()[-1] == said[0], err[-2000:]
    assert "recordings are complete in" in said[0] and "run the same command again" in said[0], said[0]
    assert json.loads((out / "synth.json").read_text())["complete"] is False
    transcripts = {p.stem for p in out.glob("*/*.json")}
    assert {p.stem for p in out.glob("*/*.wav")} == transcripts, "audio without its transcript was left"
    assert not list(out.glob("*/*.tmp")) and {p.stem for p in (out / "meta").glob("*.json")} == transcripts
    n = int(said[0].split(" of ")[0].rsplit(" ", 1)[1])
    assert n == len(transcripts), said[0]
