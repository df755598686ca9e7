"""The window fusion methods run on a recording (asr_core.decoding.fused), with a stand-in model that reads each frame's
token off the features: every window then transcribes its frames exactly, so every method must give the reference,
and what differs between methods is only which windows they ask for."""

from __future__ import annotations

import pytest
import torch

from asr_core.contract.metrics import FUSION_METHODS, fusion_decoder, fusion_method
from asr_core.data.tokenizer import Tokenizer
from asr_core.decoding.decode import WindowBatch, collapse_frames, greedy_ids, plan_windows, posteriors
from asr_core.decoding.fused import ROVER_PHASES, WindowIds, fused_texts, phase_spans, rover_step
from asr_core.decoding.fusion import tokenizer_pieces

SUB, FPS = 8, 100.0
TEXT = ("the cat sat on the mat while a dog ran to the cathedral at dawn and the cat ran back to the mat "
        "at dusk while the dog sat on the cathedral steps")


class FrameReader(torch.nn.Module):
    """A 'model' whose output frame j is one-hot of the token id written in feature 0 of input frame j * SUB
    (the ids of the recording's script): a window transcribes exactly the frames it sees."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.calls = 0

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += x.shape[0]
        ids = x[:, ::SUB, 0].round().long().clamp(0, self.vocab - 1)
        return torch.nn.functional.one_hot(ids, self.vocab).float() * 20.0, torch.div(lengths + SUB - 1, SUB,
                                                                                     rounding_mode="floor")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train([TEXT, "a cat and a dog", "the steps of the cathedral"] * 4, 40)


def script(tok: Tokenizer, text: str = TEXT, gap: int = 3) -> torch.Tensor:
    """Features (T, 2) of a recording saying ``text``: each token for one output frame, then ``gap`` blank frames."""
    ids: list[int] = []
    for t in tok.encode(text):
        ids += [t] + [tok.blank_id] * gap
    feats = torch.zeros(len(ids) * SUB, 2)
    feats[::SUB, 0] = torch.tensor(ids, dtype=torch.float32)
    return feats


def run(tok: Tokenizer, feats: torch.Tensor, window: int, methods=FUSION_METHODS, stride: float = 0.125):
    model = FrameReader(tok.vocab_size)
    cache = WindowIds(model, feats, subsampling=SUB, batch=WindowBatch(4))
    return fused_texts(cache, methods, window=window, stride=stride, tokenizer=tok, pieces=tokenizer_pieces(tok),
                       fps=FPS), cache, model


def test_every_method_transcribes_a_recording_every_window_reads_right(tok):
    """Frame-level methods are exact at any window; the word-level ones that join overlapping windows once words
    are short against the window (a word cut at a window's edge leaves fragments that a hypothesis-level join
    cannot always mend: the price of joining words rather than frames, measured by the decoding-method experiment);
    block-wise words only with one window for it all (paper 001 §4.1: each window's words, nothing mended)."""
    feats = script(tok)
    for window in (64, 96, 256, 512, 10_000):  # windows of 8, 12, 32 and 64 output frames, and one for it all
        texts, cache, _ = run(tok, feats, window)
        exact = ("select", "blockwise-frames")
        if window >= 512:
            exact += ("chiu", "chiu-seconds", "lcs", "rover")
        if window == 10_000:
            exact += ("blockwise",)
        assert {m: texts[m] for m in exact} == {m: TEXT for m in exact}, window
        spans = plan_windows(feats.shape[0], window, 1.0, SUB).spans
        each = [tok.decode([t for t, _ in collapse_frames(ids, tok.blank_id)]) for ids in cache.ids(spans)]
        assert texts["blockwise"] == " ".join(w for text in each for w in text.split()), window


def test_select_equals_averaging_where_windows_do_not_overlap(tok):
    feats = script(tok)
    model = FrameReader(tok.vocab_size)
    averaged = tok.decode(greedy_ids(posteriors(model, feats, 64, stride=1.0, subsampling=SUB), tok.blank_id))
    texts, _, _ = run(tok, feats, 64, ("select", "blockwise-frames", "blockwise"), stride=1.0)
    assert texts["select"] == texts["blockwise-frames"] == averaged
    assert texts["blockwise"] != averaged  # words cut at the windows' edges stay cut: "w hi le" for "while"
    assert texts["blockwise"].replace(" ", "") == averaged.replace(" ", "")


def test_windows_handed_over_by_the_averaging_pass_are_not_run_again(tok):
    feats = script(tok)
    model = FrameReader(tok.vocab_size)
    cache = WindowIds(model, feats, subsampling=SUB, batch=WindowBatch(4))
    posteriors(model, feats, 96, stride=0.125, subsampling=SUB, on_window=cache.keep)
    averaging_calls = model.calls
    fused_texts(cache, ("select",), window=96, stride=0.125, tokenizer=tok, pieces=tokenizer_pieces(tok), fps=FPS)
    assert model.calls == averaging_calls and cache.ran == 0  # select at the evaluation's stride: all handed over
    fused_texts(cache, ("chiu",), window=96, stride=0.125, tokenizer=tok, pieces=tokenizer_pieces(tok), fps=FPS)
    assert cache.ran <= 1  # the 50% windows are among the 1/8 ones but for a last one cut at the end


def test_each_rover_phase_covers_every_frame_once_and_shifts_by_an_eighth():
    frames, window = 1000, 96
    step = rover_step(window, SUB)
    assert step == 8  # 12 output frames: an eighth rounds down to one
    assert rover_step(512, SUB) == plan_windows(5000, 512, 1 / ROVER_PHASES, SUB).stride == 64
    for p in range(ROVER_PHASES):
        spans = phase_spans(frames, window, step, p)
        covered = [f for s, e in spans for f in range(s, e)]
        assert covered == list(range(frames)), p
        assert all(e - s <= window for s, e in spans)
        assert spans[1 if p else 0][0] == p * step
    assert phase_spans(0, window, step, 3) == []


def test_rover_outvotes_a_phase_that_errs(tok):
    """One wrong window in one phase is outvoted by the seven others; a join of that phase alone keeps the error."""
    feats = script(tok)
    window = 512
    texts, cache, _ = run(tok, feats, window, ("rover",))
    assert texts["rover"] == TEXT
    step = rover_step(window, SUB)
    span = phase_spans(feats.shape[0], window, step, 3)[2]
    wrong = cache.ids([span])[0].clone()
    wrong[wrong != tok.blank_id] = tok.encode("dog")[0]  # the window says something else throughout
    cache._ids[span] = wrong
    voted = fused_texts(cache, ("rover",), window=window, stride=0.125, tokenizer=tok, pieces=tokenizer_pieces(tok),
                        fps=FPS)["rover"]
    assert voted == TEXT


def test_every_method_is_deterministic_and_an_empty_recording_gives_nothing(tok):
    feats = script(tok) + 0.0
    feats[5 * SUB:40 * SUB:3, 0] = 7.0  # noise in some frames, so that the methods disagree somewhere
    a, _, _ = run(tok, feats, 96)
    b, _, _ = run(tok, feats, 96)
    assert a == b
    empty, _, _ = run(tok, torch.zeros(0, 2), 96)
    assert empty == {m: "" for m in FUSION_METHODS}


def test_an_unknown_method_is_refused_naming_the_valid_ones(tok):
    with pytest.raises(ValueError, match="valid are select, blockwise, blockwise-frames, chiu, chiu-seconds, lcs, rover"):
        run(tok, script(tok), 96, ("median",))


def test_decoder_names_of_the_methods_round_trip():
    for m in FUSION_METHODS:
        assert fusion_method(fusion_decoder(m)) == m
    assert fusion_decoder("average") == "greedy" and fusion_method("greedy") == "average"
    assert fusion_method("beam-lm256") is None and fusion_method("fusion-median") is None
    with pytest.raises(ValueError, match="valid are average"):
        fusion_decoder("median")


def test_the_word_level_methods_join_with_their_settings():
    """``chiu`` takes paper 001's word-position confidence, ``chiu-seconds`` the seconds from the window's centre
    (the same windows: tests/test_fusion_ties.py works the example by hand); ``blockwise`` concatenates."""
    from asr_core.decoding.fused import join_words
    from asr_core.decoding.fusion import WindowHyp

    def hyp(start, end, *words):
        return WindowHyp(tuple(w for w, _ in words), tuple(t for _, t in words), start, end)

    hyps = [hyp(0, 4, ("the", 0.5), ("cat", 1.2), ("sat", 2.0), ("on", 2.8), ("tha", 3.7)),
            hyp(2, 6, ("sad", 2.1), ("on", 2.8), ("the", 3.7), ("mat", 4.3), ("and", 5.2)),
            hyp(4, 8, ("mad", 4.3), ("and", 5.2), ("purred", 6.0), ("loudly", 7.0)),
            hyp(6, 10, ("purred", 6.1), ("loudly", 7.0))]
    assert join_words("chiu", hyps) == "the cat sat on the mad and purred loudly".split()
    assert join_words("chiu-seconds", hyps) == "the cat sat on the mat and purred loudly".split()
    assert join_words("blockwise", hyps[:1]) == "the cat sat on tha".split()
    with pytest.raises(ValueError, match="not a word-level"):
        join_words("select", hyps)


def test_evaluate_refuses_an_unknown_fusion_method_naming_it_and_the_valid_ones(tmp_path, capsys):
    """``python -m asr_core evaluate --fusion``: exit 2 before the checkpoint is read, the new names valid."""
    from asr_core.evaluation.evaluate import cli
    from asr_core.evaluation.evaluate_cli import parse_fusion

    assert parse_fusion("blockwise-frames, chiu-seconds") == ("blockwise-frames", "chiu-seconds")
    assert parse_fusion("all") == FUSION_METHODS
    assert cli([str(tmp_path / "none.pt"), "--data", f"t=podcast:{tmp_path}", "--fusion", "chiu,median"]) == 2
    err = capsys.readouterr().err
    assert "'median' is not a window fusion method" in err
    assert "valid are select, blockwise, blockwise-frames, chiu, chiu-seconds, lcs, rover" in err
