"""The training step on a GPU, plain and compiled, measured in one call: the before/after table of the step's speed.

    python scripts/gpu_step_check.py prepare                 # where espeak-ng is: .devdata/speech (a minute of speech)
    python scripts/gpu_step_check.py run OUT                 # on the GPU machine (carry .devdata): under 8 minutes
    python scripts/gpu_step_check.py compare OUT             # the table again from OUT's files

``run`` calibrates the main model (``python -m asr_core bench calibrate``, bf16, the real training step on the
prepared speech tiled) at 10.24, 81.92, 327.68, 1310.72 and 3600 s of context, once plain and once with
``--set train.compile=true``, then ``python -m asr_core bench train`` (the GPU rows: frames/s, MFU and the longest
context of the main model). It writes ``OUT/calibration-plain.json``, ``OUT/calibration-compiled.json``, their
logs, ``OUT/bench-train.txt`` and ``OUT/step-table.md``: per context, frames/s, MFU and seconds per step (one hour
of audio unless ``BATCH_S``), plain and compiled, and the ratio. The compiled calibration is the one to ship as
``orchestrate/assets/calibrations/<device>-measured.json`` where it is the faster.

``PRESET``, ``CONTEXTS``, ``STEPS``, ``BATCH_S`` (audio seconds a step) and ``DEVICE`` (auto, cpu) in the environment narrow it, e.g. for a check on a
CPU: ``PRESET=tiny CONTEXTS=2.56,5.12 STEPS=2 BATCH_S=81.92 DEVICE=cpu python scripts/gpu_step_check.py run /tmp/out``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO / ".devdata" / "speech"
CONTEXTS = os.environ.get("CONTEXTS", "10.24,81.92,327.68,1310.72,3600")
PRESET = os.environ.get("PRESET", "main")
STEPS = os.environ.get("STEPS", "3")
DEVICE = os.environ.get("DEVICE", "auto")
BATCH_S = os.environ.get("BATCH_S", "")  # seconds of audio a step (default: the preset's, one hour)


def _run(argv: list[str], log: Path) -> None:
    """Run ``argv`` from the repository, its output to the terminal and to ``log``; stop on failure."""
    print(f"$ {' '.join(argv)}", flush=True)
    start = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
        rc = proc.wait()
    print(f"({time.monotonic() - start:.0f} s, exit {rc})", flush=True)
    if rc != 0:
        raise SystemExit(f"gpu_step_check: {argv[3] if len(argv) > 3 else argv} failed (exit {rc}); see {log}")


def prepare() -> int:
    """A minute of espeak-ng speech in .devdata/speech/train: what the calibration tiles on a node without espeak."""
    if (SPEECH / "train").is_dir() and any((SPEECH / "train").glob("*.wav")):
        print(f"{SPEECH / 'train'} is there")
        return 0
    SPEECH.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "asr_core", "synth", "--out", str(SPEECH), "--hours", "0.02", "--min-minutes", "1",
          "--max-minutes", "1.5", "--splits", "train", "--voices", "3", "--seed", "0"], REPO / ".devdata" / "synth.log")
    return 0


def run(out: Path) -> int:
    """Both calibrations and the GPU rows of ``bench train`` into ``out``; then the table."""
    if not (SPEECH / "train").is_dir():
        raise SystemExit(f"gpu_step_check: no {SPEECH / 'train'}: run 'python scripts/gpu_step_check.py prepare' "
                         "where espeak-ng is, and carry .devdata")
    out.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "asr_core", "bench", "calibrate", "--preset", PRESET, "--contexts-s", CONTEXTS,
            "--steps", STEPS, "--warmup", "2", "--speech", f"sp=podcast:{SPEECH / 'train'}",
            "--set", f"train.device={DEVICE}", "--set", "data.num_workers=8", "--eval-seconds", "20"]
    if BATCH_S:
        base += ["--set", f"data.batch_audio_s={BATCH_S}"]
    for mode, extra in (("plain", []), ("compiled", ["--set", "train.compile=true"])):
        _run(base + extra + ["--out", str(out / f"calibration-{mode}.json")], out / f"calibration-{mode}.log")
    if PRESET == "main" and DEVICE != "cpu":
        _run([sys.executable, "-m", "asr_core", "bench", "train", "--gpu-presets", "main", "--contexts-s", "30,60",
              "--json", str(out / "bench-train.json")], out / "bench-train.txt")
    return compare(out)


def compare(out: Path) -> int:
    """Print (and write to OUT/step-table.md) the per-context table of the plain and the compiled calibration."""
    cal = {m: json.loads((out / f"calibration-{m}.json").read_text()) for m in ("plain", "compiled")}
    rows = {m: {c["context_s"]: c for c in cal[m]["train"]["contexts"]} for m in cal}
    lines = [f"Training step, plain and compiled: {cal['plain']['device']}, {cal['plain']['precision']}, preset "
             f"{cal['plain'].get('preset') or PRESET}, torch {cal['plain']['torch']}",
             "",
             "| context s | frames/s plain | frames/s compiled | speed-up | MFU plain | MFU compiled "
             "| s per step plain | compiled | outside fwd/bwd plain | compiled |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    # both against one peak, the plain run's (a CPU's peak is measured in each run, and moves with the machine's load)
    peaks = [cal[m].get("peak_flops_per_s") for m in ("plain", "compiled")]
    rescale = peaks[1] / peaks[0] if all(peaks) else 1.0

    for ctx in sorted(rows["plain"]):
        p, c = rows["plain"][ctx], rows["compiled"].get(ctx)
        if c is None:
            continue
        lines.append(f"| {ctx:g} | {p['frames_per_s']:,.0f} | {c['frames_per_s']:,.0f} | "
                     f"{c['frames_per_s'] / p['frames_per_s']:.2f}x | {pct(p.get('mfu'))} | "
                     f"{pct(c['mfu'] * rescale if c.get('mfu') is not None else None)} | "
                     f"{p['full_step_s']:.3f} | {c['full_step_s']:.3f} | {pct(p.get('outside_share'))} | "
                     f"{pct(c.get('outside_share'))} |")
    lines.append("")
    lines.append(f"A step: {cal['plain']['data']['batch_audio_s']:g} s of audio. MFU of both against "
                 f"{cal['plain'].get('peak_source') or 'no known peak'}; goal (issue 36, main model on an H100): "
                 ">= 30% at 10.24 s, >= 20% at 3600 s.")
    text = "\n".join(lines) + "\n"
    (out / "step-table.md").write_text(text)
    print(text, end="")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) >= 1 and argv[0] == "prepare":
        return prepare()
    if len(argv) == 2 and argv[0] in ("run", "compare"):
        return run(Path(argv[1])) if argv[0] == "run" else compare(Path(argv[1]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
