"""A synthetic long-form corpus spoken by espeak-ng: ``python -m asr_core synth --out OUT --hours H --seed S``.

Output layout (every split loads with the podcast reader, e.g. ``load_corpus("podcast:OUT/train")``)::

    OUT/synth.json              the arguments and a summary per split (re-running with the same ones resumes)
    OUT/recordings.jsonl        one line per recording: split, kind, topic, key terms, voices, acoustic condition
    OUT/train/<id>.wav|.json    16 kHz mono PCM WAV + speech-API JSON with word times (``--hours`` of audio)
    OUT/dev/                    in-domain, ``--eval-hours`` (default max(0.1, hours/10))
    OUT/test/                   in-domain: the training voices and conditions, new recordings
    OUT/test-shifted/           shifted domain: unseen accents and voice variants, speaking rates and pitches
                                outside the training ranges, a narrower (telephone-like) channel, more reverberation
                                and background noise (``--shift far``, the default); with ``--shift near``
                                the training voices themselves, at rates and pitches just outside the training
                                ranges, in the shifted rooms
    OUT/meta/<id>.json          per-recording metadata (gathered into recordings.jsonl); with ``--cue``, the
                                planted words (``cues``: index, word, distances; see :mod:`asr_core.data.synth.cues`);
                                with ``--recall``, the code word and its slots (``recall_slots``; see
                                :mod:`asr_core.data.synth.recall`)

Recordings last ``--min-minutes`` to ``--max-minutes`` (default 1-5); ``--eval-max-minutes`` shortens those of
dev, test and test-shifted, so that a small evaluation set still has enough recordings for a paired test, and
``--eval-min-minutes`` sets their shortest (recordings long enough to hold many window edges). Each is
a "podcast" (one voice) or, with probability ``--meeting-fraction``, a "meeting" (two voices alternating turns).
Structure that rewards long context, as real long-form audio does: one espeak-ng voice, rate and pitch per speaker
and one acoustic condition (channel colouring, reverberation, background noise level) per recording, held for the
whole recording; one topic per recording whose key terms recur minutes apart (see
:mod:`asr_core.data.synth.text`). Topics are dealt from shuffled decks, so a split of 12 recordings covers all
12, and each recording drops in an occasional word of another topic, so that a small training split has heard
every word.

``--cue RATE[,NEAR-FAR][,gK]`` plants a long-range cue in every split (:mod:`asr_core.data.synth.cues`): words that
sound the same but are spelt by the recording's topic, RATE a minute, each with the nearest word that gives the topic
away NEAR to FAR seconds before it (default 20-60) and none within NEAR seconds after it; ``gK`` plants only the
first K cue groups and deals every recording a topic that owns one of their spellings (a concentrated plant: many
examples of few spellings). ``--cue 0`` (the default) makes the corpus as it was before the cue existed, byte for
byte; a spec without ``gK`` makes the corpus it made before ``gK`` existed. ``--cue-report`` prints, per split, how often a window of
5, 10, 20, 40 and 80 s holds a disambiguating word with the cue word.

``--recall RATE`` plants a masked-recall control (:mod:`asr_core.data.synth.recall`): each recording's code word,
one of 8 words the generator never says otherwise, is said clearly ("the code word is X") and asked for again RATE
times a minute ("remember the code word X") with X's audio replaced by a fixed 0.8 s pink-noise masker at the
sentence's level; the transcript keeps X. Half the slots lie 1-4 s after the latest clear mention, half 20-60 s; about
10% are unmasked and about 5% of the recordings never say the key. ``--recall 0`` (the default) makes the corpus as it
was before the plant existed, byte for byte.

``--copy near`` or ``--copy near,far`` plants the copy control (:mod:`asr_core.data.synth.copy_plant`) instead: a
one-piece identity token (one of 16 letters said by name, drawn afresh for every episode), said clearly ("letter X")
and asked for again with its audio masked, 1-3 s later inside one 5.12 s cell of the recording (near), or 20-60 s
later inside one 81.92 s block (far, in every other block), so that every training window of a context 5.12 * 2^k s
holds an episode whole or not at all. Not with ``--recall`` or ``--cue``; without it the corpus is as before.

Word times are exact by construction: every word is synthesised on its own
(:mod:`asr_core.data.synth.audio`), its leading and trailing silence trimmed, and placed at a known sample
offset with short pauses between words; the reported start and end are the first and last sample of the trimmed
word. Everything is a pure function of ``--seed``: each recording has its own seed derived from (seed, split,
index), so the number of parallel ``--jobs`` does not change the output.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from asr_core.data.corpora import podcast
from asr_core.data.corpora.base import Word
from asr_core.data.synth.cues import CueConfig, CuePlanter, cue_sites, cue_topics, sound_of
from asr_core.data.synth.pool import Interrupted, render_all
from asr_core.data.synth.text import TOPICS, SentenceMaker

# the audio side (torch, torchaudio, scipy, soundfile) is imported where a recording is drawn or rendered: a
# refusal of the command line needs none of it
if TYPE_CHECKING:
    from asr_core.data.synth.copy_plant import CopyConfig
    from asr_core.data.synth.recall import KeyEdit, RecallConfig
    from asr_core.data.synth.audio import Room, Speaker

FORMAT_VERSION = 1
SPLITS = ("train", "dev", "test", "test-shifted")


@dataclass(frozen=True)
class Domain:
    """Ranges each recording's voice and acoustic condition are drawn from."""

    accents: tuple[str, ...]  # espeak-ng language voices
    variants: tuple[str, ...]  # espeak-ng voice variants (+m1, +f2, ...)
    rates: tuple[tuple[int, int], ...]  # words per minute, one of these ranges
    pitches: tuple[tuple[int, int], ...]  # espeak-ng pitch 0-99
    highpass_hz: tuple[float, float]
    lowpass_hz: tuple[float, float]
    peak_db: tuple[float, float]  # a resonance somewhere in 400-3000 Hz
    reverb_s: tuple[float, float]  # decay time of the synthetic room
    reverb_mix: tuple[float, float]
    noise_snr_db: tuple[float, float]  # stationary background, relative to the speech


