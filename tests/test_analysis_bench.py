"""``python -m analysis bench`` at a tiny size, so it cannot rot: a real mlflow server, a fake paper-grid ledger,
a cold, a warm and a one-run-changed report that write the same files, and the table of figures; plus the table's goals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.bench import GIB, Row, Timing, table

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a server start and two reports: about 90 s on 2 busy cores
def test_the_bench_runs_at_a_tiny_size_and_the_warm_report_equals_the_cold(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "analysis", "bench", "--runs", "4", "--out", str(tmp_path / "b"),
                        "--bootstrap", "200"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "bench: ledger 4/4 runs written" in r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("| runs | ledger built | wall cold | wall warm | wall, one run changed | peak memory")
    assert len(lines) == 3
    assert lines[2].startswith("| 4 |") and lines[2].endswith("| - |")
    cold, warm = tmp_path / "b" / "report-4-cold", tmp_path / "b" / "report-4-warm"
    files = sorted(p.relative_to(cold) for p in cold.rglob("*") if p.is_file())
    assert Path("wer.csv") in files and Path("significance.csv") in files
    assert all((cold / f).read_bytes() == (warm / f).read_bytes() for f in files)
    assert len(list((tmp_path / "b" / "cache-4" / "reports").glob("*/memo.json"))) == 1
    changed = tmp_path / "b" / "report-4-changed"
    assert sorted(p.relative_to(changed) for p in changed.rglob("*") if p.is_file()) == files
    assert len(list((tmp_path / "b" / "cache-4").rglob("*.json.gz"))) == 4


def test_the_table_says_which_goals_are_met() -> None:
    fast, slow = Timing(40.0, GIB, 4.0, ""), Timing(400.0, 3 * GIB, None, "")
    text = table([Row(321, 80.0, fast, Timing(10.0, GIB // 2, 2.0, ""), fast), Row(3000, 900.0, slow, slow, slow),
                  Row(50, 10.0, fast, fast, fast)])
    rows = text.splitlines()
    assert rows[2] == ("| 321 | 80 s | 40.0 s | 10.0 s | 40.0 s | 1024 MiB | 10% (20%) | cold ≤ 60 s met, "
                       "warm ≤ 15 s met |")
    assert rows[3].endswith("| ? (?) | cold ≤ 300 s NOT met, ≤ 2 GiB NOT met |")
    assert rows[4].endswith("| - |")


def test_the_tree_memory_counts_a_workers_memory_beside_its_parents() -> None:
    """A parent holding 150 MiB starts a child holding 200 MiB: the tree's peak is their sum, more than either alone
    (wait4's peak RSS is that of the largest process, and on Linux also counts what the process that started it
    held when it forked, so it says nothing here)."""
    import os

    from analysis.bench import TreeMemory

    hold = "b = bytearray({n} * 2**20); b[::4096] = b'x' * len(b[::4096])"
    child = hold.format(n=200) + "; import time; time.sleep(1.5)"
    code = hold.format(n=150) + f"; import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    proc = subprocess.Popen([sys.executable, "-c", code])
    tree = TreeMemory(proc.pid, every_s=0.05)
    tree.start()
    os.wait4(proc.pid, 0)
    tree.stop()
    assert tree.peak > 340 * 2 ** 20
