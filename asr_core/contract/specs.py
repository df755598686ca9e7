"""The dataset-spec grammar: ``FORMAT:PATH`` names a corpus on disk, ``NAME=FORMAT:PATH`` a named one.

Parsing a spec reads nothing: the planner, the dispatcher and the report check and name corpora here without
importing the readers (:mod:`asr_core.data.corpora`, which maps each format to the module that reads it). A spec
that does not parse raises :class:`CorpusError`, the error of every corpus problem.
"""

from __future__ import annotations

from pathlib import Path

# The corpus formats a spec may name, in the order error messages list them; asr_core.data.corpora reads each with
# the module of the same name, or names the module and function (earnings22-authors: the Earnings-22 reader with the
# authors' preparation of the reference words).
CORPUS_FORMATS: tuple[str, ...] = ("podcast", "tedlium", "earnings22", "earnings22-authors", "rev16", "manifest",
                                   "prepared")


class CorpusError(ValueError):
    """A corpus file is missing, corrupt or truncated; the message names the file and the line."""


def split_spec(spec: str) -> tuple[str, Path]:
    """``"podcast:data/dev"`` -> ``("podcast", Path("data/dev"))``; a bad spec raises :class:`CorpusError`."""
    fmt, sep, path = spec.partition(":")
    if not sep or not path:
        raise CorpusError(f"corpus spec {spec!r} must look like FORMAT:PATH, e.g. 'podcast:data/dev'; "
                          f"formats: {', '.join(CORPUS_FORMATS)}")
    if fmt not in CORPUS_FORMATS:
        raise CorpusError(f"corpus spec {spec!r}: unknown format {fmt!r}; valid: {', '.join(CORPUS_FORMATS)}")
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


def corpus_spec_problem(spec: str, *, named: bool = False) -> str | None:
    """What is wrong with a corpus spec (``NAME=FORMAT:PATH`` when ``named``, else ``[NAME=]FORMAT:PATH``), or None
    when it parses: for validators that raise their own error (a config field names itself)."""
    if not isinstance(spec, str):
        return f"corpus spec {spec!r} is not a string"
    try:
        (parse_dataset_spec if named else split_named_spec)(spec)
    except CorpusError as e:
        return str(e)
    return None


def dataset_name(spec: str) -> str:
    """The name of a corpus spec, without parsing or reading it: ``NAME`` of ``NAME=FORMAT:PATH``, ``""`` for an
    unnamed ``FORMAT:PATH``.

    The name is the corpus's identity in trial keys (:mod:`asr_core.contract.identity`): its path and file format may change
    (a move to another filesystem, a prepared copy), its name may not. An unnamed training corpus is "the" corpus of
    its trials: moving it keeps their keys, and its content fingerprint, checked on every resume, tells it apart from
    another one. Name corpora to compare them in one sweep."""
    head, sep, _ = spec.partition("=")
    return head if sep and head and not any(c in head for c in "/: ") else ""
