"""``bench train`` runs end to end on a miniature setting and prints its tables (figures are not asserted)."""

import subprocess
import sys

from asr_core.bench.train import fit_exponent


def test_fit_exponent_recovers_power_laws() -> None:
    xs = [30.0, 60.0, 120.0, 240.0]
    assert abs(fit_exponent(xs, [3 * x for x in xs]) - 1.0) < 1e-9
    assert abs(fit_exponent(xs, [0.5 * x * x for x in xs]) - 2.0) < 1e-9


def test_bench_train_prints_throughput_and_memory_tables(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "asr_core", "bench", "train", "--d-model", "32", "--layers", "1",
                          "--heads", "2", "--batch", "2", "--frames", "32", "--repeats", "1", "--contexts", "4,8",
                          "--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ratio (ours / torchaudio)" in out.stdout and "growth exponent" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("asr_core"))
    assert row.endswith("%") and 0 < float(row.split()[-1].rstrip("%")) < 150  # MFU against this CPU's matmul
    assert "this CPU's float32 matmul, measured" in out.stdout
    assert (tmp_path / "b.json").exists()
