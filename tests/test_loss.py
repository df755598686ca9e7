"""The step objective: the authors' normalisation (summed CTC / (window frames x configured batch) x 100) against
their formula written out as in ``exp/train.py``, the per-token option, and gradient accumulation keeping both."""

from __future__ import annotations

import pytest
import torch

from asr_core.data.chunking import Window, group_size
from asr_core.config import DataConfig, preset
from asr_core.training.loss import ctc_loss, pass_loss, step_frames
from asr_core.model.acoustic import build_model
from asr_core.training.step import accumulate_gradients
from asr_core.data.batching import MicroBatch


def _batch(seed: int = 0, n: int = 5, frames: int = 96) -> tuple[MicroBatch, list[Window]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([frames, frames, frames, frames - 40, frames - 70][:n])
    feats = torch.randn(n, frames, 80, generator=g)
    for i, t in enumerate(lengths.tolist()):
        feats[i, t:] = 0
    targets = [torch.randint(0, 127, (k,), generator=g).tolist() for k in (4, 0, 7, 2, 1)[:n]]
    windows = [Window(i, 0.0, t / 100, "", seq=frames / 100) for i, t in enumerate(lengths.tolist())]
    return MicroBatch(feats, lengths, targets), windows


def _authors(model, mb: MicroBatch, chunk_size: int, batch_size: int) -> torch.Tensor:
    """exp/train.py: CTCLoss(blank=V-1, reduction='sum') on log-softmax posteriors (T, B, V), padded targets, then
    (loss / (chunk_size * batch_size) * steps_since_backwards) * 100 with steps_since_backwards = 1."""
    logits, out_len = model(mb.features, mb.lengths)
    posts = torch.log_softmax(logits.float(), dim=-1)
    txt = torch.nn.utils.rnn.pad_sequence([torch.tensor(t, dtype=torch.long) for t in mb.targets],
                                          batch_first=True, padding_value=0)
    t_len = torch.tensor([len(t) for t in mb.targets])
    fn = torch.nn.CTCLoss(blank=model.blank_id, reduction="sum", zero_infinity=True)
    loss = fn(posts.transpose(0, 1), txt, out_len, t_len).sum()
    return ((loss / (chunk_size * batch_size)) * 1) * 100


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = build_model(preset("tiny").model)
    m.train()
    return m


def test_the_audio_normalisation_is_the_authors_formula(model) -> None:
    data = DataConfig(context_s=0.96, batch_audio_s=4.8, seqlen_warmup="none")
    mb, windows = _batch()
    frames = step_frames(windows, data)
    assert group_size(0.96, data) == 5 and frames == 96 * 5  # chunk_size (frames) x configured batch size
    logits, out_len = model(mb.features, mb.lengths)
    ours = pass_loss(logits, out_len, mb.targets, model.blank_id, "audio", 1.0, frames)
    theirs = _authors(model, mb, 96, 5)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0) and float(ours.detach()) > 0
    # a partial step (the group's last windows) is divided by the same constant: it weighs less
    part = MicroBatch(mb.features[:2], mb.lengths[:2], mb.targets[:2])
    assert step_frames(windows[:2], data) == frames
    logits2, out2 = model(part.features, part.lengths)
    assert torch.allclose(pass_loss(logits2, out2, part.targets, model.blank_id, "audio", 1.0, frames),
                          _authors(model, part, 96, 5), rtol=1e-6)


def test_tokens_normalisation_is_the_mean_per_token(model) -> None:
    mb, _ = _batch()
    logits, out_len = model(mb.features, mb.lengths)
    per = torch.nn.functional.ctc_loss(torch.log_softmax(logits.float(), -1).transpose(0, 1),
                                       torch.tensor([t for s in mb.targets for t in s]), out_len,
                                       torch.tensor([len(s) for s in mb.targets]), blank=model.blank_id,
                                       reduction="none", zero_infinity=True)
    expect = (per / torch.tensor([max(1, len(s)) for s in mb.targets])).mean()
    assert torch.allclose(ctc_loss(logits, out_len, mb.targets, model.blank_id), expect, rtol=1e-6)
    audio = pass_loss(logits, out_len, mb.targets, model.blank_id, "audio", 1.0, 480)
    assert not torch.allclose(audio, expect)


@pytest.mark.parametrize("norm", ["audio", "tokens"])
def test_micro_batches_give_the_whole_steps_gradient(model, norm: str) -> None:
    mb, windows = _batch(seed=3)
    frames = step_frames(windows, DataConfig(context_s=0.96, batch_audio_s=4.8, seqlen_warmup="none"))
    model.eval()  # batch statistics would differ between passes; the normalisation is what is tested here
    try:
        one = accumulate_gradients(model, [mb], torch.device("cpu"), False, 0, norm, frames)
        g1 = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        parts = [MicroBatch(mb.features[a:b], mb.lengths[a:b], mb.targets[a:b]) for a, b in ((0, 2), (2, 5))]
        two = accumulate_gradients(model, parts, torch.device("cpu"), False, 0, norm, frames)
        g2 = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    finally:
        model.train()
    assert one == pytest.approx(two, rel=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(g1, g2))
