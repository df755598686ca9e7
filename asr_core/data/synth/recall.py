"""The recall plant of the synthetic corpus (``synth --recall RATE``): a code word said clearly, then asked for again
with its audio masked, at controlled distances.

Each recording draws one *code word* from :data:`CODE_WORDS` (K = 8 words the generator never says otherwise, with
distinct onsets: :func:`check_code_words`). The *key sentence* "the code word is X" says it clearly; later, RATE
times a minute on average, a *slot* "remember the code word X" asks for it, X's audio replaced by a fixed
:data:`MASKER_S` s masker: pink noise at the RMS of the slot sentence's other words (:func:`masker`). The transcript
keeps X, and X's word times are the masker's span.

Placement (:class:`RecallPlanter`, asked by the renderer before every sentence, with its own random stream
``recall/<seed>``) runs in *episodes*. Every episode opens with a key sentence followed at once by a *near* slot (same
speaker, the shortest pause), so the code word is heard :data:`NEAR_S` (1-4 s) before it is asked for. A *far*
episode then asks again :data:`FAR_PER_EPISODE` times, at offsets drawn from :data:`FAR_S` (20-60 s) after the latest
clear mention, with no clear mention in between; near episodes are dealt until as many near slots as far ones were
planted, so the two bands are about even. The distance of a slot is measured from the end of the latest clear
mention (a key sentence's code word, or an unmasked slot's) to the start of the slot's code word; a slot whose
distance would fall outside its band when its code word is due is said clearly instead (a clear mention, not a slot),
so every recorded slot lies in its band by construction. Ordinary speech fills the rest, paced so that slots come at
RATE a minute (fewer where the structure cannot fit more, about 6 a minute at most).

Controls in the same corpus: about :data:`UNMASKED_SHARE` of the slots are said unmasked (the acoustic ceiling; an
unmasked far slot ends its episode, being a clear mention itself), and :data:`NO_KEY_SHARE` of the recordings never
say the key sentence: their slots, all masked, give the guess rate (1/K). They are dealt by the recording's index in
its split (every 20th, the first included), so that even a test split of a dozen recordings holds the control. A recording shorter than
:data:`FAR_MIN_RECORDING_S` gets near slots only.

Recorded in ``OUT/meta/<id>.json`` (and ``OUT/recordings.jsonl``), as :mod:`asr_core.data.synth.cues` records its
planted words: ``recall`` (the spec), ``recall_word``, ``recall_key`` (whether the key is said), ``recall_near_only``,
``recall_clear`` (indices of the clear mentions among the transcript's words) and ``recall_slots``, one entry per slot
(:func:`slot_records`): ``slot`` (an id), ``index`` (of the code word in the transcript), ``word``, ``start`` /
``end`` (the slot sentence's span, seconds), ``masker`` / ``masker_samples`` (the masked span in seconds and in
samples, null when unmasked), ``distance_s`` (to the latest clear mention; null without a key), ``band`` (``near`` or
``far``) and ``kind`` (``masked``, ``unmasked`` or ``no-key``). A corpus made without ``--recall`` has none of these
keys.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from asr_core.contract.metrics import RECALL_KEY_EDITS
from asr_core.data.audio import SAMPLE_RATE
from asr_core.data.corpora.base import Word
from asr_core.data.synth.audio import coloured_noise
from asr_core.data.synth.text import vocabulary

CODE_WORDS = ("banjo", "falcon", "gecko", "jigsaw", "lantern", "pelican", "walrus", "zebra")
KEY_WORDS = ("the", "code", "word", "is")  # the key sentence: these, then the code word
SLOT_WORDS = ("remember", "the", "code", "word")  # a slot: these, then the (masked) code word
MAX_PER_MINUTE = 8.0
MASKER_S = 0.8
MASKER_SEED = 32  # the masker is one fixed noise, the same in every slot and corpus
MASKER_FADE_S = 0.005  # raised-cosine fades at its ends (no clicks)
NEAR_S = (1.0, 4.0)
FAR_S = (20.0, 60.0)
FAR_PER_EPISODE = 4
UNMASKED_SHARE = 0.10
NO_KEY_SHARE = 0.05
LEAD_S = (3.0, 8.0)  # ordinary speech before the first episode
SLOT_PREFIX_S = 3.5  # at most, from the start of a slot sentence to its code word (slowest voices, longest pauses)
SENTENCE_S = 5.0  # about the longest ordinary sentence with its pause: how late after its offset a far slot may come
# a shorter recording gets near slots only: its first episode (a near one, after the lead) leaves too little
# time for a far slot (the far band's start, a sentence and a slot's prefix)
FAR_MIN_RECORDING_S = 45.0
BANDS = {"near": NEAR_S, "far": FAR_S}
KINDS = ("masked", "unmasked", "no-key")


def onset(word: str) -> str:
    """The letters of ``word`` before its first vowel (its written onset): ``"jigsaw"`` -> ``"j"``."""
    for i, ch in enumerate(word):
        if ch in "aeiouy":
            return word[:i]
    return word


def check_code_words(words: Sequence[str] = CODE_WORDS, lexicon: Sequence[str] | None = None) -> None:
    """Raise ValueError naming the first code word that is a word of the generator's lexicon (``lexicon``, default
    :func:`~asr_core.data.synth.text.vocabulary`) or of the plant's own sentences, that repeats another's
    onset, or that is not a plain lower-case word."""
    lex = set(vocabulary() if lexicon is None else lexicon) | set(KEY_WORDS) | set(SLOT_WORDS)
    seen: dict[str, str] = {}
    for w in words:
        if not (w.isalpha() and w.islower()):
            raise ValueError(f"code word {w!r} must be one lower-case word of letters")
        if w in lex:
            raise ValueError(f"code word {w!r} is a word the generator says otherwise")
        o = onset(w)
        if not o or o in seen:
            raise ValueError(f"code word {w!r}: its onset {o!r} is not distinct (as {seen.get(o)!r})")
        seen[o] = w


@dataclass(frozen=True)
class RecallConfig:
    """The recall plant: ``per_minute`` slots a minute (0: none, the corpus as without the plant)."""

    per_minute: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.per_minute, bool) or not isinstance(self.per_minute, (int, float)) \
                or not (math.isfinite(self.per_minute) and 0 <= self.per_minute <= MAX_PER_MINUTE):
            raise ValueError(f"recall rate must be 0 (no plant) to {MAX_PER_MINUTE:g} slots a minute, "
                             f"got {self.per_minute!r}")

    @property
    def active(self) -> bool:
        return self.per_minute > 0

    def spec(self) -> str:
        """``"5"``: what :meth:`parse` reads back."""
        return f"{self.per_minute:g}"

    @classmethod
    def parse(cls, text: str) -> "RecallConfig":
        """``"RATE"`` (slots a minute), e.g. ``"5"``, ``"4.5"``, ``"0"``."""
        try:
            return cls(float(text.strip()))
        except ValueError as e:
            raise ValueError(f"recall spec {text!r}: {e}; valid: RATE, slots a minute from 0 to "
                             f"{MAX_PER_MINUTE:g} (4-6 recommended), 0 for none") from None


# ---- the masker ---------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _unit_masker() -> np.ndarray:
    n = int(round(MASKER_S * SAMPLE_RATE))
    x = coloured_noise(n, 1.0, np.random.default_rng(MASKER_SEED))  # 1/f power: pink
    fade = int(MASKER_FADE_S * SAMPLE_RATE)
    ramp = 0.5 - 0.5 * np.cos(np.pi * (np.arange(fade) + 0.5) / fade)
    x[:fade] *= ramp
    x[-fade:] *= ramp[::-1]
    x = x / np.sqrt(np.mean(x ** 2))
    x.setflags(write=False)
    return x


def masker(rms: float) -> np.ndarray:
    """The fixed masker (pink noise, :data:`MASKER_S` s) at RMS ``rms``. Shape (round(MASKER_S * 16000),), float32."""
    if not (math.isfinite(rms) and rms > 0):
        raise ValueError(f"masker RMS must be positive, got {rms!r}")
    return (_unit_masker() * rms).astype(np.float32)


def sentence_rms(parts: Sequence[np.ndarray]) -> float:
    """RMS over the samples of ``parts`` (each (N_i,): the words of a sentence, pauses excluded)."""
    if not parts or not sum(len(p) for p in parts):
        raise ValueError("a slot sentence needs words before its code word to take the masker's level from")
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])
    return float(np.sqrt(np.mean(x ** 2)))


# ---- placement ------------------------------------------------------------------------------------------------------

EDITS = RECALL_KEY_EDITS  # the names shared with the command line (asr_core.probes.recall_args)


@dataclass(frozen=True)
class KeyEdit:
    """How a re-rendering for the causal check says the code word's clear mentions (the key sentence's, and a slot
    said clearly), each in the span the unedited word had, so every other sample and every word time stays as it
    was: ``swap``: as ``word`` (another code word), time-scaled to the span; ``silence``: not at all (zeros)."""

    mode: str
    word: str = ""

    def __post_init__(self) -> None:
        if self.mode not in EDITS:
            raise ValueError(f"key edit {self.mode!r}: one of {', '.join(EDITS)}")
        if (self.mode == "swap") != (self.word in CODE_WORDS):
            raise ValueError(f"key edit {self.mode!r} with word {self.word!r}: a swap names one of the code words "
                             f"{', '.join(CODE_WORDS)}; silence names none")

    def audio(self, n: int, other: np.ndarray | None) -> np.ndarray:
        """The ``n`` samples said instead of the clear mention: zeros, or ``other`` (the swap word as this speaker
        says it, shape (M,)) resampled to ``n`` samples (its pitch moves by M/n: the swap word is chosen for the
        closest length, :func:`swap_word`)."""
        if self.mode == "silence":
            return np.zeros(n, dtype=np.float32)
        if other is None or len(other) == 0:
            raise ValueError("a swap needs the swap word's audio")
        from scipy import signal  # here, not at the top: 0.3-0.4 s that every trainer would pay for the tokenizer

        return signal.resample(other, n).astype(np.float32) if len(other) != n else other.astype(np.float32)


def swap_word(word: str, lengths: dict[str, int]) -> str:
    """The code word other than ``word`` whose rendering is closest in length to ``word``'s (``lengths``: samples
    per code word, as one speaker says them; ties go to the earlier in :data:`CODE_WORDS`)."""
    others = [w for w in CODE_WORDS if w != word]
    return min(others, key=lambda w: (abs(lengths[w] - lengths[word]), others.index(w)))


@dataclass(frozen=True)
class Draw:
    """What a recording draws once: its code word, whether it says the key, whether it is too short for far slots."""

    word: str
    keyed: bool
    near_only: bool


def draw_recording(rng: random.Random, target_s: float, index: int | None = None) -> Draw:
    """The per-recording draws, first in the recall stream. Without a key: the recording whose ``index`` in its split
    is a multiple of 1/:data:`NO_KEY_SHARE` (None: drawn by chance at that share); the draw is made either way, so
    the rest of the stream does not depend on it."""
    word = rng.choice(CODE_WORDS)
    keyed = rng.random() >= NO_KEY_SHARE
    if index is not None:
        keyed = index % round(1 / NO_KEY_SHARE) != 0
    return Draw(word, keyed, target_s < FAR_MIN_RECORDING_S)


def far_offsets(rng: random.Random, k: int = FAR_PER_EPISODE) -> list[float]:
    """``k`` sorted offsets (seconds after the latest clear mention) for the far slots of an episode: drawn from the far
    band, less room for the sentence still being said when one falls due and for the slot sentence's prefix."""
    lo, hi = FAR_S[0], FAR_S[1] - SENTENCE_S - SLOT_PREFIX_S
    return sorted(rng.uniform(lo, hi) for _ in range(k))


