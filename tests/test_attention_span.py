"""model.attention_span_s: self-attention banded to |i - j| <= span frames, and the exact receptive field it gives
(asr_core.model.receptive): an output frame does not move at all when input beyond its field changes, and does
within it; the band is the same computed in blocks or whole, padded or not; bad spans exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from asr_core.config import Config, preset
from asr_core.config.parse import ConfigError
from asr_core.contract.identity import trial_key
from asr_core.model.acoustic import build_model
from asr_core.model.attention import banded_sdpa
from asr_core.model.receptive import receptive_field, span_frames

TINY = ["model.d_model=32", "model.heads=2", "model.layers=2", "model.subsampling_channels=8", "model.vocab_size=16",
        "model.subsampling_factor=4", "data.context_s=10.24"]


def _cfg(*extra: str) -> Config:
    return preset("tiny").with_overrides([*TINY, *extra])


def test_the_receptive_field_by_hand() -> None:
    cfg = _cfg("model.attention_span_s=0.32")  # 0.32 s x 100 frames/s / 4 = 8 output frames
    rf = receptive_field(cfg)
    assert rf.span_frames == 8 and rf.frame_s == pytest.approx(0.04)
    assert rf.output_frames == 2 * (8 + cfg.model.conv_kernel // 2)  # 2 layers x (band + kernel 9 // 2) = 24
    assert rf.feature_frames == 4 * 24 + 3
    assert rf.seconds == pytest.approx((99 * 160 + 200) / 16000)
    assert "+-1.00 s of audio" in rf.describe()
    whole = receptive_field(_cfg())
    assert not whole.banded and whole.seconds is None and "whole window" in whole.describe()
    assert span_frames(_cfg("model.attention_span_s=0.03").model) == 0  # under one frame: each frame itself


def _model(span: str | None) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = _cfg(*([f"model.attention_span_s={span}"] if span else []))
    return build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second).eval()


@pytest.mark.parametrize("span", ["0.32", "1.0"])
def test_output_moves_exactly_within_the_receptive_field(span: str) -> None:
    model = _model(span)
    rf = receptive_field(_cfg(f"model.attention_span_s={span}"))
    t = 1000  # feature frames: 250 output frames
    x = torch.randn(1, t, 80)
    j = 125  # the output frame watched; its field covers feature frames 4j -+ rf.feature_frames
    lo, hi = 4 * j - rf.feature_frames, 4 * j + rf.feature_frames
    with torch.no_grad():
        base = model(x, torch.tensor([t]))[0][0, j]
        for edit in (slice(0, lo), slice(hi + 1, t)):  # everything outside the field
            y = x.clone()
            y[0, edit] = torch.randn_like(y[0, edit]) * 5
            assert torch.equal(model(y, torch.tensor([t]))[0][0, j], base), edit
        for at in (lo, hi):  # one feature frame at either edge of the field moves it
            y = x.clone()
            y[0, at] += 3.0
            assert not torch.equal(model(y, torch.tensor([t]))[0][0, j], base), at


def test_an_unbanded_model_sees_the_whole_window() -> None:
    model = _model(None)
    x = torch.randn(1, 1000, 80)
    y = x.clone()
    y[0, :10] += 3.0
    with torch.no_grad():
        assert not torch.equal(model(y, torch.tensor([1000]))[0][0, -1], model(x, torch.tensor([1000]))[0][0, -1])


def test_banded_blocks_equal_one_masked_call_padded_or_not() -> None:
    torch.manual_seed(1)
    b, h, t, d, span = 2, 2, 37, 8, 5
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    lengths = torch.tensor([37, 23])
    mask = torch.arange(t)[None] < lengths[:, None]
    pos = torch.arange(t)
    band = (pos[:, None] - pos[None]).abs() <= span
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=(band[None] & mask[:, None, :])[:, None])
    got = banded_sdpa(q, k, v, span, mask, block=8)
    valid = mask[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[valid], want[valid])
    assert torch.isfinite(got).all()  # padded rows far from any valid key are not empty (no NaN)
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(banded_sdpa(q, k, v, span, None, block=7), whole)


def test_a_padded_batch_gives_each_window_what_it_gives_alone() -> None:
    model = _model("0.32")
    a, b = torch.randn(400, 80), torch.randn(260, 80)
    batch = torch.zeros(2, 400, 80)
    batch[0], batch[1, :260] = a, b
    with torch.no_grad():
        out, lens = model(batch, torch.tensor([400, 260]))
        alone = model(b[None], torch.tensor([260]))[0][0]
    torch.testing.assert_close(out[1, : int(lens[1])], alone, rtol=1e-4, atol=1e-5)


def test_the_field_is_science_and_no_existing_key_moves() -> None:
    assert trial_key(_cfg()) != trial_key(_cfg("model.attention_span_s=2.56"))
    assert trial_key(_cfg()) == trial_key(_cfg("model.attention_span_s=null"))


@pytest.mark.parametrize(("value", "valid"), [
    ("0", "a positive number of seconds"), ("-1", "a positive number of seconds"),
    ("20.48", "at most data.context_s=10.24 s")])
def test_a_bad_span_is_refused(value: str, valid: str) -> None:
    with pytest.raises(ConfigError, match=valid):
        _cfg(f"model.attention_span_s={value}")


def test_params_shows_the_receptive_field() -> None:
    done = subprocess.run([sys.executable, "-m", "asr_core", "params", "tiny", "--set", "model.attention_span_s=2.56",
                           "--set", "data.context_s=81.92"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "receptive field: +-" in done.stdout and "attention banded to" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "asr_core", "params", "tiny", "--set", "model.attention_span_s=0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "model.attention_span_s" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_a_banded_model_trains_records_its_field_and_decodes_banded(tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from asr_core.training.checkpoint import load_for_eval
    from asr_core.training.train import train
    from tests.test_train import make_corpus

    recs = make_corpus(tmp_path / "corpus", 6)
    cfg = _cfg("model.attention_span_s=0.32", "model.vocab_size=48", "data.batch_audio_s=20.48",
               "data.seqlen_warmup=none", "train.max_steps=2", "train.warmup_steps=1", "train.log_every=1",
               "train.checkpoint_every=100")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(cfg, tmp_path / "run", recordings=recs, tracking_uri=uri, experiment="band")
    run = MlflowClient(uri).get_run(result.run_id)
    assert run.data.tags["model.receptive_field_s"] == f"{receptive_field(cfg).seconds:.3f}"
    assert run.data.params["model.attention_span_s"] == "0.32"
    model, again, _ = load_for_eval(result.checkpoint)
    assert again == cfg and {layer.attn.span for layer in model.layers} == {8}  # decoding bands as training did


@pytest.mark.slow
def test_reach_sees_nothing_beyond_the_receptive_field_and_something_within() -> None:
    """``reach``'s distance profile through the moving-window decoder, 16 s windows: a model banded to 0.32 s a
    layer (a field of +-1.36 s) is moved by audio 0.5 s away and not at all by audio 4 or 8 s away, though its
    windows hold both; the same model unbanded is moved by all three."""
    import pandas as pd

    from asr_core.probes.reach import Decoding, distance_profile, summarise_distances

    banded_cfg = preset("tiny").with_overrides(["model.attention_span_s=0.32", "data.context_s=16"])
    assert receptive_field(banded_cfg).seconds == pytest.approx(1.3625)
    feats = torch.randn(2000, 80)  # 20 s
    for span, moved in (("0.32", {0.5: True, 4.0: False, 8.0: False}), (None, {0.5: True, 4.0: True, 8.0: True})):
        torch.manual_seed(0)
        cfg = banded_cfg if span else preset("tiny").with_overrides(["data.context_s=16"])
        model = build_model(cfg.model, 80, 100.0).eval()
        dec = Decoding(model, window=1600, stride=0.125, subsampling=8, frames_per_second=100.0)
        rows = pd.DataFrame(distance_profile(dec, feats, 20.0, recording="r", distances_s=tuple(moved), targets=2,
                                             span_s=1.0))
        summary = summarise_distances(rows).set_index("distance_s")
        for d, yes in moved.items():
            if yes:
                assert summary.loc[d, "changed_pct"] == 100.0 and summary.loc[d, "mean_tv"] > 0, (span, d)
            else:
                assert summary.loc[d, "changed_pct"] == 0.0 and summary.loc[d, "mean_tv"] == 0.0, (span, d)
