"""SentencePiece BPE + blank as the last id, whatever the corpus size."""

import pytest

from asr_core.data.tokenizer import Tokenizer, TokenizerError

TEXTS = ["the quick brown fox jumps over the lazy dog", "Hello World, hello again!", "one two three four five"]


def test_small_corpus_keeps_the_requested_output_size(tmp_path) -> None:
    tok = Tokenizer.train(TEXTS, 128, tmp_path / "t.model")
    assert tok.vocab_size == 128 and tok.blank_id == 127
    ids = tok.encode("Hello the lazy fox")
    assert ids and max(ids) < 127
    assert tok.decode(ids) == "hello the lazy fox"  # nmt_nfkc_cf case-folds
    assert tok.decode(ids + [127, 127]) == "hello the lazy fox"  # the blank is skipped
    again = Tokenizer.from_bytes(tok.to_bytes())
    assert again.encode("one two") == tok.encode("one two") and again.blank_id == 127
    assert Tokenizer.load(tmp_path / "t.model", 128).blank_id == 127


def test_reserved_ids_never_come_from_text() -> None:
    tok = Tokenizer.train(TEXTS, 200)
    assert tok.vocab_size == 200
    assert all(i not in tok._unused for t in TEXTS for i in tok.encode(t + " <reserved_0>"))


def test_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(TokenizerError, match="empty"):
        Tokenizer.train(["", "  "], 64)
    tok = Tokenizer.train(TEXTS, 64, tmp_path / "t.model")
    with pytest.raises(TokenizerError, match="model.vocab_size"):
        Tokenizer.load(tmp_path / "t.model", 4096)
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.load(tmp_path / "missing.model")
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        Tokenizer.from_bytes(b"garbage")
    assert tok.vocab_size == 64


def test_a_transcript_longer_than_sentencepieces_sentence_limit_is_learned_not_skipped() -> None:
    """A 100-minute podcast is one transcript of about 90 kB: past SentencePiece's 64 kB sentence limit, which it
    skips silently. Its words must still be learned (here: the only one with the letters q, x and z)."""
    long = " ".join(["quixotic zebra"] * 6000)  # 90,000 bytes
    assert len(long.encode()) > 1 << 16
    tok = Tokenizer.train(["the cat sat on the mat"] * 5 + [long], 40)
    ids = tok.encode("quixotic zebra")
    assert ids and 0 not in ids  # no unknown piece: its letters were seen
    assert tok.decode(ids) == "quixotic zebra"


def test_cutting_transcripts_between_words_learns_the_same_pieces() -> None:
    from asr_core.data.tokenizer import sentences

    texts = ["alpha beta gamma delta epsilon " * 40, "zeta eta theta iota kappa lambda " * 30]
    pieces = list(sentences(texts, 64))
    assert all(len(s.encode()) <= 64 for s in pieces) and " ".join(pieces).split() == " ".join(texts).split()
    assert Tokenizer.train(texts, 30).to_bytes() == Tokenizer.train(pieces, 30).to_bytes()
    with pytest.raises(TokenizerError, match="longer than 8 bytes"):
        list(sentences(["a averyverylongword b"], 8))
