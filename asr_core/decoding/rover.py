"""ROVER: word-level voting over several hypotheses of one recording, through SCTK's ``rover`` binary.

SCTK's ``rover`` (Debian package ``sctk``, installed by ``bash scripts/setup.sh``) reads N hypotheses as CTM files
(``<file> <channel> <start> <duration> <word> <confidence>``, one word a line), aligns them word by word with an
N-way dynamic-programming alignment and, at every aligned slot, keeps the word (or the null word) that wins the
vote of ``method``:

* ``meth1``: word frequency only (with the default ``alpha = 1``); ties go to the earlier hypothesis;
* ``avgconf``: ``alpha * frequency + (1 - alpha) * average confidence``, a missing word counting ``null_conf``;
* ``maxconf``: like ``avgconf`` with the maximum confidence of the word instead of the average.

A voted word's start and end are the averages over the hypotheses that voted for it; the binary writes times to
the millisecond. In issue 34 the hypotheses are phase-shifted block-wise decodings of one recording (phase ``p``
holds the windows of index ``p mod 8``), each turned into timed words by the caller.

The binary's alignment grows faster than linearly with the number of words (8 hypotheses of 1000 words take
about 13 s, of 250 words under 1 s), so :func:`rover` votes segment by segment: it cuts the recording at times no
word of any hypothesis straddles, about every ``segment_seconds``, and a word belongs to the segment holding its
midpoint. Where speech never pauses in every hypothesis at once, it cuts, after ``2 * segment_seconds``, at the
time straddled by the fewest words. Each segment is one run of the binary.

The binary's own limits, handled here: it needs two files or more (a lone hypothesis is passed twice), it hangs
when every file is empty (such a segment votes nothing, without a run) and it crashes when the first file is
empty (empty hypotheses are passed after the others, which only matters to ``meth1``'s tie-break).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SCTK_ROVER = Path("/usr/lib/sctk/bin/rover")
METHODS = ("meth1", "avgconf", "maxconf", "maxconfa")
CHANNEL = "1"
NULL_WORD = "@"  # the binary's null word: a hypothesis word spelt so would be read as "no word"
INSTALL_HINT = "install Debian's sctk package (run `bash scripts/setup.sh`, or `apt-get install sctk`)"


@dataclass(frozen=True)
class TimedWord:
    """One word of a hypothesis: its spelling, start and duration in seconds, and a confidence in [0, 1]."""

    word: str
    start: float
    duration: float
    confidence: float = 1.0

    @property
    def end(self) -> float:
        """The time the word ends, in seconds."""
        return self.start + self.duration

    @property
    def midpoint(self) -> float:
        """The middle of the word, in seconds: what places it in a segment."""
        return self.start + self.duration / 2


def rover_command() -> list[str]:
    """The command that runs SCTK's ``rover``: ``/usr/lib/sctk/bin/rover``, else ``rover`` on the PATH, else
    ``sctk rover``. Raises :class:`FileNotFoundError`, saying how to install it, when none is there."""
    if SCTK_ROVER.is_file():
        return [str(SCTK_ROVER)]
    on_path = shutil.which("rover")
    if on_path is not None:
        return [on_path]
    sctk = shutil.which("sctk")
    if sctk is not None:
        return [sctk, "rover"]
    raise FileNotFoundError(f"SCTK's rover binary was not found ({SCTK_ROVER}, `rover` or `sctk rover` on the "
                            f"PATH): {INSTALL_HINT}")


def rover_binary() -> str:
    """:func:`rover_command` as one shell-quoted string (``shlex.split`` gives the command back), e.g.
    ``/usr/lib/sctk/bin/rover`` or ``/usr/bin/sctk rover``; raises like it when the binary is missing."""
    return shlex.join(rover_command())


def check_words(words: Sequence[TimedWord], what: str = "hypothesis") -> None:
    """Raise :class:`ValueError` on a word the CTM format or the binary cannot carry: an empty spelling, one with
    whitespace or the null word ``@``, a negative start or duration, a confidence outside [0, 1]."""
    for w in words:
        if not w.word or any(c.isspace() for c in w.word) or w.word == NULL_WORD:
            raise ValueError(f"{what}: word {w.word!r} cannot go into a CTM file: give non-empty words without "
                             f"whitespace, and not {NULL_WORD!r} (rover's null word)")
        if w.start < 0 or w.duration < 0:
            raise ValueError(f"{what}: word {w.word!r} has start {w.start} and duration {w.duration}: give times "
                             "in seconds, neither negative")
        if not 0.0 <= w.confidence <= 1.0:
            raise ValueError(f"{what}: word {w.word!r} has confidence {w.confidence}: give one in [0, 1]")


def check_recording(recording: str) -> None:
    """Raise :class:`ValueError` unless ``recording`` can be a CTM file name (non-empty, no whitespace)."""
    if not recording or any(c.isspace() for c in recording):
        raise ValueError(f"recording {recording!r} cannot name a CTM file: give a non-empty name without "
                         "whitespace")


def write_ctm(path: Path | str, recording: str, words: Sequence[TimedWord]) -> Path:
    """Write ``words`` as a CTM file of ``recording`` (channel ``1``), one ``<recording> 1 <start> <duration>
    <word> <confidence>`` line a word, in the order given; times to the microsecond. Returns the path."""
    check_recording(recording)
    check_words(words)
    path = Path(path)
    lines = [f"{recording} {CHANNEL} {w.start:.6f} {w.duration:.6f} {w.word} {w.confidence:.6f}\n" for w in words]
    path.write_text("".join(lines))
    return path


def read_ctm(path: Path | str) -> list[TimedWord]:
    """The words of a CTM file, in file order (a missing or negative confidence, the binary's "none", reads as 1.0;
    ``;;`` comment lines skipped).
    Raises :class:`ValueError`, naming the line, on a line that is not CTM."""
    words: list[TimedWord] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith(";;"):
            continue
        if len(fields) not in (5, 6):
            raise ValueError(f"{path}:{n}: {line!r} is not a CTM line (<file> <channel> <start> <duration> <word> "
                             "[<confidence>])")
        confidence = float(fields[5]) if len(fields) == 6 else 1.0
        words.append(TimedWord(fields[4], float(fields[2]), float(fields[3]), 1.0 if confidence < 0 else confidence))
    return words


def segment_cuts(hypotheses: Sequence[Sequence[TimedWord]], segment_seconds: float) -> list[float]:
    """The times, ascending, at which :func:`rover` cuts the recording into segments.

    Candidates are the words' starts and ends. Once a segment is ``segment_seconds`` long, it ends at the first
    candidate no word (of positive duration) strictly straddles; if none comes before it is ``2 * segment_seconds``
    long, it ends at the candidate, since it was ``segment_seconds`` long, straddled by the fewest words (the
    earliest of those)."""
    if segment_seconds <= 0:
        raise ValueError(f"segment_seconds is {segment_seconds}: give a positive length, or None for one segment")
    spans = [(w.start, w.end) for h in hypotheses for w in h if w.duration > 0]
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    points = sorted({w.start for h in hypotheses for w in h} | {w.end for h in hypotheses for w in h})
    if not points:
        return []
    cuts: list[float] = []
    origin = points[0]
    best: tuple[int, float] | None = None  # (straddling words, time) of the best fallback since the segment filled
    for t in points:
        if t - origin < segment_seconds:
            continue
        straddling = bisect_left(starts, t) - bisect_right(ends, t)
        if best is None or straddling < best[0]:
            best = (straddling, t)
        if straddling == 0 or t - origin >= 2 * segment_seconds:
            cut = t if straddling == 0 else best[1]
            cuts.append(cut)
            origin, best = cut, None
    return cuts


def split_words(words: Sequence[TimedWord], cuts: Sequence[float]) -> list[list[TimedWord]]:
    """``words`` by segment (``len(cuts) + 1`` lists): segment ``k`` holds the words whose midpoint lies in
    ``[cuts[k - 1], cuts[k])``, in their order."""
    out: list[list[TimedWord]] = [[] for _ in range(len(cuts) + 1)]
    for w in words:
        out[bisect_right(cuts, w.midpoint)].append(w)
    return out


def run_rover(files: Sequence[Path], output: Path, *, method: str, alpha: float, null_conf: float,
              case_sensitive: bool, timeout_s: float) -> None:
    """Run the binary on CTM ``files`` (two or more, the first not empty), writing the voted CTM to ``output``.
    Raises :class:`RuntimeError`, with the binary's messages, when it fails or outlasts ``timeout_s``."""
    command = rover_command()
    for f in files:
        command += ["-h", str(f), "ctm"]
    command += ["-o", str(output), "-m", method, "-a", repr(alpha), "-c", repr(null_conf), "-f", "0"]
    if case_sensitive:
        command.append("-s")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"rover ran past {timeout_s} s on {len(files)} hypotheses: lower segment_seconds or raise "
                           f"timeout_s (command: {' '.join(command)})") from e
    if done.returncode != 0 or not output.is_file():
        raise RuntimeError(f"rover failed (exit status {done.returncode}) on {', '.join(map(str, files))}: "
                           f"{(done.stderr or done.stdout).strip()[-2000:]!r}; check that the files are CTM of one "
                           "recording, sorted by time")