DOMAINS: dict[str, Domain] = {
    "in": Domain(accents=("en-us", "en", "en-gb-x-rp"), variants=("m1", "m2", "m3", "m4", "f1", "f2", "f3"),
                 rates=((145, 185),), pitches=((35, 65),), highpass_hz=(60, 180), lowpass_hz=(4500, 7500),
                 peak_db=(-5, 5), reverb_s=(0.05, 0.25), reverb_mix=(0.0, 0.25), noise_snr_db=(20, 35)),
    # shifted, but not so far that a small model trained on "in" cannot recognise anything
    "shifted": Domain(accents=("en-gb-scotland", "en-029", "en-us-nyc", "en-gb-x-gbclan"),
                      variants=("m5", "m6", "m7", "f4", "f5"), rates=((120, 138), (192, 208)),
                      pitches=((18, 30), (70, 82)), highpass_hz=(200, 350), lowpass_hz=(3000, 4000),
                      peak_db=(-9, 9), reverb_s=(0.25, 0.45), reverb_mix=(0.2, 0.4), noise_snr_db=(12, 20)),
    # a milder shift for models trained on a few voices (--shift near): the training voices, speaking faster or
    # slower and higher or lower than in training, through a narrower channel in more reverberant, noisier rooms
    "near": Domain(accents=("en-us", "en", "en-gb-x-rp"), variants=("m1", "m2", "m3", "m4", "f1", "f2", "f3"),
                   rates=((128, 142), (188, 198)), pitches=((24, 33), (67, 76)), highpass_hz=(150, 280),
                   lowpass_hz=(3600, 4500), peak_db=(-8, 8), reverb_s=(0.2, 0.4), reverb_mix=(0.15, 0.35),
                   noise_snr_db=(14, 22)),
}
SHIFTS = ("far", "near")  # --shift: which domain test-shifted is drawn from ("far" = DOMAINS["shifted"])
SPLIT_DOMAIN = {"train": "in", "dev": "in", "test": "in", "test-shifted": "shifted"}


