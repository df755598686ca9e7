"""The copy plant of the synthetic corpus (``synth --copy BANDS``): a one-piece identity token said clearly, then
asked for again with its audio masked, at a known distance, placed so that every training window holds what a slot
needs.

Each *episode* draws an *identity token* afresh (uniformly from :data:`IDENTITY_TOKENS`, its own random stream
``copy/<seed>``): 16 letters spoken by their names, none a word (or the prefix of a word) the generator says
otherwise, none the prefix of another (:func:`check_tokens`), so that a tokenizer given them as user symbols
(:func:`one_piece_words`) encodes each to exactly one piece. The *key* "letter X" says it clearly; a *slot*
"letter X" asks for it with X's audio replaced by the recall plant's masker
(:func:`~asr_core.data.synth.recall.masker`, pink noise at the level of the carrier word before it); the transcript
keeps X, and X's word times are the masker's span. Each token is spoken as written.

Cells. The recording's time axis is cut into cells of :data:`CELL_S` = 5.12 s, ``[k 5.12, (k+1) 5.12)`` from the
recording's first sample, the origin the training windows count from (:func:`asr_core.data.chunking.window_bounds`:
``[k L, (k+1) L)``). Every window of a context ``L = 5.12 * 2^j`` (the sequence-length warmup's 5.12, 10.24, ...,
81.92 s) is then a union of whole cells; a context that is not such a multiple (3600 s, say) is not aligned, and
nothing here holds for it. An episode lies inside one cell, :data:`MARGIN_S` from both its ends, so every training
window of every aligned context holds the whole episode or none of it.

* ``near``: an episode in every other cell (the odd ones, k = 1, 3, 5, ...): the key at the cell's start (plus the
  margin), then one slot whose token starts :data:`NEAR_S` (1-3 s) after the end of the key's token, drawn
  uniformly; where the cell leaves less (the slowest voices, the longest tokens), uniformly up to what it leaves.
  The same speaker says both (a meeting holds the turn).
* ``far`` (``--copy near,far``): the recording's :data:`BLOCK_S` = 81.92 s blocks alternate: even blocks are near
  blocks as above, odd blocks far blocks: one key in the block's second cell, then :data:`FAR_SLOTS` (2 or 3;
  ``near,far:LO-HI``: LO to HI, for a training split that asks more far slots) slots
  whose tokens start :data:`FAR_S` (20-60 s) after the end of the key's token, each slot inside its own cell of the
  block (with the margin; uniformly over the positions that allows), and no other identity token in the block. A far
  slot is said by whoever holds the turn. A block is far only when the recording reaches past its last slot cell
  (:data:`FAR_LAST_CELL`): a recording shorter than one block and a far episode's span gets near blocks only.

Ordinary speech (the generator's sentences) fills the rest, and never crosses into a cell an episode uses: a sentence
stops (its remaining words are dropped) before a word whose audio would reach past the next such cell's start less
the margin; the renderer then waits in silence until the episode starts (:meth:`CopyPlanter.wait`,
:meth:`CopyPlanter.fits`). After an episode, ordinary speech resumes in the rest of its cell.

Controls: :data:`UNMASKED_SHARE` of the slots are said unmasked (the acoustic ceiling; an unmasked far slot ends its
episode, being a clear mention itself); in the evaluation splits (every split but ``train``) every
:data:`NO_KEY_EVERY`-th recording by index (the first included) never says its keys: the key sentence is left out
(silence in its span), the slots remain, kind ``no-key``: the guess rate, 1/16. The training split has no such
recordings: every slot it trains on is answerable.

Metadata, in the recall plant's format (:func:`~asr_core.data.synth.recall.slot_records`, read by
:func:`asr_core.evaluation.scorers.slots.recall_slots`): ``recall`` (``"copy:near"`` or ``"copy:near,far"``), ``recall_word``
(null: the token changes by episode), ``recall_key``, ``recall_near_only``, ``recall_clear`` (indices of the clear
mentions: keys and unmasked slots), ``recall_choices`` (the 16 tokens, the candidates of a forced choice) and
``recall_slots``, each with the recall plant's fields plus ``key_index`` (the transcript index of its key's token;
null without a key). ``distance_s`` is measured from the end of the key's token, the latest clear mention before the
slot. The causal check (:mod:`asr_core.data.synth.rerender`) says every key token as its :func:`partner` (swap) or
not at all (silence): :class:`CopyEdit`; a model that copies follows the swap, :func:`swap_of_slot`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asr_core.data.corpora.base import Word
from asr_core.data.synth.recall import CODE_WORDS, EDITS, KEY_WORDS, MASKER_S, SLOT_WORDS, KeyEdit, slot_records
from asr_core.data.synth.text import vocabulary

SAMPLE_RATE = 16000  # asr_core.data.audio's (not imported: that pulls in the audio side)
IDENTITY_TOKENS = ("aitch", "ar", "cue", "dee", "ef", "ell", "em", "ess", "gee", "jay", "kay", "tee", "vee", "wye",
                   "yew", "zed")
# the swap of the causal check: tokens sorted by their rendered length (espeak-ng, a few voices) and paired with
# their neighbour, so that a swapped token fills the key's span with little time-scaling
PARTNER_PAIRS = (("ef", "ess"), ("dee", "tee"), ("gee", "ar"), ("ell", "jay"), ("kay", "em"), ("yew", "aitch"),
                 ("zed", "cue"), ("vee", "wye"))
CARRIER = "letter"  # the key and the slot: the carrier, then the token
BANDS = ("near", "far")
SPECS = ("near", "near,far")
CELL_S = 5.12
CELL = 81920  # samples of a cell (CELL_S * SAMPLE_RATE, exactly)
BLOCK_CELLS = 16
BLOCK_S = CELL_S * BLOCK_CELLS  # 81.92
MARGIN_S = 0.1
MARGIN = 1600
NEAR_S = (1.0, 3.0)
FAR_S = (20.0, 60.0)
FAR_SLOTS = (2, 3)
FAR_SLOTS_MAX = 8  # a far block's cells 5-12 hold one slot each (20-60 s after a key that ends by 7 s)
FAR_KEY_CELL = 1  # of its block
FAR_LAST_CELL = 13  # of its block: the last a far slot may use (the key's token ends 7 s into the block at most)
UNMASKED_SHARE = 0.10
NO_KEY_EVERY = 5
EDGE_S = 0.002  # inside the band's ends, so that times rounded to milliseconds stay in the band
PAUSE_S = 0.15  # at least, between the key's token and a near slot's carrier
GAP_S = 0.17  # the longest pause between two words (the rooms' word gap, 0.12 s, times 1.4)
STRETCH = 1.12  # a word's two renditions differ by rate 0.95 / 1.05: lengths of another rendition, bounded
TOKEN_MAX_S = 1.0  # the longest token said clearly, at the slowest rate any split uses (0.88 s measured)
LEAD_MAX_S = 1.05  # the longest carrier and pause before a slot's token (0.79 s + the pause, measured)
NOMINAL_KEY_S = 1.2  # without a key: where its token would have ended, after the key sentence's start
MIN_FILL_S = 0.3  # less room than this before an episode: wait for it rather than start an ordinary sentence


def check_tokens(tokens: Sequence[str] = IDENTITY_TOKENS, lexicon: Sequence[str] | None = None) -> None:
    """Raise ValueError naming the first token that is not a plain lower-case word, that is a word of the lexicon
    (``lexicon``, default :func:`~asr_core.data.synth.text.vocabulary` with the recall plant's words and the
    carrier) or the prefix of one, or that is the prefix of another token (repeats included)."""
    lex = set(vocabulary() if lexicon is None else lexicon) | set(CODE_WORDS) | set(KEY_WORDS) | set(SLOT_WORDS) \
        | {CARRIER}
    for t in tokens:
        if not (t.isalpha() and t.islower()):
            raise ValueError(f"identity token {t!r} must be one lower-case word of letters")
        hit = sorted(w for w in lex if w.startswith(t))
        if hit:
            raise ValueError(f"identity token {t!r} is, or begins, a word the generator says: {hit[0]!r}")
        other = [u for u in tokens if u is not t and u.startswith(t)]
        if other:
            raise ValueError(f"identity token {t!r} is the prefix of another token {other[0]!r}")


def partner(token: str) -> str:
    """The token a swap says instead of ``token`` (:data:`PARTNER_PAIRS`: a derangement, its own inverse)."""
    for a, b in PARTNER_PAIRS:
        if token == a:
            return b
        if token == b:
            return a
    raise ValueError(f"{token!r} is not an identity token; valid: {', '.join(IDENTITY_TOKENS)}")


def swap_of_slot(meta: dict, slot: dict) -> str:
    """The word a model that copies says at ``slot`` (a ``recall_slots`` entry of the recording's metadata ``meta``)
    when the keys are swapped: the partner of the slot's word. For a corpus of the recall plant (one code word per
    recording) this is not the function to use: its swap word is the one :class:`KeyEdit` names."""
    if not str(meta.get("recall", "")).startswith("copy:"):
        raise ValueError(f"metadata of {meta.get('id')!r} is not of a copy plant (recall: {meta.get('recall')!r})")
    return partner(str(slot["word"]))


def one_piece_words(split_dir: Path) -> tuple[str, ...]:
    """The words a tokenizer trained on ``split_dir`` (``<corpus>/<split>``) must keep as one piece each: the
    identity tokens when the corpus's ``synth.json`` records ``--copy``; () otherwise (no stamp, another corpus)."""
    try:
        args = json.loads((Path(split_dir).parent / "synth.json").read_text()).get("args", {})
    except (OSError, ValueError, AttributeError):
        return ()
    return IDENTITY_TOKENS if isinstance(args, dict) and args.get("copy") else ()


