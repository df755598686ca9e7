"""The planted long-range cue of the synthetic corpus (``synth --cue``), and what reads it back.

A *cue word* is a word of :data:`~asr_core.data.synth.text.CUE_GROUPS`: a group's spellings sound the same
(espeak-ng gives them the same phonemes, and the renderer speaks every spelling of a group from its first one, so the
audio is identical) but each belongs to a topic, and the recording's topic decides which one is written. The topic
is given away only by *disambiguating words*: words of the recording's own topic
(:data:`~asr_core.data.synth.text.TOPICS`) that no other topic has. The planter (:class:`CuePlanter`, asked by
the renderer before every sentence) keeps them at a controlled distance from every cue word:

- a stretch of ordinary speech (topic words as usual) ends with a disambiguating word, at time t0;
- a *quiet zone* follows, sentences without any topic word; its cue words (one word of one of the topic's groups,
  :func:`cues_per_zone` times) are said at offsets drawn uniformly from [near, far] seconds after t0;
- after the zone's last cue word, ``near`` more seconds without topic words; then ordinary speech again.

So the nearest disambiguating word before each cue word ends ``near`` to ``far`` seconds before the cue word starts,
and none starts within ``near`` seconds after it ends: a window shorter than ``near`` never holds one, and a window
that ends at the cue word and is longer than ``far`` by the two words' length (a second or two) always does. ``--cue RATE[,NEAR-FAR]`` (band 20-60 s unless
given) asks for RATE cue words a minute on average; recordings shorter than a zone get none.

``--cue RATE[,NEAR-FAR],gK`` concentrates the plant (:attr:`CueConfig.groups`): only the first K groups of
:data:`~asr_core.data.synth.text.CUE_GROUPS` are planted, and every recording's topic is dealt from the topics that
own a spelling in them (:func:`cue_topics`), so every recording carries cue words and each spelling is said many
more times than when the cue is spread over every group. Without ``gK`` (K = 0) every group is planted and topics are
dealt from all of them, as before the option existed.

Recorded in ``OUT/meta/<id>.json`` (and ``OUT/recordings.jsonl``): ``cue`` (the spec) and ``cues``, one entry per
planted word: ``index`` (into the transcript's words), ``word`` (as written), ``sound`` (the spelling rendered),
``before_s`` / ``after_s`` (the gap to the nearest disambiguating word before / after it; null where there is none).
A corpus made without a cue has neither key. Read back by :func:`planted` (``evaluate``'s cue-word error rate) and
:func:`corpus_sites` with :func:`containment` (``synth --cue-report``).
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording, Word
from asr_core.data.synth.text import CUE_GROUPS, TOPICS, SentenceMaker

MAX_PER_MINUTE = 10.0
NORMAL_S = (4.0, 10.0)  # ordinary speech between two zones at the least: long enough to say a topic word
PREFIX_S = 1.0  # a carrier's cue word starts within this of the sentence's start (one determiner and a pause)
SENTENCE_S = 5.0  # about the longest sentence with its pause: how late after its offset a cue word may come
WINDOWS_S = (5.0, 10.0, 20.0, 40.0, 80.0)  # the window lengths --cue-report tabulates


@dataclass(frozen=True)
class CueConfig:
    """How strongly the cue is planted: ``per_minute`` cue words a minute (0: none, the corpus as without a cue),
    each with its nearest disambiguating word ``near_s`` to ``far_s`` seconds before it and none within ``near_s``
    seconds after it. The band caps the rate a corpus reaches (zones of at most one cue word per 4 s of the band,
    each zone far + near seconds and more): about 7 a minute at 20-60 s; ``synth`` prints the rate reached.
    ``groups``: plant only the first ``groups`` groups of :data:`CUE_GROUPS` and deal every recording a topic that
    owns a spelling in them (0: every group and every topic)."""

    per_minute: float = 0.0
    near_s: float = 20.0
    far_s: float = 60.0
    groups: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_minute) and 0 <= self.per_minute <= MAX_PER_MINUTE):
            raise ValueError(f"cue rate must be 0 (no cue) to {MAX_PER_MINUTE:g} words a minute, got {self.per_minute}")
        if not (math.isfinite(self.near_s) and math.isfinite(self.far_s) and 0 < self.near_s
                and self.far_s >= self.near_s + 2 * PREFIX_S):
            raise ValueError(f"cue band {self.near_s:g}-{self.far_s:g} s: need 0 < NEAR and FAR >= NEAR + "
                             f"{2 * PREFIX_S:g} s, e.g. 20-60")
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) \
                or not 0 <= self.groups <= len(CUE_GROUPS):
            raise ValueError(f"cue groups g{self.groups}: K must be an integer from 0 (every group) to "
                             f"{len(CUE_GROUPS)} (the groups of CUE_GROUPS), e.g. g2")
        if self.groups and not self.per_minute > 0:
            raise ValueError(f"cue groups g{self.groups} with rate 0: a cue of rate 0 plants nothing and deals every "
                             f"topic; give a rate above 0 or leave gK out")

    @property
    def active(self) -> bool:
        return self.per_minute > 0

    def spec(self) -> str:
        """``"1,20-60"`` (``"1,20-60,g2"`` with groups): what :meth:`parse` reads back."""
        band = f"{self.per_minute:g},{self.near_s:g}-{self.far_s:g}"
        return f"{band},g{self.groups}" if self.groups else band

    @classmethod
    def parse(cls, text: str) -> "CueConfig":
        """``"RATE[,NEAR-FAR][,gK]"`` (cue words a minute; seconds; the first K cue groups), e.g. ``"1"``,
        ``"1.5,20-60"``, ``"10,2-6,g2"``, ``"7,g2"``, ``"0"``."""
        rate, *rest = [part.strip() for part in text.strip().split(",")]
        try:
            groups = 0
            if rest and rest[-1][:1] in ("g", "G"):
                k = rest.pop()[1:]
                if not k.isdigit():
                    raise ValueError(f"gK needs a whole number K from 0 to {len(CUE_GROUPS)}, got 'g{k}'")
                groups = int(k)
            if len(rest) > 1:
                raise ValueError("too many fields")
            if not rest:
                return cls(float(rate), groups=groups)
            near, sep, far = rest[0].partition("-")
            if not sep:
                raise ValueError("no '-' in the band")
            return cls(float(rate), float(near), float(far), groups)
        except ValueError as e:
            raise ValueError(f"cue spec {text!r}: {e}; valid: RATE[,NEAR-FAR][,gK] (cue words a minute, seconds, "
                             f"the first K of {len(CUE_GROUPS)} cue groups), e.g. 1, 1,20-60 or 10,2-6,g2; 0 for "
                             f"none") from None


def planted_groups(cue: CueConfig) -> tuple[dict[str, str], ...]:
    """The cue groups ``cue`` plants: the first ``cue.groups`` of :data:`CUE_GROUPS`, or every one (groups 0)."""
    return CUE_GROUPS[: cue.groups] if cue.groups else CUE_GROUPS


def cue_topics(cue: CueConfig) -> tuple[str, ...]:
    """The topics recordings are dealt under ``cue`` (sorted): those owning a spelling in :func:`planted_groups`
    when ``cue.groups`` is set, else every topic of :data:`TOPICS`."""
    if not cue.groups:
        return tuple(sorted(TOPICS))
    return tuple(sorted({t for group in planted_groups(cue) for t in group.values()}))


def topic_groups(topic: str, groups: Sequence[dict[str, str]] = CUE_GROUPS) -> list[tuple[str, str]]:
    """(spelling, spelling rendered) of every cue group of ``groups`` in which ``topic`` owns a spelling."""
    return [(word, next(iter(group))) for group in groups for word, t in group.items() if t == topic]


def sound_of(word: str) -> str:
    """The spelling a cue word is rendered from: its group's first (KeyError for a word of no group)."""
    for group in CUE_GROUPS:
        if word in group:
            return next(iter(group))
    raise KeyError(f"{word!r} is in no cue group")