@dataclass(frozen=True)
class Plan:
    id: str
    split: str
    kind: str  # "podcast" or "meeting"
    topic: str
    speakers: tuple[Speaker, ...]
    room: Room
    target_s: float
    seed: int
    cue: CueConfig | None = None  # the planted cue (None: none)


def _u(rng: random.Random, lo_hi: tuple[float, float]) -> float:
    return rng.uniform(*lo_hi)


def domain_voices(dom: Domain, voices: int = 0) -> tuple[str, ...]:
    """The domain's espeak-ng voices ("accent+variant"), or only the first ``voices`` of them (0 = all).

    The order deals accents round-robin over variants (en-us+m1, en+m2, en-gb-x-rp+m3, en-us+m4, ...), so a
    short list still mixes accents and sexes.
    """
    combos = [f"{a}+{v}" for a in dom.accents for v in dom.variants]
    diagonal = [f"{dom.accents[i % len(dom.accents)]}+{dom.variants[i % len(dom.variants)]}"
                for i in range(len(combos))]
    ordered = list(dict.fromkeys(diagonal + combos))  # the diagonal first, then any combinations it missed
    return tuple(ordered[:voices] if voices else ordered)


def espeak(text: str, speaker: Speaker) -> np.ndarray:
    """:func:`asr_core.data.synth.audio.espeak` (the one name :func:`render` speaks through, so a test can
    replace the synthesiser here)."""
    from asr_core.data.synth.audio import espeak as speak

    return speak(text, speaker)


def draw_speaker(rng: random.Random, dom: Domain, voices: int = 0) -> Speaker:
    from asr_core.data.synth.audio import Speaker

    rate = rng.randint(*rng.choice(dom.rates))
    pitch = rng.randint(*rng.choice(dom.pitches))
    if voices:
        return Speaker(rng.choice(domain_voices(dom, voices)), rate, pitch)
    return Speaker(f"{rng.choice(dom.accents)}+{rng.choice(dom.variants)}", rate, pitch)


def draw_room(rng: random.Random, dom: Domain) -> Room:
    from asr_core.data.synth.audio import Room

    return Room(highpass_hz=round(_u(rng, dom.highpass_hz), 1), lowpass_hz=round(_u(rng, dom.lowpass_hz), 1),
                peak_hz=round(rng.uniform(400, 3000), 1), peak_db=round(_u(rng, dom.peak_db), 2),
                reverb_s=round(_u(rng, dom.reverb_s), 3), reverb_mix=round(_u(rng, dom.reverb_mix), 3),
                noise_snr_db=round(_u(rng, dom.noise_snr_db), 2), noise_slope=round(rng.uniform(0.0, 2.0), 2),
                word_gap_s=round(rng.uniform(0.04, 0.12), 3))


def recording_seed(seed: int, split: str, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"synth/{seed}/{split}/{index}".encode()).digest()[:8], "little")