def vote_segment(hypotheses: Sequence[Sequence[TimedWord]], recording: str, folder: Path, tag: str, *, method: str,
                 alpha: float, null_conf: float, case_sensitive: bool, timeout_s: float) -> list[TimedWord]:
    """One run of the binary on one segment's hypotheses, CTM files written in ``folder`` (names tagged ``tag``).
    Every hypothesis empty: ``[]`` without a run. Empty hypotheses go after the others; a lone one is passed
    twice."""
    if not any(hypotheses):
        return []
    order = [i for i, h in enumerate(hypotheses) if h] + [i for i, h in enumerate(hypotheses) if not h]
    files = [write_ctm(folder / f"{tag}_hyp{i:02d}.ctm", recording, hypotheses[i]) for i in order]
    if len(files) == 1:
        files *= 2
    output = folder / f"{tag}_rover.ctm"
    run_rover(files, output, method=method, alpha=alpha, null_conf=null_conf, case_sensitive=case_sensitive,
              timeout_s=timeout_s)
    return read_ctm(output)


def rover(hypotheses: Sequence[Sequence[TimedWord]], recording: str, method: str = "meth1",
          workdir: Path | str | None = None, *, segment_seconds: float | None = 30.0, alpha: float = 1.0,
          null_conf: float = 0.0, case_sensitive: bool = True, timeout_s: float = 600.0) -> list[TimedWord]:
    """Vote ``hypotheses`` (timed words of one ``recording``) into one with SCTK's ``rover``.

    ``method`` is the binary's ``-m`` (``meth1``: frequency; ``avgconf``, ``maxconf``, ``maxconfa``: confidences
    weighed in with ``1 - alpha``); ``alpha`` and ``null_conf`` are its ``-a`` and ``-c``. Each hypothesis is
    sorted by start time (stably). ``case_sensitive=False`` aligns ignoring case and returns lower-case words.
    The CTM files go to ``workdir`` when given (kept), else to a temporary folder. ``segment_seconds`` bounds the
    segments voted apart (see the module's docstring); ``None`` votes the whole recording in one run.

    Returns the voted words in time order, times to the millisecond, each with the confidence the method gave it;
    ``[]`` when every hypothesis is empty. Deterministic: the same input gives the same output.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not a voting method of rover: give one of {', '.join(METHODS)}")
    if not hypotheses:
        raise ValueError("no hypotheses: give one list of TimedWord or more (an empty list for an empty one)")
    check_recording(recording)
    hyps = [sorted(h, key=lambda w: w.start) for h in hypotheses]
    for i, h in enumerate(hyps):
        check_words(h, f"hypothesis {i}")
    if not any(hyps):
        return []
    cuts = [] if segment_seconds is None else segment_cuts(hyps, segment_seconds)
    by_segment = [split_words(h, cuts) for h in hyps]
    voted: list[TimedWord] = []
    with tempfile.TemporaryDirectory(prefix="rover_") as tmp:
        folder = Path(tmp) if workdir is None else Path(workdir)
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(len(cuts) + 1):
            voted += vote_segment([segs[k] for segs in by_segment], recording, folder, f"seg{k:05d}", method=method,
                                  alpha=alpha, null_conf=null_conf, case_sensitive=case_sensitive,
                                  timeout_s=timeout_s)
    return voted
