"""Steps prepared by worker threads are the steps prepared in the loop: same order, same bits, same positions;
a bad recording fails the step that uses it, and closing the loader stops its threads."""

from __future__ import annotations

import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from asr_core.data.batching import BatchMaker, Step, StepLoader
from asr_core.data.chunking import Position, WindowStream
from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording
from asr_core.data.features import FeatureExtractor
from asr_core.data.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from test_train import make_corpus, tiny_cfg  # noqa: E402

CFG = tiny_cfg(**{"data.context_s": 2.0, "data.batch_audio_s": 9, "data.micro_batch_audio_s": 4,
                  "model.vocab_size": 40})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Recording], Tokenizer]:
    root = tmp_path_factory.mktemp("batching")
    recs = make_corpus(root / "corpus", 6, seed=2, words_per=(6, 10))
    return recs, Tokenizer.train([r.text for r in recs], 40, root / "tok.model")


def _steps(recs: list[Recording], tok: Tokenizer, workers: int, pos: Position = Position(),
           windows: bool = True) -> list[Step]:
    maker = BatchMaker(recs, FeatureExtractor(CFG.data.features), tok, windows=windows)
    with StepLoader(WindowStream(recs, CFG.data, 0, epochs=2), pos, maker, CFG.data.micro_batch_audio_s,
                    workers) as loader:
        return list(loader)


def _assert_same(a: list[Step], b: list[Step]) -> None:
    assert len(a) == len(b)
    for sa, sb in zip(a, b):
        assert sa.windows == sb.windows and sa.next_pos == sb.next_pos
        assert len(sa.micro) == len(sb.micro)
        for ma, mb in zip(sa.micro, sb.micro):
            assert torch.equal(ma.features, mb.features) and torch.equal(ma.lengths, mb.lengths)
            assert ma.targets == mb.targets


def test_workers_give_the_same_steps_in_the_same_order(corpus: tuple[list[Recording], Tokenizer]) -> None:
    recs, tok = corpus
    torch.set_num_threads(2)
    inline = _steps(recs, tok, 0)
    assert len(inline) >= 6 and any(len(s.micro) > 1 for s in inline)  # micro-batches are exercised
    for s in inline:
        assert sum(m.size for m in s.micro) == s.size
        # padded frames per pass within data.micro_batch_audio_s (up to a rounded frame per window)
        assert all(m.features.shape[0] * m.features.shape[1] <= 4.0 * 100 + m.size for m in s.micro)
    _assert_same(inline, _steps(recs, tok, 2))
    _assert_same(inline, _steps(recs, tok, 5))  # more workers than steps in flight
    # resuming from a step's position gives the rest of the same steps, with or without workers
    _assert_same(inline[4:], _steps(recs, tok, 2, inline[3].next_pos))


def test_an_unreadable_recording_fails_the_step_that_uses_it(corpus: tuple[list[Recording], Tokenizer],
                                                              tmp_path: Path) -> None:
    recs, tok = corpus
    stream = WindowStream(recs, CFG.data, 0)
    bad_rec = list(stream.batches())[3][0][-1].recording
    broken = list(recs)
    broken[bad_rec] = replace(recs[bad_rec], audio=tmp_path / "gone.wav")
    bad_step = next(i for i, (ws, _) in enumerate(stream.batches()) if any(w.recording == bad_rec for w in ws))
    maker = BatchMaker(broken, FeatureExtractor(CFG.data.features), tok)
    with StepLoader(WindowStream(broken, CFG.data, 0), Position(), maker, 4.0, 2) as loader:
        for _ in range(bad_step):
            next(loader)  # steps before it (prepared ahead alongside the bad one) are fine
        with pytest.raises(CorpusError, match=rf"recording '{recs[bad_rec].id}'.*gone\.wav"):
            next(loader)


def test_closing_the_loader_stops_its_threads(corpus: tuple[list[Recording], Tokenizer]) -> None:
    recs, tok = corpus
    maker = BatchMaker(recs, FeatureExtractor(CFG.data.features), tok)
    loader = StepLoader(WindowStream(recs, CFG.data, 0), Position(), maker, 0.0, 3)
    next(loader)
    assert any(t.name.startswith("asr-data") for t in threading.enumerate())
    loader.close()
    assert not any(t.name.startswith("asr-data") for t in threading.enumerate())
    with pytest.raises(StopIteration):
        next(loader)


def test_windows_read_on_their_own_have_the_features_cut_from_the_whole_recording(corpus) -> None:
    """The interleaved loader reads each window's samples and normalises with the recording's statistics; its
    features are those of the whole recording, cut (bit for bit on 16 kHz audio, up to 1e-5 at the last frame)."""
    recs, tok = corpus
    assert CFG.data.batching == "interleaved"
    by_window, whole = _steps(recs, tok, 2), _steps(recs, tok, 0, windows=False)
    assert len(by_window) == len(whole) > 3
    for a, b in zip(by_window, whole):
        assert a.windows == b.windows and a.next_pos == b.next_pos
        for ma, mb in zip(a.micro, b.micro):
            assert torch.equal(ma.lengths, mb.lengths) and ma.targets == mb.targets
            assert torch.allclose(ma.features, mb.features, atol=1e-5, rtol=0)
