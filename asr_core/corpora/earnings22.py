"""Earnings-22: one ``.nlp`` token file per call, audio beside it or under ``PATH/media/`` (the release layout is
``media/<id>.mp3`` and ``transcripts/nlp_references/<id>.nlp``).

An ``.nlp`` file is pipe-separated, one token a line, with a header naming the columns, e.g.
``token|speaker|ts|endTs|punctuation|prepunctuation|case|tags`` (columns are found by name, so the Rev16 variant
with ``wer_tags|confidence`` reads the same way). ``ts``/``endTs`` are seconds and often empty. Non-speech tags
written as tokens (``<inaudible>``, ``<crosstalk>``, ``<laugh>``, ``<noise>``, ``<silence>``, ``<affirmative>``, any
``<...>``) are stripped, as the authors did; the entity tags in the ``tags`` column are annotations, not words,
and are ignored. Punctuation columns are dropped (the scorer normalises both sides anyway).
"""

from __future__ import annotations

import re
from pathlib import Path

from asr_core.corpora.base import Problems, Recording, Word, check_words, find_audio, probe_duration

_TAG = re.compile(r"^<[^<>]*>$")


class NlpError(ValueError):
    pass


def parse_nlp(text: str) -> tuple[list[Word], list[str]]:
    """Words (tags stripped, times where given) and the speaker of each word. Raises :class:`NlpError`."""
    lines = text.splitlines()
    if not lines:
        raise NlpError("empty file (no header)")
    header = [h.strip() for h in lines[0].lstrip("\ufeff").split("|")]
    if "token" not in header:
        raise NlpError(f"header {lines[0]!r} has no 'token' column (expected e.g. token|speaker|ts|endTs|...)")
    col = {name: i for i, name in enumerate(header)}
    words, speakers = [], []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(header):
            raise NlpError(f"line {n} has {len(fields)} fields, the header has {len(header)} "
                           f"(truncated or corrupt): {line[:60]!r}")
        token = fields[col["token"]].strip()
        if not token or _TAG.match(token):
            continue
        start = _time(fields, col.get("ts"), n)
        end = _time(fields, col.get("endTs"), n)
        if start is None or end is None:  # a half-timed word is as good as untimed
            start = end = None
        words.append(Word(token, start, end))
        speakers.append(fields[col["speaker"]].strip() if "speaker" in col else "")
    return words, speakers


def _time(fields: list[str], i: int | None, n: int) -> float | None:
    if i is None or not fields[i].strip():
        return None
    try:
        return float(fields[i])
    except ValueError:
        raise NlpError(f"line {n}: time {fields[i]!r} is not a number of seconds") from None


def read_nlp_recording(f: Path, rec_id: str, audio_dirs: list[Path], problems: Problems) -> Recording | None:
    """One recording from ``f`` and the first audio file named ``<stem>.*`` in ``audio_dirs``."""
    try:
        words, speakers = parse_nlp(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        problems.bad(f, f"cannot read: {e}")
        return None
    except NlpError as e:
        problems.bad(f, str(e))
        return None
    audio = next((a for d in audio_dirs if (a := find_audio(d / f.stem)) is not None), None)
    if audio is None:
        problems.bad(f, f"no audio file {f.stem}.(mp3|wav|flac|...) in {', '.join(map(str, audio_dirs))}")
        return None
    duration = probe_duration(audio, problems, f)
    if duration is None or not check_words(words, duration, f, problems):
        return None
    return Recording(rec_id, audio, duration, tuple(words), (), {"speakers": speakers, "transcript": str(f)})


def audio_dirs_for(f: Path, root: Path) -> list[Path]:
    """Beside the transcript, then the release layout's ``media/`` and ``audio/`` folders up to ``root``."""
    dirs = [f.parent]
    for up in [f.parent, *f.parent.parents]:
        dirs += [up / "media", up / "audio"]
        if up == root:
            break
    return dirs


def read(path: Path, problems: Problems) -> list[Recording]:
    files = [path] if path.is_file() else sorted(path.rglob("*.nlp"))
    if not files:
        problems.bad(path, "no *.nlp transcripts found")
    root = path if path.is_dir() else path.parent
    out = []
    for f in files:
        rec = read_nlp_recording(f, f.stem, audio_dirs_for(f, root), problems)
        if rec is not None:
            out.append(rec)
    return sorted(out, key=lambda r: r.id)
