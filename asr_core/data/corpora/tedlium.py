"""TED-LIUM: ``PATH/stm/<talk>.stm`` transcripts and ``PATH/sph/<talk>.sph`` audio.

Release: the reader expects one split's folder of any release, e.g. ``TEDLIUM_release1/test`` or
``TEDLIUM_release-3/legacy/test``. The paper cites TED-LIUM 3, but its numbers come from release 1: the authors'
``eval/tedlium/run.py`` (``robflynnyh/long-context-asr`` v1.0) reads ``TEDLIUM_release1/test/`` and ``dev/``. Release
3's ``legacy`` partition is release 2's; that its test transcripts equal release 1's line for line is not checked
here, so read release 1 (``tedlium:TEDLIUM_release1/test``) to reproduce the paper's numbers.

STM lines are ``talk channel speaker start end <label> transcript``; ``;;`` lines are comments. A segment whose
transcript is ``ignore_time_segment_in_scoring`` is untranscribed (adverts, music, other speakers): it becomes an
``ignore`` region, zeroed in the features before decoding (paper 000 §3.1), and contributes no reference words.
As the authors zeroed it (``lcasr/eval/utils.py`` ``zero_out_spectogram``, ``buffer=-0.5``), the region is the
segment shrunk by :data:`IGNORE_SHRINK_S` at both ends, ``[start + 0.5, end - 0.5]``; a segment of 1 s or less
leaves no region (their frame slice is then empty). A talk's duration read without audio still reaches the
segment's end.

The segments of a talk are joined in time order into one long recording; TED-LIUM splits clitics off their word
(``i 'd``, ``it 's``), which are rejoined (``i'd``, ``it's``) as the authors did (only true clitics). Word times
are not in the format (only segment times, kept in ``meta['segments']``), so words are untimed.
"""

from __future__ import annotations

import re
from pathlib import Path

from asr_core.data.corpora.base import Problems, Recording, Word, find_audio, probe_duration, transcript_duration

IGNORE = "ignore_time_segment_in_scoring"
IGNORE_SHRINK_S = 0.5  # seconds taken off both ends of an ignored segment before it is zeroed
# "i 'd" -> "i'd". The authors joined any " '<letter>"; limiting it to the English clitics keeps words that
# start with an apostrophe ("'cause", "'em") apart from the word before them.
_CLITIC = re.compile(r"(?<=\S) '(?=(?:s|re|ve|m|d|ll|t)\b)", re.IGNORECASE)


def rejoin_clitics(text: str) -> str:
    return _CLITIC.sub("'", " ".join(text.split()))


def ignore_region(start: float, end: float) -> tuple[float, float] | None:
    """The region zeroed for an ignored segment ``start``-``end``: shrunk by :data:`IGNORE_SHRINK_S` at both ends,
    None when nothing is left."""
    a, b = start + IGNORE_SHRINK_S, end - IGNORE_SHRINK_S
    return (a, b) if b > a else None


def read(path: Path, problems: Problems, *, audio: bool = True) -> list[Recording]:
    stm_dir = path / "stm" if (path / "stm").is_dir() else path
    sph_dir = path / "sph" if (path / "sph").is_dir() else stm_dir
    files = [path] if path.is_file() else sorted(stm_dir.glob("*.stm"))
    if not files:
        problems.bad(path, "no *.stm transcripts found (expected PATH/stm/*.stm and PATH/sph/*.sph)")
    out: list[Recording] = []
    seen_audio: set[Path] = set()
    for f in files:
        for rec in read_stm(f, sph_dir if not path.is_file() else f.parent.parent / "sph", problems, audio=audio):
            out.append(rec)
            seen_audio.add(rec.audio.resolve())
    if audio and path.is_dir() and sph_dir.is_dir():
        for sph in sorted(sph_dir.glob("*.sph")):  # audio without a transcript is a missing file, not nothing
            if sph.resolve() not in seen_audio and not (stm_dir / f"{sph.stem}.stm").exists():
                problems.bad(sph, f"no transcript {stm_dir / (sph.stem + '.stm')}")
    return sorted(out, key=lambda r: r.id)


def read_stm(f: Path, sph_dir: Path, problems: Problems, *, audio: bool = True) -> list[Recording]:
    """The talks of one STM file. Without ``audio`` no audio is required or opened: the duration is the last
    segment's end and the audio path the file found (or an empty path)."""
    try:
        lines = f.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        problems.bad(f, f"cannot read: {e}")
        return []
    talks: dict[str, list[tuple[float, float, str]]] = {}
    ignores: dict[str, list[tuple[float, float]]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith(";;"):
            continue
        parts = line.split(None, 6)
        if len(parts) < 6:
            problems.bad(f"{f}:{n}", f"truncated STM line (need talk channel speaker start end <label> text): "
                                     f"{line[:60]!r}")
            return []
        talk, _chan, _spk, start_s, end_s, label = parts[:6]
        text = parts[6] if len(parts) > 6 else ""
        if not label.startswith("<"):  # a line without the <label> field: the label is the first text word
            text = f"{label} {text}".strip()
        try:
            start, end = float(start_s), float(end_s)
            if end < start:
                raise ValueError("end before start")
        except ValueError as e:
            problems.bad(f"{f}:{n}", f"bad segment times {start_s!r} {end_s!r}: {e}")
            return []
        if text.strip() == IGNORE:
            ignores.setdefault(talk, []).append((start, end))
        else:
            talks.setdefault(talk, []).append((start, end, text))
    out = []
    for talk in sorted(set(talks) | set(ignores)):
        found = find_audio(sph_dir / talk, (".sph", ".wav", ".flac"))
        segments = sorted(talks.get(talk, []))
        spans = sorted(ignores.get(talk, []))
        ignored = tuple(r for s, e in spans if (r := ignore_region(s, e)) is not None)
        if not audio:
            duration = transcript_duration((), *(e for _, e, _ in segments), *(e for _, e in spans))
        else:
            if found is None:
                problems.bad(f, f"audio {sph_dir / (talk + '.sph')} not found")
                continue
            probed = probe_duration(found, problems, f)
            if probed is None:
                continue
            duration = probed
            if segments and segments[-1][1] > duration + 1.0:
                problems.bad(f, f"segment ending at {segments[-1][1]} s is past the end of {found} "
                                f"({duration:.2f} s)")
                continue
        text = rejoin_clitics(" ".join(t for _, _, t in segments))
        words = tuple(Word(w) for w in text.split())
        meta = {"segments": [[s, e] for s, e, _ in segments], "transcript": str(f)}
        out.append(Recording(talk, found or Path(""), duration, words, ignored, meta))
    return out
