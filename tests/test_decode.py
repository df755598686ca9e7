"""Moving-window decoding: window placement, batching, probability averaging, greedy CTC; precision, the window
batch sized from free memory and remembered after an out-of-memory error."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from asr_core.decoding.decode import (CPU_BATCH_WINDOWS, FREE_MEMORY_FRACTION, MAX_BATCH_WINDOWS, WindowBatch,
                              auto_batch_windows, decode_features, forward_windows, greedy_ids, plan_windows,
                              posteriors, window_bytes, window_frames, windows_that_fit)
from asr_core.device import resolve_precision

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
    from asr_core.model.acoustic import build_model

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
    from asr_core.decoding.decode import prepare_features
    from asr_core.data.features import FeatureExtractor

    extractor = FeatureExtractor(FeatureConfig())
    wave = torch.randn(16000 * 4) * 0.1
    feats = prepare_features(extractor, wave, [(1.0, 1.5), (3.0, 3.2)], 100.0)
    full = extractor(wave)
    assert feats.shape == full.shape
    assert feats[100:150].abs().max() == 0 and feats[300:320].abs().max() == 0
    torch.testing.assert_close(feats[:100], full[:100])  # statistics come from the whole recording
    torch.testing.assert_close(feats[150:300], full[150:300])


# ---- precision, batch sizing, and the batch size remembered after an out-of-memory error --------------------------
class _CountingOom(nn.Module):
    """A fake model: raises torch.OutOfMemoryError for batches of more than ``limit`` windows, counts its calls."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit = inner, limit
        self.calls: list[int] = []  # windows per call, in order
        self.ooms = 0

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(features.shape[0])
        if features.shape[0] > self.limit:
            self.ooms += 1
            raise torch.OutOfMemoryError("CUDA out of memory (mocked)")
        return self.inner(features, lengths)


def test_halved_batch_is_remembered_for_every_later_recording(capsys) -> None:
    """One WindowBatch per evaluation: the first recording finds the size that fits (16 -> 8 -> 4 -> 2 with a
    limit of 3), every later one starts from it; a plain int re-finds it per recording, as before."""
    inner = ConvCTC(seed=5)
    recordings = [torch.randn(n, 16) for n in (2000, 1500, 2500, 1800)]
    expected = [posteriors(inner, f, 256, stride=0.125, batch_windows=16) for f in recordings]

    shared = WindowBatch(16)
    model = _CountingOom(inner, limit=3)
    for feats, want in zip(recordings, expected):
        torch.testing.assert_close(posteriors(model, feats, 256, stride=0.125, batch_windows=shared), want,
                                   atol=1e-5, rtol=1e-4)
    assert model.ooms == 3 and model.calls[:4] == [16, 8, 4, 2]
    assert max(model.calls[4:]) == 2 and shared.size == 2 and shared.initial == 16
    windows = sum(len(plan_windows(f.shape[0], 256, 0.125).starts) for f in recordings)
    assert len(model.calls) == 3 + sum(math.ceil(len(plan_windows(f.shape[0], 256, 0.125).starts) / 2)
                                       for f in recordings)
    assert sum(model.calls[3:]) == windows  # every window decoded exactly once after the failed attempts
    assert capsys.readouterr().err.count("out of memory") == 3

    per_call = _CountingOom(inner, limit=3)  # an int: a fresh batch size for every recording
    for feats in recordings:
        posteriors(per_call, feats, 256, stride=0.125, batch_windows=16)
    assert per_call.ooms == 3 * len(recordings)


def test_out_of_memory_with_one_window_is_raised() -> None:
    model = _CountingOom(ConvCTC(), limit=0)
    with pytest.raises(torch.OutOfMemoryError):
        posteriors(model, torch.randn(600, 16), 256, stride=0.5, batch_windows=WindowBatch(4))
    assert model.calls == [4, 2, 1]  # 4 windows tried, then 2, then 1, which still fails: raised


def test_window_batch_shrinks_from_the_attempt_not_below_one() -> None:
    b = WindowBatch(64)
    assert b.shrink(64) and b.size == 32
    assert b.shrink(5) and b.size == 2  # a short last chunk that failed: half of what was tried
    assert b.shrink(2) and b.size == 1
    assert not b.shrink(1) and b.size == 1
    with pytest.raises(ValueError):
        WindowBatch(0)


