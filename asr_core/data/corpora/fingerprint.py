"""A corpus's content fingerprint: what a dataset *name* stands for, checked whenever a trial resumes.

Trial keys name datasets, not paths (``docs/ARCHITECTURE.md``, "Trial identity"), so a corpus can move to another
filesystem without renaming trials. The fingerprint guards the other direction: the same name with other content.
It covers what the models learn from and are scored on — each recording's id, duration (to the millisecond) and
words with their timings — and nothing of where or in which file format the corpus is stored.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

from asr_core.data.corpora.base import Recording


def _t(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def fingerprint(recordings: Iterable[Recording]) -> str:
    """16 hex digits of SHA-256 over the recordings in id order (the order a reader lists them does not matter)."""
    return fingerprint_in_order(sorted(recordings, key=lambda r: r.id))


def fingerprint_in_order(recordings: Iterable[Recording]) -> str:
    """:func:`fingerprint` of recordings already in id order, one at a time (a prepared corpus of half a billion
    words is never held whole); a recording out of order raises ValueError."""
    h = hashlib.sha256()
    last = None
    for r in recordings:
        if last is not None and r.id <= last:
            raise ValueError(f"recording {r.id!r} comes after {last!r}: not in id order")
        last = r.id
        h.update(f"{r.id}\x1f{r.duration:.3f}\x1e".encode())
        for w in r.words:
            h.update(f"{w.text}\x1f{_t(w.start)}\x1f{_t(w.end)}\x1e".encode())
        for a, b in r.ignore:
            h.update(f"ignore\x1f{a:.3f}\x1f{b:.3f}\x1e".encode())
        h.update(b"\x1d")
    return h.hexdigest()[:16]
