"""The plain manifest: JSON lines, one recording per line.

Each line is an object::

    {"id": "talk1", "audio": "audio/talk1.wav",            # relative paths are relative to the manifest file
     "duration": 612.3,                                     # optional; read from the audio header when absent
     "words": [{"text": "hello", "start": 0.51, "end": 0.9}, ...],   # or "text": "hello world" (untimed)
     "ignore": [[12.0, 15.5]],                              # optional untranscribed regions, seconds
     ...}                                                   # any other keys are kept in Recording.meta

``PATH`` is a ``.jsonl`` file or a folder whose ``*.jsonl`` files are read in name order. A line that is not valid
JSON (e.g. a truncated last line), lacks ``id``/``audio``, or names a missing audio file is reported by file and
line number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from asr_core.data.corpora.base import Problems, Recording, Word, check_words, probe_duration, transcript_duration

KNOWN_KEYS = {"id", "audio", "duration", "words", "text", "ignore"}


def read(path: Path, problems: Problems, *, audio: bool = True) -> list[Recording]:
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        problems.bad(path, "folder holds no *.jsonl manifest")
    out: list[Recording] = []
    for f in files:
        try:
            lines = f.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            problems.bad(f, f"cannot read manifest: {e}")
            continue
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            rec = _parse_line(line, f, n, problems, audio=audio)
            if rec is not None:
                out.append(rec)
    return sorted(out, key=lambda r: r.id)


def _parse_line(line: str, f: Path, n: int, problems: Problems, *, audio: bool = True) -> Recording | None:
    """One recording. Without ``audio`` the audio file is neither required nor opened: the duration is the line's
    ``duration``, else the last word's end (0.0 when untimed)."""
    where = f"{f}:{n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        problems.bad(where, f"not valid JSON ({e.msg}); truncated or corrupt line")
        return None
    if not isinstance(obj, dict):
        problems.bad(where, "each line must be a JSON object")
        return None
    missing = [k for k in ("id", "audio") if not obj.get(k)]
    if missing:
        problems.bad(where, f"missing key(s) {', '.join(missing)}; needed: id, audio, and words or text")
        return None
    audio_path = Path(obj["audio"])
    if not audio_path.is_absolute():
        audio_path = f.parent / audio_path
    try:
        words = _words(obj)
        ignore = tuple((float(a), float(b)) for a, b in obj.get("ignore") or ())
    except (TypeError, ValueError, KeyError) as e:
        problems.bad(where, f"bad 'words', 'text' or 'ignore': {e}")
        return None
    if "duration" in obj:
        try:
            duration = float(obj["duration"])
            if not duration > 0 or not math.isfinite(duration):
                raise ValueError(duration)
        except (TypeError, ValueError):
            problems.bad(where, f"'duration' must be a positive number of seconds, got {obj['duration']!r}")
            return None
        if audio and not audio_path.is_file():
            problems.bad(where, f"audio file {audio_path} not found")
            return None
    elif not audio:
        duration = transcript_duration(words)
    else:
        probed = probe_duration(audio_path, problems, where)
        if probed is None:
            return None
        duration = probed
    if audio and not check_words(words, duration, where, problems):
        return None
    meta = {k: v for k, v in obj.items() if k not in KNOWN_KEYS}
    return Recording(str(obj["id"]), audio_path, duration, tuple(words), ignore, meta)


def _words(obj: dict[str, Any]) -> list[Word]:
    if "words" in obj:
        out = []
        for w in obj["words"]:
            text = w.get("text", w.get("word"))
            if not isinstance(text, str):
                raise ValueError(f"word {w!r} has no 'text'")
            start, end = w.get("start"), w.get("end")
            out.append(Word(text, None if start is None else float(start), None if end is None else float(end)))
        return out
    text = obj.get("text", "")
    if not isinstance(text, str):
        raise ValueError(f"'text' must be a string, got {type(text).__name__}")
    return [Word(t) for t in text.split()]


def write(path: Path, recordings: list[Recording]) -> None:
    """Write ``recordings`` as a manifest (audio paths relative to the manifest when below it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in recordings:
            try:
                audio = str(Path(r.audio).resolve().relative_to(path.parent.resolve()))
            except ValueError:
                audio = str(r.audio)
            obj = {"id": r.id, "audio": audio, "duration": r.duration,
                   "words": [{"text": w.text, "start": w.start, "end": w.end} for w in r.words]}
            if r.ignore:
                obj["ignore"] = [list(x) for x in r.ignore]
            obj.update(r.meta)
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