def make_plans(split: str, hours: float, seed: int, *, min_minutes: float = 1.0, max_minutes: float = 5.0,
               meeting_fraction: float = 0.3, voices: int = 0, shift: str = "far",
               cue: CueConfig | None = None) -> list[Plan]:
    """The recordings of one split: durations drawn until ``hours`` are used up (at least one recording).
    ``cue`` (when active) is carried by every plan; it draws nothing from the plans' random stream. With
    ``cue.groups`` set, topics are dealt only from :func:`~asr_core.data.synth.cues.cue_topics` (the same draws from
    a shorter deck), so every recording carries cue words.

    ``voices`` > 0 limits the in-domain splits (train, dev, test) to that many espeak-ng voices (see
    :func:`domain_voices`): a narrower, easier training domain. With ``shift="far"`` the shifted split keeps all of
    its own voices; with ``shift="near"`` it speaks with the training voices (the same ``voices`` limit) at rates,
    pitches and in rooms outside the training ranges."""
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {', '.join(SHIFTS)}, got {shift!r}")
    rng = random.Random(f"plans/{seed}/{split}")
    domain = SPLIT_DOMAIN[split]
    if domain == "shifted" and shift == "near":
        domain = "near"
    dom = DOMAINS[domain]
    if domain == "shifted":
        voices = 0
    if voices == 1:
        meeting_fraction = 0.0  # a meeting needs two different voices
    budget, total, plans = hours * 3600.0, 0.0, []
    min_s, max_s = min_minutes * 60.0, max_minutes * 60.0
    cued = cue is not None and cue.active
    deck = cue_topics(cue) if cued else tuple(sorted(TOPICS))
    topics: list[str] = []  # topics dealt from shuffled decks, so even a small split covers them evenly
    while total < budget or not plans:
        if not topics:
            topics = list(deck)
            rng.shuffle(topics)
        remaining = budget - total
        if plans and remaining < 0.5 * min_s:
            break
        target = min(rng.uniform(min_s, max_s), max(remaining, min_s))
        kind = "meeting" if rng.random() < meeting_fraction else "podcast"
        speakers = [draw_speaker(rng, dom, voices)]
        while kind == "meeting" and len(speakers) < 2:
            other = draw_speaker(rng, dom, voices)
            if other.voice != speakers[0].voice:
                speakers.append(other)
        i = len(plans)
        plans.append(Plan(f"{split}-{i:04d}", split, kind, topics.pop(), tuple(speakers),
                          draw_room(rng, dom), round(target, 2), recording_seed(seed, split, i),
                          cue if cued else None))
        total += target
    return plans


# ---- rendering -------------------------------------------------------------------------------------------------

