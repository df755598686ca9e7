"""The tail-word part of the report (analysis.features.tail): pooled tail-WERs beside WER, the tests of each context against
the baseline context with Holm's correction, the verdict lines, tail.csv and tail_tests.csv, and no part (the same
report, byte for byte) without tail counts.

The sweep is small and hand-made: one family, contexts 5.12 / 10.24 (the baseline) / 81.92 s, two seeds, two datasets
of 12 recordings (100 words each, 5 of them tail words; rec11 has none). On ``books`` the long context makes fewer
tail errors than the baseline on every recording with tail words (1 against 3); on ``flat`` the tail errors move
between recordings and their total stays the same. Seed 2 has one more tail error on rec0 at every context. The other
words have the same errors at every context.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.significance import stats
from analysis.features import tail as tl
from analysis.ledger.collect import Sweep, build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report
from asr_core.contract.metrics import TAIL_COLUMNS

CONTEXTS = (5.12, 10.24, 81.92)
BASELINE = 10.24
SEEDS = (1, 2)
WORDS = 100
N_REC = 12
TAIL_WORDS = [5] * 11 + [0]  # rec11 has no tail word: left out of the test
# tail errors of seed 1; seed 2 has one more on rec0
TAIL_ERRORS = {
    "books": {5.12: [2, 4] * 5 + [3, 0], 10.24: [3] * 11 + [0], 81.92: [1] * 11 + [0]},
    "flat": {5.12: [4, 2] * 5 + [3, 0], 10.24: [3] * 11 + [0], 81.92: [2, 4] * 5 + [3, 0]},
}
OTHER_ERRORS = {1: 20, 2: 22}  # errors on the other words per recording (2 of them insertions), any context
HEAD = ("dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer,cue_words,"
        "cue_errors")


def tail_errors(ds: str, ctx: float, seed: int) -> np.ndarray:
    e = np.array(TAIL_ERRORS[ds][ctx], dtype=float)
    if seed == 2:
        e[0] += 1
    return e


def _table(ds: str, ctx: float, seed: int, tail: str) -> tuple[str, float]:
    """eval/<ds>.csv as the evaluation writes it; ``tail``: "counts", "empty" (the columns, no values) or "none"
    (no columns: an evaluation given no tail set)."""
    lines = [HEAD + ("" if tail == "none" else ",tail_words,tail_errors")]
    errs = tail_errors(ds, ctx, seed) + OTHER_ERRORS[seed]
    for i, (e, tw, te) in enumerate(zip(errs, TAIL_WORDS, tail_errors(ds, ctx, seed))):
        row = f"{ds},clean,,rec{i:02d},{WORDS},{e - 2:g},0,2,{WORDS + 2},{e:g},,"
        lines.append(row + {"counts": f",{tw},{te:g}", "empty": ",,", "none": ""}[tail])
    return "\n".join(lines) + "\n", 100.0 * float(errs.sum()) / (WORDS * N_REC)


def records(tail: str = "counts") -> list[RunRecord]:
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    for ctx in CONTEXTS:
        for seed in SEEDS:
            label = f"ctx{ctx:.0f}s-rope1.5M-2L96d4h-s{seed}"
            tags = {"sweep.role": "trial", "trial.label": label, "trial.seed": str(seed), "trial.subgrids": "context",
                    "mlflow.parentRunId": "parent"}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2"}
            metrics, tables = {}, {}
            for ds in TAIL_ERRORS:
                tables[ds], metrics[f"wer/{ds}"] = _table(ds, ctx, seed, tail)
                if tail == "counts":
                    metrics[f"tail/{ds}"] = 100.0 * tail_errors(ds, ctx, seed).sum() / sum(TAIL_WORDS)
            out.append(RunRecord(f"r{ctx:.0f}-{seed}", "FINISHED", tags, params, metrics, tables))
    return out


@pytest.fixture(scope="module")
def sweep() -> Sweep:
    return build_sweep("tail", records())


@pytest.fixture(scope="module")
def rates(sweep: Sweep) -> pd.DataFrame:
    return tl.rate_table(sweep)


@pytest.fixture(scope="module")
def tests(sweep: Sweep, rates: pd.DataFrame) -> pd.DataFrame:
    return tl.tail_tests(sweep, rates, BASELINE)


def _row(table: pd.DataFrame, ds: str, ctx: float) -> pd.Series:
    return table[(table["dataset"] == ds) & np.isclose(table["context_s"], ctx)].iloc[0]


def test_collect_keeps_tail_counts(sweep: Sweep) -> None:
    rec = sweep.recordings
    assert set(TAIL_COLUMNS) <= set(rec.columns)
    r = rec[(rec["dataset"] == "books") & (rec["recording"] == "rec00") & (rec["seed"] == 2)
            & np.isclose(rec["context_s"], 81.92)].iloc[0]
    assert (r["tail_words"], r["tail_errors"]) == (5.0, 2.0)
    for tail in ("none", "empty"):
        other = build_sweep("tail", records(tail)).recordings
        assert other["tail_words"].isna().all() and other["tail_errors"].isna().all()
        assert not tl.has_tail(build_sweep("tail", records(tail)))
    assert tl.has_tail(sweep)


def test_pooled_rates_and_seed_spread(rates: pd.DataFrame) -> None:
    """Per seed all tail errors over all tail words, then mean / sd / min / max over seeds; WER beside it."""
    assert set(rates["dataset"]) == set(TAIL_ERRORS) and len(rates) == 6
    words = sum(TAIL_WORDS)
    for ds in TAIL_ERRORS:
        for ctx in CONTEXTS:
            r = _row(rates, ds, ctx)
            per_seed = [100.0 * tail_errors(ds, ctx, s).sum() / words for s in SEEDS]
            assert r["tail_wer"] == pytest.approx(np.mean(per_seed))
            assert r["tail_wer_sd"] == pytest.approx(np.std(per_seed, ddof=1))
            assert (r["tail_wer_min"], r["tail_wer_max"]) == pytest.approx((min(per_seed), max(per_seed)))
            wer = [100.0 * (tail_errors(ds, ctx, s).sum() + OTHER_ERRORS[s] * N_REC) / (WORDS * N_REC) for s in SEEDS]
            assert r["wer"] == pytest.approx(np.mean(wer))
            assert r["wer_sd"] == pytest.approx(np.std(wer, ddof=1))
            assert r["tail_words"] == words and r["n_seeds"] == 2 and r["n_recordings"] == N_REC
            assert r["n_tail_recordings"] == 11 and r["tail_share"] == pytest.approx(100.0 * words / (WORDS * N_REC))
    # books: 33 (34 with seed 2) tail errors of 55 at the baseline, 11 (12) at 82 s
    assert _row(rates, "books", 10.24)["tail_wer"] == pytest.approx(100.0 * 33.5 / 55)
    assert _row(rates, "books", 81.92)["tail_wer"] == pytest.approx(100.0 * 11.5 / 55)
    assert rates[rates["dataset"] == "flat"]["tail_wer"].nunique() == 1


def _expected_p(ds: str, ctx: float) -> float:
    """The project's permutation test on per-recording tail-WERs of ``ctx`` against the baseline."""
    mean = {c: np.mean([tail_errors(ds, c, s) for s in SEEDS], axis=0) for c in (BASELINE, ctx)}
    words = np.array(TAIL_WORDS, dtype=float)
    has = words > 0
    return stats.sign_flip_test((mean[ctx][has] - mean[BASELINE][has]) / words[has]).pvalue


