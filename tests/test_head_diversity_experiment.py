"""The pure parts of scripts/head_diversity_experiment.py: the verdict of issue 17's bar (the targeted similarity at
least halved, WER at most one point worse, means over seeds), the tables and the seconds per step from the trainer's
step log. The training itself is the script's run, not a test."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "head_diversity_experiment.py"


@pytest.fixture(scope="module")
def hd():
    spec = importlib.util.spec_from_file_location("head_diversity_experiment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def results(base_a: tuple[float, float], aux_a: tuple[float, float], base_wer: tuple[float, float],
            aux_wer: tuple[float, float], weight: float = 1.0) -> pd.DataFrame:
    rows = []
    for w, sims, wers in ((0.0, base_a, base_wer), (weight, aux_a, aux_wer)):
        for seed, sim, wer in zip((1, 2), sims, wers):
            rows.append({"weight": w, "seed": seed, "wer": wer, "A": sim, "Q": 0.1, "K": 0.2, "V": 0.3, "Y": 0.4})
    return pd.DataFrame(rows)


def test_a_fall_of_half_with_wer_within_a_point_holds(hd):
    (v,) = hd.verdicts(results((0.8, 1.0), (0.3, 0.6), (30.0, 32.0), (31.5, 32.4)), "A")
    assert v.seeds == (1, 2)
    assert v.base_similarity == pytest.approx(0.9) and v.similarity == pytest.approx(0.45)
    assert v.fall == pytest.approx(0.5)
    assert v.wer_change == pytest.approx(0.95)
    assert v.halved and v.wer_ok and v.holds
    assert "HOLDS" in v.sentence() and "NOT" not in v.sentence()


def test_too_small_a_fall_is_named(hd):
    (v,) = hd.verdicts(results((0.8, 1.0), (0.5, 0.5), (30.0, 32.0), (30.0, 32.0)), "A")
    assert not v.halved and v.wer_ok and not v.holds
    assert "did not fall by half" in v.sentence() and "WER is more" not in v.sentence()


def test_wer_more_than_a_point_worse_is_named(hd):
    (v,) = hd.verdicts(results((0.8, 1.0), (0.1, 0.1), (30.0, 32.0), (31.6, 32.5)), "A")
    assert v.halved and not v.wer_ok and not v.holds
    assert "WER is more than 1 point worse" in v.sentence() and "did not fall" not in v.sentence()


def test_both_failures_are_named_and_the_target_is_the_column_asked(hd):
    table = results((0.8, 1.0), (0.9, 1.2), (30.0, 32.0), (35.0, 36.0))
    (v,) = hd.verdicts(table, "A")
    assert v.fall < 0
    assert "did not fall by half and WER is more" in v.sentence()
    (y,) = hd.verdicts(table, "Y")  # Y is 0.4 everywhere: no fall
    assert y.representation == "Y" and y.fall == pytest.approx(0.0) and not y.halved


def test_one_verdict_per_weight_on_shared_seeds(hd):
    table = pd.concat([results((0.8, 1.0), (0.3, 0.6), (30.0, 32.0), (31.0, 33.0)),
                       pd.DataFrame([{"weight": 0.1, "seed": 2, "wer": 32.0, "A": 0.2, "Q": 0, "K": 0, "V": 0,
                                      "Y": 0}])])
    v01, v1 = hd.verdicts(table, "A")
    assert (v01.weight, v01.seeds, v01.base_similarity) == (0.1, (2,), 1.0)
    assert v1.weight == 1.0 and v1.seeds == (1, 2)


def test_a_verdict_needs_the_baseline_and_a_known_representation(hd):
    table = results((0.8, 1.0), (0.3, 0.6), (30.0, 32.0), (31.0, 33.0))
    with pytest.raises(ValueError, match="weight 0"):
        hd.verdicts(table[table.weight > 0], "A")
    with pytest.raises(ValueError, match="valid: A, Q, K, V, Y"):
        hd.verdicts(table, "Z")


def test_markdown_marks_the_target_and_adds_means(hd):
    md = hd.markdown_table(results((0.8, 1.0), (0.3, 0.6), (30.0, 32.0), (31.0, 33.0)), "A")
    lines = md.splitlines()
    assert lines[0].startswith("| lambda | seed | clean WER | A* | Q |")
    assert len(lines) == 2 + 6  # header, rule, 2 seeds + a mean per lambda
    assert "| 0 | **mean** | 31.00% | 0.9000 |" in md and "| 1 | **mean** | 32.00% | 0.4500 |" in md


def metrics(step: int, ms: int, seq: float) -> dict:
    return {"kind": "metrics", "step": step, "time": ms, "metrics": {"train/seq_len_s": seq, "train/loss": 1.0}}


def test_step_seconds_counts_only_consecutive_steps_at_full_context(hd):
    records = [{"kind": "params", "params": {}},
               metrics(1, 1000, 5.12), metrics(2, 1500, 5.12),  # warmup: not counted
               metrics(3, 4000, 20.48), metrics(4, 6000, 20.48), metrics(5, 9000, 20.48),
               metrics(7, 30000, 20.48),  # step 6 missing: no gap for 7
               {"kind": "metrics", "step": 5, "time": 99999, "metrics": {"heads/test/A/sum": 1.0}}]
    median, n = hd.step_seconds(records, 20.48)
    assert n == 2 and median == pytest.approx(2.5)  # steps 4 (2 s) and 5 (3 s)
    assert math.isnan(hd.step_seconds(records[:3], 20.48)[0])


def test_clean_wer_and_summed_similarity_read_the_commands_files(hd, tmp_path):
    csv = tmp_path / "test.csv"
    pd.DataFrame([
        {"dataset": "test", "condition": "clean", "recording": "0001", "ref_words": 100, "substitutions": 5,
         "deletions": 3, "insertions": 2},
        {"dataset": "test", "condition": "clean", "recording": "0002", "ref_words": 100, "substitutions": 10,
         "deletions": 0, "insertions": 0},
        {"dataset": "test", "condition": "snr10", "recording": "0001", "ref_words": 100, "substitutions": 90,
         "deletions": 0, "insertions": 0},
    ]).to_csv(csv, index=False)
    assert hd.clean_wer(csv) == pytest.approx(10.0)
    npz = tmp_path / "test.npz"
    np.savez(npz, **{f"diversity_{r}": np.array([0.25, 0.5]) * (i + 1) for i, r in enumerate("AQKVY")})
    assert hd.summed_similarity(npz) == pytest.approx({"A": 0.75, "Q": 1.5, "K": 2.25, "V": 3.0, "Y": 3.75})


def test_sweep_rows_mark_missing_heads_as_nan(hd, tmp_path):
    trial = tmp_path / "trials" / "abc"
    (trial / "heads").mkdir(parents=True)
    (trial / "config.json").write_text(json.dumps({"data": {"context_s": 5.12}, "train": {"seed": 1}}))
    other = tmp_path / "trials" / "def"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"data": {"context_s": 81.92}, "train": {"seed": 2}}))
    np.savez(trial / "heads" / "test.npz", **{f"diversity_{r}": np.array([0.1, 0.2]) for r in "AQKVY"})
    rows = hd.sweep_rows(tmp_path, None)
    assert list(rows.context_s) == [5.12, 81.92]
    assert rows.A.iloc[0] == pytest.approx(0.3) and math.isnan(rows.A.iloc[1]) and rows.wer.isna().all()
    assert "| 5.12 s | **mean** |" in hd.sweep_markdown(rows)
