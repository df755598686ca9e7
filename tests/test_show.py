"""``orchestrate show SWEEP KEY``: one trial whole (state, folder, log, config, segments, attempts, its run and its
WERs), found by key, unique key prefix or label; with MLflow down it still shows the folder's truth.

Real pieces: a real ``mlflow server`` (the session fixture) holding the sweep's runs and a logged WER, trial folders
written with the trial contract's own writers, ``show`` run in a fresh process as a person runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

from asr_core.contract.folder.segments import Segment, append_segment
from asr_core.contract.trial import OUTCOME_PREEMPTED, record_attempt
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.tools.fake_sweep import fake_trials
from tests.plugins.mlflow_server import free_port

REPO = Path(__file__).resolve().parents[1]


def show(root: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", "show", name, *args, "--sweep-root", str(root)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def make_sweep(root: Path, uri: str, n: int = 40) -> tuple[SweepDir, list]:
    trials = fake_trials(n)
    sweep = SweepDir(root, f"show-{uuid.uuid4().hex[:8]}")
    sweep.write_manifest(Manifest(name=sweep.name, grid="grids/paper.yaml", backend="local", profile="",
                                  tracking_uri=uri, workdir=str(REPO), sweep_id=uuid.uuid4().hex))
    sweep.write_trials(trials)
    t = trials[0]
    folder = sweep.prepare_trial(t)
    append_segment(folder, Segment(number=1, time=1_700_000_000.0, code="3f2a9c1d0b7e", host="gpu-node-07",
                                   job_id="local"))
    record_attempt(folder, OUTCOME_PREEMPTED, segment=1, job_id="local", by="job")
    return sweep, trials


def test_show_prints_one_trial_whole_with_its_run_and_wer(tmp_path: Path, mlflow_server) -> None:  # noqa: ANN001
    sweep, trials = make_sweep(tmp_path, mlflow_server.uri)
    t = trials[0]
    manifest = sweep.read_manifest()
    ledger = Ledger(mlflow_server.uri, sweep.name)
    parent = ledger.ensure_sweep(manifest.grid, "local", manifest.sweep_id, str(sweep.path))
    run_ids = ledger.create_trial_runs(parent, trials[:2], "local")
    sweep.new_submission("local", [x.key for x in trials[:2]], run_ids)
    mlflow_server.client().log_metric(run_ids[t.key], "wer/earnings22", 18.19726)

    p = show(tmp_path, sweep.name, t.label)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.startswith(f"trial {t.label}  {t.key}")
    assert f"folder    {sweep.trial_dir(t.key)}" in out and f"log       {sweep.trial_dir(t.key) / 'trial.log'}" in out
    assert f"context_s: {t.config.data.context_s}" in out  # the config, whole
    assert "host gpu-node-07" in out and "preempted" in out  # its segment and its attempt
    assert run_ids[t.key] in out and "wer/earnings22 = 18.20" in out

    p = show(tmp_path, sweep.name, t.key[:8], "--json")  # a unique prefix
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    assert rec["key"] == t.key and rec["config"]["data"]["context_s"] == t.config.data.context_s
    assert rec["status"]["log"].endswith("trial.log") and len(rec["segments"]) == 1 and len(rec["attempts"]) == 1
    assert rec["runs"][run_ids[t.key]]["wer"] == {"wer/earnings22": 18.19726}

    first = Counter(x.key[0] for x in trials).most_common(1)[0][0]  # a prefix of several keys
    p = show(tmp_path, sweep.name, first)
    assert p.returncode == 2 and "give more of it" in p.stderr and "Traceback" not in p.stderr
    p = show(tmp_path, sweep.name, "no-such-trial")
    assert p.returncode == 2 and "'no-such-trial'" in p.stderr and "Traceback" not in p.stderr


def test_show_without_mlflow_still_shows_the_folder(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    sweep, trials = make_sweep(tmp_path, uri, n=2)
    sweep.new_submission("local", [trials[0].key], {trials[0].key: "0123abcd"})
    p = show(tmp_path, sweep.name, trials[0].label)
    assert p.returncode == 0, p.stderr
    assert "0123abcd: MLflow unreachable" in p.stdout and "host gpu-node-07" in p.stdout
    p = show(tmp_path, sweep.name, trials[1].key)
    assert p.returncode == 0 and "LOST" in p.stdout and "segments (0)" in p.stdout, p.stdout