def test_tests_against_the_baseline_with_holm(tests: pd.DataFrame) -> None:
    """Two comparisons per dataset (5 s and 82 s against 10 s), Holm-corrected over the four; the baseline row is
    not tested against itself."""
    assert len(tests) == 4 and not (np.isclose(tests["context_s"], BASELINE)).any()
    assert (tests["baseline_context_s"] == BASELINE).all() and (tests["note"] == "").all()
    assert (tests["n_recordings"] == 11).all()
    # the long context is better on each of the 11 recordings with tail words: exact p = 2 / 2^11
    assert _row(tests, "books", 81.92)["p"] == pytest.approx(2 / 2 ** 11)
    assert _row(tests, "flat", 81.92)["p"] == pytest.approx(1.0)
    keys = [(ds, c) for ds in TAIL_ERRORS for c in (5.12, 81.92)]
    raw = {k: _expected_p(*k) for k in keys}
    holm = dict(zip(keys, stats.holm([raw[k] for k in keys])))
    for ds, ctx in keys:
        r = _row(tests, ds, ctx)
        assert r["p"] == pytest.approx(raw[(ds, ctx)]) and r["p_holm"] == pytest.approx(holm[(ds, ctx)])
        assert r["delta_tail_wer"] == pytest.approx(r["tail_wer"] - r["tail_wer_baseline"])
    assert holm[("books", 81.92)] == pytest.approx(4 * 2 / 2 ** 11) and holm[("books", 81.92)] < 0.05