def render(plan: Plan, *, dry: bool = False, recall: RecallConfig | None = None, key_edit: KeyEdit | None = None,
           copy: CopyConfig | None = None) -> tuple[np.ndarray, list[Word], list[int], dict]:
    """Synthesise one recording. Returns (waveform (N,) float32 16 kHz, words with times, speaker index per
    word, metadata). ``dry`` skips the room (channel, reverberation, noise), for tests of the word times.

    With ``plan.cue`` a :class:`~asr_core.data.synth.cues.CuePlanter` chooses the sentences around the cue words and
    the metadata lists them (``cues``); without one, nothing else is drawn and the recording is as it always was.
    With an active ``recall`` a :class:`~asr_core.data.synth.recall.RecallPlanter` puts in its key sentences and
    slots (they take precedence over the cue's sentences) and the metadata lists them (``recall_slots``).
    ``key_edit`` (the causal check) says every clear mention of the code word otherwise, in the same span: every
    other sample, word time and metadata entry is the unedited rendering's (:class:`KeyEdit`).
    With an active ``copy`` (not with ``recall`` or a cue) a :class:`~asr_core.data.synth.copy_plant.CopyPlanter`
    puts its episodes into their cells, stops ordinary sentences short of them and waits for them; ``key_edit`` (a
    :class:`~asr_core.data.synth.copy_plant.CopyEdit`) then says every key token otherwise."""
    from asr_core.data.audio import SAMPLE_RATE
    from asr_core.data.synth.copy_plant import CopyPlanter
    from asr_core.data.synth.recall import RecallPlanter, masker, sentence_rms
    from asr_core.data.synth.audio import Speaker, apply_room

    rng = random.Random(plan.seed)
    maker = SentenceMaker(rng, plan.topic)
    planter = CuePlanter(plan.cue, plan.topic, plan.seed, plan.target_s) if plan.cue is not None else None
    index = int(plan.id.rsplit("-", 1)[1])
    recaller: RecallPlanter | CopyPlanter | None = (RecallPlanter(recall, plan.seed, plan.target_s, index)
                                                    if recall is not None and recall.active else None)
    copier = CopyPlanter(copy, plan.seed, plan.target_s, index, plan.split) if copy is not None and copy.active \
        else None
    if copier is not None:
        if recaller is not None or planter is not None:
            raise ValueError("the copy plant goes with neither the recall plant nor a cue")
        recaller = copier
    cache: dict[tuple[int, str, int], np.ndarray] = {}
    pieces: list[tuple[int, np.ndarray]] = []
    words: list[Word] = []
    speakers: list[int] = []
    sentence_starts: list[int] = []
    edited: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # key_edit: start sample -> (the audio, what is said)
    cursor = int(rng.uniform(0.3, 1.0) * SAMPLE_RATE)
    turn_left, who = rng.randint(1, 3), 0
    while cursor < plan.target_s * SAMPLE_RATE:
        if plan.kind == "meeting" and turn_left <= 0 and not (recaller is not None and recaller.holds_turn()):
            who, turn_left = 1 - who, rng.randint(1, 3)
            cursor += int(rng.uniform(0.3, 0.9) * SAMPLE_RATE)
        if copier is not None:
            cursor = copier.wait(cursor)  # an episode due: silence until it starts
        spk = plan.speakers[who]
        sentence_starts.append(len(words))
        recalled = recaller.sentence(cursor / SAMPLE_RATE) if recaller is not None else None
        first_piece = len(pieces)
        if recalled is not None:
            sentence = recalled
        else:
            sentence = maker.sentence() if planter is None else planter.sentence(maker, cursor / SAMPLE_RATE)[0]
        for j, w in enumerate(sentence):
            variant = rng.randrange(2)  # two renditions per word (rate +-5%) so repeats are not sample-identical
            # a cue word: its group's one sound
            said = w if planter is None or recalled is not None else planter.spoken(j, w)
            key = (who, said, variant)
            if copier is not None:
                cursor = copier.place(j, cursor)  # a slot's token at its planned start
            masked = recaller is not None and recaller.masks(j, cursor / SAMPLE_RATE)
            rate = round(spk.rate * (0.95 if variant == 0 else 1.05))
            if key not in cache and not masked:
                cache[key] = espeak(said, Speaker(spk.voice, rate, spk.pitch))
            gain = 10 ** (rng.uniform(-2, 2) / 20)
            # a masked code word: the fixed masker at the level of the sentence's other words
            audio = masker(sentence_rms([a for _, a in pieces[first_piece:]])) if masked else cache[key] * gain
            if copier is not None and recalled is None and not copier.fits(cursor + len(audio)):
                break  # the word would reach into an episode's cell: the sentence stops here
            if key_edit is not None and recalled is not None and j == len(sentence) - 1 and not masked \
                    and (copier is None or copier.keying()):
                other = key_edit.word if copier is None else key_edit.instead(w)  # type: ignore[attr-defined]
                if other and (who, other, variant) not in cache:
                    cache[(who, other, variant)] = espeak(other, Speaker(spk.voice, rate, spk.pitch))
                edited[cursor] = (audio, key_edit.audio(len(audio), gain * cache[(who, other, variant)]
                                                        if other else None))
            pieces.append((cursor, audio))
            words.append(Word(w, round(cursor / SAMPLE_RATE, 3), round((cursor + len(audio)) / SAMPLE_RATE, 3)))
            speakers.append(who)
            if planter is not None and recalled is None:
                planter.heard(len(words) - 1, j, words[-1])
            if recaller is not None:
                recaller.heard(len(words) - 1, j, words[-1], cursor, cursor + len(audio))
            gap = plan.room.word_gap_s * rng.uniform(0.6, 1.4)
            cursor += len(audio) + int(gap * SAMPLE_RATE)
        if copier is not None and sentence_starts[-1] == len(words):
            sentence_starts.pop()  # stopped before its first word
        pause = rng.uniform(0.25, 0.7)
        if recaller is not None and recaller.holds_turn():
            pause = 0.25  # a near slot follows its key sentence at once
        cursor += int(pause * SAMPLE_RATE)
        turn_left -= 1
    total = cursor + int(0.5 * SAMPLE_RATE)
    wave = np.zeros(total, dtype=np.float32)
    for off, audio in pieces:
        wave[off: off + len(audio)] += audio
    said = wave
    if edited:
        said = wave.copy()
        for off, (audio, placed) in edited.items():
            said[off: off + len(audio)] += placed - audio
    if not dry:
        said = apply_room(said, plan.room, np.random.default_rng(plan.seed % 2**32), levels_of=wave if edited else None)
    wave = said
    meta = {"id": plan.id, "split": plan.split, "kind": plan.kind, "topic": plan.topic,
            "key_terms": maker.key_terms, "speakers": [asdict(s) for s in plan.speakers], "room": asdict(plan.room),
            "duration": round(total / SAMPLE_RATE, 3), "words": len(words), "sentence_starts": sentence_starts}
    if planter is not None and plan.cue is not None:
        sites = cue_sites(words, planter.planted, plan.topic)
        meta["cue"] = plan.cue.spec()
        meta["cues"] = [{"index": i, "word": words[i].text, "sound": sound_of(words[i].text),
                         "before_s": site.before_s, "after_s": site.after_s}
                        for i, site in zip(planter.planted, sites)]
    if recaller is not None:
        meta.update(recaller.meta(plan.id, words))
    return wave, words, speakers, meta


