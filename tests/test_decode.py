"""Moving-window decoding: window placement, batching, probability averaging, greedy CTC."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from asr_core.decode import decode_features, greedy_ids, plan_windows, posteriors, window_frames

torch.set_num_threads(1)


class ConvCTC(nn.Module):
    """A small real model with the contract's signature: 8x subsampling by strided convolutions, padding masked
    so that it never reaches the outputs, plus a window-level term (mean over the valid input) so the output of
    a frame depends on where its window was cut, as an attention model's does."""

    def __init__(self, n_mels: int = 16, vocab: int = 7, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.convs = nn.ModuleList(nn.Conv1d(c_in, 24, 3, stride=2, padding=1) for c_in in (n_mels, 24, 24))
        self.head = nn.Linear(24 + n_mels, vocab)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.5

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.arange(features.shape[1])[None, :] < lengths[:, None]
        x = (features * mask[..., None]).transpose(1, 2)
        cur = lengths.clone()
        for conv in self.convs:
            x = torch.relu(conv(x))
            cur = (cur + 1) // 2
            keep = torch.arange(x.shape[2])[None, :] < cur[:, None]
            x = x * keep[:, None, :]
        ctx = (features * mask[..., None]).sum(1) / lengths[:, None].clamp(min=1)
        ctx = ctx[:, None, :].expand(-1, x.shape[2], -1)
        return self.head(torch.cat([x.transpose(1, 2), ctx], -1)), cur


def test_plan_covers_the_end_with_paper_starts() -> None:
    for frames in (0, 1, 100, 1024, 1025, 5000, 12345):
        plan = plan_windows(frames, 1024, 0.125, 8)
        assert plan.stride == 128
        assert plan.starts[0] == 0 and all(s == i * 128 for i, s in enumerate(plan.starts))
        assert plan.spans[-1][1] == frames or (frames == 0 and plan.spans == [(0, 0)])
        assert len(plan.starts) == 1 or plan.starts[-2] + 1024 < frames  # no window past the first that ends it


def test_window_and_stride_are_whole_output_frames() -> None:
    assert window_frames(10.24, 100, 8) == 1024
    assert window_frames(5.0, 100, 8) == 496 or window_frames(5.0, 100, 8) == 504
    plan = plan_windows(3000, 504, 0.125, 8)
    assert plan.stride % 8 == 0 and plan.window % 8 == 0
    with pytest.raises(ValueError, match="multiple of 8"):
        plan_windows(100, 500, 0.125, 8)
    with pytest.raises(ValueError, match="stride"):
        plan_windows(100, 512, 0.0, 8)


def test_short_recording_with_stride_equal_to_window_is_one_forward_pass() -> None:
    model = ConvCTC()
    feats = torch.randn(301, 16)
    probs = posteriors(model, feats, window=512, stride=1.0)
    logits, n = model(feats[None], torch.tensor([301]))
    assert probs.shape == (math.ceil(301 / 8), 7) and int(n[0]) == probs.shape[0]
    torch.testing.assert_close(probs, torch.softmax(logits[0], -1))


def test_probabilities_are_averaged_over_covering_windows() -> None:
    model = ConvCTC(seed=3)
    feats = torch.randn(1000, 16)
    window, stride = 256, 0.25
    plan = plan_windows(1000, window, stride)
    sums = torch.zeros(125, 7)
    counts = torch.zeros(125)
    for s, e in plan.spans:  # the definition, one window at a time
        logits, n = model(feats[s:e][None], torch.tensor([e - s]))
        sums[s // 8: s // 8 + int(n[0])] += torch.softmax(logits[0, : int(n[0])], -1)
        counts[s // 8: s // 8 + int(n[0])] += 1
    expected = sums / counts[:, None]
    for batch in (1, 3, 8, 100):
        got = posteriors(model, feats, window, stride=stride, batch_windows=batch)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert counts.max() == 4 and counts.min() == 1  # interior frames are covered by window/stride windows


def test_greedy_ctc_merges_repeats_and_drops_blanks() -> None:
    blank = 4
    seq = [4, 1, 1, 4, 1, 2, 2, 4, 4, 3]
    probs = torch.nn.functional.one_hot(torch.tensor(seq), 5).float()
    assert greedy_ids(probs, blank) == [1, 1, 2, 3]
    assert greedy_ids(torch.zeros(0, 5), blank) == []


class ToneModel(nn.Module):
    """Emits token k where feature band k is active (pooled over 8 frames), blank on silence; plus a small
    window-dependent bias so overlapping windows disagree slightly and only their average decodes cleanly."""

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, f = features.shape
        t_out = math.ceil(t / 8)
        x = nn.functional.pad(features, (0, 0, 0, t_out * 8 - t)).reshape(b, t_out, 8, f).mean(2)
        blank = torch.full((b, t_out, 1), 1.0)
        ctx = features.sum(1, keepdim=True)[..., :f] / lengths[:, None, None].clamp(min=1)
        logits = torch.cat([4 * x + 0.3 * ctx, blank], -1)
        return logits, (lengths + 7) // 8


def _tone_features(tokens: list[int], lead: int, tail: int, f: int = 5) -> torch.Tensor:
    parts = [torch.zeros(lead, f)]
    for k in tokens:
        word = torch.zeros(40, f)
        word[:, k] = 1.0
        parts += [word, torch.zeros(30, f)]
    parts.append(torch.zeros(tail, f))
    return torch.cat(parts)


def test_differently_silence_padded_recordings_decode_the_same_text() -> None:
    tokens = [0, 3, 1, 1, 4, 2, 0, 3, 3, 2, 1, 4] * 4
    texts = set()
    for lead, tail in ((0, 0), (37, 5), (3, 301), (250, 129)):
        feats = _tone_features(tokens, lead, tail)
        text = decode_features(ToneModel(), feats, window=256, decode_ids=lambda ids: " ".join(map(str, ids)),
                               blank=5, stride=0.125, batch_windows=4)
        texts.add(text)
    assert texts == {" ".join(map(str, tokens))}


def test_with_the_project_model() -> None:
    """The real FastConformer (tiny preset, random weights): batching and padding do not change posteriors."""
    from asr_core.config import preset
    from asr_core.model import build_model

    cfg = preset("tiny")
    torch.manual_seed(0)
    model = build_model(cfg.model, n_mels=80).eval()
    feats = torch.randn(1500, 80)
    one = posteriors(model, feats, 512, stride=0.25, batch_windows=1)
    many = posteriors(model, feats, 512, stride=0.25, batch_windows=8)
    assert one.shape == (math.ceil(1500 / 8), cfg.model.vocab_size)
    torch.testing.assert_close(one, many, atol=1e-4, rtol=1e-3)
    short = feats[:400]
    logits, _ = model(short[None], torch.tensor([400]))
    torch.testing.assert_close(posteriors(model, short, 512, stride=1.0), torch.softmax(logits[0], -1),
                               atol=1e-5, rtol=1e-4)


class _OomAbove(nn.Module):
    """Wraps a model and raises CUDA's out-of-memory error for batches larger than ``limit`` (what a long-context
    model does on a real GPU; no GPU here, hence mocked)."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit, self.sizes = inner, limit, []

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.sizes.append(features.shape[0])
        if features.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (mocked)")
        return self.inner(features, lengths)


def test_out_of_memory_halves_the_window_batch_mocked_oom(capsys) -> None:
    model = ConvCTC(seed=2)
    feats = torch.randn(2000, 16)
    expected = posteriors(model, feats, 256, stride=0.125, batch_windows=8)
    wrapped = _OomAbove(model, limit=3)
    got = posteriors(wrapped, feats, 256, stride=0.125, batch_windows=8)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert wrapped.sizes[:3] == [8, 4, 2] and max(wrapped.sizes[3:]) <= 2
    assert "out of memory" in capsys.readouterr().err


def test_untranscribed_regions_are_zeroed_after_whole_recording_normalisation() -> None:
    from asr_core.config import FeatureConfig
    from asr_core.decode import prepare_features
    from asr_core.features import FeatureExtractor

    extractor = FeatureExtractor(FeatureConfig())
    wave = torch.randn(16000 * 4) * 0.1
    feats = prepare_features(extractor, wave, [(1.0, 1.5), (3.0, 3.2)], 100.0)
    full = extractor(wave)
    assert feats.shape == full.shape
    assert feats[100:150].abs().max() == 0 and feats[300:320].abs().max() == 0
    torch.testing.assert_close(feats[:100], full[:100])  # statistics come from the whole recording
    torch.testing.assert_close(feats[150:300], full[150:300])
