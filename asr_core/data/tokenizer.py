"""SentencePiece BPE (normalisation ``nmt_nfkc_cf``) plus the CTC blank as the last id (paper 000 §3.1).

``vocab_size`` counts the blank: the paper's 4096 outputs are 4095 pieces + blank (id 4095). A small corpus may
not support the requested number of pieces; SentencePiece then stops early (``hard_vocab_limit=false``) and the
missing ids are filled with reserved control symbols, which text never encodes to. The piece count therefore always
equals ``vocab_size - 1``, the blank is always ``vocab_size - 1`` and the model's output size never changes.

``symbols`` (optional) are words that must stay one piece each (the copy plant's identity tokens,
:func:`asr_core.data.synth.copy_plant.one_piece_words`): each becomes the user-defined symbol ``"▁" + word``, so a
whole word equal to it encodes to exactly that piece (a word it begins is split after it: give words that begin no
other word). Without symbols the model file is what it was before the option existed, byte for byte.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import sentencepiece as spm

RESERVED = "<reserved_{}>"
SENTENCE_BYTES = 8192  # transcripts go to SentencePiece in pieces of at most this many bytes (its limit: 65536)
# SentencePiece's threads. Any count learns the same pieces, but the model file records it: a constant keeps the
# file the same on every machine (16 threads on a 2-core machine cost nothing).
THREADS = 16
SPACE = "\u2581"  # SentencePiece's word boundary, "▁"


class TokenizerError(ValueError):
    """A tokenizer file or training request is unusable; the message says which and why."""


class Tokenizer:
    def __init__(self, proto: bytes) -> None:
        self._proto = proto
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        self.pieces = self.sp.get_piece_size()
        self.vocab_size = self.pieces + 1
        self.blank_id = self.pieces  # the last id
        self._unused = {i for i in range(self.pieces) if self.sp.is_control(i) or self.sp.is_unused(i)}

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, path: str | Path | None = None,
              symbols: Sequence[str] = ()) -> "Tokenizer":
        """Learn ``vocab_size - 1`` BPE pieces from ``texts``, each of ``symbols`` (whole words) one of them; write the
        model to ``path`` when given."""
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise TokenizerError("cannot train a tokenizer: the training transcripts are empty")
        if vocab_size < 3:
            raise TokenizerError(f"vocab_size={vocab_size} is too small; it must be >= 3 (pieces + blank)")
        bad = [s for s in symbols if not s or s != s.strip() or len(s.split()) != 1]
        if bad:
            raise TokenizerError(f"tokenizer symbol {bad[0]!r} is not one word")
        user = list(dict.fromkeys(SPACE + s for s in symbols))
        want = vocab_size - 1
        if len(user) >= want:
            raise TokenizerError(f"{len(user)} symbols leave no room in {want} pieces; raise model.vocab_size "
                                 f"(currently {vocab_size})")
        proto = _train(texts, want, [], user)
        got = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
        if got < want:  # small corpus: pad with reserved ids so the blank stays at vocab_size - 1
            proto = _train(texts, want, [RESERVED.format(i) for i in range(want - got)], user)
        tok = cls(proto)
        if tok.vocab_size != vocab_size:
            raise TokenizerError(f"tokenizer has {tok.pieces} pieces, expected {want}; "
                                 f"lower model.vocab_size (currently {vocab_size})")
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(proto)
        return tok

    @classmethod
    def from_bytes(cls, proto: bytes) -> "Tokenizer":
        try:
            return cls(bytes(proto))
        except Exception as e:  # sentencepiece raises RuntimeError / OSError on garbage
            raise TokenizerError(f"not a SentencePiece model ({len(proto)} bytes): {e}") from None

    @classmethod
    def load(cls, path: str | Path, vocab_size: int | None = None) -> "Tokenizer":
        """Read a ``.model`` file; with ``vocab_size``, check it fits a model with that many outputs."""
        p = Path(path)
        if not p.is_file():
            raise TokenizerError(f"tokenizer file not found: {p}")
        tok = cls.from_bytes(p.read_bytes())
        if vocab_size is not None and tok.vocab_size != vocab_size:
            raise TokenizerError(f"{p}: {tok.pieces} pieces + blank = {tok.vocab_size} outputs, but "
                                 f"model.vocab_size is {vocab_size}; set model.vocab_size={tok.vocab_size}")
        return tok

    def to_bytes(self) -> bytes:
        return self._proto

    # ---- use ---------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text, out_type=int))

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; the blank and reserved ids are skipped."""
        keep = [int(i) for i in ids if 0 <= int(i) < self.pieces and int(i) not in self._unused]
        return self.sp.decode(keep)


def sentences(texts: Iterable[str], max_bytes: int = SENTENCE_BYTES) -> Iterator[str]:
    """Each transcript as pieces of whole words of at most ``max_bytes`` UTF-8 bytes. SentencePiece skips, without
    saying so, any sentence longer than its ``max_sentence_length``: a podcast's transcript as one sentence passes
    that at about 70 minutes. Pieces never span a space, so cutting between words learns the same pieces."""
    for text in texts:
        words, size = [], 0
        for w in text.split():
            n = len(w.encode("utf-8")) + 1
            if n > max_bytes:
                raise TokenizerError(f"a word of {n - 1} bytes in the transcripts ({w[:40]!r}...) is longer than "
                                     f"{max_bytes} bytes; no tokenizer can learn from it: fix that transcript")
            if size + n > max_bytes:
                yield " ".join(words)
                words, size = [], 0
            words.append(w)
            size += n
        if words:
            yield " ".join(words)


def _train(texts: list[str], pieces: int, reserved: list[str], user: list[str] | None = None) -> bytes:
    buf = io.BytesIO()
    kwargs = dict(sentence_iterator=sentences(texts), model_writer=buf, model_type="bpe", vocab_size=pieces,
                  normalization_rule_name="nmt_nfkc_cf", character_coverage=1.0, hard_vocab_limit=False,
                  bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1, num_threads=THREADS, minloglevel=2,
                  input_sentence_size=2_000_000, shuffle_input_sentence=True, max_sentence_length=1 << 16)
    if reserved:
        kwargs["control_symbols"] = reserved
    if user:
        kwargs["user_defined_symbols"] = user
    try:
        spm.SentencePieceTrainer.train(**kwargs)
    except RuntimeError as e:
        raise TokenizerError(f"SentencePiece could not learn {pieces} pieces from {len(texts)} transcripts: {e}"
                             ) from None
    return buf.getvalue()