def test_window_memory_estimate_and_windows_that_fit() -> None:
    """The per-window estimate (documented in window_bytes) with fake free-memory numbers."""
    gib = 2**30
    main = dict(n_mels=80, subsampling_channels=256, d_model=768, vocab_size=4096, subsampling=8)
    per_frame = window_bytes(1000, **main) / 1000
    assert 40_000 < per_frame < 50_000  # ~45 KiB per input frame in bf16 for the main model
    assert window_bytes(360_000, **main) == pytest.approx(360 * window_bytes(1000, **main), rel=1e-6)
    assert window_bytes(1000, bf16=False, **main) > 1.6 * window_bytes(1000, **main)
    # 1 h windows on an 80 GB GPU: a few at a time; 10 s windows: capped
    assert windows_that_fit(78 * gib, 360_000, **main) == 3
    assert windows_that_fit(78 * gib, 360_000, bf16=False, **main) == 2
    assert windows_that_fit(78 * gib, 1024, **main) == MAX_BATCH_WINDOWS
    assert windows_that_fit(78 * gib, 1024, most=64, **main) == 64
    # exactly: fraction x (free - reserve) // per-window bytes
    w = window_bytes(81_920, **main)
    assert windows_that_fit(10 * gib, 81_920, **main) == int(FREE_MEMORY_FRACTION * 10 * gib // w)
    assert windows_that_fit(10 * gib, 81_920, reserve_bytes=4 * gib, **main) == int(
        FREE_MEMORY_FRACTION * 6 * gib // w)
    assert windows_that_fit(0, 81_920, **main) == 1 and windows_that_fit(gib, 81_920, reserve_bytes=2 * gib) == 1
    # more free memory never means fewer windows; longer windows never more
    fits = [windows_that_fit(f * gib, 262_144, **main) for f in (8, 16, 40, 78, 139)]
    assert fits == sorted(fits) and fits[0] == 1 and fits[-1] >= 5
    assert [windows_that_fit(40 * gib, t, **main) for t in (4096, 32_768, 262_144)] == sorted(
        [windows_that_fit(40 * gib, t, **main) for t in (4096, 32_768, 262_144)], reverse=True)


def test_auto_batch_windows_from_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    assert auto_batch_windows(360_000, "cpu", bf16=False) == CPU_BATCH_WINDOWS == 8
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (asked.append(dev) or (20 * 2**30, 80 * 2**30)))
    got = auto_batch_windows(131_072, "cuda", bf16=True, reserve_bytes=2**30, d_model=768)
    assert asked and got == windows_that_fit(20 * 2**30, 131_072, reserve_bytes=2**30, bf16=True, d_model=768)


def test_precision_resolves_by_device() -> None:
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("fp32", "cpu") == "fp32"
    assert resolve_precision("auto", torch.device("cuda")) == "bf16" and resolve_precision("fp32", "cuda") == "fp32"
    assert resolve_precision("bf16", "cuda:0") == "bf16"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_precision("bf16", "cpu")
    with pytest.raises(ValueError, match="needs CUDA"):
        posteriors(ConvCTC(), torch.randn(300, 16), 256, precision="bf16")
    with pytest.raises(ValueError, match="unknown precision"):
        resolve_precision("fp16", "cuda")


def test_bf16_runs_the_model_under_cuda_autocast_and_sums_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch.autocast is replaced by a recorder, and the model returns bf16 logits as it would."""
    entered = []

    class Recorder:
        def __init__(self, device_type: str, dtype=None, enabled: bool = True) -> None:
            entered.append((device_type, dtype, enabled))

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc) -> None:
            return None

    class Bf16Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = ConvCTC(seed=7)

        def forward(self, features, lengths):
            logits, n = self.inner(features, lengths)
            return logits.to(torch.bfloat16), n

    monkeypatch.setattr(torch, "autocast", Recorder)
    feats = torch.randn(900, 16)
    probs, _ = forward_windows(Bf16Logits(), feats, [(0, 256), (128, 384)], "cpu", bf16=True)
    assert entered == [("cuda", torch.bfloat16, True)] and probs.dtype == torch.float32
    entered.clear()
    out = posteriors(Bf16Logits(), feats, 256, stride=0.5, precision="fp32")
    assert out.dtype == torch.float32 and entered and all(e == ("cuda", torch.bfloat16, False) for e in entered)