def test_verdicts(rates: pd.DataFrame, tests: pd.DataFrame) -> None:
    lines = {ds: next(x for x in tl.verdicts(rates, tests, 0.05, BASELINE) if f", {ds}, " in x) for ds in TAIL_ERRORS}
    base, long = 100.0 * 33.5 / 55, 100.0 * 11.5 / 55
    p = 4 * 2 / 2 ** 11
    assert "10.24 s → 81.92 s: **longer context lowered the tail-word error rate significantly** (11 recordings with " \
        "tail words, α = 0.05)" in lines["books"]
    assert f"Tail-WER {base:.1f}% → {long:.1f}% (fell; Holm p = {p:.3f}, significant)" in lines["books"]
    assert f"Other contexts against 10.24 s: 5.12 s {base:.1f}% (Holm p = 1.000, not significant)." in lines["books"]
    assert "**no significant change in the tail-word error rate from longer context**" in lines["flat"]
    assert f"Tail-WER {base:.1f}% → {base:.1f}% (did not change; Holm p = 1.000, not significant)" in lines["flat"]


def test_no_baseline_in_the_series_is_said(sweep: Sweep) -> None:
    rates = tl.rate_table(sweep)
    tests = tl.tail_tests(sweep, rates, 20.48)
    assert len(tests) == 6 and tests["p"].isna().all()
    assert tests["note"].str.contains("no model at the baseline context 20.48 s").all()
    assert all("**not tested** — no model at the baseline context 20.48 s" in x
               for x in tl.verdicts(rates, tests, 0.05, 20.48))


def test_report_section_and_csvs(tmp_path: Path) -> None:
    rep = build_report(build_sweep("tail", records()), tmp_path, bootstrap_resamples=200)
    md = rep.markdown.read_text()
    titles = [x for x in md.splitlines() if x.startswith("## ")]
    assert titles[titles.index("## WER and WERR") + 1] == "## Tail words (paper 002)"
    section = md.split("## Tail words (paper 002)")[1].split("\n## ")[0]
    assert "Tail words are the rarest word types" in section and "the tail set named by eval.tail" in section
    assert "**longer context lowered the tail-word error rate significantly**" in section
    assert "Tail words (paper 002)" in rep.html.read_text()
    assert rep.csvs["tail"] == tmp_path / "tail.csv" and rep.csvs["tail_tests"] == tmp_path / "tail_tests.csv"
    rates, tests = pd.read_csv(rep.csvs["tail"]), pd.read_csv(rep.csvs["tail_tests"])
    assert list(rates.columns) == tl.RATE_COLUMNS and len(rates) == 6
    assert list(tests.columns) == tl.TEST_COLUMNS and len(tests) == 4
    assert _row(rates, "books", 81.92)["tail_wer"] == pytest.approx(100.0 * 11.5 / 55)
    assert _row(tests, "books", 81.92)["p_holm"] == pytest.approx(4 * 2 / 2 ** 11)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_no_tail_counts_no_part_and_the_same_report(tmp_path: Path) -> None:
    """Tables without the columns, or with them empty, give no part, no tail CSVs, and byte for byte the report of
    the same sweep without the tail columns at all (as it was read before they were collected)."""
    folders = {}
    for tail in ("none", "empty"):
        out = tmp_path / tail
        sweep = build_sweep("tail", records(tail))
        rep = build_report(sweep, out, bootstrap_resamples=200)
        assert "Tail words" not in rep.markdown.read_text() and not {"tail", "tail_tests"} & set(rep.csvs)
        assert not (out / "tail.csv").exists() and not (out / "tail_tests.csv").exists()
        folders[tail] = _files(out)
    bare = build_sweep("tail", records("none"))
    bare = replace(bare, recordings=bare.recordings.drop(columns=list(TAIL_COLUMNS)))
    build_report(bare, tmp_path / "bare", bootstrap_resamples=200)
    assert folders["none"] == folders["empty"] == _files(tmp_path / "bare")
