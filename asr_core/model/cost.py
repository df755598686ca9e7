"""The model's arithmetic without building it: multiply-accumulates per second of audio (:func:`model_macs`) and
parameters (:func:`model_params`) of :func:`asr_core.model.acoustic.build_model`'s model, from its config alone.
Pure functions of the config, no torch: the budget (``orchestrate plan --estimate``) scales one calibration to other
model sizes with them, and a calibration file records them (:func:`model_summary`). Checked against
``torch.utils.flop_counter`` and the built models in the tests."""

from __future__ import annotations

import math

from asr_core.config import Config, FeatureConfig, ModelConfig
from asr_core.contract.calibration import ModelSummary


def model_macs(m: ModelConfig, features: FeatureConfig | None = None) -> tuple[float, float]:
    """Multiply-accumulates of one forward pass per second of audio: ``(linear, attention)``, where ``linear`` is
    everything that runs once per frame (subsampling convolutions, feed-forwards, projections, convolution module,
    the self-conditioned CTC head after every layer) and ``attention`` the score and value products per second of
    audio **per second of window** (``2 x window frames x d_model`` per output frame and layer). A forward+backward
    pass is about three times this. Checked against ``torch.utils.flop_counter`` in the tests."""
    f = features or FeatureConfig()
    fps = f.frames_per_second
    sub_f, c, d, n, v = m.subsampling_factor, m.subsampling_channels, m.d_model, m.layers, m.vocab_size
    stages = int(math.log2(sub_f))
    freq, sub = f.n_mels, 0.0
    for s in range(stages):
        freq = (freq + 1) // 2
        per_frame = freq / 2 ** (s + 1)  # output positions of this stage per input frame
        sub += per_frame * (9 * c if s == 0 else 9 * c + c * c)
    sub += c * freq * d / sub_f
    layer = (4 * m.ff_expansion + 4 + 3) * d * d + m.conv_kernel * d  # 2 FF, q/k/v/out, conv module
    head = (2 * (n - 1) + 1) * d * v if m.self_conditioning else d * v
    linear = fps * (sub + (n * layer + head) / sub_f)
    attention = fps * (fps / sub_f) * 2 * n * d / sub_f
    return linear, attention


def model_params(m: ModelConfig, n_mels: int = 80) -> int:
    """Parameters of :func:`asr_core.model.acoustic.build_model` (``m``), counted without building it (a learnt Fourier
    positional encoding's few are not counted). Checked against the built models in the tests."""
    c, d, v, e, k = m.subsampling_channels, m.d_model, m.vocab_size, m.ff_expansion, m.conv_kernel
    stages = int(math.log2(m.subsampling_factor))
    freq = n_mels
    for _ in range(stages):
        freq = (freq + 1) // 2
    sub = 10 * c + (stages - 1) * (10 * c + c * c + c) + c * freq * d + d
    ff = 2 * d + 2 * e * d * d + ((e * d + d) if m.ff_bias else 0)
    attention = 2 * d + 4 * d * d + 4 * d
    conv = 2 * d + (2 * d * d + 2 * d) + k * d + 2 * d + (d * d + d)
    layer = 2 * ff + attention + conv + 2 * d
    head = (2 * d if m.decoder_norm else 0) + d * v + v + ((v * d + d) if m.self_conditioning else 0)
    return sub + m.layers * layer + head


def model_summary(cfg: Config, params: int | None = None) -> ModelSummary:
    """What the estimate needs of a model: its shape, parameters and arithmetic (:func:`model_macs`)."""
    m = cfg.model
    if params is None:
        params = model_params(m, cfg.data.features.n_mels)
    linear, attention = model_macs(m, cfg.data.features)
    return ModelSummary(layers=m.layers, d_model=m.d_model, heads=m.heads, vocab_size=m.vocab_size,
                        subsampling_factor=m.subsampling_factor, subsampling_channels=m.subsampling_channels,
                        params=int(params), macs_linear_per_s=linear, macs_attention_per_s2=attention)
