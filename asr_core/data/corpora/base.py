"""The one shape every corpus reader yields: a :class:`Recording` with optional word timings."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from asr_core.contract.specs import CorpusError


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


class Problems:
    """Collects bad files while a reader runs: fatal at once when ``strict``, else reported on stderr and kept.

    Readers call :meth:`bad` for every file they cannot use, so that no recording is ever dropped silently; the
    caller sees the list in :attr:`items` (``(file, reason)`` pairs) and a one-line summary on stderr. A flaw that
    leaves the recording usable (a word whose time cannot be read, kept untimed) goes to :meth:`warn` instead:
    printed once and listed in :attr:`warnings`. What a reader chose not to read (another copy of the transcripts
    in a release) goes to :meth:`note`, printed once.
    """

    def __init__(self, spec: str, *, strict: bool = False) -> None:
        self.spec = spec
        self.strict = strict
        self.items: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str]] = []
        self.notes: list[str] = []

    def bad(self, path: str | Path, reason: str) -> None:
        if self.strict:
            raise CorpusError(f"{path}: {reason}")
        self.items.append((str(path), reason))
        print(f"corpus {self.spec}: skipping {path}: {reason}", file=sys.stderr)

    def warn(self, path: str | Path, message: str) -> None:
        """A flaw in ``path`` that the reader worked around (the recording is kept); fatal when ``strict``."""
        if self.strict:
            raise CorpusError(f"{path}: {message}")
        self.warnings.append((str(path), message))
        print(f"corpus {self.spec}: warning: {path}: {message}", file=sys.stderr)

    def note(self, message: str) -> None:
        """Something the user should know about what was (not) read; never fatal."""
        if message not in self.notes:
            self.notes.append(message)
            print(f"corpus {self.spec}: {message}", file=sys.stderr)

    def __len__(self) -> int:
        return len(self.items)


AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".sph", ".mp3", ".opus")


def find_audio(stem: Path, extensions: tuple[str, ...] = AUDIO_EXTENSIONS) -> Path | None:
    """The first existing ``stem`` + extension (``stem`` without suffix), or None."""
    for ext in extensions:
        p = stem.with_name(stem.name + ext)
        if p.is_file():
            return p
    return None


def probe_duration(audio: Path, problems: Problems, owner: str | Path) -> float | None:
    """Duration of ``audio`` from its header; a missing or unreadable file is reported against ``owner``."""
    from asr_core.data.audio import audio_duration

    if not audio.is_file():
        problems.bad(owner, f"audio file {audio} not found")
        return None
    if is_lfs_pointer(audio):
        problems.bad(owner, f"audio file {audio} is a Git LFS pointer, not audio: fetch the media with "
                            f"'git lfs pull' in the clone of the release")
        return None
    try:
        duration = audio_duration(audio)
    except Exception as e:  # libsndfile raises several types for corrupt headers
        problems.bad(owner, f"audio file {audio} is unreadable: {e}")
        return None
    if duration <= 0:
        problems.bad(owner, f"audio file {audio} is empty")
        return None
    return duration


_LFS_HEAD = b"version https://git-lfs.github.com/spec/v1"


def is_lfs_pointer(path: Path) -> bool:
    """Whether ``path`` is a Git LFS pointer file (what a clone without ``git lfs`` holds instead of the media)."""
    try:
        if path.stat().st_size > 1024:
            return False
        with path.open("rb") as fh:
            return fh.read(len(_LFS_HEAD)) == _LFS_HEAD
    except OSError:
        return False


def transcript_duration(words: list[Word] | tuple[Word, ...], *ends: float) -> float:
    """A recording's duration as far as its transcript knows it, for reading without audio: the last word end (or
    any of ``ends``, e.g. segment ends), 0.0 when nothing is timed."""
    return max([w.end for w in words if w.end is not None] + list(ends), default=0.0)


def check_words(words: list[Word], duration: float, owner: str | Path, problems: Problems) -> bool:
    """Word times must be ordered pairs inside the recording (a little slack for rounding); else report."""
    slack = 0.5
    for w in words:
        if w.start is None or w.end is None:
            continue
        if w.end < w.start or w.start < 0 or w.end > duration + slack:
            problems.bad(owner, f"word {w.text!r} has times {w.start}-{w.end} outside the recording "
                                f"(0-{duration:.2f} s)")
            return False
    return True