def in_band(distance_s: float, band: str) -> bool:
    lo, hi = BANDS[band]
    return lo <= distance_s <= hi


class RecallPlanter:
    """What the renderer says next, so that slots sit at the configured distances (see the module docstring).

    The renderer calls :meth:`sentence` before each sentence (the words to say, or None for an ordinary sentence),
    :meth:`holds_turn` before the pause and turn change that follow a sentence, :meth:`masks` before synthesising each
    word of a recall sentence (True: render :func:`masker` instead), and :meth:`heard` for each word it places."""

    def __init__(self, cfg: RecallConfig, seed: int, target_s: float, index: int | None = None) -> None:
        if not cfg.active:
            raise ValueError("a RecallPlanter needs a recall rate above 0")
        check_code_words()
        self.cfg = cfg
        self.rng = random.Random(f"recall/{seed}")
        self.draw = draw_recording(self.rng, target_s, index)
        self.word = self.draw.word
        self.target_s = target_s
        self.next_at = self.rng.uniform(*LEAD_S)
        self.first_at = self.next_at
        # seconds of speech per slot: RATE a minute over the whole recording, placed between the lead and the tail
        usable = max(1.0, target_s - self.first_at - 2 * SENTENCE_S)
        self.spacing = 60.0 / cfg.per_minute * usable / max(1.0, target_s)
        self.queue: list[str] = []  # "key", "near" (a near slot) for the episode under way
        self.offsets: list[float] = []  # far offsets still due in the episode under way
        self.in_episode = False
        self.ref: float | None = None  # end of the latest clear mention (without a key: where it would have been)
        self.near_n = self.far_n = 0
        self.current: tuple[str, str] | None = None  # ("key", "") or ("slot", band) of the sentence being said
        self.cancelled = False
        self._kind = ""  # of the slot being said
        self._start_index = 0  # its first word's index
        self.clear: list[int] = []  # transcript indices of clear mentions
        self.slots: list[dict] = []  # index, band, kind, start_index, masker_samples

    # -- sentences ----------------------------------------------------------------------------------------------------

    def sentence(self, now: float) -> list[str] | None:
        """The recall sentence starting at ``now`` seconds, or None (say an ordinary one)."""
        self.current, self.cancelled = None, False
        item = self._next(now)
        if item is None:
            return None
        if item == "key":
            self.current = ("key", "")
            return [*KEY_WORDS, self.word]
        self.current = ("slot", item)
        if item == "near":
            self.near_n += 1
        else:
            self.far_n += 1
        return [*SLOT_WORDS, self.word]

    def _next(self, now: float) -> str | None:
        if self.queue:
            return self.queue.pop(0)
        if self.offsets:
            assert self.ref is not None
            if now - self.ref < self.offsets[0]:
                return None
            self.offsets.pop(0)
            if now - self.ref + SLOT_PREFIX_S <= FAR_S[1]:
                return "far"
            self.offsets.clear()  # the sentences ran past the band: the episode asks no more
        if self.in_episode:  # the episode is over: the next one when the rate asks for it
            self.in_episode = False
            slots = self.near_n + self.far_n
            self.next_at = self.first_at + slots * self.spacing
        if now < self.next_at or now + 2 * SENTENCE_S > self.target_s:
            return None
        self.in_episode = True
        self.queue = ["key", "near"] if self.draw.keyed else ["near"]
        if not self.draw.keyed:
            self.ref = now
        # a far episode once the near slots lead by half an episode's far ones: the bands stay about even
        if not self.draw.near_only and self.near_n - self.far_n >= (FAR_PER_EPISODE - 1) // 2 \
                and self.target_s - now >= FAR_S[0] + SENTENCE_S + SLOT_PREFIX_S:
            self.offsets = far_offsets(self.rng)
        return self.queue.pop(0)

    def holds_turn(self) -> bool:
        """A near slot follows the sentence just said (a key): the same speaker goes on after the shortest pause."""
        return self.current is not None and self.current[0] == "key" and self.queue[:1] == ["near"]

    # -- words --------------------------------------------------------------------------------------------------------

    def masks(self, position: int, start_s: float) -> bool:
        """Whether the ``position``-th word of the current sentence, starting at ``start_s`` seconds, is masked. Decides
        the slot's kind; a slot whose distance falls outside its band is said clearly instead (a clear mention)."""
        if self.current is None or self.current[0] != "slot" or position != len(SLOT_WORDS):
            return False
        band = self.current[1]
        if not self.draw.keyed:
            self._kind = "no-key"
            return True
        assert self.ref is not None
        if not in_band(round(start_s, 3) - self.ref, band):
            self.cancelled = True
            if band == "near":
                self.near_n -= 1
            else:
                self.far_n -= 1
            return False
        self._kind = "unmasked" if self.rng.random() < UNMASKED_SHARE else "masked"
        return self._kind != "unmasked"

    def heard(self, index: int, position: int, word: Word, start_sample: int, end_sample: int) -> None:
        """The renderer placed ``word`` (the ``position``-th of its sentence, samples ``start_sample`` to
        ``end_sample``) as the recording's ``index``-th word."""
        if self.current is None:
            return
        kind, band = self.current
        end = float(word.end or 0.0)
        if kind == "key" and position == len(KEY_WORDS):
            self.clear.append(index)
            self.ref = end
        elif kind == "slot" and position == 0:
            self._start_index = index
        elif kind == "slot" and position == len(SLOT_WORDS):
            if self.cancelled:
                self.clear.append(index)
                self.ref = end
                if band == "far":
                    self.offsets.clear()  # a clear mention: later far slots of this episode would come too close
                return
            masked = self._kind != "unmasked"
            self.slots.append({"index": index, "band": band, "kind": self._kind, "start_index": self._start_index,
                               "masker_samples": [start_sample, end_sample] if masked else None})
            if not masked:  # a clear mention: the far offsets count from it; after a far one, none would fit
                self.clear.append(index)
                self.ref = end
                if band == "far":
                    self.offsets.clear()

    def meta(self, rec_id: str, words: Sequence[Word]) -> dict:
        """The recording's metadata entries (see the module docstring)."""
        return {"recall": self.cfg.spec(), "recall_word": self.word, "recall_key": self.draw.keyed,
                "recall_near_only": self.draw.near_only, "recall_clear": list(self.clear),
                "recall_slots": slot_records(rec_id, words, self.clear, self.slots)}


def slot_records(rec_id: str, words: Sequence[Word], clear: Sequence[int], slots: Sequence[dict]) -> list[dict]:
    """One record per slot, its distance measured from the timed ``words``: from the end of the latest clear
    mention before it (``clear``: transcript indices) to the start of its code word (None where there is none).
    ``slots``: index, band, kind, start_index (the slot sentence's first word) and masker_samples, as planted."""
    out = []
    for k, s in enumerate(slots):
        i = s["index"]
        w, first = words[i], words[s["start_index"]]
        before = [c for c in clear if c < i]
        dist = None if not before else round(float(w.start) - float(words[before[-1]].end), 3)
        span = s["masker_samples"]
        out.append({"slot": f"{rec_id}/{k}", "index": i, "word": w.text, "start": first.start, "end": w.end,
                    "masker": None if span is None else [w.start, w.end], "masker_samples": span,
                    "distance_s": dist if s["kind"] != "no-key" else None, "band": s["band"], "kind": s["kind"]})
    return out
