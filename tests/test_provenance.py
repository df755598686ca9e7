"""Which code ran a trial: ``code_version`` of a checkout, and a run resumed after a new commit carries both commits.

Every test builds its own git repository in a temporary folder (a copy of the ``asr_core`` package), so the state
of the checkout the suite runs from never matters.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import asr_core
from asr_core.config import Config, preset
from asr_core.contract.provenance import DIFF_DIGITS, DIRTY_SUFFIX, UNKNOWN, code_version
from asr_core.contract.trial import (
    CODE_ARTIFACT_DIR,
    ENV_JOB_ID,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    FAILED,
    FINISHED,
    TAG_CODE,
    TAG_CPU,
    TAG_KERNELS,
    TAG_ERROR,
    TAG_GIT_COMMIT,
    TAG_SEGMENTS,
    TrialFolder,
    trial_command,
    write_config,
)

PACKAGE = Path(asr_core.__file__).resolve().parent
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git on PATH")


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _repo(root: Path) -> Path:
    """A git repository holding a copy of ``asr_core`` and one commit; identity and signing set locally, so the
    machine's git configuration cannot change the outcome."""
    repo = root / "repo"
    shutil.copytree(PACKAGE, repo / "asr_core", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "README.md").write_text("a copy of asr_core for provenance tests\n")
    _git(repo, "init", "-q")
    for key, value in (("user.name", "Test"), ("user.email", "test@example.org"), ("commit.gpgsign", "false")):
        _git(repo, "config", key, value)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def _commit_comment(repo: Path, text: str) -> str:
    with (repo / "asr_core" / "__init__.py").open("a") as f:
        f.write(f"# {text}\n")
    _git(repo, "commit", "-q", "-am", text)
    return _git(repo, "rev-parse", "HEAD")


# ---- code_version ----------------------------------------------------------------------------------------------------
def test_a_clean_checkout_is_labelled_by_its_commit(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    head = _git(repo, "rev-parse", "HEAD")
    v = code_version(repo / "asr_core")
    assert (v.commit, v.dirty, v.diff, v.root) == (head, False, "", repo)
    assert v.label == head[:12] and v.to_dict() == {"code": head[:12], "commit": head, "dirty": False}
    assert code_version(repo / "asr_core" / "trial.py").commit == head  # a file names its checkout too

    (repo / "asr_core" / "__pycache__").mkdir()  # compiled copies and files outside the packages are not code
    (repo / "asr_core" / "__pycache__" / "trial.cpython-311.pyc").write_bytes(b"\0\1")
    (repo / "notes.txt").write_text("not code\n")
    (repo / "sweeps" / "s1").mkdir(parents=True)
    (repo / "sweeps" / "s1" / "x.py").write_text("print()\n")
    assert code_version(repo).label == head[:12]


def test_tracked_changes_and_new_package_files_make_it_dirty_with_a_diff_that_rebuilds_them(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    head = _git(repo, "rev-parse", "HEAD")
    with (repo / "asr_core" / "scoring" / "score.py").open("a") as f:
        f.write("# tuned by hand\n")
    v = code_version(repo)
    digest = hashlib.sha256(v.diff.encode()).hexdigest()[:DIFF_DIGITS]
    assert v.dirty and v.label == f"{head[:12]}{DIRTY_SUFFIX}.{digest}" and len(digest) == 8
    assert "+# tuned by hand" in v.diff and "a/asr_core/scoring/score.py" in v.diff
    assert code_version(repo).label == v.label  # the same uncommitted state, the same label

    (repo / "asr_core" / "extra").mkdir()
    (repo / "asr_core" / "extra" / "helper.py").write_text("VALUE = 1\nLAST = 2")  # no final newline
    before, v = v, code_version(repo)
    assert "new file mode 100644" in v.diff and "+VALUE = 1" in v.diff
    assert v.commit == before.commit and v.label != before.label  # another uncommitted state of the same commit

    # the diff is a patch: applied to a fresh clone of the commit it gives back the work tree
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    (tmp_path / "code.diff").write_text(v.diff)
    _git(clone, "apply", str(tmp_path / "code.diff"))
    for rel in ("asr_core/scoring/score.py", "asr_core/extra/helper.py"):
        assert (clone / rel).read_text() == (repo / rel).read_text()

    _git(repo, "checkout", "-q", "--", "asr_core/scoring/score.py")
    shutil.rmtree(repo / "asr_core" / "extra")
    assert code_version(repo).label == head[:12]


def test_two_dirty_work_trees_of_one_commit_get_different_labels(tmp_path: Path) -> None:
    """Two checkouts of one commit with different uncommitted changes ran different code: their labels differ (and
    name the commit); identical changes give identical labels, wherever the checkout is."""
    a = _repo(tmp_path)
    b, c = tmp_path / "b", tmp_path / "c"
    for clone in (b, c):  # checkouts of a's commit elsewhere
        _git(tmp_path, "clone", "-q", str(a), str(clone))
    for repo, text in ((a, "# one experiment\n"), (b, "# another experiment\n"), (c, "# one experiment\n")):
        with (repo / "asr_core" / "scoring" / "score.py").open("a") as f:
            f.write(text)
    va, vb, vc = code_version(a), code_version(b), code_version(c)
    assert va.commit == vb.commit == vc.commit and va.dirty and vb.dirty
    assert va.label != vb.label and va.label == vc.label
    for v in (va, vb):
        commit, _, digest = v.label.partition(DIRTY_SUFFIX + ".")
        assert commit == v.commit[:12] and len(digest) == DIFF_DIGITS and int(digest, 16) >= 0
        assert v.to_dict()["code"] == v.label


def test_anything_but_a_checkout_is_unknown_and_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    v = code_version(plain)
    assert v.label == UNKNOWN and v.commit is None and "not inside a git checkout" in v.why

    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert "no commit yet" in code_version(empty).why

    repo = _repo(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # git is not installed
    v = code_version(repo)
    assert v.label == UNKNOWN and "git is not installed" in v.why


# ---- the trial job ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("provenance-corpus") / "c"
    subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out), "--hours", "0.015", "--eval-hours", "0.005",
                    "--min-minutes", "0.3", "--max-minutes", "0.5", "--seed", "3", "--splits", "train"],
                   check=True, capture_output=True)
    return out / "train"


