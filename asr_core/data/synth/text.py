"""The words the synthetic corpus speaks: a small lexicon (~400 words), topics with rare words, and a grammar.

Long context should pay off the way it does in real long-form audio, so each recording has one *topic* and a few
*key terms* drawn from it that recur throughout, often minutes apart; a model that has heard a key term early on
(in the same voice and room) can recognise it again later. Topic words are rare in the corpus as a whole (each
topic is one of many), so a short-context model meets them seldom. The overall vocabulary stays small so that a
tiny model learns it in minutes on a CPU.

The planted long-range cue (``synth --cue``, :mod:`asr_core.data.synth.cues`) adds :data:`CUE_GROUPS`: words that
espeak-ng speaks identically (the same phonemes in every voice the corpus uses) but spells by topic, so only the
recording's topic, heard elsewhere in the recording, tells which spelling is right. They are said in
:data:`CARRIERS`, sentences that give no hint of the topic.
"""

from __future__ import annotations

import random

SUBJECTS = ("we", "they", "you", "i", "people", "the team", "my friend", "our guest", "the author", "everyone",
            "my sister", "the doctor", "the teacher", "nobody", "somebody", "the old man", "the kids")
VERBS = ("talked about", "looked at", "found", "needed", "wanted", "built", "saw", "liked", "studied", "changed",
         "moved", "checked", "fixed", "described", "remembered", "explained", "painted", "carried", "bought",
         "sold", "measured", "tested", "opened", "cleaned", "followed")
DETS = ("the", "a", "this", "that", "every", "some", "our", "their", "my", "your")
ADJS = ("good", "new", "big", "small", "great", "old", "early", "late", "simple", "strong", "different",
        "important", "quiet", "bright", "heavy", "strange", "careful", "famous", "cheap", "perfect", "little",
        "green", "red", "cold", "warm", "hidden", "broken", "lucky", "narrow", "ancient")
NOUNS = ("time", "year", "day", "week", "thing", "idea", "story", "question", "friend", "money", "plan", "point",
         "place", "world", "number", "problem", "house", "road", "morning", "evening", "answer", "window", "table",
         "letter", "picture", "river", "garden", "city", "village", "market", "book", "door", "machine", "office",
         "kitchen", "school", "doctor", "season", "journey", "project", "message", "corner", "mountain", "island",
         "station", "bridge", "lesson", "reason", "moment", "family")
PLURALS = ("people", "things", "ideas", "stories", "questions", "friends", "houses", "roads", "letters",
           "pictures", "books", "machines", "lessons", "reasons", "years", "days", "weeks", "hours", "minutes")
ADVERBS = ("really", "very", "quite", "almost", "always", "never", "often", "sometimes", "actually", "probably",
           "certainly", "slowly", "quickly", "together", "again")
NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "twenty",
           "fifty", "hundred", "thousand")
CONNECTIVES = ("and then", "but", "so", "because", "after that", "of course", "well", "anyway", "you know",
               "in fact", "by the way", "meanwhile")

# each topic's rare words: one topic per recording, its key terms recur through the recording
TOPICS: dict[str, tuple[str, ...]] = {
    "astronomy": ("telescope", "nebula", "orbit", "comet", "galaxy", "asteroid", "eclipse", "satellite", "meteor",
                  "gravity", "crater", "spectrum", "observatory", "quasar"),
    "cooking": ("saffron", "risotto", "casserole", "marinade", "cinnamon", "dumpling", "vinegar", "skillet",
                "oregano", "pastry", "broth", "caramel", "spatula", "anchovy"),
    "finance": ("dividend", "revenue", "mortgage", "inflation", "portfolio", "equity", "liquidity", "auditor",
                "invoice", "treasury", "bankruptcy", "pension", "valuation", "ledger"),
    "gardening": ("compost", "tulip", "hedgerow", "seedling", "fertiliser", "orchid", "greenhouse", "lavender",
                  "trellis", "mulch", "begonia", "pruning", "marigold", "wheelbarrow"),
    "sailing": ("harbour", "mainsail", "anchor", "rudder", "starboard", "lighthouse", "dinghy", "regatta",
                "keel", "mooring", "compass", "tiller", "schooner", "buoy"),
    "medicine": ("vaccine", "antibiotic", "diagnosis", "surgeon", "ligament", "insulin", "migraine", "stethoscope",
                 "allergy", "cardiology", "paracetamol", "fracture", "bandage", "pharmacy"),
    "geology": ("volcano", "granite", "sediment", "glacier", "magma", "fossil", "basalt", "earthquake", "quartz",
                "limestone", "tectonic", "erosion", "crystal", "canyon"),
    "music": ("violin", "saxophone", "orchestra", "melody", "rhythm", "conductor", "clarinet", "harmony",
              "symphony", "trombone", "cello", "percussion", "ukulele", "soprano"),
    "chess": ("bishop", "gambit", "checkmate", "castling", "endgame", "knight", "stalemate", "grandmaster",
              "rook", "opening", "tournament", "pawn", "sacrifice", "zugzwang"),
    "railways": ("locomotive", "platform", "signalman", "carriage", "timetable", "viaduct", "tunnel", "conductor",
                 "junction", "freight", "sleeper", "railcar", "terminus", "gauge"),
    "beekeeping": ("hive", "honeycomb", "pollen", "beeswax", "apiary", "swarm", "propolis", "larva", "nectar",
                   "drone", "smoker", "queen", "colony", "frame"),
    "weather": ("hurricane", "drizzle", "thunderstorm", "humidity", "forecast", "monsoon", "blizzard",
                "barometer", "cyclone", "hailstone", "tornado", "rainbow", "frost", "drought"),
}