def write_recording(plan: Plan, out: Path, recall: RecallConfig | None = None,
                    copy: CopyConfig | None = None) -> dict:
    """Render ``plan`` (with the recall plant ``recall`` or the copy plant ``copy``) into
    ``out/<split>/<id>.wav|.json`` and ``out/meta/<id>.json``; returns the metadata. The transcript is written last,
    so a recording whose JSON exists is complete (used to resume)."""
    from asr_core.data.audio import save_audio

    t0 = time.perf_counter()
    wave, words, speakers, meta = render(plan, recall=recall, copy=copy)
    split_dir = out / plan.split
    save_audio(split_dir / f"{plan.id}.wav", wave)
    meta["render_s"] = round(time.perf_counter() - t0, 2)
    (out / "meta").mkdir(parents=True, exist_ok=True)
    (out / "meta" / f"{plan.id}.json").write_text(json.dumps(meta))
    podcast.write(split_dir / f"{plan.id}.json", words, starts=meta["sentence_starts"],
                  speakers=[s + 1 for s in speakers])
    return meta


# ---- command line ----------------------------------------------------------------------------------------------

def synthesise(out: Path, hours: float, seed: int, *, eval_hours: float | None = None, min_minutes: float = 1.0,
               max_minutes: float = 5.0, meeting_fraction: float = 0.3, jobs: int = 2,
               splits: tuple[str, ...] = SPLITS, voices: int = 0, shift: str = "far",
               eval_max_minutes: float | None = None, cue: CueConfig | None = None,
               recall: RecallConfig | None = None, eval_min_minutes: float | None = None,
               copy: CopyConfig | None = None) -> dict:
    """Generate (or finish generating) the corpus in ``out``; returns the summary written to synth.json.

    ``eval_max_minutes`` (default ``max_minutes``) caps the recordings of dev, test and test-shifted, whose
    shortest stay ``min(min_minutes, eval_max_minutes)`` unless ``eval_min_minutes`` is given. ``cue``: the planted cue of every split (None or a rate
    of 0: none); the summary then counts each split's planted words (``cue_words``). ``recall``: the recall plant
    (None or a rate of 0: none); the summary then counts each split's slots (``recall_slots``). ``copy``: the copy
    plant (None or no bands: none; not with ``recall`` or ``cue``), its slots counted the same way."""
    cue = cue if cue is not None and cue.active else None
    recall = recall if recall is not None and recall.active else None
    copy = copy if copy is not None and copy.active else None
    if copy is not None and (cue is not None or recall is not None):
        raise ValueError("the copy plant goes with neither --recall nor --cue")
    if eval_hours is None:
        eval_hours = max(0.1, hours / 10)
    args = {"format_version": FORMAT_VERSION, "hours": hours, "eval_hours": eval_hours, "seed": seed,
            "min_minutes": min_minutes, "max_minutes": max_minutes, "meeting_fraction": meeting_fraction,
            "splits": list(splits)}
    # the newer options enter the stamp only when set, so corpora made before they existed still resume
    if voices:
        args["voices"] = voices
    if shift != "far":
        args["shift"] = shift
    if eval_max_minutes is not None:
        args["eval_max_minutes"] = eval_max_minutes
    if eval_min_minutes is not None:
        args["eval_min_minutes"] = eval_min_minutes
    if cue is not None:
        args["cue"] = cue.spec()
    if recall is not None:
        args["recall"] = recall.spec()
    if copy is not None:
        args["copy"] = copy.spec()

    def lengths(split: str) -> tuple[float, float]:
        if split == "train" or (eval_max_minutes is None and eval_min_minutes is None):
            return min_minutes, max_minutes
        top = max_minutes if eval_max_minutes is None else eval_max_minutes
        return (min(min_minutes, top) if eval_min_minutes is None else eval_min_minutes), top

    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "synth.json"
    if stamp.exists():
        old = json.loads(stamp.read_text()).get("args")
        if old != args:
            raise SystemExit(f"synth: {out} already holds a corpus made with different arguments {old}; "
                             f"choose another OUT or delete it")
    stamp.write_text(json.dumps({"args": args, "complete": False}, indent=1))
    plans = [p for s in splits for p in make_plans(s, hours if s == "train" else eval_hours, seed,
                                                   min_minutes=lengths(s)[0], max_minutes=lengths(s)[1],
                                                   meeting_fraction=meeting_fraction, voices=voices, shift=shift,
                                                   cue=cue)]
    todo = [p for p in plans if not (out / p.split / f"{p.id}.json").exists()]
    print(f"synth: {len(plans)} recordings ({len(plans) - len(todo)} already done) -> {out}", file=sys.stderr)
    t0 = time.perf_counter()
    done = 0
    try:
        for meta in render_all(write_recording, [(p, out, recall, copy) for p in todo], jobs, out,
                               lambda job: job[1] / job[0].split / f"{job[0].id}.json"):
            done += 1
            print(f"synth: [{done}/{len(todo)}] {meta['id']} {meta['kind']} {meta['duration']:.0f} s, "
                  f"{meta['words']} words ({time.perf_counter() - t0:.0f} s elapsed)", file=sys.stderr)
    except Interrupted:  # Ctrl-C: the workers are stopped; counted over the whole corpus
        raise Interrupted(out, sum((out / p.split / f"{p.id}.json").exists() for p in plans), len(plans)) from None
    metas = [json.loads((out / "meta" / f"{p.id}.json").read_text()) for p in plans]
    with (out / "recordings.jsonl").open("w") as fh:
        for m in metas:
            fh.write(json.dumps({k: v for k, v in m.items() if k != "sentence_starts"}) + "\n")
    summary = {s: {"recordings": sum(m["split"] == s for m in metas),
                   "hours": round(sum(m["duration"] for m in metas if m["split"] == s) / 3600, 4),
                   "words": sum(m["words"] for m in metas if m["split"] == s), "spec": f"podcast:{out / s}"}
               for s in splits}
    if cue is not None:
        for s in splits:
            summary[s]["cue_words"] = sum(len(m.get("cues", ())) for m in metas if m["split"] == s)
    if recall is not None or copy is not None:
        for s in splits:
            summary[s]["recall_slots"] = sum(len(m.get("recall_slots", ())) for m in metas if m["split"] == s)
    stamp.write_text(json.dumps({"args": args, "complete": True, "splits": summary}, indent=1))
    return summary
