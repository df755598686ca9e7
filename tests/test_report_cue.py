"""The planted cue's section of the report (analysis.features.cue): pooled cue-word error rates, the tests against the shortest
and the baseline context with Holm's correction, the verdict lines, cue.csv, and no section without planted words.

The sweep is small and hand-made: one family, contexts 5.12 / 10.24 / 81.92 s, two seeds, two datasets of 12
recordings (100 words each). On ``cued`` the planted words' errors fall with context on most recordings; on ``flat``
they move between recordings and their total stays the same. The words that are not planted have the same errors at
every context, so WER on them does not change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.significance import stats
from analysis.__main__ import main
from analysis.ledger.collect import build_sweep
from analysis.features.cue import cue_table
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402

CONTEXTS = (5.12, 10.24, 81.92)
SEEDS = (1, 2)
WORDS = 100
N_REC = 12
CUE_WORDS = {"cued": [10] * 11 + [0], "flat": [10] * 12}  # cued rec11 has no planted word: left out of the cue test
# cue errors of seed 1; seed 2 has one more on rec0
CUE_ERRORS = {
    "cued": {5.12: [6] * 10 + [5, 0], 10.24: [4] * 10 + [5, 0], 81.92: [1] * 9 + [7, 5, 0]},
    "flat": {5.12: [5] * 12, 10.24: [4, 6] * 6, 81.92: [6, 4] * 6},
}
OTHER_ERRORS = {1: 20, 2: 22}  # errors on the other words per recording (2 of them insertions), any context
HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer"


def cue_errors(ds: str, ctx: float, seed: int) -> np.ndarray:
    e = np.array(CUE_ERRORS[ds][ctx], dtype=float)
    if seed == 2:
        e[0] += 1
    return e


def _table(ds: str, ctx: float, seed: int, cue: str) -> tuple[str, float]:
    """eval/<ds>.csv as asr_core.evaluation.evaluate writes it; ``cue``: "counts", "empty" (the columns, no values) or "none"
    (no columns)."""
    lines = [HEAD + ("" if cue == "none" else ",cue_words,cue_errors")]
    errs = cue_errors(ds, ctx, seed) + OTHER_ERRORS[seed]
    for i, (e, cw, ce) in enumerate(zip(errs, CUE_WORDS[ds], cue_errors(ds, ctx, seed))):
        row = f"{ds},clean,,rec{i:02d},{WORDS},{e - 2:g},0,2,{WORDS + 2},{e:g}"
        lines.append(row + {"counts": f",{cw},{ce:g}", "empty": ",,", "none": ""}[cue])
    return "\n".join(lines) + "\n", 100.0 * float(errs.sum()) / (WORDS * N_REC)


def records(cue: str = "counts") -> list[RunRecord]:
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    for ctx in CONTEXTS:
        for seed in SEEDS:
            label = f"ctx{ctx:.0f}s-rope1.5M-2L96d4h-s{seed}"
            tags = {"sweep.role": "trial", "trial.label": label, "trial.seed": str(seed), "trial.subgrids": "context",
                    "mlflow.parentRunId": "parent"}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2"}
            metrics, tables = {}, {}
            for ds in CUE_ERRORS:
                tables[ds], metrics[f"wer/{ds}"] = _table(ds, ctx, seed, cue)
                if cue == "counts":
                    metrics[f"cue/{ds}"] = 100.0 * cue_errors(ds, ctx, seed).sum() / sum(CUE_WORDS[ds])
            out.append(RunRecord(f"r{ctx:.0f}-{seed}", "FINISHED", tags, params, metrics, tables))
    return out


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return cue_table(build_sweep("cue", records()), 10.24)


def _row(table: pd.DataFrame, ds: str, ctx: float) -> pd.Series:
    return table[(table["dataset"] == ds) & np.isclose(table["context_s"], ctx)].iloc[0]


def test_pooled_rates_and_seed_spread(table: pd.DataFrame) -> None:
    """Per seed all cue errors over all cue words, then mean / min / max over seeds; WER on the other words is the
    errors less the cue errors over the words less the cue words."""
    assert set(table["dataset"]) == {"cued", "flat"} and len(table) == 6
    for ds in CUE_ERRORS:
        words = sum(CUE_WORDS[ds])
        for ctx in CONTEXTS:
            r = _row(table, ds, ctx)
            per_seed = [100.0 * cue_errors(ds, ctx, s).sum() / words for s in SEEDS]
            assert r["cue_rate"] == pytest.approx(np.mean(per_seed))
            assert (r["cue_rate_min"], r["cue_rate_max"]) == pytest.approx((min(per_seed), max(per_seed)))
            assert r["cue_rate_sd"] == pytest.approx(np.std(per_seed, ddof=1))
            assert r["cue_words"] == words and r["n_seeds"] == 2 and r["n_recordings"] == N_REC
            assert r["n_cue_recordings"] == sum(w > 0 for w in CUE_WORDS[ds])
            other = [100.0 * OTHER_ERRORS[s] * N_REC / (WORDS * N_REC - words) for s in SEEDS]
            assert r["noncue_wer"] == pytest.approx(np.mean(other))
            wer = [100.0 * (cue_errors(ds, ctx, s).sum() + OTHER_ERRORS[s] * N_REC) / (WORDS * N_REC) for s in SEEDS]
            assert r["wer"] == pytest.approx(np.mean(wer))
    # the pooled rate falls with context on cued and stays on flat
    assert list(table[table["dataset"] == "cued"].sort_values("context_s")["cue_rate"]) == \
        pytest.approx([65.5 / 1.1, 45.5 / 1.1, 21.5 / 1.1])
    assert table[table["dataset"] == "flat"]["cue_rate"].nunique() == 1


def _expected_p(ds: str, a: float, b: float) -> dict[str, float]:
    """The project's permutation test on what the section is said to test, worked out from the arrays above."""
    mean = {c: np.mean([cue_errors(ds, c, s) for s in SEEDS], axis=0) for c in (a, b)}
    words = np.array(CUE_WORDS[ds], dtype=float)
    has = words > 0
    other = np.mean([OTHER_ERRORS[s] for s in SEEDS])
    return {"cue": stats.sign_flip_test((mean[b][has] - mean[a][has]) / words[has]).pvalue,
            "wer": stats.sign_flip_test((mean[b] + other) - (mean[a] + other)).pvalue,
            "noncue": stats.sign_flip_test(np.zeros(N_REC)).pvalue}


