"""``orchestrate resume SWEEP --dry-run`` and ``retry SWEEP --failed|--cancelled --dry-run`` on a made-up local
sweep with trials in every state (:func:`orchestrate.tools.fake_sweep.make_fake_sweep`): each trial that would go out
again is named with why (lost, preempted, failed, cancelled), no MLflow answers and no scheduler is asked, and the
sweep's folder is byte-identical afterwards (no lock file, no attempt, no run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrate.tools.fake_sweep import make_fake_sweep
from tests.folder_snapshot import snapshot

ROOT = Path(__file__).resolve().parents[1]
NOBODY = "http://127.0.0.1:9"  # the ledger: nothing answers there


@pytest.fixture()
def sweep_root(tmp_path: Path) -> Path:
    make_fake_sweep(tmp_path, 40, name="every-state", backend="local", tracking_uri=NOBODY)
    return tmp_path


def files(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """:func:`snapshot` of ``root``, but for the mtimes of the ``lease/`` folders: reading a live lease probes the
    filesystem's clock there (a file made and removed, as ``status`` does), which writes nothing that stays."""
    return {k: (kind, 0 if kind == "dir" and Path(k).name == "lease" else mtime, data)
            for k, (kind, mtime, data) in snapshot(root).items()}


def orchestrate(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", *args, "--sweep-root", str(root)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def would(out: str) -> dict[str, str]:
    """{trial key: why} from the lines under 'would resubmit N:'."""
    return {m[1]: m[2] for m in re.finditer(r"^  \S+  ([0-9a-f]{12})  (.+)$", out, re.M)}


def count(out: str, what: str) -> int:
    m = re.search(rf"(\d+) {re.escape(what)}", out)
    return int(m[1]) if m else 0


def test_resume_dry_run_names_what_it_would_resubmit_and_writes_nothing(sweep_root: Path) -> None:
    before = files(sweep_root)
    r = orchestrate("resume", "every-state", "--dry-run", root=sweep_root)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert files(sweep_root) == before, "the dry run changed the sweep's folder"
    assert "dry run: nothing submitted or written" in r.stdout and NOBODY in r.stdout
    lines = would(r.stdout)
    whys = {why.split(":")[0].split(",")[0] for why in lines.values()}
    assert whys == {"lost", "preempted", "failed"}, r.stdout
    n = count(r.stdout, "lost (resubmitted)") + count(r.stdout, "preempted (resubmitted)") + \
        count(r.stdout, "failed/killed (resubmitted)")
    assert len(lines) == n and f"would resubmit {n}:" in r.stdout, r.stdout
    assert count(r.stdout, "gave up") and count(r.stdout, "cancelled (left KILLED")  # left, said, not listed


@pytest.mark.parametrize("what, why", [("--failed", "failed, failure count reset"), ("--cancelled", "cancelled")])
def test_retry_dry_run_names_only_what_retry_starts_again(sweep_root: Path, what: str, why: str) -> None:
    before = files(sweep_root)
    r = orchestrate("retry", "every-state", what, "--dry-run", root=sweep_root)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert files(sweep_root) == before, "the dry run changed the sweep's folder"
    lines = would(r.stdout)
    assert lines and all(w.startswith(why) for w in lines.values()), r.stdout
    if what == "--failed":  # those past the failure budget too
        assert any("gave up after" in w for w in lines.values()), r.stdout


def test_a_dry_run_with_where_lists_only_the_matching_trials(sweep_root: Path) -> None:
    every = would(orchestrate("resume", "every-state", "--dry-run", root=sweep_root).stdout)
    r = orchestrate("resume", "every-state", "--dry-run", "--where", "data.context_s=10.24", root=sweep_root)
    assert r.returncode == 0, r.stderr
    some = would(r.stdout)
    assert set(some) < set(every) and all(k in every for k in some), r.stdout


def test_a_dry_run_of_a_sweep_that_is_not_there_exits_2(tmp_path: Path) -> None:
    r = orchestrate("resume", "nosuch", "--dry-run", root=tmp_path)
    assert r.returncode == 2 and "'nosuch'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())
