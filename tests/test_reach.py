"""How far back the decoded output reaches (``python -m asr_core reach``): the stretch-only posteriors equal the
whole recording's, audio beyond the context never moves the output and audio inside it does (the real FastConformer
through the moving-window decoder), and the command on the quick demo's trained models (real espeak-ng corpus with a
planted cue): the disambiguating word moves the decoded cue word exactly when the context holds it."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from asr_core.decoding.decode import posteriors, posteriors_at
from asr_core.data.features import zero_regions
from asr_core.probes.reach import Decoding, distance_profile, summarise_cues, summarise_distances, total_variation

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    from asr_core.config import preset
    from asr_core.model.acoustic import build_model

    torch.manual_seed(0)
    return build_model(preset("tiny").model, n_mels=80).eval()


@pytest.mark.slow
def test_stretch_posteriors_are_those_of_the_whole_recording(model: torch.nn.Module) -> None:
    feats = torch.randn(2300, 80)
    whole = posteriors(model, feats, 512, stride=0.25, batch_windows=4)
    for a, b in [(0, 5), (40, 90), (100, 180), (287, 288), (0, 288)]:
        torch.testing.assert_close(posteriors_at(model, feats, 512, (a, b), stride=0.25, batch_windows=4),
                                   whole[a:b], atol=1e-4, rtol=1e-3)
    with pytest.raises(ValueError, match="not a stretch"):
        posteriors_at(model, feats, 512, (280, 300))


@pytest.mark.parametrize("window, moved_at", [(200, {0.5: True, 1.0: True, 3.0: False, 8.0: False}),
                                              (1600, {0.5: True, 1.0: True, 3.0: True, 8.0: True})])
@pytest.mark.slow
def test_audio_moves_the_decoded_output_exactly_when_a_window_holds_both(model: torch.nn.Module, window: int,
                                                                          moved_at: dict[float, bool]) -> None:
    """Silence half a second ``d`` seconds before a stretch at 20-21 s of a 30 s recording and decode the whole
    recording as ``evaluate`` does: a 2 s context is moved by audio 0.5 and 1 s away and not by audio 3 and 8 s away
    (bitwise), a 16 s context by all four. A decoder that cut windows short, lost their averaging or placed them
    wrongly fails one side or the other."""
    feats = torch.randn(3000, 80)
    base = posteriors(model, feats, window, stride=0.125, batch_windows=8)[250:263]
    for d, moved in moved_at.items():
        quiet = zero_regions(feats, [(20.0 - d - 0.5, 20.0 - d)], 100.0)
        got = posteriors(model, quiet, window, stride=0.125, batch_windows=8)[250:263]
        change = float(total_variation(base, got).max())
        assert (change > 1e-5) is moved, (window, d, change)
        if not moved:
            assert torch.equal(base, got)


@pytest.mark.slow
def test_distance_profile_skips_what_lies_before_the_recording_and_is_zero_beyond_the_context(
        model: torch.nn.Module) -> None:
    feats = torch.randn(2000, 80)  # 20 s
    dec = Decoding(model, window=200, stride=0.125, subsampling=8, frames_per_second=100.0)
    rows = pd.DataFrame(distance_profile(dec, feats, 20.0, recording="r", distances_s=(0.5, 4.0, 15.0),
                                         targets=4, span_s=1.0))
    starts = sorted(rows["target_s"].unique())
    assert len(starts) == 4 and starts[0] >= 1.0 and starts[-1] <= 18.0
    for (t, d), part in rows.groupby(["target_s", "distance_s"]):
        assert t - d - 1.0 >= 0  # only silenced stretches inside the recording
    assert set(rows[rows["distance_s"] == 15.0]["target_s"]) == {t for t in starts if t >= 16.0}
    summary = summarise_distances(rows).set_index("distance_s")
    assert summary.loc[0.5, "changed_pct"] == 100.0 and summary.loc[0.5, "mean_tv"] > 0
    assert summary.loc[4.0, "changed_pct"] == 0.0 and summary.loc[4.0, "mean_tv"] == 0.0


def test_cue_summary_bands_the_gaps() -> None:
    rows = pd.DataFrame([
        {"before_s": 3.0, "tv_decider": 0.2, "changed_decider": True, "tv_control": 0.1, "changed_control": True},
        {"before_s": 4.0, "tv_decider": 0.0, "changed_decider": False, "tv_control": math.nan,
         "changed_control": None},
        {"before_s": 30.0, "tv_decider": 0.0, "changed_decider": False, "tv_control": 0.0,
         "changed_control": False}])
    s = summarise_cues(rows).set_index("gap_s")
    assert list(s.index) == ["0-5", "20-40"]
    assert s.loc["0-5", "cue_words"] == 2 and s.loc["0-5", "changed_decider_pct"] == 50.0
    assert s.loc["0-5", "tv_control"] == pytest.approx(0.1) and s.loc["0-5", "changed_control_pct"] == 100.0
    assert s.loc["20-40", "tv_decider"] == 0.0


def _checkpoints(root: Path) -> dict[float, Path]:
    from asr_core.config import Config

    out = {}
    for path in sorted(root.glob("runs/**/checkpoint.pt")):
        ck = torch.load(str(path), map_location="cpu", weights_only=True)
        cfg = Config.from_stored(ck["config"], source=str(path))
        out.setdefault(cfg.data.context_s, path)
    return out


@pytest.mark.slow
def _cued_test_split(out: Path) -> Path:
    """The test split of ``./scripts/demo.sh --quick``'s corpus without the recall control: the same synth arguments
    as the demo's training corpus (a split's recordings depend only on them, the seed and the split)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "asr_core", "synth", "--out", str(out), "--hours", "0.25", "--eval-hours",
                    "0.04", "--eval-max-minutes", "0.5", "--min-minutes", "0.4", "--max-minutes", "0.55", "--voices",
                    "3", "--shift", "near", "--splits", "test", "--seed", "0", "--cue", "6,3-10"],
                   check=True, capture_output=True, timeout=600)
    return out / "test"


