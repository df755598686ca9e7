"""Rev16: the 16 podcast episodes Whisper's paper chose from Rev's podcast benchmark (paper 000 §3.1), the
project's in-domain long-form test set.

Transcripts are ``<number>.nlp`` files in the Earnings-22 ``.nlp`` layout plus ``wer_tags|confidence`` columns (see
:mod:`asr_core.corpora.earnings22`), anywhere below ``PATH``; audio ``<number>.mp3`` (or .wav, .flac, ...) beside
them or under ``audio/`` or ``media/``. Only the 16 evaluation file numbers are read; other episodes in the folder
are listed on stderr as not part of Rev16, and a missing one of the 16 is reported like any bad file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from asr_core.corpora.base import Problems, Recording
from asr_core.corpora.earnings22 import audio_dirs_for, read_nlp_recording

FILE_NUMBERS = (3, 4, 9, 10, 11, 14, 17, 18, 20, 21, 23, 24, 26, 27, 29, 32)


def _number(stem: str) -> int | None:
    return int(stem) if stem.isdigit() else None


def read(path: Path, problems: Problems) -> list[Recording]:
    files = [path] if path.is_file() else sorted(path.rglob("*.nlp"))
    root = path if path.is_dir() else path.parent
    by_number: dict[int, Path] = {}
    others: list[str] = []
    for f in files:
        n = _number(f.stem)
        if n in FILE_NUMBERS:
            if n in by_number:
                problems.bad(f, f"Rev16 file number {n} appears twice (also {by_number[n]})")
                continue
            by_number[n] = f
        else:
            others.append(f.name)
    if others:
        print(f"corpus rev16:{path}: {len(others)} transcripts are not among the 16 Rev16 files and are not read "
              f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''})", file=sys.stderr)
    out = []
    for n in FILE_NUMBERS:
        f = by_number.get(n)
        if f is None:
            if path.is_dir():
                problems.bad(path / f"{n}.nlp", "Rev16 transcript missing")
            continue
        rec = read_nlp_recording(f, str(n), audio_dirs_for(f, root), problems)
        if rec is not None:
            out.append(rec)
    return out
