"""Earnings-22: one ``.nlp`` token file per call, read from the release as downloaded (``earnings22:ROOT``).

The release (``earnings22/`` of github.com/revdotcom/speech-datasets) holds, for its 125 calls::

    media/<id>.mp3                                             the audio (Git LFS)
    transcripts/nlp_references/<id>.nlp                        the reference transcripts      <- read
    transcripts/force_aligned_nlp_references/<id>.aligned.nlp  the same calls, verbalised and force-aligned
    transcripts/normalizations/<id>.norm.json                  alternative spellings for fstalign
    subset10/verbatim_transcripts/nlp_references/<id>.nlp     links to 10 of the references
    subset10/nonverbatim_transcripts/nlp_references/<id>.nlp  the same 10 calls, edited for readability
    subset10/media/<id>.mp3                                    links to 10 of the recordings

The reference is ``transcripts/nlp_references``: it is what the release's own results were scored against (its
``transcripts/README.md``), and what Whisper's paper scored (its ``data/README.md``: the repository's 202206 version,
before the force-aligned copies were added in September 2022). The force-aligned copies are another rendering of the
same speech (numbers and acronyms spelt out: ``2021`` becomes ``twenty twenty one``, ``KBFG`` becomes ``k b f g``),
with machine-made times; ``subset10`` repeats ten calls, once as links to the references and once in another
transcription style. Reading them too would score each call up to three times, so when ``ROOT`` (or ``ROOT/
earnings22``, or ``ROOT`` = ``transcripts/`` or ``subset10/``) holds such a reference folder, only that folder is read
and every other ``.nlp`` below ``ROOT`` is named once on stderr as not read. ``earnings22:`` a folder without that
layout (e.g. ``.../subset10/nonverbatim_transcripts``, a folder of your own, one ``.nlp`` file) reads every ``.nlp``
below it; a recording id is the file name without ``.nlp`` (and without ``.aligned``); a second file with an id
already read is reported and skipped, never silently preferred.

Audio ``<id>.mp3`` (or .wav, .flac, ...) is looked for beside the transcript, then in ``media/`` and ``audio/`` of
every folder from there up to ``ROOT`` and up to two folders above it (so ``earnings22:ROOT/transcripts`` still
finds ``ROOT/media``). A clone made without Git LFS holds small pointer files instead of the media; they are named
as such.

An ``.nlp`` file is pipe-separated, one token a line, with a header naming the columns, e.g.
``token|speaker|ts|endTs|punctuation|prepunctuation|case|tags`` (columns are found by name, so the Rev16 variant
with ``wer_tags|confidence`` reads the same way). ``ts``/``endTs`` are seconds and often empty (the references are
untimed); a time that is not a number makes its word untimed, with one warning per file naming the line and the
value (``strict``: an error). Non-speech tags written as tokens (``<inaudible>``, ``<crosstalk>``, ``<laugh>``,
``<noise>``, ``<silence>``, ``<affirmative>``, any ``<...>``) are stripped, as the authors did; the entity tags in the
``tags`` column are annotations, not words, and are ignored. Punctuation columns are dropped (the scorer normalises
both sides anyway).

Two preparations of the same words, told apart by the spec's format (the scorer applies Whisper's English
normaliser to both sides afterwards):

- ``earnings22:ROOT`` the tokens as released: ``3.5`` stays ``3.5`` and ``U.S.`` becomes ``u s`` under the
  normaliser, as Whisper's paper scored Earnings-22.
- ``earnings22-authors:ROOT`` the authors' preparation (``robflynnyh/long-context-asr`` v1.0,
  ``eval/earnings22_full/run.py`` and ``eval/earnings22/run.py``, ``preprocess_transcript``), which produced the
  paper's Earnings-22 numbers: each token lower-cased, the tags ``<silence> <inaudible> <laugh> <noise>
  <affirmative> <crosstalk>`` removed, ``…``, ``,``, ``?`` and every ``.`` deleted and ``-`` turned into a space
  (:func:`authors_text`). ``3.5`` becomes ``35``, ``U.S.`` ``us`` and ``year-over-year`` three words, which share
  the token's times. A token that leaves nothing is dropped. The authors applied these steps to a
  ``full_transcripts.json`` of their own (neither in the release nor in their repository); here they are applied
  to the release's tokens. The recordings' ``meta['preparation']`` says which preparation was read, and the
  dataset's content fingerprint (recorded with every evaluation) differs between the two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from asr_core.data.corpora.base import (Problems, Recording, Word, check_words, find_audio, probe_duration,
                                   transcript_duration)

_TAG = re.compile(r"^<[^<>]*>$")

# eval/earnings22_full/run.py preprocess_transcript (robflynnyh/long-context-asr v1.0): removed, in this order,
# after lower-casing; "-" becomes a space
AUTHORS_TAGS = ("<silence>", "<inaudible>", "<laugh>", "<noise>", "<affirmative>", "<crosstalk>")
AUTHORS_DELETED = ("\u2026", ",")
AUTHORS_DELETED_AFTER_HYPHEN = (".", "?")
PREPARATIONS = ("release", "authors")  # meta['preparation'] of earnings22: and earnings22-authors: recordings

# reference folders of the release, relative to the PATH given: the first that exists is read, nothing else
REFERENCE_DIRS = ("transcripts/nlp_references", "earnings22/transcripts/nlp_references",
                  "verbatim_transcripts/nlp_references", "nlp_references")
ABOVE_ROOT = 2  # folders above PATH searched for media/ and audio/


class NlpError(ValueError):
    pass


@dataclass
class Nlp:
    """A parsed ``.nlp`` file: words (tags stripped, times where readable), each word's speaker, and the
    ``(line, value)`` of every time field that is not a number (its word is untimed)."""

    words: list[Word]
    speakers: list[str]
    bad_times: list[tuple[int, str]] = field(default_factory=list)


def parse_nlp(text: str) -> Nlp:
    """Parse an ``.nlp`` file's text. Raises :class:`NlpError` for a missing header or a line with the wrong number
    of fields (a truncated or corrupt file); an unreadable time only makes its word untimed (listed in
    :attr:`Nlp.bad_times`)."""
    lines = text.splitlines()
    if not lines:
        raise NlpError("empty file (no header)")
    header = [h.strip() for h in lines[0].lstrip("\ufeff").split("|")]
    if "token" not in header:
        raise NlpError(f"header {lines[0]!r} has no 'token' column (expected e.g. token|speaker|ts|endTs|...)")
    col = {name: i for i, name in enumerate(header)}
    out = Nlp([], [])
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
        start = _time(fields, col.get("ts"), n, out.bad_times)
        end = _time(fields, col.get("endTs"), n, out.bad_times)
        if start is None or end is None:  # a half-timed word is as good as untimed
            start = end = None
        out.words.append(Word(token, start, end))
        out.speakers.append(fields[col["speaker"]].strip() if "speaker" in col else "")
    return out


def _time(fields: list[str], i: int | None, n: int, bad: list[tuple[int, str]]) -> float | None:
    if i is None or not fields[i].strip():
        return None
    try:
        value = float(fields[i])
    except ValueError:
        bad.append((n, fields[i]))
        return None
    if value != value or value in (float("inf"), float("-inf")):
        bad.append((n, fields[i]))
        return None
    return value


def recording_id(f: Path) -> str:
    """``4420696.nlp`` and ``4420696.aligned.nlp`` -> ``4420696``."""
    name = f.name[:-len(".nlp")] if f.name.endswith(".nlp") else f.stem
    return name[:-len(".aligned")] if name.endswith(".aligned") else name


def read_nlp_recording(f: Path, rec_id: str, audio_dirs: list[Path], problems: Problems, *,
                       audio: bool = True) -> Recording | None:
    """One recording from ``f`` and the first audio file named ``<rec_id>.*`` in ``audio_dirs``. Without ``audio``
    no audio is required or opened: the duration is the transcript's
    (:func:`~asr_core.data.corpora.base.transcript_duration`) and the audio path the file that was found, or an empty
    path."""
    try:
        nlp = parse_nlp(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        problems.bad(f, f"cannot read: {e}")
        return None
    except NlpError as e:
        problems.bad(f, str(e))
        return None
    if nlp.bad_times:
        line, value = nlp.bad_times[0]
        more = f" (and {len(nlp.bad_times) - 1} more time fields)" if len(nlp.bad_times) > 1 else ""
        problems.warn(f, f"line {line}: time {value!r} is not a number of seconds{more}; those words are kept "
                         f"untimed")
    found = next((a for d in audio_dirs if (a := find_audio(d / rec_id)) is not None), None)
    meta = {"speakers": nlp.speakers, "transcript": str(f)}
    if not audio:
        return Recording(rec_id, found or Path(""), transcript_duration(nlp.words), tuple(nlp.words), (), meta)
    if found is None:
        top = audio_dirs[-1].parent if len(audio_dirs) > 1 else f.parent
        problems.bad(f, f"no audio file {rec_id}.(mp3|wav|flac|...) beside it or in a media/ or audio/ folder of "
                        f"the folders from {f.parent} up to {top}")
        return None
    duration = probe_duration(found, problems, f)
    if duration is None or not check_words(nlp.words, duration, f, problems):
        return None
    return Recording(rec_id, found, duration, tuple(nlp.words), (), meta)


def audio_dirs_for(f: Path, root: Path) -> list[Path]:
    """Beside the transcript, then the ``media/`` and ``audio/`` folders of every folder up to ``root`` and
    :data:`ABOVE_ROOT` folders above it (a spec may point inside the release, e.g. at its ``transcripts/``)."""
    dirs = [f.parent]
    above = -1
    for up in [f.parent, *f.parent.parents]:
        dirs += [up / "media", up / "audio"]
        if up == root:
            above = 0
        elif above >= 0:
            above += 1
        if above >= ABOVE_ROOT:
            break
    return list(dict.fromkeys(dirs))


def release_files(path: Path, reference_dirs: tuple[str, ...]) -> tuple[list[Path], Path | None, str]:
    """The ``.nlp`` files to read below ``path``: those of the first of ``reference_dirs`` that exists, else every
    ``.nlp`` below ``path``. Returns the files, the reference folder used (None when ``path`` has no release
    layout) and what was read and what not, in words, for the one note on stderr ("" when nothing was left out)."""
    if path.is_file():
        return [path], None, ""
    ref = next((path / d for d in reference_dirs if (path / d).is_dir()), None)
    everything = sorted(p for p in path.rglob("*.nlp") if p.is_file())
    if ref is None:
        return everything, None, ""
    files = sorted(p for p in ref.glob("*.nlp") if p.is_file())
    chosen = set(files)
    others: dict[Path, int] = {}
    for p in everything:
        if p not in chosen:
            others[p.parent] = others.get(p.parent, 0) + 1
    listed = ", ".join(f"{rel_path(d, path)}/ ({n})" for d, n in sorted(others.items()))
    return files, ref, f"{rel_path(ref, path)}/ ({len(files)} files); not read: {listed}" if others else ""


def rel_path(p: Path, root: Path) -> str:
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(p)


def authors_text(text: str) -> str:
    """The authors' preparation of Earnings-22 reference text, before Whisper's normaliser: ``"U.S. 3.5
    year-over-year…"`` -> ``"us 35 year over year"`` (single spaces, no ends)."""
    text = text.lower()
    for tag in AUTHORS_TAGS:
        text = text.replace(tag, "")
    for ch in AUTHORS_DELETED:
        text = text.replace(ch, "")
    text = text.replace("-", " ")
    for ch in AUTHORS_DELETED_AFTER_HYPHEN:
        text = text.replace(ch, "")
    return " ".join(text.split())


