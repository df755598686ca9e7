"""The recall control in the report (analysis.features.recall): slot accuracy by band, distance bin and context with the
ceiling and guess-rate controls, the far-band tests between context lengths (Holm), the verdict line, recall.csv,
and no such part without the plant.

The sweep is small and hand-made: one family, contexts 10.24 and 81.92 s, two seeds, two datasets of 12 recordings.
Ten recordings have a key sentence and five slots each: masked near slots at 2 and 3.5 s, masked far slots at 25 and
45 s, and an unmasked far slot; two have no key sentence and two masked slots each. On ``rec`` the long context
recalls the far slots (19 of 20 against 2 of 20); on ``flat`` both recall the same 2 of 20.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.features import recall as rc
from analysis.ledger.collect import build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report
from asr_core.contract.metrics import SLOT_COLUMNS

CONTEXTS = (10.24, 81.92)
SEEDS = (1, 2)
KEYED, NO_KEY = 10, 2
WORDS = 100
HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer"
SLOTS = (("near", "masked", 2.0), ("near", "masked", 3.5), ("far", "masked", 25.0), ("far", "masked", 45.0),
         ("far", "unmasked", 30.0))


def correct(ds: str, ctx: float, seed: int, rec: int, k: int) -> int:
    """Whether slot ``k`` of recording ``rec`` is recalled (see the module docstring)."""
    if rec >= KEYED:  # no key: the short context guesses one of four right, the long none
        return int(ctx < 20 and rec == KEYED and k == 0)
    band, kind, _ = SLOTS[k]
    if kind == "unmasked":
        return 1
    if band == "near":
        return int(not (seed == 2 and rec == 0 and k == 0))  # one miss: seeds differ
    if rec == 0:  # recalled at every context
        return 1
    return int(ds == "rec" and ctx > 20 and not (rec == 9 and k == 3))


def slot_table(ds: str, ctx: float, seed: int, window: bool = False) -> str:
    """The moving-window rows as a table written before the ``scoring`` column (nine columns and the rest empty);
    with ``window``, single-window rows too, where every keyed far slot of the long context is recalled."""
    lines = [",".join(SLOT_COLUMNS)]
    for scoring in ("", "window") if window else ("",):
        for rec in range(KEYED + NO_KEY):
            slots = SLOTS if rec < KEYED else (("near", "no-key", math.nan),) * 2
            for k, (band, kind, d) in enumerate(slots):
                ok = correct(ds, ctx, seed, rec, k)
                if scoring and band == "far" and rec < KEYED and ctx > 20:
                    ok = 1
                hyp = "zebra" if ok else ("" if k == 3 else "walrus")  # a deletion leaves the cell empty
                lines.append(f"rec{rec:02d},clean,,rec{rec:02d}/{k},zebra,{band},{kind},{'' if d != d else d},{hyp},"
                             f"{ok}" + (f",{scoring}" if scoring else ""))
    return "\n".join(lines) + "\n"


def records(slots: bool = True, cue: bool = False, window: bool = False) -> list[RunRecord]:
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    for ctx in CONTEXTS:
        for seed in SEEDS:
            label = f"ctx{ctx:.0f}s-2L96d4h-s{seed}"
            tags = {"sweep.role": "trial", "trial.label": label, "trial.seed": str(seed), "trial.subgrids": "context",
                    "mlflow.parentRunId": "parent"}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2"}
            metrics, tables = {}, {}
            for ds in ("rec", "flat"):
                head = HEAD + (",cue_words,cue_errors" if cue else "")
                rows = [f"{ds},clean,,rec{i:02d},{WORDS},8,1,1,{WORDS},10" + (",4,1" if cue else "")
                        for i in range(KEYED + NO_KEY)]
                tables[ds] = "\n".join([head, *rows]) + "\n"
                metrics[f"wer/{ds}"] = 10.0
                if slots:
                    tables[f"{ds}.slots"] = slot_table(ds, ctx, seed, window)
                if cue:
                    metrics[f"cue/{ds}"] = 25.0
            out.append(RunRecord(f"r{ctx:.0f}-{seed}", "FINISHED", tags, params, metrics, tables))
    return out


@pytest.fixture(scope="module")
def sweep():
    return build_sweep("recall", records())


def _acc(rates: pd.DataFrame, ds: str, ctx: float, group: str) -> pd.Series:
    return rates[(rates["dataset"] == ds) & np.isclose(rates["context_s"], ctx) & (rates["group"] == group)].iloc[0]


def test_distance_bins() -> None:
    assert [rc.distance_bin(d) for d in (1.0, 4.0, 4.9, 5.0, 10.0, 19.9, 20.0, 40.0, 60.0)] == [
        "1-4 s", "1-4 s", "1-4 s", "5-10 s", "10-20 s", "10-20 s", "20-40 s", "40-60 s", "40-60 s"]
    assert rc.distance_bin(math.nan) == ""


def test_slots_are_collected_with_the_trial_columns(sweep) -> None:
    s = sweep.slots
    assert len(s) == 2 * 2 * 2 * (KEYED * len(SLOTS) + NO_KEY * 2) and set(s["decoder"]) == {"greedy"}
    assert set(s["dataset"]) == {"rec", "flat"} and set(s["condition"]) == {"clean"}
    assert {"config", "context_s", "seed", "series_id", "families"} <= set(s.columns)
    missed = s[(s["correct"] == 0) & s["slot"].str.endswith("/3")]
    assert (missed["hyp"] == "").all() and len(missed) and s["hyp"].map(type).eq(str).all()
    assert s[s["kind"] == "no-key"]["distance_s"].isna().all()
    assert not rc.has_slots(build_sweep("recall", records(slots=False)))


def test_accuracies_by_band_bin_and_control(sweep) -> None:
    rates = rc.rate_table(sweep)
    assert set(rates["group"]) == set(rc.GROUPS) - {"5-10 s", "10-20 s"}  # no slot lies there
    near = _acc(rates, "rec", 10.24, "near")
    assert near["accuracy"] == pytest.approx(97.5) and near["accuracy_sd"] == pytest.approx(np.std([100, 95], ddof=1))
    assert (near["accuracy_min"], near["accuracy_max"], near["n_slots"], near["n_seeds"]) == (95, 100, 20, 2)
    assert _acc(rates, "rec", 81.92, "1-4 s")["accuracy"] == pytest.approx(97.5)
    assert _acc(rates, "rec", 10.24, "far")["accuracy"] == pytest.approx(10.0)
    assert _acc(rates, "rec", 81.92, "far")["accuracy"] == pytest.approx(95.0)
    assert _acc(rates, "rec", 81.92, "far")["accuracy_sd"] == 0
    assert _acc(rates, "rec", 81.92, "20-40 s")["accuracy"] == pytest.approx(100.0)
    assert _acc(rates, "rec", 81.92, "40-60 s")["accuracy"] == pytest.approx(90.0)
    assert _acc(rates, "rec", 10.24, "40-60 s")["accuracy"] == pytest.approx(10.0)
    assert _acc(rates, "flat", 81.92, "far")["accuracy"] == pytest.approx(10.0)
    for ctx in CONTEXTS:  # the controls: unmasked slots are all recalled; the guess rate
        assert _acc(rates, "rec", ctx, "unmasked")["accuracy"] == 100 and _acc(rates, "rec", ctx, "unmasked")[
            "n_slots"] == KEYED
    assert _acc(rates, "rec", 10.24, "no-key")["accuracy"] == pytest.approx(25.0)
    assert _acc(rates, "rec", 81.92, "no-key")["accuracy"] == 0 and _acc(rates, "rec", 81.92, "no-key")[
        "n_recordings"] == NO_KEY


def test_far_band_tests_are_paired_by_recording_and_holm_corrected(sweep) -> None:
    tests = rc.far_tests(sweep)
    assert len(tests) == 2 and set(tests["dataset"]) == {"rec", "flat"}
    rec = tests[tests["dataset"] == "rec"].iloc[0]
    flat = tests[tests["dataset"] == "flat"].iloc[0]
    # rec: nine recordings recall more far slots at 82 s (eight by 2 of 2, one by 1 of 2), rec00 the same
    assert rec["n_recordings"] == KEYED and rec["p"] == pytest.approx(2 / 2 ** 9)
    assert flat["p"] == pytest.approx(1.0)
    assert rec["p_holm"] == pytest.approx(2 * 2 / 2 ** 9) and flat["p_holm"] == pytest.approx(1.0)
    assert (rec["far_shortest"], rec["far"]) == pytest.approx((10.0, 95.0))
    assert rec["shortest_context_s"] == 10.24 and rec["context_s"] == 81.92 and rec["note"] == ""


def test_verdict_lines(sweep) -> None:
    rates = rc.rate_table(sweep)
    lines = rc.verdicts(rates, rc.far_tests(sweep, rates), 0.05)
    assert len(lines) == 2
    rec = next(x for x in lines if ", rec, " in x)
    flat = next(x for x in lines if ", flat, " in x)
    assert "10.24 s → 81.92 s: **yes: the longer context recalls far slots significantly better**" in rec
    assert f"far-band accuracy 10.0% → 95.0% (Holm p = {4 / 512:.3f}, 10 recordings, α = 0.05)" in rec
    assert "near band (2-3.5 s) 97.5% → 97.5%; ceiling (unmasked) 100.0% → 100.0%; guess rate (no key) 25.0% → 0.0%" \
        in rec
    assert "**no: no significant difference in far-slot recall from longer context**" in flat
    assert "far-band accuracy 10.0% → 10.0% (Holm p = 1.000" in flat


def test_report_part_and_csvs(tmp_path: Path) -> None:
    rep = build_report(build_sweep("recall", records()), tmp_path, bootstrap_resamples=200)
    md = rep.markdown.read_text()
    assert "## Recall control (positive control)" in md and "Planted cue" not in md
    part = md.split("## Recall control (positive control)")[1].split("\n## ")[0]
    assert "**Recall control.**" in part and "**yes: the longer context recalls far slots significantly better**" \
        in part
    for row in ("near band (2-3.5 s)", "far band (25-45 s)", "distance 1-4 s", "distance 20-40 s", "distance 40-60 s",
                "ceiling (unmasked)", "guess rate (no key)"):
        assert f"| {row} " in part, row
    assert "97.5 ± 3.5 (n=20, 2 seeds)" in part
    assert pd.read_csv(rep.csvs["recall"]).shape[0] == 2 * 2 * 7 and rep.csvs["recall"] == tmp_path / "recall.csv"
    assert pd.read_csv(rep.csvs["recall_tests"]).shape[0] == 2
    assert "Recall control" in rep.html.read_text()


def test_the_recall_part_joins_the_planted_cue_section(tmp_path: Path) -> None:
    rep = build_report(build_sweep("recall", records(cue=True)), tmp_path, bootstrap_resamples=200)
    md = rep.markdown.read_text()
    assert "## Planted cue (positive control)" in md and "\n## Recall control" not in md
    section = md.split("## Planted cue (positive control)")[1].split("\n## ")[0]
    assert "**Recall control.**" in section and "recalls far slots significantly better" in section


def test_no_plant_no_part(tmp_path: Path) -> None:
    texts = []
    for slots, out in ((False, tmp_path / "plain"), (False, tmp_path / "again")):
        rep = build_report(build_sweep("recall", records(slots=slots)), out, bootstrap_resamples=200)
        md = rep.markdown.read_text()
        assert "Recall control" not in md and "recall" not in rep.csvs and not (out / "recall.csv").exists()
        texts.append(md)
    assert texts[0] == texts[1]


def test_single_window_rows_are_reported_as_their_own_condition(tmp_path: Path) -> None:
    """The single-window rows (scoring ``window``) get their own tables, tests and verdicts, beside the moving-window
    ones (rows of a table written before the column), which stay as they were."""
    sw = build_sweep("recall", records(window=True))
    assert set(rc.slot_rows(sw)["condition"]) == {"clean", "clean, one window per slot"}
    rates = rc.rate_table(sw)
    one = rates[rates["condition"] == "clean, one window per slot"]
    assert _acc(one, "flat", 81.92, "far")["accuracy"] == 100.0 and _acc(one, "flat", 10.24, "far")["accuracy"] == 10.0
    plain = rates[rates["condition"] == "clean"]
    pd.testing.assert_frame_equal(plain.reset_index(drop=True), rc.rate_table(build_sweep("recall", records())))
    lines = rc.verdicts(rates, rc.far_tests(sw, rates), 0.05)
    flat_one = next(x for x in lines if ", flat (clean, one window per slot)" in x)
    assert "**yes: the longer context recalls far slots significantly better**" in flat_one
    assert "**no: no significant difference" in next(x for x in lines if ", flat, " in x)
    md = build_report(sw, tmp_path, bootstrap_resamples=200).markdown.read_text()
    assert "Family context, flat, clean, one window per slot: recall slot accuracy" in md
