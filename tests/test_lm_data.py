"""Text for the language model (``asr_core/lm/data.py``): sources, the generator, and Transformer-XL chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asr_core.lm.data import (Document, TextError, chunk_batches, generate_documents, ngram_overlap, read_documents,
                              write_documents)


def test_generated_documents_are_deterministic_by_seed_and_on_one_topic() -> None:
    from asr_core.data.synth.text import TOPICS

    a, b, c = generate_documents(5, 1), generate_documents(5, 1), generate_documents(5, 2)
    assert a == b and a != c
    assert all(300 <= len(d.text.split()) <= 1500 + 20 for d in a)
    for d in a:  # most topic words of a document come from one topic
        words = d.text.split()
        counts = {t: sum(w in ws for w in words) for t, ws in TOPICS.items()}
        top = max(counts.values())
        assert top >= 0.7 * sum(counts.values())


def test_sources_read_jsonl_txt_folder_and_name_what_is_wrong(tmp_path: Path) -> None:
    docs = [Document("a", "one two three"), Document("b", "four five")]
    write_documents(tmp_path / "d.jsonl", docs)
    assert read_documents(f"text:{tmp_path / 'd.jsonl'}") == docs
    (tmp_path / "t.txt").write_text("one two\nthree\n\n\nfour   five\n")
    assert [d.text for d in read_documents(f"text:{tmp_path / 't.txt'}")] == ["one two three", "four five"]
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "x.txt").write_text("hello there")
    assert read_documents(f"text:{tmp_path / 'f'}") == [Document("x", "hello there")]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": "a"}) + "\n")
    with pytest.raises(TextError, match=r"bad\.jsonl:1"):
        read_documents(f"text:{tmp_path / 'bad.jsonl'}")
    with pytest.raises(TextError, match="does not exist"):
        read_documents(f"text:{tmp_path / 'nowhere'}")


def test_overlap_is_zero_for_disjoint_text_and_one_for_the_same() -> None:
    a = [Document("a", "the cat sat on the mat today and then left")]
    b = [Document("b", "completely other words that never appear in the first one at all")]
    assert ngram_overlap(a, a, n=4) == 1.0 and ngram_overlap(a, b, n=4) == 0.0


def test_chunks_cover_every_token_once_never_span_documents_and_flag_resets() -> None:
    docs = [list(range(1, 12)), list(range(20, 25)), list(range(30, 47))]
    seen: dict[int, list[int]] = {0: [], 1: []}
    resets = []
    for ch in chunk_batches(docs, batch=2, length=4, bos=0):
        assert ch.tokens.shape == (2, 5)
        for b in range(2):
            n = int(ch.lengths[b])
            if ch.reset[b]:
                resets.append(int(ch.tokens[b, 1]))
                assert int(ch.tokens[b, 0]) == 0  # a document starts with bos
            seen[b].extend(ch.tokens[b, 1: n + 1].tolist())
            assert (ch.tokens[b, n + 1:] == 0).all()
    assert seen[0] == docs[0] + docs[2] and seen[1] == docs[1]
    assert resets == [1, 20, 30]