def disambiguating(topic: str) -> frozenset[str]:
    """The words that say ``topic``: its own topic words that no other topic has."""
    others = {w for t, words in TOPICS.items() if t != topic for w in words}
    return frozenset(w for w in TOPICS[topic] if w not in others)


def _offsets(cue: CueConfig) -> tuple[float, float]:
    """The range cue offsets (seconds after t0) are drawn from: the band, less room for the sentence that is still
    being said when an offset falls due and for the carrier's first word, so the cue word lands inside the band."""
    return cue.near_s, max(cue.near_s, cue.far_s - PREFIX_S - SENTENCE_S)


def _zone_cycle_s(cue: CueConfig, k: int) -> float:
    """Expected seconds from one zone's t0 to the next with ``k`` cue words a zone: the latest of k offsets (and
    the rest of a sentence), the guard after it, and the shortest ordinary stretch."""
    lo, hi = _offsets(cue)
    return lo + (hi - lo) * k / (k + 1) + SENTENCE_S / 2 + cue.near_s + sum(NORMAL_S) / 2


def cues_per_zone(cue: CueConfig) -> int:
    """The fewest cue words a zone that reach ``cue.per_minute`` when zones follow each other as closely as they
    can (at most one per 4 s of the band: more would not fit between the carrier sentences)."""
    most = max(1, int((cue.far_s - cue.near_s) // 4))
    k = 1
    while k < most and 60.0 * k / _zone_cycle_s(cue, k) < cue.per_minute:
        k += 1
    return k


class CuePlanter:
    """What the renderer says next, sentence by sentence, so that cue words sit at the configured distances from the
    disambiguating words (see the module docstring). Its own random stream (``cue/<seed>``) decides the zones; the
    sentences themselves come from the recording's :class:`SentenceMaker`.

    The renderer calls :meth:`sentence` before each sentence (with the time it starts at), :meth:`spoken` for the
    spelling to render each word from, and :meth:`heard` for each word it places; :attr:`planted` collects the
    indices of the cue words among the recording's words."""

    def __init__(self, cue: CueConfig, topic: str, seed: int, target_s: float) -> None:
        if not cue.active:
            raise ValueError("a CuePlanter needs a cue rate above 0")
        self.cue = cue
        self.rng = random.Random(f"cue/{seed}")
        self.groups = topic_groups(topic, planted_groups(cue))
        self.own = disambiguating(topic)
        self.target_s = target_s
        self.per_zone = cues_per_zone(cue)
        self.state = "normal"  # normal -> quiet (cue words due) -> guard (no topic words) -> normal
        self.normal_start, self.normal_until = 0.0, self.rng.uniform(*NORMAL_S)
        self.last_own_end: float | None = None
        self.t0 = 0.0
        self.offsets: list[float] = []
        self.word = self.sound = ""
        self.said = 0  # cue words said in the current zone
        self.last_cue_end = 0.0
        self.planted: list[int] = []
        self._pending: int | None = None  # position of the cue word in the current sentence

    def sentence(self, maker: SentenceMaker, now: float) -> tuple[list[str], int | None]:
        """The next sentence, starting at ``now`` seconds, and the position of its cue word (None: it has none)."""
        self._pending = None
        if not self.groups:
            return maker.sentence(), None
        if self.state == "normal" and self._zone_may_start(now):
            self._start_zone()
        if self.state == "quiet":
            if self.offsets and now - self.t0 >= self.offsets[0]:
                self.offsets.pop(0)
                if now - self.t0 + PREFIX_S <= self.cue.far_s:
                    words, at = maker.carrier(self.word)
                    self._pending = at
                    self.said += 1
                    return words, at
                self.offsets.clear()  # the sentences ran past the band: this zone says no more
            if not self.offsets:
                if self.said:
                    self.state = "guard"
                else:
                    self._back_to_normal(now)
        if self.state == "guard" and now - self.last_cue_end >= self.cue.near_s:
            self._back_to_normal(now)
        return maker.sentence(topic=self.state == "normal"), None

    def spoken(self, position: int, word: str) -> str:
        """The spelling to render the ``position``-th word of the current sentence from: a cue word's group's
        first spelling (so every spelling of a group sounds the same), any other word itself."""
        return self.sound if position == self._pending else word

    def heard(self, index: int, position: int, word: Word) -> None:
        """The renderer placed ``word`` (the ``position``-th of its sentence) as the recording's ``index``-th word."""
        if position == self._pending:
            self.planted.append(index)
            self.last_cue_end = float(word.end or 0.0)
        elif word.text in self.own:
            self.last_own_end = float(word.end or 0.0)

    def _zone_may_start(self, now: float) -> bool:
        return (self.last_own_end is not None and self.last_own_end >= self.normal_start and now >= self.normal_until
                and self.last_own_end + self.cue.near_s < self.target_s)

    def _start_zone(self) -> None:
        assert self.last_own_end is not None
        self.state, self.t0, self.said = "quiet", self.last_own_end, 0
        self.offsets = sorted(self.rng.uniform(*_offsets(self.cue)) for _ in range(self.per_zone))
        self.word, self.sound = self.rng.choice(self.groups)

    def _back_to_normal(self, now: float) -> None:
        """Ordinary speech from ``now``, for long enough that zones come at the configured rate."""
        self.state, self.normal_start = "normal", now
        cycle = 60.0 * self.per_zone / self.cue.per_minute * self.rng.uniform(0.8, 1.2)
        self.normal_until = now + max(self.rng.uniform(*NORMAL_S), cycle - (now - self.t0))


# ---- distances between cue words and disambiguating words --------------------------------------------------------

@dataclass(frozen=True)
class CueSite:
    """One planted word and the nearest disambiguating words before and after it, as (start, end) seconds
    (None: there is none in the recording)."""

    start: float
    end: float
    prev: tuple[float, float] | None
    next: tuple[float, float] | None

    @property
    def before_s(self) -> float | None:
        """Seconds from the end of the disambiguating word before to the start of the cue word."""
        return None if self.prev is None else round(self.start - self.prev[1], 3)

    @property
    def after_s(self) -> float | None:
        """Seconds from the end of the cue word to the start of the disambiguating word after."""
        return None if self.next is None else round(self.next[0] - self.end, 3)


def cue_sites(words: Sequence[Word], marks: Sequence[int], topic: str) -> list[CueSite]:
    """The :class:`CueSite` of each planted word (``marks``: indices into ``words``, which must be timed)."""
    own = disambiguating(topic)
    hits = [i for i, w in enumerate(words) if w.text in own]

    def span(i: int) -> tuple[float, float]:
        w = words[i]
        if w.start is None or w.end is None:
            raise ValueError(f"word {i} ({w.text!r}) has no time; cue distances need a timed transcript")
        return float(w.start), float(w.end)

    out = []
    for m in marks:
        k = bisect.bisect_left(hits, m)
        prev = span(hits[k - 1]) if k > 0 else None
        nxt = span(hits[k]) if k < len(hits) else None
        out.append(CueSite(*span(m), prev, nxt))
    return out


def holds_before(site: CueSite, window_s: float) -> bool:
    """A window of ``window_s`` seconds that ends where the cue word ends holds the disambiguating word before it."""
    return site.prev is not None and site.prev[0] >= site.end - window_s


def placed_share(site: CueSite, window_s: float) -> float:
    """The share of the placements of a ``window_s``-second window holding the whole cue word (its start uniform
    over them, as moving-window decoding averages them) that also hold a whole disambiguating word."""
    lo, hi = site.end - window_s, site.start  # window starts that hold the cue word
    if hi < lo:
        return 0.0
    parts = []
    if site.prev is not None:
        parts.append((lo, min(hi, site.prev[0])))
    if site.next is not None:
        parts.append((max(lo, site.next[1] - window_s), hi))
    parts = sorted((a, b) for a, b in parts if b >= a)
    if not parts:
        return 0.0
    if hi == lo:
        return 1.0
    covered, reach = 0.0, lo
    for a, b in parts:
        a = max(a, reach)
        if b > a:
            covered += b - a
            reach = b
    return covered / (hi - lo)


def containment(sites: Sequence[CueSite], windows_s: Sequence[float] = WINDOWS_S) -> list[dict]:
    """Per window length: the planted words counted, the percentage whose disambiguating word a window ending at the
    cue word holds (``before``), and the mean percentage of window placements around the cue word that hold one
    (``placed``). NaN percentages for no planted words."""
    rows = []
    for w in windows_s:
        n = len(sites)
        before = 100.0 * sum(holds_before(s, w) for s in sites) / n if n else math.nan
        placed = 100.0 * sum(placed_share(s, w) for s in sites) / n if n else math.nan
        rows.append({"window_s": w, "cue_words": n, "before": before, "placed": placed})
    return rows


def format_containment(rows: Sequence[dict], title: str = "") -> str:
    lines = [title] if title else []
    lines.append(f"{'window':>8s} {'cue words':>9s} {'before':>7s} {'placed':>7s}")
    for r in rows:
        lines.append(f"{r['window_s']:7g}s {r['cue_words']:9d} {r['before']:6.1f}% {r['placed']:6.1f}%")
    return "\n".join(lines)


# ---- reading the plant back ---------------------------------------------------------------------------------------

def meta_file(rec: Recording) -> Path | None:
    """``<split>/../meta/<id>.json`` of a recording read by the podcast reader (None for other formats)."""
    transcript = rec.meta.get("transcript") if isinstance(rec.meta, dict) else None
    if not transcript:
        return None
    t = Path(transcript)
    return t.parent.parent / "meta" / f"{t.stem}.json"


def read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorpusError(f"{path}: cannot read the recording's metadata ({e})") from None
    if not isinstance(meta, dict):
        raise CorpusError(f"{path}: the recording's metadata must be a JSON object")
    return meta


def planted(recordings: Sequence[Recording]) -> dict[str, tuple[int, ...]] | None:
    """The indices (into ``rec.words``) of each recording's planted words, by recording id, from the synthetic
    corpus's metadata next to the split folder; None when no recording has any metadata with ``cues`` (a corpus made
    without a cue, or another format). Recordings of a cued dataset without metadata have none. Metadata that do
    not match their transcript (another word at a recorded index) raise :class:`CorpusError` naming the file."""
    found: dict[str, tuple[int, ...]] = {}
    for rec in recordings:
        path = meta_file(rec)
        if path is None or not path.is_file():
            continue
        meta = read_meta(path)
        if "cues" not in meta:
            continue
        marks = []
        for c in meta["cues"]:
            i = c.get("index") if isinstance(c, dict) else None
            if not isinstance(i, int) or not 0 <= i < len(rec.words) or rec.words[i].text != c.get("word"):
                raise CorpusError(f"{path}: planted word {c!r} does not match transcript {rec.meta['transcript']} "
                                  f"({len(rec.words)} words); regenerate the corpus (python -m asr_core synth)")
            marks.append(i)
        found[rec.id] = tuple(marks)
    if not found:
        return None
    return {rec.id: found.get(rec.id, ()) for rec in recordings}


def corpus_sites(split_dir: Path) -> list[CueSite]:
    """The :class:`CueSite` of every planted word of one split of a synthetic corpus (``OUT/<split>``)."""
    from asr_core.data.corpora import load_corpus

    sites: list[CueSite] = []
    for rec in load_corpus(f"podcast:{split_dir}", audio=False, strict=True):
        path = meta_file(rec)
        if path is None or not path.is_file():
            continue
        meta = read_meta(path)
        if meta.get("cues"):
            sites += cue_sites(rec.words, [c["index"] for c in meta["cues"]], meta["topic"])
    return sites
