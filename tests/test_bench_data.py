"""``python -m asr_core bench data``: a generated index of the paper's shape, and its table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from asr_core.bench.data import PAPER_HOURS, PAPER_RECORDINGS, PAPER_WORDS, generate_index
from asr_core.data.corpora import load_corpus


def test_the_generated_index_has_the_papers_shape_at_its_fraction(tmp_path: Path) -> None:
    manifest = generate_index(tmp_path / "index", 0.002)
    assert manifest["recordings"] == round(PAPER_RECORDINGS * 0.002)
    assert abs(manifest["words"] / (PAPER_WORDS * 0.002) - 1) < 0.1
    assert abs(manifest["hours"] / (PAPER_HOURS * 0.002) - 1) < 0.15
    corpus = load_corpus(f"podcasts=prepared:{tmp_path / 'index'}")
    rec = corpus[7]
    starts = [w.start for w in rec.words]
    assert rec.timed and starts == sorted(starts) and rec.words[-1].end <= rec.duration


def test_bench_data_prints_every_row_with_its_figure(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "asr_core", "bench", "data", "--fraction", "0.002", "--audio-s", "3"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = {m.group(1).strip(): m.group(2) for m in re.finditer(r"^(\S.{0,43}?)\s{2,}([\d.]+)", p.stdout, re.M)}
    for what in ("resident bytes/word (private + mapped)", "reader's Word objects today, bytes/word", "index load",
                 "trial data start-up", "loader, one worker, 44.1 kHz OGG Vorbis", "loader, one worker, OGG by window"):
        assert what in rows, (what, p.stdout)
    assert float(rows["reader's Word objects today, bytes/word"]) > 100  # what the prepared index replaces
    assert "measured on 9" in p.stdout  # a fraction is extrapolated to the paper's size, and says so