@dataclass(frozen=True)
class CopyConfig:
    """The copy plant: ``bands``, ``("near",)`` or ``("near", "far")``; () for none (the corpus as without it).
    ``far_slots``: how many slots a far episode draws, uniformly from ``lo..hi`` (:data:`FAR_SLOTS` unless the spec
    says ``near,far:LO-HI``; a far block's cells leave room for at most :data:`FAR_SLOTS_MAX`)."""

    bands: tuple[str, ...] = ()
    far_slots: tuple[int, int] = FAR_SLOTS

    def __post_init__(self) -> None:
        if self.bands and ",".join(self.bands) not in SPECS:
            raise ValueError(f"copy bands {self.bands!r}: one of {' or '.join(SPECS)}")
        lo, hi = self.far_slots
        if not (1 <= lo <= hi <= FAR_SLOTS_MAX):
            raise ValueError(f"far slots {lo}-{hi}: LO-HI with 1 <= LO <= HI <= {FAR_SLOTS_MAX}")
        if self.far_slots != FAR_SLOTS and not self.far:
            raise ValueError(f"far slots {lo}-{hi} without the far band: give near,far:{lo}-{hi}")

    @property
    def active(self) -> bool:
        return bool(self.bands)

    @property
    def far(self) -> bool:
        return "far" in self.bands

    def spec(self) -> str:
        """``"near,far"`` (``"near,far:LO-HI"`` for other far slot counts): what :meth:`parse` reads back
        (``synth.json``'s ``copy``)."""
        tail = "" if self.far_slots == FAR_SLOTS else f":{self.far_slots[0]}-{self.far_slots[1]}"
        return ",".join(self.bands) + tail

    @classmethod
    def parse(cls, text: str) -> "CopyConfig":
        """``"near"``, ``"near,far"`` or ``"near,far:LO-HI"`` (LO to HI slots per far episode)."""
        valid = f"valid: {' or '.join(SPECS)}, or near,far:LO-HI with 1 <= LO <= HI <= {FAR_SLOTS_MAX}"
        head, colon, count = text.partition(":")
        bands = tuple(b.strip() for b in head.split(","))
        if ",".join(bands) not in SPECS:
            raise ValueError(f"copy spec {text!r}; {valid}")
        if not colon:
            return cls(bands)
        lo, dash, hi = count.strip().partition("-")
        try:
            slots = (int(lo), int(hi if dash else lo))
            return cls(bands, slots)
        except ValueError:
            raise ValueError(f"copy spec {text!r}; {valid}") from None


