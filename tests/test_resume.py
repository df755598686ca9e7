"""Exact resume: 2k steps straight equal k steps, a kill (-9 or SIGUSR2), resume, k more — bitwise on the CPU —
and MLflow holds one run with one continuous step history. Also with gradient accumulation and data worker
threads on (``accum``): the checkpoint holds the position of the last step trained, not of steps prefetched; and
in the middle of an interleaved group (``midgroup``: step k of 3 recordings, window k of each), where the resumed
run must take up window k+1 of the same recordings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from asr_core.training.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from test_train import make_corpus, tiny_cfg  # noqa: E402

K = 4
SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from asr_core.config import Config
from asr_core.data.corpora.base import Recording, Word
from asr_core.training.loop import Preempted
from asr_core.training.train import train
spec = json.loads(Path(sys.argv[1]).read_text())
recs = [Recording(r["id"], Path(r["audio"]), r["duration"], tuple(Word(*w) for w in r["words"]))
        for r in spec["recordings"]]
try:
    res = train(Config.from_dict(spec["config"]), sys.argv[2], tracking_uri=spec["tracking_uri"],
                experiment=spec["experiment"], recordings=recs)
except Preempted:
    sys.exit(75)
print("RUN_ID", res.run_id, flush=True)
"""


VARIANTS = {
    "whole": {},
    # windows of 10.24 s, ~30 s per step: 2-3 passes of one window each, two threads preparing upcoming steps
    "accum": {"data.micro_batch_audio_s": 10.24, "data.num_workers": 2},
    # 2 s windows, groups of 3 recordings (6 s a step), each 3-5 windows deep: the kill lands inside a group
    "midgroup": {"data.context_s": 2.0, "data.batch_audio_s": 6, "data.num_workers": 2},
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("resume")
    return root, make_corpus(root / "corpus", 10, seed=1, words_per=(8, 14))


@pytest.fixture(scope="module", params=list(VARIANTS))
def setup(request: pytest.FixtureRequest, corpus: tuple[Path, list]) -> dict:
    root, recs = corpus
    # a folder (and ledger URI) of each build's own: pytest builds a parametrized module fixture again when the
    # tests of its params interleave on a worker, and MLflow keeps a store per URI for the life of the process
    root = Path(tempfile.mkdtemp(prefix=f"{request.param}-", dir=root))
    cfg = tiny_cfg(**{"train.max_steps": 2 * K, "train.checkpoint_every": K, "train.log_every": 1,
                      "data.batch_audio_s": 30, "model.vocab_size": 40, **VARIANTS[request.param]})
    (root / "train.py").write_text(SCRIPT)
    spec = {"config": cfg.to_dict(), "tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
            "recordings": [{"id": r.id, "audio": str(r.audio), "duration": r.duration,
                            "words": [[w.text, w.start, w.end] for w in r.words]} for r in recs]}
    straight = _spec(root, spec, "straight")
    proc = _launch(root, straight, root / "straight")
    log = proc.stdout.read()
    assert proc.wait(timeout=300) == 0, log
    if request.param == "accum":  # the variant really accumulates and prefetches
        assert "2 data workers" in log and " passes" in log, log
    return {"root": root, "spec": spec, "straight": load_checkpoint(root / "straight" / "checkpoint.pt"),
            "variant": request.param}


def _spec(root: Path, spec: dict, experiment: str) -> Path:
    path = root / f"{experiment}.json"
    path.write_text(json.dumps({**spec, "experiment": experiment}))
    return path


def _launch(root: Path, spec_path: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(root / "train.py"), str(spec_path), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).parents[1])


def _assert_same_training(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] == 2 * K
    assert a["data_position"] == b["data_position"]
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), f"parameter {name} differs after resume"
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for key in sa:
        if isinstance(sa[key], torch.Tensor):  # Madgrad's step counter 'k'
            assert torch.equal(sa[key], sb[key]), f"optimizer state {key} differs"
            continue
        for field, v in sa[key].items():
            assert torch.equal(v, sb[key][field]), f"optimizer state {key}.{field} differs"


def _assert_one_continuous_history(tracking_uri: str, experiment: str, straight_losses: list[float] | None) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, f"expected one MLflow run, found {len(runs)}"
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["model.d_model"] == "96" and "mlflow.source.git.commit" in run.data.tags
    assert run.data.tags["trial.checkpoint"].endswith("checkpoint.pt")
    for key in ("train/loss", "train/lr", "train/seq_len_s", "train/batch_size"):
        hist = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in hist) == list(range(1, 2 * K + 1)), key
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)]
    if straight_losses is not None:
        assert losses == straight_losses
    return losses


