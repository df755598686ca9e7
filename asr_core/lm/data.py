"""Text for the language model: documents from a corpus's transcripts, text files or the generator, and the
Transformer-XL chunks the trainer reads them in.

A *document* is what the LM's memory may span: one recording's transcript, one text file, one generated "episode".
Sources (``read_documents(spec)``):

- ``text:PATH``: a ``.jsonl`` file of ``{"id": ..., "text": ...}`` lines (what :func:`write_documents` and
  ``python -m asr_core lm text`` write), a ``.txt`` file (documents separated by blank lines) or a folder of
  ``.txt`` files (one document each, in name order);
- any corpus spec ``[NAME=]FORMAT:PATH`` (:func:`asr_core.data.corpora.load_corpus`, transcripts only): one document per
  recording, its words in order.

The generator (:func:`generate_documents`) speaks the synthetic corpus's language (:mod:`asr_core.data.synth.text`:
the grammar, one topic per document with key terms that recur) from its own random streams (``lmtext/<seed>/<i>``),
so its documents are not the corpus's recordings; :func:`ngram_overlap` measures how much of a test set's text the
LM has seen verbatim anyway (a small grammar repeats short phrases).

Chunks (:func:`chunk_batches`): ``batch`` lanes, each reading one document after another in ``length``-token
chunks that never span two documents; a lane that starts a document is flagged ``reset`` so the trainer drops that
lane's cache (Transformer-XL memory is reset per document).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


class TextError(ValueError):
    """A text source that cannot be read; the message names it and what would be valid."""


@dataclass(frozen=True)
class Document:
    id: str
    text: str


def read_documents(spec: str) -> list[Document]:
    """The documents of ``spec`` (see the module docstring); TextError naming the spec when it cannot be read."""
    if spec.startswith("text:"):
        return _read_text(Path(spec[len("text:"):]).expanduser(), spec)
    from asr_core.data.corpora import CorpusError, load_corpus

    try:
        recs = load_corpus(spec, audio=False)
    except CorpusError as e:
        raise TextError(f"text source {spec!r}: {e}; valid: text:FILE.jsonl, text:FILE.txt, text:FOLDER of .txt "
                        "files, or a corpus spec FORMAT:PATH") from None
    docs = [Document(r.id, " ".join(w.text for w in r.words)) for r in sorted(recs, key=lambda r: r.id)]
    return [d for d in docs if d.text]


def _read_text(path: Path, spec: str) -> list[Document]:
    if not path.exists():
        raise TextError(f"text source {spec!r}: {path} does not exist")
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise TextError(f"text source {spec!r}: no .txt files in {path}")
        return [Document(f.stem, " ".join(f.read_text().split())) for f in files]
    if path.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                docs.append(Document(str(row["id"]), " ".join(str(row["text"]).split())))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TextError(f"{path}:{n}: not a JSON object with \"id\" and \"text\"") from None
        return docs
    blocks = [" ".join(b.split()) for b in path.read_text().split("\n\n")]
    return [Document(f"{path.stem}-{i:05d}", b) for i, b in enumerate(b for b in blocks if b)]


def write_documents(path: Path, docs: Sequence[Document]) -> None:
    """``docs`` as JSON lines (``{"id", "text"}``), written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for d in docs:
            f.write(json.dumps({"id": d.id, "text": d.text}) + "\n")
    tmp.replace(path)


def generate_documents(n: int, seed: int, *, min_words: int = 300, max_words: int = 1500) -> list[Document]:
    """``n`` documents in the synthetic corpus's language, each one topic (dealt from shuffled decks, as the corpus
    deals them) with its recurring key terms; a pure function of (``n``, ``seed``, word range)."""
    from asr_core.data.synth.text import TOPICS, SentenceMaker

    if n < 1 or not 1 <= min_words <= max_words:
        raise ValueError(f"need n >= 1 and 1 <= min_words <= max_words, got {n}, {min_words}, {max_words}")
    deck_rng = random.Random(f"lmtext/{seed}/topics")
    topics: list[str] = []
    docs = []
    for i in range(n):
        if not topics:
            topics = sorted(TOPICS)
            deck_rng.shuffle(topics)
        rng = random.Random(int.from_bytes(hashlib.sha256(f"lmtext/{seed}/{i}".encode()).digest()[:8], "little"))
        maker = SentenceMaker(rng, topics.pop())
        target = rng.randint(min_words, max_words)
        words: list[str] = []
        while len(words) < target:
            words.extend(maker.sentence())
        docs.append(Document(f"lmtext-{seed}-{i:05d}", " ".join(words)))
    return docs