@dataclass(frozen=True)
class CopyEdit(KeyEdit):
    """:class:`~asr_core.data.synth.recall.KeyEdit` for the copy plant: every key token said as its
    :func:`partner` (``swap``) or not at all (``silence``), in the span the unedited token had. It names no word:
    the swap depends on the token (:meth:`instead`)."""

    def __post_init__(self) -> None:
        if self.mode not in EDITS:
            raise ValueError(f"key edit {self.mode!r}: one of {', '.join(EDITS)}")
        if self.word:
            raise ValueError(f"a copy plant's key edit names no word (got {self.word!r}): the swap is per token")

    def instead(self, token: str) -> str:
        """What is said in ``token``'s span: its partner, or nothing ("")."""
        return partner(token) if self.mode == "swap" else ""


@dataclass
class _Slot:
    band: str
    cell: int
    at: int  # the token's start (samples)
    start: int  # the slot sentence's start
    kind: str = "masked"


@dataclass
class _Episode:
    band: str
    cell: int  # the key's
    token: str
    slots: list[_Slot] = field(default_factory=list)
    key_index: int | None = None

    @property
    def start(self) -> int:
        return self.cell * CELL + MARGIN


def _s(seconds: float) -> int:
    return int(math.ceil(seconds * SAMPLE_RATE - 1e-9))