def test_reach_command_on_the_quick_demo_models(quick_demo, tmp_path: Path, capsys) -> None:
    """The quick demo's shortest and longest models (5.12 s and 10.24 s) on a cued test set as the demo's corpus
    makes it (cue band 3-10 s, 30 s recordings; the demo's own test set holds the recall control, which crowds the
    cue out): what lies within a model's window moves its output, what lies beyond never does; both ways for each
    model, for the silenced seconds and for each planted word's decider."""
    from asr_core.probes.reach import cli

    assert quick_demo.first.returncode == 0, quick_demo.first.output[-3000:]
    ckpts = _checkpoints(quick_demo.root)
    short, long = min(ckpts), max(ckpts)
    assert (short, long) == (5.12, 10.24), ckpts
    test = f"test=podcast:{_cued_test_split(tmp_path / 'cued')}"
    assert cli([str(ckpts[short]), str(ckpts[long]), "--data", test]) == 2  # several need --out
    assert "need --out" in capsys.readouterr().err
    out = tmp_path / "reach"
    assert cli([str(ckpts[short]), str(ckpts[long]), "--data", test, "--targets", "2", "--distances", "1,8,20",
                "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "context 5.12 s" in printed and "context 10.24 s" in printed and "planted cue words" in printed
    assert (out / "reach.png").stat().st_size > 0
    for k, ctx in enumerate((short, long), 1):
        folder = out / f"{k}-{ckpts[ctx].parent.name}"
        assert (folder / "reach.png").stat().st_size > 0
        dist, cues = pd.read_csv(folder / "reach.csv"), pd.read_csv(folder / "cue_reach.csv")
        assert len(cues) > 0 and set(cues["dataset"]) == {"test"}
        beyond = cues[cues["before_s"] > ctx + 0.2]  # the decider never shares a window with its cue word
        assert (beyond["tv_decider"] == 0).all() and not beyond["changed_decider"].any(), (ctx, beyond)
        assert (dist[dist["distance_s"] > ctx]["tv"] == 0).all(), (ctx, dist)
        within = dist[dist["distance_s"] < ctx - 1.5]  # a silenced second this close shares a window with it
        assert len(within) > 0 and (within["tv"] > 0).all(), (ctx, dist)
    assert len(cues[cues["before_s"] > short + 0.2]) > 0  # the band reaches beyond the short window