def _straight_losses(setup: dict) -> list[float]:
    return _assert_one_continuous_history(setup["spec"]["tracking_uri"], "straight", None)


@pytest.mark.slow
@pytest.mark.parametrize("setup", ["whole", "midgroup"], indirect=True)  # "accum": by the SIGUSR2 test
def test_kill_9_after_checkpoint_then_resume_is_bitwise_exact(setup: dict) -> None:
    root, out = setup["root"], setup["root"] / "kill9"
    spec = _spec(root, setup["spec"], "kill9")
    proc = _launch(root, spec, out)
    ckpt = out / "checkpoint.pt"
    deadline = time.time() + 240
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log = proc.stdout.read()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it could be killed:\n{log}"
    at_kill = load_checkpoint(ckpt)
    assert at_kill["step"] == K
    if setup["variant"] == "midgroup":
        assert at_kill["data_position"]["window"] > 0, at_kill["data_position"]  # inside a group
    resumed = _launch(root, spec, out)
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read()
    assert f"resuming {ckpt} at step {K}" in resumed.stdout.read()
    _assert_same_training(setup["straight"], load_checkpoint(ckpt))
    _assert_one_continuous_history(setup["spec"]["tracking_uri"], "kill9", _straight_losses(setup))


@pytest.mark.slow
def test_sigusr2_checkpoints_exits_75_and_resumes_bitwise_exact(setup: dict) -> None:
    root, out = setup["root"], setup["root"] / "usr2"
    spec = _spec(root, setup["spec"], "usr2")
    proc = _launch(root, spec, out)
    lines = []
    for line in proc.stdout:  # wait until two steps are done, then ask for a checkpoint
        lines.append(line)
        if line.startswith("[train] step 2/"):
            proc.send_signal(signal.SIGUSR2)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 75, "".join(lines) + rest
    stopped_at = load_checkpoint(out / "checkpoint.pt")["step"]
    assert 2 <= stopped_at < 2 * K and "SIGUSR2 received" in rest
    resumed = _launch(root, spec, out)
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read()
    _assert_same_training(setup["straight"], load_checkpoint(out / "checkpoint.pt"))
    _assert_one_continuous_history(setup["spec"]["tracking_uri"], "usr2", _straight_losses(setup))


@pytest.mark.parametrize("setup", ["whole"], indirect=True)
def test_resume_refuses_a_different_config(setup: dict, tmp_path: Path) -> None:
    from asr_core.config import Config
    from asr_core.training.train import TrainError, train

    cfg = Config.from_dict(setup["spec"]["config"]).with_overrides(["train.lr=0.001"])
    with pytest.raises(TrainError, match=r"was written for trial .*train.lr: 0.003 -> 0.001"):
        train(cfg, setup["root"] / "straight", recordings=[])


def _recordings(setup: dict) -> list:
    from asr_core.data.corpora.base import Recording, Word

    return [Recording(r["id"], Path(r["audio"]), r["duration"], tuple(Word(*w) for w in r["words"]))
            for r in setup["spec"]["recordings"]]


@pytest.mark.parametrize("setup", ["whole"], indirect=True)
def test_resume_takes_other_execution_settings_but_not_other_data_under_the_same_name(setup: dict,
                                                                                     tmp_path: Path) -> None:
    import shutil

    from asr_core.config import Config
    from asr_core.data.corpora.base import Word
    from asr_core.training.train import TrainError, train

    out = tmp_path / "copy"
    shutil.copytree(setup["root"] / "straight", out)
    cfg = Config.from_dict(setup["spec"]["config"])
    assert load_checkpoint(out / "checkpoint.pt")["data_fingerprint"].startswith("recordings=")
    # the same words with one changed: the same name ("recordings", given directly), other content
    recs = _recordings(setup)
    r0 = recs[0]
    w0 = r0.words[0]
    changed = [r0.__class__(r0.id, r0.audio, r0.duration, (Word("changed", w0.start, w0.end),) + r0.words[1:]),
               *recs[1:]]
    with pytest.raises(TrainError, match="other content than when this trial started"):
        train(cfg, out, tracking_uri=None, recordings=changed)
    # loader threads, micro-batches and checkpoint interval are how it runs: the same trial resumes (it is done)
    faster = cfg.with_overrides(["data.num_workers=2", "data.micro_batch_audio_s=20", "train.checkpoint_every=3"])
    res = train(faster, out, recordings=recs)
    assert res.steps == 2 * K