class CopyPlanter:
    """What the renderer says next, and when, so that every episode lies in its cell (see the module docstring).

    The interface of :class:`~asr_core.data.synth.recall.RecallPlanter` (:meth:`sentence`, :meth:`holds_turn`,
    :meth:`masks`, :meth:`heard`, :meth:`meta`), and three hooks on the renderer's cursor, in samples: :meth:`wait`
    before each sentence (the cursor moved to the episode's start when one is due: silence until then),
    :meth:`place` before each word (a slot's token at its planned start) and :meth:`fits` before each word of an
    ordinary sentence (False: drop the rest of the sentence)."""

    def __init__(self, cfg: CopyConfig, seed: int, target_s: float, index: int, split: str) -> None:
        if not cfg.active:
            raise ValueError("a CopyPlanter needs a band")
        check_tokens()
        self.cfg = cfg
        self.rng = random.Random(f"copy/{seed}")
        self.keyed = split == "train" or index % NO_KEY_EVERY != 0
        target = int(target_s * SAMPLE_RATE)
        self.far_blocks = [b for b in range(1, math.ceil(target_s / BLOCK_S), 2) if cfg.far
                           and b * BLOCK_CELLS * CELL + (FAR_LAST_CELL + 1) * CELL <= target]
        self.near_only = not self.far_blocks
        self.episodes: list[_Episode] = []
        for c in range(1, target // CELL + 1):
            if (c + 1) * CELL > target:
                break
            b, k = divmod(c, BLOCK_CELLS)
            if b in self.far_blocks:
                if k == FAR_KEY_CELL:
                    self.episodes.append(_Episode("far", c, self.rng.choice(IDENTITY_TOKENS)))
            elif c % 2 == 1:
                self.episodes.append(_Episode("near", c, self.rng.choice(IDENTITY_TOKENS)))
        # the sentences still to say, in time order: (start sample, "key" or "slot", episode, slot)
        self.items: list[tuple[int, str, _Episode, _Slot | None]] = []
        for ep in self.episodes:
            if self.keyed:
                self.items.append((ep.start, "key", ep, None))
            else:  # the key's span stays silent; its token would have ended NOMINAL_KEY_S after the start
                self._plan_slots(ep, ep.start + _s(NOMINAL_KEY_S), _s(LEAD_MAX_S), TOKEN_MAX_S)
        self.items.sort(key=lambda it: it[0])
        self.current: tuple[str, _Episode, _Slot | None] | None = None
        self.cut = False
        self.last_end = 0  # the end of the latest audio placed (samples)
        self._letter = (0, 0)  # the key's carrier: start, end (samples)
        self._start_index = 0
        self.clear: list[int] = []
        self.slots: list[dict] = []  # index, band, kind, start_index, masker_samples, key_index

    # -- planning -----------------------------------------------------------------------------------------------------

    def _plan_slots(self, ep: _Episode, ref: int, lead: int, clear_s: float) -> None:
        """Plan ``ep``'s slots once its key's token ends at ``ref`` (samples): ``lead`` samples of carrier and pause
        before each slot's token, and after it the masker or, unmasked, a token of at most ``clear_s`` s."""
        if ep.band == "near":
            kind = self._kind()
            tok = _s(MASKER_S) if kind != "unmasked" else max(_s(MASKER_S), _s(clear_s))
            lo = ref + max(_s(NEAR_S[0] + EDGE_S), _s(PAUSE_S) + lead)
            hi = min(ref + int((NEAR_S[1] - EDGE_S) * SAMPLE_RATE), (ep.cell + 1) * CELL - MARGIN - tok)
            u = self.rng.random()
            if hi >= lo:
                at = lo + int(u * (hi - lo))
                ep.slots.append(_Slot("near", ep.cell, at, at - lead, kind))
        else:
            tok = max(_s(MASKER_S), _s(clear_s))  # the kinds are drawn once the cells are
            n = self.rng.choice(tuple(range(self.cfg.far_slots[0], self.cfg.far_slots[1] + 1)))
            block = ep.cell // BLOCK_CELLS * BLOCK_CELLS
            free = []  # (cell, first, last) token starts that keep the slot in the cell and the band
            for c in range(block + FAR_KEY_CELL + 1, block + FAR_LAST_CELL + 1):
                first = max(c * CELL + MARGIN + lead, ref + _s(FAR_S[0] + EDGE_S))
                last = min((c + 1) * CELL - MARGIN - tok, ref + int((FAR_S[1] - EDGE_S) * SAMPLE_RATE))
                if last > first:
                    free.append((c, first, last))
            chosen = []
            while free and len(chosen) < n:  # cells by the room they leave: positions uniform over the union
                pick = self.rng.uniform(0, sum(last - first for _, first, last in free))
                for i, (c, first, last) in enumerate(free):
                    pick -= last - first
                    if pick <= 0 or i == len(free) - 1:
                        break
                c, first, last = free.pop(i)
                chosen.append((c, first + int(self.rng.random() * (last - first))))
            for c, at in sorted(chosen, key=lambda x: x[1]):
                kind = self._kind()
                ep.slots.append(_Slot("far", c, at, at - lead, kind))
                if kind == "unmasked":
                    break  # a clear mention: the episode asks no more
        for s in ep.slots:
            self.items.append((s.start, "slot", ep, s))

    def _kind(self) -> str:
        if not self.keyed:
            return "no-key"
        return "unmasked" if self.rng.random() < UNMASKED_SHARE else "masked"

    def _limit(self) -> int:
        """Where ordinary speech must have ended: the next cell an episode still uses, less the margin."""
        if not self.items:
            return 1 << 62
        _, _, ep, slot = self.items[0]
        return (ep.cell if slot is None else slot.cell) * CELL - MARGIN

    # -- the cursor ---------------------------------------------------------------------------------------------------

    def wait(self, cursor: int) -> int:
        """The cursor (samples) to start the next sentence at: the next episode sentence's start when it is due (an
        ordinary sentence was stopped short of it, or no ordinary word fits before it), else ``cursor``."""
        self.current = None
        if not self.items:
            return cursor
        start, what, ep, slot = self.items[0]
        if not (self.cut or cursor + _s(MIN_FILL_S) > self._limit()):
            return cursor
        self.items.pop(0)
        self.cut = False
        if start < self.last_end:
            raise AssertionError(f"copy plant: an episode sentence due at sample {start} overlaps speech that ends "
                                 f"at {self.last_end}")
        self.current = (what, ep, slot)
        return start

    def fits(self, end: int) -> bool:
        """Whether an ordinary word ending at sample ``end`` keeps out of the next episode's cell (False: the
        sentence stops here, and the episode is due)."""
        if end <= self._limit():
            return True
        self.cut = True
        return False

    def place(self, position: int, cursor: int) -> int:
        """The start (samples) of the ``position``-th word of the current sentence: a slot's token at its planned
        start, any other word at ``cursor``."""
        if self.current is not None and self.current[0] == "slot" and position == 1:
            assert self.current[2] is not None
            return max(cursor, self.current[2].at)
        return cursor

    # -- the recall plant's interface -------------------------------------------------------------------------------

    def sentence(self, now: float) -> list[str] | None:
        """The episode sentence :meth:`wait` made due, or None (say an ordinary one)."""
        return None if self.current is None else [CARRIER, self.current[1].token]

    def keying(self) -> bool:
        """Whether the sentence being said is a key (the causal check edits its token)."""
        return self.current is not None and self.current[0] == "key"

    def holds_turn(self) -> bool:
        """A near slot follows the sentence just said (its key): the same speaker goes on."""
        return self.keying() and self.current is not None and self.current[1].band == "near"

    def masks(self, position: int, start_s: float) -> bool:
        """Whether the ``position``-th word of the current sentence is masked (a slot's token, unless unmasked)."""
        if self.current is None or self.current[0] != "slot" or position != 1:
            return False
        assert self.current[2] is not None
        return self.current[2].kind != "unmasked"

    def heard(self, index: int, position: int, word: Word, start_sample: int, end_sample: int) -> None:
        """The renderer placed ``word`` (the ``position``-th of its sentence, samples ``start_sample`` to
        ``end_sample``) as the recording's ``index``-th word."""
        self.last_end = max(self.last_end, end_sample)
        if self.current is None:
            return
        what, ep, slot = self.current
        if what == "key" and position == 0:
            self._letter = (start_sample, end_sample)
        elif what == "key" and position == 1:
            ep.key_index = index
            self.clear.append(index)
            near = ep.band == "near"
            # a near slot: the same speaker, its carrier and token as long as the key's up to another rendition; a
            # far one: perhaps another speaker, the longest any says
            lead = _s(STRETCH * (self._letter[1] - self._letter[0]) / SAMPLE_RATE + GAP_S) if near \
                else _s(LEAD_MAX_S)
            clear_s = STRETCH * (end_sample - start_sample) / SAMPLE_RATE if near else TOKEN_MAX_S
            self._plan_slots(ep, end_sample, lead, clear_s)
            self.items.sort(key=lambda it: it[0])
        elif what == "slot" and position == 0:
            self._start_index = index
        elif what == "slot" and position == 1:
            assert slot is not None
            masked = slot.kind != "unmasked"
            if not masked:
                self.clear.append(index)
            self.slots.append({"index": index, "band": slot.band, "kind": slot.kind, "start_index": self._start_index,
                               "masker_samples": [start_sample, end_sample] if masked else None,
                               "key_index": ep.key_index})

    def meta(self, rec_id: str, words: Sequence[Word]) -> dict:
        """The recording's metadata entries (see the module docstring)."""
        records = slot_records(rec_id, words, self.clear, self.slots)
        for r, s in zip(records, self.slots):
            r["key_index"] = s["key_index"]
        return {"recall": f"copy:{self.cfg.spec()}", "recall_word": None, "recall_key": self.keyed,
                "recall_near_only": self.near_only, "recall_clear": list(self.clear),
                "recall_choices": list(IDENTITY_TOKENS), "recall_slots": records}
