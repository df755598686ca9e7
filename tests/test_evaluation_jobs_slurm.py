"""Evaluation jobs on a real SLURM cluster: one ``max_parallel`` for training and evaluation, and ``cancel`` (whole
or ``--where``) stopping both kinds.

A cluster of this module's own with 8 CPUs (so the node could run more tasks than ``max_parallel``), the trial jobs
real (tiny models, two steps), the ledger a sqlite file on this host (``--allow-sqlite``):

1. two models are trained and evaluated on ``dev``;
2. the grid gains a test set and a seed: two evaluation jobs (the trained models on ``other``) and two models to
   train go out in one submission; ``squeue``, polled throughout, never shows more than ``max_parallel`` (2)
   running; everything finishes;
3. the grid gains an SNR and another seed, with the evaluation jobs held in a sleep
   (``ASR_CORE_FAULT=sleep-in-eval:S``): ``cancel --where key=<one job>`` stops that job only; ``cancel`` then
   stops the rest of both kinds, leaving no job of the sweep in the queue, every unfinished folder ``CANCELLED``
   and the models trained before still FINISHED.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asr_core.contract.folder.segments import read_segments
from asr_core.contract.trial import FINISHED, KILLED, read_progress
from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.sweep.folder import SweepDir
from tests.plugins.slurm_cluster import SlurmCluster, own_cluster
from tests.test_backend import smoke_corpus, wait_until
from tests.test_slurm_arrays import Poller, on_cluster, wait_gone

__all__ = ["smoke_corpus", "on_cluster"]

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]

LIMIT = 2
GRID = """
name: evs
seeds: [%(seeds)s]
base:
  preset: tiny
  data: {train: "podcast:%(corpus)s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: 2, warmup_steps: 2, checkpoint_every: 2, device: cpu, precision: fp32}
  eval: {datasets: [%(datasets)s], snrs: [%(snrs)s], stride: 1.0}
subgrids:
  heads:
    axes: {model.heads: [2]}
"""


@pytest.fixture(scope="module")
def cluster8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from own_cluster(tmp_path_factory, "evj8", {"TESTCLUSTER_CPUS": "8"}, "the test cluster with 8 CPUs")


def _copy_one(corpus: Path, out: Path, which: int) -> str:
    wavs = sorted(corpus.glob("train/*.wav"), key=lambda p: p.stat().st_size)
    out.mkdir(parents=True, exist_ok=True)
    for p in (wavs[which], wavs[which].with_suffix(".json")):
        shutil.copy(p, out / p.name)
    return f'"{out.name}=podcast:{out}"'


def _queued(cluster: SlurmCluster, sweep: str) -> list[str]:
    out = cluster.run("squeue", "-h", "-r", "-o", "%i|%j", check=False).stdout.split()
    return [ln.split("|")[0] for ln in out if ln.split("|")[1].startswith(f"orch.{sweep}.")]


def _trials(sweep: SweepDir) -> list[dict]:
    import json

    return json.loads((sweep.path / "trials.json").read_text())


def test_training_and_evaluation_share_max_parallel_and_cancel_stops_both(
        cluster8: SlurmCluster, on_cluster: object, tmp_path: Path, smoke_corpus: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    on_cluster(cluster8)  # type: ignore[operator]
    dev = _copy_one(smoke_corpus, tmp_path / "dev", 0)
    other = _copy_one(smoke_corpus, tmp_path / "other", 1)
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"partition: gpu\ncpus_per_task: 1\ntime_limit: '00:20:00'\nmax_parallel: {LIMIT}\n")
    root = tmp_path / "runs"

    def submit(seeds: str, datasets: str, snrs: str = "") -> None:
        grid = tmp_path / f"grid-{time.monotonic_ns()}.yaml"
        grid.write_text(textwrap.dedent(GRID % {"seeds": seeds, "corpus": smoke_corpus, "datasets": datasets,
                                                "snrs": snrs}))
        assert main(["submit", str(grid), "--backend", "slurm", "--profile", str(profile), "--sweep-root",
                     str(root), "--allow-sqlite"]) == 0

    sweep = SweepDir(root, "evs")
    with Poller(cluster8) as poll:
        # 1. two models, trained and evaluated on dev
        submit("1, 2", dev)
        ledger = Ledger(sweep.read_manifest().tracking_uri, "evs")
        first = wait_for(ledger, [t["key"] for t in _trials(sweep)], timeout=600)
        assert {r.status for r in first.values()} == {FINISHED}

        # 2. one more test set and one more seed: evaluation jobs and training in one submission, one limit
        submit("1, 2, 3", f"{dev}, {other}")
        trials = _trials(sweep)
        jobs = [t for t in trials if t.get("evaluation")]
        models = [t["key"] for t in trials if not t.get("evaluation")]
        assert sorted(j["evaluation"]["model"] for j in jobs) == sorted(first) and len(models) == 3
        wait_until(lambda: all((sweep.trial_dir(t["key"]) / "DONE").exists() for t in trials), 600,
                   "the evaluation jobs and the new model never finished")
        assert all(r.status == FINISHED for r in wait_for(ledger, models, timeout=120).values())

        # 3. an SNR and a fourth seed, the evaluation jobs held in a sleep: cancel --where, then cancel
        monkeypatch.setenv("ASR_CORE_FAULT", "sleep-in-eval:300")
        submit("1, 2, 3, 4", f"{dev}, {other}", "5")
        trials = _trials(sweep)
        new_jobs = [t["key"] for t in trials if t.get("evaluation") and t["key"] not in {j["key"] for j in jobs}]
        assert len(new_jobs) == 3  # the three trained models at 5 dB

        def sleeping() -> list[str]:
            return [k for k in new_jobs if (p := read_progress(sweep.trial_dir(k))) is not None
                    and p.dataset == "fault"]

        one = wait_until(sleeping, 300, "no evaluation job reached its sleep")[0]
        one_job = str(read_segments(sweep.trial_dir(one))[-1].job_id)
        assert main(["cancel", "evs", "--where", f"key={one}", "--sweep-root", str(root)]) == 0
        assert (sweep.trial_dir(one) / "CANCELLED").exists()
        others = [k for k in new_jobs if k != one]
        assert not any((sweep.trial_dir(k) / "CANCELLED").exists() for k in others + models)
        wait_gone(cluster8, [one_job], timeout=120)
        still = _queued(cluster8, "evs")
        assert still and one_job not in still  # the rest of the sweep is still queued or running

        assert main(["cancel", "evs", "--sweep-root", str(root)]) == 0
        wait_gone(cluster8, sorted(still), timeout=180)
        assert not _queued(cluster8, "evs")

    assert poll.polls > 100 and poll.most == LIMIT, f"{poll.most} tasks ran at once under max_parallel {LIMIT}"
    trials = _trials(sweep)
    for t in trials:
        folder = sweep.trial_dir(t["key"])
        assert (folder / "DONE").exists() or (folder / "CANCELLED").exists(), t["label"]
    final = ledger.trial_runs()
    assert all(final[k].status == FINISHED for k in models)  # trained before: evaluation never touches them
    fourth = [t["key"] for t in trials if not t.get("evaluation") and t["key"] not in models]
    assert len(fourth) == 1
    if not (sweep.trial_dir(fourth[0]) / "DONE").exists():
        assert final[fourth[0]].status == KILLED