def _trial(tmp_path: Path, train: str, steps: int) -> tuple[Path, str, str, MlflowClient]:
    cfg = preset("tiny").with_overrides([
        f"data.train=podcast:{train}", "data.batch_audio_s=20.48", "data.context_s=5.12", "data.seqlen_warmup=none",
        f"train.max_steps={steps}", "train.warmup_steps=2", "train.checkpoint_every=100", "train.log_every=1",
        "eval.datasets=[]"])
    trial_dir = tmp_path / "trial"
    write_config(trial_dir, cfg)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("provenance", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(exp, run_name="t")
    client.update_run(run.info.run_id, status="SCHEDULED")
    return trial_dir, uri, run.info.run_id, client


def _env(repo: Path, job: str, kernels: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", ENV_JOB_ID: job}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernels:
        env["ATEN_CPU_CAPABILITY"] = kernels
    return env


def _own_kernels() -> str:
    """The CPU kernel level torch picks here when nothing lowers it."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", "from asr_core.contract.provenance import cpu_kernels; "
                           "print(cpu_kernels())"], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _first_train_record(trial_dir: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    path = TrialFolder(trial_dir).progress
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and any(json.loads(ln).get("phase") == "train" for ln in path.read_text().splitlines()
                                 if ln.endswith("}")):
            return
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the trial ended (exit {proc.returncode}) before writing a train progress record:\n{out}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no train progress record in {path} after {timeout:g} s")


@pytest.mark.slow
def test_a_run_resumed_after_a_new_commit_carries_both_commits(tmp_path: Path, corpus: Path) -> None:
    repo = _repo(tmp_path)
    first = _git(repo, "rev-parse", "HEAD")
    where = subprocess.run([sys.executable, "-c", "import asr_core; print(asr_core.__file__)"], cwd=repo,
                           env=_env(repo, "x"), capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(repo), f"the job would import {where}, not the copy in {repo}"

    trial_dir, uri, run_id, client = _trial(tmp_path, str(corpus), steps=6)
    cmd = trial_command(trial_dir, uri, run_id)
    # the first segment on the portable kernels, the second on this CPU's own: a trial resumed on another kind of CPU
    own = _own_kernels()
    assert own, "torch names no CPU kernel level"
    proc = subprocess.Popen(cmd, cwd=repo, env=_env(repo, "job-1", "default"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    _first_train_record(trial_dir, proc)
    proc.send_signal(signal.SIGUSR2)
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == EXIT_PREEMPTED, log
    tags = client.get_run(run_id).data.tags
    assert tags[TAG_CODE] == first[:12] and tags[TAG_SEGMENTS] == "1" and tags[TAG_GIT_COMMIT] == first
    assert tags[TAG_KERNELS] == "default" and tags[TAG_CPU]

    second = _commit_comment(repo, "a new commit between two segments")
    done = subprocess.run(cmd, cwd=repo, env=_env(repo, "job-2", own), capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_OK, done.stdout[-3000:] + done.stderr[-3000:]

    run = client.get_run(run_id)
    assert run.info.status == FINISHED
    assert run.data.tags[TAG_CODE] == f"{first[:12]},{second[:12]}"
    assert run.data.tags[TAG_SEGMENTS] == "2"
    assert run.data.tags[TAG_KERNELS] == ",".join(dict.fromkeys(["default", own]))  # both levels that trained it
    assert run.data.tags[TAG_GIT_COMMIT] == first  # MLflow's own tag keeps the first segment's commit
    segments = [json.loads(ln) for ln in TrialFolder(trial_dir).segments.read_text().splitlines()]
    assert [(s["segment"], s["commit"], s["dirty"], s["job_id"]) for s in segments] == [
        (1, first, False, "job-1"), (2, second, False, "job-2")]
    assert all(s["code"] == s["commit"][:12] and s["host"] and s["cpu"] for s in segments)
    assert [s["kernels"] for s in segments] == ["default", own]
    assert not any(TrialFolder(trial_dir).segment_diff(n).exists() for n in (1, 2))  # clean segments leave no diff
    phases = [json.loads(ln)["phase"] for ln in TrialFolder(trial_dir).progress.read_text().splitlines()]
    assert phases[0] == "start" and phases[-1] == "done" and phases.count("start") == 2
    assert phases[phases.index("preempted") + 1] == "start"


@pytest.mark.slow
def test_a_dirty_segment_keeps_its_diff_in_the_folder_and_the_run(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from asr_core import trial

    repo = _repo(tmp_path)
    with (repo / "asr_core" / "scoring" / "score.py").open("a") as f:
        f.write("# an uncommitted experiment\n")
    dirty = code_version(repo)
    monkeypatch.setattr(trial, "code_version", lambda: dirty)
    missing = tmp_path / "no-such-corpus"  # training fails at once: the segment is recorded before it starts
    trial_dir, uri, run_id, client = _trial(tmp_path, str(missing), steps=2)
    cfg = Config.from_yaml(str(TrialFolder(trial_dir).config), [])
    assert trial.run_trial(cfg, trial_dir, tracking_uri=uri, run_id=run_id) == EXIT_FAILED

    saved = TrialFolder(trial_dir).segment_diff(1)
    assert saved.read_text() == dirty.diff and "+# an uncommitted experiment" in dirty.diff
    run = client.get_run(run_id)
    assert run.info.status == FAILED and "no-such-corpus" in run.data.tags[TAG_ERROR]
    assert run.data.tags[TAG_CODE] == dirty.label == f"{dirty.commit[:12]}{DIRTY_SUFFIX}.{dirty.diff_digest}"
    attached = f"{CODE_ARTIFACT_DIR}/{saved.name}"
    assert [a.path for a in client.list_artifacts(run_id, CODE_ARTIFACT_DIR)] == [attached]
    local = client.download_artifacts(run_id, attached, str(tmp_path))
    assert Path(local).read_text() == dirty.diff

    # a store that refuses the artifact costs the diff in the run, never the trial: the error stays the corpus's
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("artifact store unavailable")

    monkeypatch.setattr(MlflowClient, "log_artifact", refuse)
    assert trial.run_trial(cfg, trial_dir, tracking_uri=uri, run_id=run_id) == EXIT_FAILED
    run = client.get_run(run_id)
    assert TrialFolder(trial_dir).segment_diff(2).exists() and run.data.tags[TAG_SEGMENTS] == "2"
    assert "no-such-corpus" in run.data.tags[TAG_ERROR]
    assert [a.path for a in client.list_artifacts(run_id, CODE_ARTIFACT_DIR)] == [attached]
