"""A standalone ``python -m asr_core train`` that ends while MLflow is down names the one command that ships what it
could not send, and that command works on the ``--out`` folder as printed: a real ``mlflow server``
(slurm/mlflow-server.sh) stopped before training and started again after it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_core.config import preset
from asr_core.contract.folder.outbox_files import outbox_dir, parse_record, read_lines, record_files
from tests.test_backend import smoke_corpus
from tests.test_tracker_outage import Server, _overrides

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

STEPS = 10


def _logged_steps(out: Path, key: str) -> set[int]:
    """The steps at which the outbox holds a value of ``key``."""
    box = outbox_dir(out)
    steps = set()
    for name in record_files(box):
        for _, line in read_lines(box / name, 0):
            rec = parse_record(line)
            if rec is not None and rec["kind"] == "metrics" and key in (rec.get("metrics") or {}):
                steps.add(int(rec.get("step", 0)))
    return steps


@pytest.mark.slow
def test_train_ending_while_mlflow_is_down_prints_a_ship_command_that_works(tmp_path: Path,
                                                                            smoke_corpus: Path) -> None:
    server = Server(tmp_path / "mlflow-server")
    server.start()
    try:
        client = MlflowClient(tracking_uri=server.uri)
        run_id = client.create_run(client.create_experiment(f"standalone-{tmp_path.name}")).info.run_id
        server.stop()  # down for the whole of training

        overrides = _overrides(smoke_corpus, STEPS)
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(preset("tiny").with_overrides(overrides).to_dict()))
        out = tmp_path / "my run"  # a space: the printed command quotes the folder
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ASR_CORE_FINAL_FLUSH_S": "3", 
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
        env.pop("MLFLOW_TRACKING_URI", None)
        done = subprocess.run([sys.executable, "-m", "asr_core", "train", str(cfg), "--out", str(out),
                               "--tracking-uri", server.uri, "--run-id", run_id],
                              capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "next segment" not in done.stderr
        last = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()][-1]
        assert last.startswith("python -m asr_core ship "), done.stderr[-1500:]
        expected = _logged_steps(out, "train/loss")
        assert expected and max(expected) == STEPS, expected  # the points MLflow never got

        server.start()
        argv = shlex.split(last)
        assert argv[:4] == ["python", "-m", "asr_core", "ship"] and Path(argv[4]) == out.resolve()
        shipped = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=env, timeout=300,
                                 cwd=Path(__file__).resolve().parents[1])
        assert shipped.returncode == 0, shipped.stdout + shipped.stderr
        history = client.get_metric_history(run_id, "train/loss")
        assert sorted(m.step for m in history) == sorted(expected)  # every point, once
        assert client.get_run(run_id).info.status == "FINISHED"
    finally:
        server.stop()