def ngram_overlap(train: Sequence[Document], test: Sequence[Document], n: int = 8) -> float:
    """The fraction of the test documents' word ``n``-grams that occur anywhere in ``train`` (0: disjoint)."""
    seen: set[tuple[str, ...]] = set()
    for d in train:
        w = d.text.split()
        seen.update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    total = hits = 0
    for d in test:
        w = d.text.split()
        for i in range(len(w) - n + 1):
            total += 1
            hits += tuple(w[i:i + n]) in seen
    return hits / total if total else 0.0


@dataclass(frozen=True)
class Chunk:
    """One step's chunk: ``tokens`` (B, T+1) long (inputs are ``[:, :-1]``, targets ``[:, 1:]``; padding past
    ``lengths`` is 0), ``lengths`` (B,) long (targets per lane, 0 for a lane with nothing left), ``reset`` (B,) bool
    (the lane starts a new document: drop its cache first)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    reset: torch.Tensor


def _chunks_of(doc_len: int, length: int) -> int:
    """Chunks a document of ``doc_len`` ids takes (read as ``[bos] + ids``: ``doc_len`` targets)."""
    return -(-doc_len // length)


def count_chunks(docs: Sequence[Sequence[int]], batch: int, length: int) -> int:
    """How many chunks :func:`chunk_batches` yields for these arguments (its longest lane), without building them."""
    if batch < 1 or length < 1:
        raise ValueError(f"batch and length must be >= 1, got {batch}, {length}")
    lanes = [0] * batch
    for i, d in enumerate(docs):
        if d:
            lanes[i % batch] += _chunks_of(len(d), length)
    return max(lanes)


def chunk_batches(docs: Sequence[Sequence[int]], batch: int, length: int, *, bos: int, start: int = 0
                  ) -> Iterator[Chunk]:
    """Documents as token ids → chunks of ``length`` targets on ``batch`` lanes (see the module docstring).
    Document ``i`` goes to lane ``i % batch`` in order; each document is read as ``[bos] + ids`` so its first token
    is predicted too; a document's last chunk may be shorter (its lane padded). Ends when every lane is empty.
    ``start``: begin with chunk number ``start`` (0-based) exactly as the full iteration would give it, without
    building the chunks before it (a resumed trainer; cost: one pass over the document lengths)."""
    if batch < 1 or length < 1:
        raise ValueError(f"batch and length must be >= 1, got {batch}, {length}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    lanes: list[list[list[int]]] = [[] for _ in range(batch)]
    for i, d in enumerate(docs):
        if d:
            lanes[i % batch].append([bos, *d])
    pos = [0] * batch  # the next target's index in the lane's current document
    for b in range(batch):  # every lane gives one chunk per step while it has a document: skip ``start`` of them
        left, done = start, 0
        while done < len(lanes[b]) and left >= _chunks_of(len(lanes[b][done]) - 1, length):
            left -= _chunks_of(len(lanes[b][done]) - 1, length)
            done += 1
        del lanes[b][:done]
        if lanes[b]:
            pos[b] = left * length
    while any(lanes):
        tokens = torch.zeros(batch, length + 1, dtype=torch.long)
        lengths = torch.zeros(batch, dtype=torch.long)
        reset = torch.zeros(batch, dtype=torch.bool)
        for b in range(batch):
            if not lanes[b]:
                continue
            doc = lanes[b][0]
            if pos[b] == 0:
                reset[b] = True
            piece = doc[pos[b]: pos[b] + length + 1]
            tokens[b, : len(piece)] = torch.tensor(piece)
            lengths[b] = len(piece) - 1
            pos[b] += length
            if pos[b] + 1 >= len(doc):  # every target of the document has been given
                lanes[b].pop(0)
                pos[b] = 0
        yield Chunk(tokens, lengths, reset)
