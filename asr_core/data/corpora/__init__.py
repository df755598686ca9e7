"""Corpus readers: ``load_corpus("FORMAT:PATH")`` turns a corpus on disk into a list of :class:`Recording`.

Formats (see ../shared/REFERENCE.md, "Data formats"):

- ``podcast``    Spotify podcast transcripts (Google speech-API JSON, word times), audio beside each JSON; also the
                 layout written by ``python -m asr_core synth``.
- ``tedlium``    TED-LIUM ``stm/`` + ``sph/`` (segments joined into talks, ignored segments kept as regions to zero).
- ``earnings22`` Earnings-22 as released: the reference ``.nlp`` files of ``transcripts/nlp_references`` (other copies
                 named and not read), audio in ``media/``.
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
from pathlib import Path
from typing import Sequence

from asr_core.data.corpora.base import CorpusError, Problems, Recording, Word

__all__ = ["CorpusError", "CorpusReport", "FORMATS", "Recording", "Word", "load_corpus", "read_corpus",
           "parse_dataset_spec", "split_named_spec", "dataset_name"]

# format name -> module holding ``read(path: Path, problems: Problems[, *, audio: bool]) -> list[Recording]``
FORMATS: dict[str, str] = {
    "podcast": "asr_core.data.corpora.podcast",
    "tedlium": "asr_core.data.corpora.tedlium",
    "earnings22": "asr_core.data.corpora.earnings22",
    "rev16": "asr_core.data.corpora.rev16",
    "manifest": "asr_core.data.corpora.manifest",
    "prepared": "asr_core.data.corpora.prepared",
}


@dataclass
class CorpusReport:
    """What a reader produced: the recordings, and every file it could not use with the reason."""

    spec: str
    recordings: Sequence[Recording]  # a list, or a PreparedCorpus built on access
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (file, what was worked around)
    notes: list[str] = field(default_factory=list)  # what the reader chose not to read, and why


def split_spec(spec: str) -> tuple[str, Path]:
    """``"podcast:data/dev"`` -> ``("podcast", Path("data/dev"))``; a bad spec raises :class:`CorpusError`."""
    fmt, sep, path = spec.partition(":")
    if not sep or not path:
        raise CorpusError(f"corpus spec {spec!r} must look like FORMAT:PATH, e.g. 'podcast:data/dev'; "
                          f"formats: {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise CorpusError(f"corpus spec {spec!r}: unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    return fmt, Path(path)


def parse_dataset_spec(spec: str) -> tuple[str, str]:
    """``"dev=podcast:data/dev"`` -> ``("dev", "podcast:data/dev")`` (the name is used in metric keys)."""
    name, sep, corpus = spec.partition("=")
    if not sep or not name or not corpus:
        raise CorpusError(f"dataset spec {spec!r} must look like NAME=FORMAT:PATH, e.g. 'dev=podcast:data/dev'")
    if any(c in name for c in "/ :"):
        raise CorpusError(f"dataset spec {spec!r}: the name {name!r} may not contain '/', ':' or spaces "
                          "(it becomes part of metric keys and file names)")
    split_spec(corpus)
    return name, corpus


def split_named_spec(spec: str) -> tuple[str, str]:
    """``"podcasts=podcast:/data/train"`` -> ``("podcasts", "podcast:/data/train")``; ``"podcast:/data/train"`` ->
    ``("", "podcast:/data/train")`` (an unnamed corpus). Only text before the first ``=`` that holds no ``:``, ``/``
    or space is a name, so paths containing ``=`` still work."""
    name = dataset_name(spec)
    corpus = spec.partition("=")[2] if name else spec
    split_spec(corpus)
    return name, corpus


def dataset_name(spec: str) -> str:
    """The name of a corpus spec, without parsing or reading it: ``NAME`` of ``NAME=FORMAT:PATH``, ``""`` for an
    unnamed ``FORMAT:PATH``.

    The name is the corpus's identity in trial keys (:mod:`asr_core.identity`): its path and file format may change
    (a move to another filesystem, a prepared copy), its name may not. An unnamed training corpus is "the" corpus of
    its trials: moving it keeps their keys, and its content fingerprint, checked on every resume, tells it apart from
    another one. Name corpora to compare them in one sweep."""
    head, sep, _ = spec.partition("=")
    return head if sep and head and not any(c in head for c in "/: ") else ""


def read_corpus(spec: str, *, strict: bool = False, audio: bool = True) -> CorpusReport:
    """Read a corpus (``[NAME=]FORMAT:PATH``) and say what was skipped. Raises :class:`CorpusError` if the path
    itself does not exist, if nothing at all could be read, or (``strict``) at the first bad file or warning.
    ``audio=False``: transcripts only (see the module's docstring)."""
    spec = split_named_spec(spec)[1]
    fmt, path = split_spec(spec)
    if not path.exists():
        raise CorpusError(f"corpus spec {spec!r}: {path} does not exist")
    problems = Problems(spec, strict=strict)
    module = importlib.import_module(FORMATS[fmt])
    if audio or "audio" not in inspect.signature(module.read).parameters:  # a prepared corpus opens no audio
        recordings = module.read(path, problems)
    else:
        recordings = module.read(path, problems, audio=False)
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
