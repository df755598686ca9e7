"""Corpus readers: ``load_corpus("FORMAT:PATH")`` turns a corpus on disk into a list of :class:`Recording`.

Formats (see ../shared/REFERENCE.md, "Data formats"):

- ``podcast``    Spotify podcast transcripts (Google speech-API JSON, word times), audio beside each JSON; also the
                 layout written by ``python -m asr_core synth``.
- ``tedlium``    TED-LIUM ``stm/`` + ``sph/`` (segments joined into talks, ignored segments kept as regions to zero).
- ``earnings22`` Earnings-22 as released: the reference ``.nlp`` files of ``transcripts/nlp_references`` (other copies
                 named and not read), audio in ``media/``.
- ``earnings22-authors`` the same, the words prepared as the authors did for the paper's numbers ("3.5" -> "35",
                 "U.S." -> "us", hyphens split; :mod:`asr_core.data.corpora.earnings22`).
- ``rev16``      Rev16 as released: the 16 evaluation file numbers, verbatim transcripts unless the spec points at
                 the nonverbatim folder.
- ``manifest``   a JSON-lines file, one recording per line.
- ``prepared``   a corpus stored by ``python -m asr_core prepare`` (memory-mapped; :mod:`asr_core.data.corpora.prepared`).

A file that is missing, corrupt or truncated is named in a :class:`CorpusError` (``strict=True``) or reported on
stderr and skipped (the default); a reader never drops a recording without saying so. A flaw a reader works around
(an unreadable word time in an ``.nlp`` file: the word is kept untimed) is a warning on stderr (``strict``: an error).

``audio=False`` reads transcripts only, for scoring text against them (``python -m asr_core score``): no audio file
is required or opened, a recording's duration is its transcript's (the last word or segment end, 0.0 when untimed)
and its audio path the file the reader found (an empty path when there is none). Training and evaluation read with
audio (the default).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

from asr_core.contract.specs import CORPUS_FORMATS, CorpusError, split_named_spec, split_spec
from asr_core.data.corpora.base import Problems, Recording, Word

__all__ = ["CorpusError", "CorpusReport", "FORMATS", "Recording", "Word", "load_corpus", "read_corpus"]

# format name -> module holding ``read(path: Path, problems: Problems[, *, audio: bool]) -> list[Recording]``, or
# ``module:function`` for a reader of another name (the format names and the spec grammar: asr_core.contract.specs)
READERS: dict[str, str] = {"earnings22-authors": "asr_core.data.corpora.earnings22:read_authors"}
FORMATS: dict[str, str] = {fmt: READERS.get(fmt, f"asr_core.data.corpora.{fmt}") for fmt in CORPUS_FORMATS}


def reader(fmt: str) -> Callable[..., Sequence[Recording]]:
    """The function that reads format ``fmt`` (a key of :data:`FORMATS`)."""
    module, _, function = FORMATS[fmt].partition(":")
    return getattr(importlib.import_module(module), function or "read")


@dataclass
class CorpusReport:
    """What a reader produced: the recordings, and every file it could not use with the reason."""

    spec: str
    recordings: Sequence[Recording]  # a list, or a PreparedCorpus built on access
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (file, what was worked around)
    notes: list[str] = field(default_factory=list)  # what the reader chose not to read, and why


def read_corpus(spec: str, *, strict: bool = False, audio: bool = True) -> CorpusReport:
    """Read a corpus (``[NAME=]FORMAT:PATH``) and say what was skipped. Raises :class:`CorpusError` if the path
    itself does not exist, if nothing at all could be read, or (``strict``) at the first bad file or warning.
    ``audio=False``: transcripts only (see the module's docstring)."""
    spec = split_named_spec(spec)[1]
    fmt, path = split_spec(spec)
    if not path.exists():
        raise CorpusError(f"corpus spec {spec!r}: {path} does not exist")
    problems = Problems(spec, strict=strict)
    read = reader(fmt)
    if audio or "audio" not in inspect.signature(read).parameters:  # a prepared corpus opens no audio
        recordings = read(path, problems)
    else:
        recordings = read(path, problems, audio=False)
    ids = getattr(recordings, "ids", None) or [r.id for r in recordings]  # a prepared corpus: without building
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise CorpusError(f"corpus {spec!r}: recording ids are not unique: {', '.join(dup[:5])}")
    if problems.items or problems.warnings:
        warned = f", {len(problems.warnings)} files with warnings" if problems.warnings else ""
        print(f"corpus {spec}: read {len(recordings)} recordings, skipped {len(problems.items)} bad files{warned}",
              file=sys.stderr)
    if not recordings:
        detail = f" ({len(problems.items)} bad files, first: {problems.items[0][0]}: {problems.items[0][1]})" \
            if problems.items else ""
        raise CorpusError(f"corpus {spec!r}: no recordings found under {path}{detail}")
    return CorpusReport(spec, recordings, list(problems.items), list(problems.warnings), list(problems.notes))


def load_corpus(spec: str, *, strict: bool = False, audio: bool = True) -> Sequence[Recording]:
    """The recordings of ``spec = "[NAME=]FORMAT:PATH"`` in a fixed order (by id; Rev16 by file number); see
    :func:`read_corpus` for errors and ``audio``."""
    return read_corpus(spec, strict=strict, audio=audio).recordings