def test_holm_pvalues_are_the_projects(table: pd.DataFrame) -> None:
    """Three distinct pairs per dataset (5 vs 10 s is both 'against the shortest' and 'against the baseline'),
    Holm-corrected per measure over the six."""
    pairs = [(ds, a, b) for ds in CUE_ERRORS for a, b in ((5.12, 10.24), (5.12, 81.92), (10.24, 81.92))]
    raw = {p: _expected_p(*p) for p in pairs}
    holm = {m: dict(zip(pairs, stats.holm([raw[p][m] for p in pairs]))) for m in ("cue", "wer", "noncue")}
    assert holm["cue"][("cued", 5.12, 81.92)] < 0.05 and holm["cue"][("flat", 5.12, 81.92)] == 1.0
    for ds in CUE_ERRORS:
        links = {(81.92, "shortest"): (5.12, 81.92), (81.92, "baseline"): (10.24, 81.92),
                 (10.24, "shortest"): (5.12, 10.24), (5.12, "baseline"): (5.12, 10.24)}
        for (ctx, ref), (a, b) in links.items():
            r = _row(table, ds, ctx)
            assert r[f"{ref}_context_s"] == pytest.approx(a if ctx == b else b)
            for m in ("cue", "wer", "noncue"):
                assert r[f"{ref}_p_{m}"] == pytest.approx(raw[(ds, a, b)][m])
                assert r[f"{ref}_p_holm_{m}"] == pytest.approx(holm[m][(ds, a, b)])
        # a row is not tested against itself
        assert np.isnan(_row(table, ds, 5.12)["shortest_p_cue"]) and np.isnan(_row(table, ds, 10.24)["baseline_p_cue"])


