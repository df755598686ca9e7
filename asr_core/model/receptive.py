"""How far the model sees: the attention band in output frames and the exact receptive field it gives.

``model.attention_span_s`` bands self-attention to ``|i - j| <= S`` output frames (:func:`span_frames`). Information
still travels farther than one band: each Conformer layer reaches ``S`` frames by attention and ``conv_kernel // 2``
by its depthwise convolution, the layers stack, and the subsampling's stride-2 convolutions (kernel 3, padding 1)
widen it again. Everything else is pointwise in time (feed-forward, norms, self-conditioning, the CTC head) or
depends on no content (rotary and absolute positions, padding masks, batch renormalisation's running statistics in
evaluation). So an output frame ``j`` depends on exactly

* output frames ``j - R .. j + R`` of the first layer's input, ``R = layers x (S + conv_kernel // 2)``;
* feature frames ``f j - (f R + f - 1) .. f j + (f R + f - 1)`` (``f`` the subsampling factor: each of its
  ``log2 f`` stages maps frame ``i`` to inputs ``2i - 1 .. 2i + 1``);
* audio samples up to ``win_length / 2`` beyond those frames' centres (each mel frame is an STFT window of
  ``win_length`` samples centred on it).

That is :func:`receptive_field`, a half-width on each side. Two caveats it states rather than hides: the features
are normalised with statistics of the whole recording (:mod:`asr_core.data.features`), so audio far away still moves
every frame through two numbers per mel bin (the probes silence features after normalisation, where the field is
exact); and in training, batch renormalisation normalises with the batch's statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from asr_core.config import Config, ModelConfig

FRAMES_PER_SECOND = 100.0  # feature frames a second at the default 16 kHz and hop 160 (data.features)


def span_frames(model: ModelConfig, frames_per_second: float = FRAMES_PER_SECOND) -> int | None:
    """The band in output frames: ``floor(attention_span_s x frames_per_second / subsampling_factor)`` (None: no
    band). ``frames_per_second`` is the features' rate (``data.features.frames_per_second``)."""
    if model.attention_span_s is None:
        return None
    return int(math.floor(model.attention_span_s * frames_per_second / model.subsampling_factor + 1e-9))


@dataclass(frozen=True)
class ReceptiveField:
    """Half-widths of what one output frame depends on (None everywhere: the whole window)."""

    span_frames: int | None  # the attention band, output frames each side
    output_frames: int | None  # R: frames of the first layer's input, each side
    feature_frames: int | None  # feature frames each side
    seconds: float | None  # audio each side, STFT window included
    frame_s: float  # seconds per output frame

    @property
    def banded(self) -> bool:
        return self.span_frames is not None

    def describe(self) -> str:
        """One line for ``params`` and the logs."""
        if not self.banded:
            return "receptive field: the whole window (attention not banded)"
        return (f"receptive field: +-{self.seconds:.2f} s of audio (+-{self.output_frames} output frames of "
                f"{self.frame_s * 1000:g} ms, +-{self.feature_frames} feature frames; attention banded to "
                f"+-{self.span_frames} frames = {self.span_frames * self.frame_s:g} s a layer)")


def receptive_field(cfg: Config) -> ReceptiveField:
    """The exact receptive field of ``cfg``'s model (see the module docstring)."""
    m, feats = cfg.model, cfg.data.features
    fps = feats.frames_per_second
    frame_s = m.subsampling_factor / fps
    s = span_frames(m, fps)
    if s is None:
        return ReceptiveField(None, None, None, None, frame_s)
    r = m.layers * (s + m.conv_kernel // 2)
    f = m.subsampling_factor
    feature = f * r + f - 1
    seconds = (feature * feats.hop_length + feats.win_length / 2) / feats.sample_rate
    return ReceptiveField(s, r, feature, seconds, frame_s)
