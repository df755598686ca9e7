"""Rev16: the 16 podcast episodes Whisper's paper chose from Rev's podcast benchmark (paper 000 §3.1), the
project's in-domain long-form test set, read from the release as downloaded (``rev16:ROOT``).

The release (``rev16/`` of github.com/revdotcom/speech-datasets) holds each episode twice::

    verbatim_transcripts/nlp_references/<number>.nlp       what was said, fillers and repetitions included  <- read
    verbatim_transcripts/normalizations/<number>.norm.json
    nonverbatim_transcripts/nlp_references/<number>.nlp    lightly edited for readability
    nonverbatim_transcripts/normalizations/<number>.norm.json
    podcasts.csv                                           file number, show, episode, where the MP3 is

``rev16:ROOT`` (ROOT the release's ``rev16/`` or the repository holding it) reads the **verbatim** transcripts: they
are the ones Whisper's paper scored (the release's README: "Radford et al., 2023 covers the verbatim transcripts"),
and says so once on stderr. For the nonverbatim ones point the spec at their folder:
``rev16:ROOT/nonverbatim_transcripts`` (any folder without the release layout reads every ``<number>.nlp`` below it;
a file number found twice there is reported and the second file skipped).

The audio is not in the repository: ``podcasts.csv`` names each episode's MP3 (``<number>.mp3``, also on Hugging
Face as ``sanchit-gandhi/rev16_csv``). Put the files in ``ROOT/media/`` (or ``ROOT/audio/``, or beside the
transcripts); they are looked for as in :mod:`asr_core.data.corpora.earnings22`.

Transcripts are in the Earnings-22 ``.nlp`` layout plus ``wer_tags|confidence`` columns (see
:mod:`asr_core.data.corpora.earnings22`). Only the 16 evaluation file numbers are read; other episodes in the folder
are listed on stderr as not part of Rev16, and a missing one of the 16 is reported like any bad file.
"""

from __future__ import annotations

from pathlib import Path

from asr_core.data.corpora.base import Problems, Recording
from asr_core.data.corpora.earnings22 import audio_dirs_for, read_nlp_recording, rel_path, release_files

FILE_NUMBERS = (3, 4, 9, 10, 11, 14, 17, 18, 20, 21, 23, 24, 26, 27, 29, 32)
# the verbatim references of the release, relative to the PATH given (ROOT = rev16/ or the repository)
REFERENCE_DIRS = ("verbatim_transcripts/nlp_references", "rev16/verbatim_transcripts/nlp_references")


def _number(stem: str) -> int | None:
    return int(stem) if stem.isdigit() else None


def read(path: Path, problems: Problems, *, audio: bool = True) -> list[Recording]:
    files, ref, which = release_files(path, REFERENCE_DIRS)
    if ref is not None:
        problems.note(f"Rev16: reading the VERBATIM transcripts (what Whisper's paper scored): "
                      f"{which or rel_path(ref, path) + '/'}; for the nonverbatim ones give "
                      f"rev16:{ref.parent.parent / 'nonverbatim_transcripts'}")
    root = path if path.is_dir() else path.parent
    by_number: dict[int, Path] = {}
    others: list[str] = []
    for f in files:
        n = _number(f.stem)
        if n in FILE_NUMBERS:
            if n in by_number:
                problems.bad(f, f"Rev16 file number {n} appears twice (also {by_number[n]}); point the spec at "
                                f"one folder of transcripts")
                continue
            by_number[n] = f
        else:
            others.append(f.name)
    if others:
        problems.note(f"{len(others)} transcripts are not among the 16 Rev16 files and are not read "
                      f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''})")
    out = []
    for n in FILE_NUMBERS:
        f = by_number.get(n)
        if f is None:
            if path.is_dir():
                problems.bad((ref or path) / f"{n}.nlp", "Rev16 transcript missing")
            continue
        rec = read_nlp_recording(f, str(n), audio_dirs_for(f, root), problems, audio=audio)
        if rec is not None:
            out.append(rec)
    return out
