"""The one shape every corpus reader yields: a :class:`Recording` with optional word timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class CorpusError(ValueError):
    """A corpus file is missing, corrupt or truncated; the message names the file and the line."""


@dataclass(frozen=True)
class Word:
    """One reference word; times in seconds from the start of the recording (None where the format has none)."""

    text: str
    start: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class Recording:
    """A long recording and its reference.

    ``words`` are in time order. ``ignore`` lists (start, end) regions in seconds that are untranscribed and are
    zeroed in the features before decoding (TED-LIUM ``ignore_time_segment_in_scoring``).
    """

    id: str
    audio: Path
    duration: float
    words: tuple[Word, ...] = ()
    ignore: tuple[tuple[float, float], ...] = ()
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)

    @property
    def timed(self) -> bool:
        return bool(self.words) and all(w.start is not None and w.end is not None for w in self.words)