def test_report_section_verdicts_and_csv(tmp_path: Path) -> None:
    rep = build_report(build_sweep("cue", records()), tmp_path, bootstrap_resamples=200)
    md = rep.markdown.read_text()
    assert "## Planted cue (positive control)" in md
    section = md.split("## Planted cue (positive control)")[1].split("\n## ")[0]
    lines = {ds: next(x for x in section.splitlines() if x.startswith("- Family context, ") and f", {ds}, " in x)
             for ds in CUE_ERRORS}
    p = stats.holm([_expected_p(*q)["cue"] for q in [(ds, a, b) for ds in CUE_ERRORS for a, b in
                                                      ((5.12, 10.24), (5.12, 81.92), (10.24, 81.92))]])
    assert "5.12 s → 81.92 s: **longer context lowered the cue-word error rate significantly**" in lines["cued"]
    assert f"Cue-word error rate {65.5 / 1.1:.1f}% → {21.5 / 1.1:.1f}% (fell; Holm p = {p[1]:.3f}, significant)" \
        in lines["cued"]
    other = 100.0 * np.mean(list(OTHER_ERRORS.values())) * N_REC / (WORDS * N_REC - 110)
    assert f"WER on the other words {other:.1f}% → {other:.1f}% (did not change; Holm p = 1.000, not significant)" \
        in lines["cued"]
    assert "**no significant change in the cue-word error rate from longer context**" in lines["flat"]
    flat = 100.0 * 60.5 / 120  # 60 cue errors of 120 at every context, 61 with seed 2
    assert f"Cue-word error rate {flat:.1f}% → {flat:.1f}% (did not change; Holm p = 1.000, not significant)" \
        in lines["flat"]
    csv = pd.read_csv(rep.csvs["cue"])
    assert rep.csvs["cue"] == tmp_path / "cue.csv"
    for col in ("family", "series", "dataset", "condition", "config", "context_s", "n_seeds", "cue_words",
                "cue_rate", "cue_rate_sd", "cue_rate_min", "cue_rate_max", "wer", "noncue_wer",
                "shortest_context_s", "shortest_p_cue", "shortest_p_holm_cue", "shortest_p_holm_wer",
                "shortest_p_holm_noncue", "baseline_context_s", "baseline_p_holm_cue", "baseline_note"):
        assert col in csv.columns, col
    assert len(csv) == 6
    fig = [f for f in rep.figures if f.key == "cue_vs_context_context"]
    assert len(fig) == 1 and fig[0].path.exists()
    assert "Planted cue (positive control)" in rep.html.read_text() and "cue_vs_context_context.png" in md


def test_no_planted_words_no_section(tmp_path: Path) -> None:
    """Tables without the columns, or with them empty: no section, no cue.csv, and the same report."""
    texts = []
    for cue in ("none", "empty"):
        out = tmp_path / cue
        rep = build_report(build_sweep("cue", records(cue)), out, bootstrap_resamples=200)
        md = rep.markdown.read_text()
        assert "Planted cue" not in md and "cue" not in rep.csvs and not (out / "cue.csv").exists()
        assert not list(out.glob("cue_*.png"))
        texts.append(md)
    assert texts[0] == texts[1]


@pytest.mark.slow
def test_cue_csv_goes_to_the_parent_run(tmp_path: Path) -> None:
    """Through a real MLflow store: the report read back from it has the section, and its files (cue.csv and the
    figure among them) are logged to the sweep's parent run."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = synth.write_to_mlflow(records(), uri, tmp_path / "artifacts", experiment="cue")
    out = tmp_path / "report"
    assert main(["report", "--experiment", "cue", "--tracking-uri", uri, "--out", str(out), "--bootstrap",
                 "200"]) == 0
    assert "## Planted cue (positive control)" in (out / "report.md").read_text()
    logged = {a.path for a in MlflowClient(uri).list_artifacts(ids["parent"], "report")}
    assert {"report/cue.csv", "report/cue_vs_context_context.png"} <= logged
