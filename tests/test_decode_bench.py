"""``python -m asr_core bench decode`` runs and prints its table (speed itself is a benchmark, not a test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_decode_prints_the_table() -> None:
    r = subprocess.run([sys.executable, "-m", "asr_core", "bench", "decode", "--minutes", "0.3", "--context-s",
                        "2.56", "--repeats", "1", "--threads", "1", "--beam-seconds", "4"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("moving, batches of 8") for line in lines)
    assert any(line.startswith("moving, one window at a time") for line in lines)
    assert "x the compute floor" in lines[-1]
    batched = next(line for line in lines if line.startswith("moving, batches"))
    assert float(batched.split()[-1]) > 0  # a ratio to the floor was measured
    beam = {line.split(",")[1].split()[0]: line for line in lines if line.startswith("beam 25,")}
    assert set(beam) == {"no", "tiny"}, lines
    assert float(beam["tiny"].split()[-2]) > 0  # LM calls per second were measured
    fusion = {line.split()[0]: line.split() for line in lines[lines.index(next(x for x in lines if x.startswith(
        "window fusion"))):]}
    assert {"select", "blockwise", "chiu", "lcs", "rover", "average"} <= set(fusion), lines
    assert all(float(fusion[m][3]) > 0 for m in ("select", "chiu", "rover"))  # ratios to the averaging measured
