"""The evaluation sets as the authors prepared them (robflynnyh/long-context-asr v1.0): Earnings-22's references
through their ``preprocess_transcript`` (``earnings22-authors:``), TED-LIUM's ignored segments shrunk by 0.5 s at
both ends (``zero_out_spectogram(buffer=-0.5)``), and the paper grid reading Earnings-22 the authors' way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from asr_core.contract.specs import CORPUS_FORMATS, split_spec
from asr_core.data.corpora import load_corpus, read_corpus
from asr_core.data.corpora.earnings22 import authors_text
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.scoring.score import normalise

ROOT = Path(__file__).resolve().parents[1]

NLP = """token|speaker|ts|endTs|punctuation|prepunctuation|case|tags
The|1|||||UC|[]
U.S.|1|||||CA|['0:GPE']
grew|1|||||LC|[]
3.5|1|||||MC|['1:PERCENT']
%|1|||||MC|['1:PERCENT']
year-over-year|1|1.0|1.6|,||LC|[]
…|1||||||[]
<laugh>|2||||||[]
Okay<crosstalk>|2|||||UC|[]
right|2|||?||LC|[]
"""


def _release(tmp_path: Path) -> Path:
    ref = tmp_path / "e22" / "transcripts" / "nlp_references"
    ref.mkdir(parents=True)
    (ref / "4420001.nlp").write_text(NLP, encoding="utf-8")
    return tmp_path / "e22"


# ---- Earnings-22 ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, prepared", [
    ("3.5", "35"), ("U.S.", "us"), ("year-over-year", "year over year"), ("well…", "well"), ("…", ""),
    ("<silence>", ""), ("ok<noise>", "ok"), ("<affirmative> Yes, sir?", "yes sir"), ("Q3.", "q3"),
])
def test_authors_text_is_their_preprocess_transcript(raw: str, prepared: str) -> None:
    assert authors_text(raw) == prepared


def test_earnings22_authors_format_prepares_the_words_the_default_keeps_them(tmp_path: Path) -> None:
    root = _release(tmp_path)
    assert "earnings22-authors" in CORPUS_FORMATS and split_spec(f"earnings22-authors:{root}")[0] == "earnings22-authors"
    (release,) = load_corpus(f"earnings22:{root}", strict=True, audio=False)
    (authors,) = read_corpus(f"e22=earnings22-authors:{root}", strict=True, audio=False).recordings
    # the default: the release's tokens, tags stripped, as before
    assert release.text == "The U.S. grew 3.5 % year-over-year … Okay<crosstalk> right"
    assert release.meta["preparation"] == "release"
    assert authors.text == "the us grew 35 % year over year okay right"
    assert authors.meta["preparation"] == "authors"
    # what the scorer compares: Whisper's normaliser after each preparation
    # ("…" as a token of its own survives Whisper's normaliser as "." unless it is removed first)
    assert normalise(release.text) == "the u s grew 3.5 year over year . okay right"
    assert normalise(authors.text) == "the us grew 35 year over year okay right"
    # the pieces of a split token keep its times and speaker; a token that leaves nothing is gone with its speaker
    pieces = [(w.text, w.start, w.end) for w in authors.words if w.start is not None]
    assert pieces == [("year", 1.0, 1.6), ("over", 1.0, 1.6), ("year", 1.0, 1.6)]
    assert authors.meta["speakers"] == ["1"] * 8 + ["2"] * 2
    assert fingerprint([release]) != fingerprint([authors])  # an evaluation records which content it scored


def test_the_paper_grid_scores_earnings22_the_authors_way() -> None:
    grid = yaml.safe_load((ROOT / "grids" / "paper.yaml").read_text())
    datasets = grid["base"]["eval"]["datasets"]
    assert "earnings22=earnings22-authors:data/earnings22" in datasets
    assert all(not d.startswith("earnings22=earnings22:") for d in datasets)


# ---- TED-LIUM ------------------------------------------------------------------------------------------------------

STM = """;; talk channel speaker start end <label> transcript
Talk_2010 1 Talk_2010 0.00 3.00 <o,f0,male> so here 's the thing
Talk_2010 1 inter_segment_gap 3.00 6.00 <o,,unknown> ignore_time_segment_in_scoring
Talk_2010 1 Talk_2010 6.00 9.00 <o,f0,male> we couldn 't
Talk_2010 1 inter_segment_gap 9.00 10.00 <o,,unknown> ignore_time_segment_in_scoring
Talk_2010 1 inter_segment_gap 10.00 10.80 <o,,unknown> ignore_time_segment_in_scoring
Talk_2010 1 inter_segment_gap 10.80 12.30 <o,,unknown> ignore_time_segment_in_scoring
"""


def test_tedlium_ignored_segments_shrink_by_half_a_second_at_both_ends(tmp_path: Path) -> None:
    (tmp_path / "stm").mkdir()
    (tmp_path / "stm" / "Talk_2010.stm").write_text(STM, encoding="utf-8")
    (rec,) = load_corpus(f"tedlium:{tmp_path}", strict=True, audio=False)
    # 3-6 s -> 3.5-5.5 s; 10.8-12.3 s -> 11.3-11.8 s; the 1.0 s and 0.8 s segments leave nothing to zero
    assert [pytest.approx(r) for r in rec.ignore] == [(3.5, 5.5), (11.3, 11.8)]
    assert rec.text == "so here's the thing we couldn't"
    assert rec.duration == pytest.approx(12.3)  # the talk still reaches the last segment's end
