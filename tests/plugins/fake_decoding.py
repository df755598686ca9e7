"""The evaluation's dataset loop fed with text instead of audio: each recording "decodes" to the text a test gives
for it, so the word scorers (WER, cue, tail, recall) are tested on hypotheses chosen by hand. The model, features
and posteriors are stand-ins (no model runs); everything after decoding is the real code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


def fake_decode(monkeypatch: pytest.MonkeyPatch, recordings: Sequence[Any], text_of: Callable[[str], str],
                scorers: Sequence[Any], name: str = "t") -> tuple[dict[str, list[dict[str, Any]]], list[dict]]:
    """``evaluate_dataset`` of ``recordings`` (clean only, greedy) with each recording decoded to ``text_of(stem)``
    (``stem``: its audio file's stem) and scored by ``scorers`` (word scorers, bound to the dataset here)."""
    import asr_core.data.audio
    from asr_core.decoding.decode import WindowBatch
    from asr_core.evaluation import dataset, decoders
    from asr_core.evaluation.dataset import Conditions, evaluate_dataset

    monkeypatch.setattr(asr_core.data.audio, "load_audio", lambda path: Path(path).stem)
    monkeypatch.setattr(dataset, "prepare_features", lambda extractor, wave, ignore, fps: SimpleNamespace(
        shape=(1,), id=wave))
    monkeypatch.setattr(dataset, "plan_windows", lambda *a, **k: SimpleNamespace(starts=[0]))
    # the posteriors stand for the recording, greedy decoding passes them through, the tokenizer gives its text
    monkeypatch.setattr(dataset, "posteriors", lambda model, feats, *a, **k: feats.id)
    monkeypatch.setattr(decoders, "greedy_ids", lambda probs, blank: probs)
    tokenizer = SimpleNamespace(blank_id=0, decode=text_of)
    setup = decoders.Setup(None, None, tokenizer, 1, 1.0, WindowBatch(1), 1, 100.0, None)
    bound = [b for s in scorers if (b := s.bind(name, recordings)) is not None]
    return evaluate_dataset(name, recordings, Conditions(), setup, [decoders.GreedyDecoder()], bound)