def authors_words(words: Sequence[Word], speakers: Sequence[str]) -> tuple[tuple[Word, ...], list[str]]:
    """Each word through :func:`authors_text`, with its speaker: a word that splits keeps its times and speaker on
    every piece, one that vanishes is dropped."""
    out: list[tuple[Word, str]] = [(Word(piece, w.start, w.end), spk) for w, spk in zip(words, speakers, strict=True)
                                   for piece in authors_text(w.text).split()]
    return tuple(w for w, _ in out), [spk for _, spk in out]


def read(path: Path, problems: Problems, *, audio: bool = True, preparation: str = "release") -> list[Recording]:
    """The calls below ``path`` (see the module's docstring), their words prepared as ``preparation`` says: one of
    :data:`PREPARATIONS`."""
    if preparation not in PREPARATIONS:
        raise ValueError(f"preparation {preparation!r}: use one of {', '.join(PREPARATIONS)}")
    files, _, which = release_files(path, REFERENCE_DIRS)
    if which:
        problems.note(f"reading the reference transcripts in {which}")
    if not files:
        problems.bad(path, "no *.nlp transcripts found")
    root = path if path.is_dir() else path.parent
    out: dict[str, Recording] = {}
    source: dict[str, Path] = {}
    for f in files:
        rec_id = recording_id(f)
        if rec_id in source:
            problems.bad(f, f"recording {rec_id} is already read from {source[rec_id]} (another copy of the "
                            f"transcripts; point the spec at the folder you want)")
            continue
        source[rec_id] = f
        rec = read_nlp_recording(f, rec_id, audio_dirs_for(f, root), problems, audio=audio)
        if rec is not None:
            meta = {**rec.meta, "preparation": preparation}
            if preparation == "authors":
                words, meta["speakers"] = authors_words(rec.words, rec.meta["speakers"])
                rec = replace(rec, words=words)
            out[rec_id] = replace(rec, meta=meta)
    return [out[k] for k in sorted(out)]


def read_authors(path: Path, problems: Problems, *, audio: bool = True) -> list[Recording]:
    """``earnings22-authors:PATH``: :func:`read` with the authors' preparation of the words."""
    return read(path, problems, audio=audio, preparation="authors")