KEY_TERMS_PER_RECORDING = 6

# homophone groups for the planted cue: spelling -> the topic it belongs to. espeak-ng 1.51 gives each group's
# spellings the same phonemes in all 7 accents of the corpus's voices (checked by tests/test_cue.py); no spelling is
# another word of the lexicon, and each topic owns a spelling in two groups. The first spelling is the one rendered.
CUE_GROUPS: tuple[dict[str, str], ...] = (
    {"flour": "cooking", "flower": "gardening"},
    {"steak": "cooking", "stake": "finance"},
    {"ore": "geology", "oar": "sailing"},
    {"vein": "medicine", "vane": "weather"},
    {"leek": "gardening", "leak": "sailing"},
    {"lode": "geology", "load": "railways"},
    {"rays": "astronomy", "raise": "finance"},
    {"gait": "medicine", "gate": "railways"},
    {"rain": "weather", "reign": "chess"},
    {"suite": "music", "sweet": "beekeeping"},
    {"tail": "astronomy", "tale": "music"},
    {"male": "beekeeping", "mail": "chess"},
)


def vocabulary() -> list[str]:
    """Every word the generator can emit (sorted); the tokenizer and tests use it."""
    words: set[str] = set()
    for group in (SUBJECTS, VERBS, DETS, ADJS, NOUNS, PLURALS, ADVERBS, NUMBERS, CONNECTIVES,
                  *TOPICS.values()):
        for phrase in group:
            words.update(phrase.split())
    for template in TEMPLATES + CARRIERS:
        words.update(w for w in template.split() if not w.startswith("{"))
    for group in CUE_GROUPS:
        words.update(group)
    words.add("an")
    return sorted(words)


# slots: {s} subject, {v} verb, {d} determiner, {a} adjective, {n} noun, {p} plural, {r} adverb, {k} number,
# {c} connective, {t} the recording's topic term (a key term, recurring)
TEMPLATES = (
    "{s} {v} {d} {a} {n}",
    "{s} {v} {d} {t}",
    "{d} {t} is {r} {a}",
    "{c} {s} {v} {k} {p}",
    "there is a {a} {t} near the {n}",
    "{s} {v} the {t} and the {t}",
    "i think the {n} was {r} {a}",
    "what about the {t}",
    "{c} {s} {r} {v} {d} {n}",
    "{k} {p} and {k} {p}",
    "{s} {v} {d} {t} in the {n}",
    "the {t} is {a} and {a}",
    "{s} {r} {v} the {a} {t}",
    "how about the {a} {n}",
    "{c} the {t} was {r} {a}",
    "{s} {v} it {r}",
)
PLAIN_TEMPLATES = tuple(t for t in TEMPLATES if "{t}" not in t)  # no topic word: the quiet stretches around a cue
# a cue word {q} in a sentence that says nothing of the topic, always right after one determiner (so the cue word
# starts well under a second after the sentence does: the planter times it from the sentence's start)
CARRIERS = (
    "{d} {q} was {r} {a}",
    "{d} {q} is {a} and {a}",
    "the {q} and the {n}",
    "{d} {q} was in the {n}",
    "the {q} is {r} {a}",
)


class SentenceMaker:
    """Sentences for one recording: one topic, a handful of key terms re-used with Zipf-like frequencies."""

    def __init__(self, rng: random.Random, topic: str) -> None:
        self.rng = rng
        self.topic = topic
        terms = list(TOPICS[topic])
        rng.shuffle(terms)
        self.key_terms = terms[:KEY_TERMS_PER_RECORDING]
        # Zipf-like weights: the first key term is the recording's main subject and recurs most
        self.weights = [1.0 / (i + 1) for i in range(len(self.key_terms))]
        self.others = terms[KEY_TERMS_PER_RECORDING:]
        self.elsewhere = sorted(w for t, ws in TOPICS.items() if t != topic for w in ws)

    def _term(self) -> str:
        r = self.rng.random()
        if r < 0.06:  # a word of another topic: every topic word turns up now and then in a small corpus
            return self.rng.choice(self.elsewhere)
        if r < 0.16 and self.others:  # an occasional one-off word of this topic
            return self.rng.choice(self.others)
        return self.rng.choices(self.key_terms, weights=self.weights)[0]

    def sentence(self, topic: bool = True) -> list[str]:
        """One sentence; ``topic=False``: one without a topic word (from :data:`PLAIN_TEMPLATES`). The default
        draws exactly as the generator always has, so corpora without a planted cue do not change."""
        return self._fill(self.rng.choice(TEMPLATES if topic else PLAIN_TEMPLATES))

    def carrier(self, word: str) -> tuple[list[str], int]:
        """A sentence of :data:`CARRIERS` saying ``word`` (a cue word), and the word's position in it."""
        at: list[int] = []
        out = self._fill(self.rng.choice(CARRIERS), word, at)
        return out, at[0]

    def _fill(self, template: str, cue: str = "", at: list[int] | None = None) -> list[str]:
        pick = {"s": SUBJECTS, "v": VERBS, "d": DETS, "a": ADJS, "n": NOUNS, "p": PLURALS, "r": ADVERBS,
                "k": NUMBERS, "c": CONNECTIVES}
        out: list[str] = []
        for token in template.split():
            if token.startswith("{"):
                slot = token[1]
                if slot == "q":
                    if at is not None:
                        at.append(len(out))
                    out.append(cue)
                else:
                    out.extend((self._term() if slot == "t" else self.rng.choice(pick[slot])).split())
            else:
                out.append(token)
        for i in range(len(out) - 1):  # "a ancient" -> "an ancient"
            if out[i] == "a" and out[i + 1][0] in "aeiou":
                out[i] = "an"
        return out
