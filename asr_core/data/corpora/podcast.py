"""Spotify podcast transcripts: Google speech-API JSON with word times (paper 000 §3.1's training data).

One ``*.json`` per episode, anywhere below ``PATH``::

    {"results": [
      {"alternatives": [{"transcript": "Hello and welcome.", "confidence": 0.91,
                         "words": [{"startTime": "0.600s", "endTime": "1s", "word": "Hello"}, ...]}]},
      ...,
      {"alternatives": [{"words": [{"startTime": "0.600s", "endTime": "1s", "word": "Hello", "speakerTag": 1},
                                   ...]}]}]}

Only the first (best) alternative of each result is used. The Spotify release ends every file with one extra
result that repeats *all* words with speaker tags and no transcript; it is recognised and not counted twice (its
speaker tags go into ``Recording.meta['speakers']``). Times are protobuf durations (``"1.200s"``); a missing time
is protobuf's zero. Audio is the file with the same stem beside the JSON (``.wav``, ``.ogg``, ...), or, in the
Spotify layout, the same relative path under ``podcasts-audio/`` instead of ``podcasts-transcripts/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from asr_core.data.corpora.base import (Problems, Recording, Word, check_words, find_audio, probe_duration,
                                   transcript_duration)

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d*)?)s\s*$")


def parse_time(value: Any) -> float:
    """``"1.200s"`` -> 1.2; a missing value (None) is protobuf's default, 0 s."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"time {value!r} is not a duration like '1.200s'")
    return float(m.group(1))


def format_time(seconds: float) -> str:
    """1.2 -> ``"1.200s"`` (millisecond resolution, as written by the speech API)."""
    return f"{seconds:.3f}s"


def read(path: Path, problems: Problems, *, audio: bool = True) -> list[Recording]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.json") if p.is_file())
    if not files:
        problems.bad(path, "no *.json transcripts found")
    out = []
    for f in files:
        rec = read_file(f, path if path.is_dir() else f.parent, problems, audio=audio)
        if rec is not None:
            out.append(rec)
    return sorted(out, key=lambda r: r.id)


def read_file(f: Path, root: Path, problems: Problems, *, audio: bool = True) -> Recording | None:
    """One episode, or None after reporting why it cannot be used. Without ``audio`` no audio is required or
    opened: the duration is the last word's end and the audio path the file found (or an empty path)."""
    try:
        obj = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        problems.bad(f, f"cannot read: {e}")
        return None
    except json.JSONDecodeError as e:
        problems.bad(f, f"not valid JSON ({e.msg} at line {e.lineno}); truncated or corrupt")
        return None
    try:
        words, speakers = parse_results(obj)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        problems.bad(f, f"not a speech-API transcript: {e}")
        return None
    rel = f.relative_to(root).with_suffix("") if f.is_relative_to(root) else Path(f.stem)
    meta: dict[str, Any] = {"transcript": str(f)}
    if speakers:
        meta["speakers"] = speakers
    found = _audio_for(f)
    if not audio:
        return Recording(rel.as_posix(), found or Path(""), transcript_duration(words), tuple(words), (), meta)
    if found is None:
        problems.bad(f, f"no audio file beside it ({f.with_suffix('.*').name}) or under podcasts-audio/")
        return None
    duration = probe_duration(found, problems, f)
    if duration is None or not check_words(words, duration, f, problems):
        return None
    return Recording(rel.as_posix(), found, duration, tuple(words), (), meta)


def parse_results(obj: dict[str, Any]) -> tuple[list[Word], list[int]]:
    """Words in time order and (when the file has them) one speaker tag per word."""
    if not isinstance(obj, dict) or not isinstance(obj.get("results"), list):
        raise ValueError("top level must be an object with a 'results' list")
    segments: list[list[dict[str, Any]]] = []
    summary: list[dict[str, Any]] | None = None
    results = obj["results"]
    for i, result in enumerate(results):
        alts = result.get("alternatives") or []
        if not alts:
            continue
        best = alts[0]
        ws = best.get("words") or []
        is_summary = (i == len(results) - 1 and "transcript" not in best and ws
                      and all("speakerTag" in w for w in ws))
        if is_summary and any(segments):
            summary = ws
        else:
            segments.append(ws)
    raw = [w for seg in segments for w in seg]
    words = []
    for w in raw:
        text = w["word"]
        if not isinstance(text, str):
            raise ValueError(f"word {w!r}: 'word' must be a string")
        if not text.strip():
            continue
        start, end = parse_time(w.get("startTime")), parse_time(w.get("endTime"))
        words.append(Word(text.strip(), start, end))
    speakers: list[int] = []
    if summary is not None and len(summary) == len(raw):
        speakers = [int(w.get("speakerTag", 0)) for w in summary if str(w.get("word", "")).strip()]
    return words, speakers


def _audio_for(f: Path) -> Path | None:
    found = find_audio(f.with_suffix(""))
    if found is not None:
        return found
    parts = list(f.parts)
    if "podcasts-transcripts" in parts:
        parts[len(parts) - 1 - parts[::-1].index("podcasts-transcripts")] = "podcasts-audio"
        return find_audio(Path(*parts).with_suffix(""))
    return None


def write(path: Path, words: list[Word], *, starts: list[int] | tuple[int, ...] = (),
          speakers: list[int] | None = None) -> None:
    """Write a transcript in the speech-API layout: one result per chunk (a new chunk at every index in
    ``starts`` and at every change of ``speakers``), then the Spotify-style summary repeating all words with
    speaker tags (1 for every word when ``speakers`` is None). Written atomically."""
    breaks = set(starts)
    chunks: list[list[int]] = []
    for i in range(len(words)):
        if not chunks or i in breaks or (speakers is not None and speakers[i] != speakers[i - 1]):
            chunks.append([])
        chunks[-1].append(i)

    def entry(i: int, tag: bool) -> dict[str, Any]:
        w = words[i]
        d = {"startTime": format_time(w.start or 0.0), "endTime": format_time(w.end or 0.0), "word": w.text}
        if tag:
            d["speakerTag"] = (speakers[i] if speakers else 1)
        return d

    results = [{"alternatives": [{"transcript": " ".join(words[i].text for i in c), "confidence": 1.0,
                                  "words": [entry(i, False) for i in c]}]} for c in chunks]
    if words:
        results.append({"alternatives": [{"words": [entry(i, True) for i in range(len(words))]}]})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"results": results}, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(path)
