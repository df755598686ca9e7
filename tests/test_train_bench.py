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


def test_bench_train_profiles_one_step_into_a_trace_and_an_operator_table(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "asr_core", "bench", "train", "--profile", str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    import json

    trace = json.loads((tmp_path / "p" / "trace.json").read_text())
    assert trace["traceEvents"]  # a Chrome trace of the step
    table = (tmp_path / "p" / "operators.txt").read_text().splitlines()
    assert table[0].split()[:2] == ["operator", "own"] and len(table) > 5
    shares = [float(line.split()[-2].rstrip("%")) for line in table[1:]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.01
    assert any("convolution" in line or "mm" in line for line in table[1:])
    assert "trace:" in out.stdout
