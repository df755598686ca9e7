"""Beam decoders, LM perplexity and head similarity in analysis: collect's decoder column, the Table 6 section, the
perplexity table, the head-similarity section; and a greedy-only sweep's report as it always was.

The sweeps are small and hand-made, so every number the report states is worked out here from the tables written.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.ledger import collect as col
from analysis.__main__ import main
from analysis.ledger.collect import build_sweep, greedy_rows
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report
from analysis.significance.werr import wer_table
from asr_core.contract.metrics import GREEDY, decoder_tag

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402

CSV_HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer\n"
WORDS = 100  # reference words of every recording
N_REC = 8
LM_RUN = "lmrun0001"

# errors per recording (8 recordings of 100 words), per context, decoder and seed. Hand-worked:
# 81.92 s: greedy 10.0% / 12.0% (mean 11.0); LM 1024: 8.0% / 9.0% (8.5, WERR 22.727%; every recording 2.5 errors
#   fewer on average: exact permutation p = 2 / 2^8); LM 64: 73 and 82 errors (9.125% / 10.25%, mean 9.6875, WERR
#   11.93%; 7 recordings 1.5 fewer, one tied: p = 2 / 2^7).
# 5.12 s: greedy 15.0% both seeds; LM 1024 as many errors, moved between recordings (+1/-1: p = 1); LM 64 the same
#   errors as greedy (p = 1).
# Holm over the four p-values (1/128, 1/64, 1, 1): 4/128 = 0.03125, max(0.03125, 3/64) = 0.046875, 1, 1.
ERRORS = {
    (81.92, GREEDY): {1: [10] * 8, 2: [12] * 8},
    (81.92, "beam-lm1024"): {1: [8] * 8, 2: [9] * 8},
    (81.92, "beam-lm64"): {1: [9] * 7 + [10], 2: [10] * 7 + [12]},
    (5.12, GREEDY): {1: [15] * 8, 2: [15] * 8},
    (5.12, "beam-lm1024"): {1: [14, 16, 14, 16, 15, 15, 15, 15], 2: [14, 16, 14, 16, 15, 15, 15, 15]},
    (5.12, "beam-lm64"): {1: [15] * 8, 2: [15] * 8},
}
LM_CONTEXT = {"beam-lm1024": 1024, "beam-lm64": 64}


def _table(errors: list[int]) -> tuple[str, float]:
    rows = [f"test,clean,,rec{i},{WORDS},{e},0,0,{WORDS},{100.0 * e / WORDS}" for i, e in enumerate(errors)]
    return CSV_HEAD + "\n".join(rows) + "\n", 100.0 * sum(errors) / (WORDS * len(errors))


def _tag(decoder: str, lm_run: str = LM_RUN) -> str:
    return json.dumps({"alpha": "0.5", "beam_width": "8", "beta": "1", "lm": "/runs/lm/checkpoint.pt",
                       "lm_context": str(LM_CONTEXT[decoder]), "lm_run": lm_run, "lm_step": "300"}, sort_keys=True)


def decoder_records(*, beams: bool = True, lm_run: str = LM_RUN) -> list[RunRecord]:
    """Two configurations (5.12 s and 81.92 s) x 2 seeds, greedy on ``test``; with ``beams`` also decoded by two
    LM decoders (metrics, tables, tags)."""
    out = []
    for ctx in (5.12, 81.92):
        for seed in (1, 2):
            label = f"ctx{ctx:.0f}s-rope1.5M-2L96d4h-s{seed}"
            tags = {"sweep.role": "trial", "trial.label": label, "trial.seed": str(seed), "trial.subgrids": "context"}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2"}
            text, wer = _table(ERRORS[(ctx, GREEDY)][seed])
            metrics, tables = {"wer/test": wer}, {"test": text}
            if beams:
                for dec in LM_CONTEXT:
                    text, wer = _table(ERRORS[(ctx, dec)][seed])
                    metrics[f"wer_{dec}/test"] = wer
                    tables[f"test.{dec}"] = text
                    tags[f"eval.decoder.{dec}"] = _tag(dec, lm_run)
            out.append(RunRecord(f"r{ctx:.0f}-{seed}", "FINISHED", tags, params, metrics, tables))
    return out


def lm_record(run_id: str = LM_RUN, name: str = "lm-tiny") -> RunRecord:
    return RunRecord(run_id, "FINISHED", {"lm.data_fingerprint": "f00d", "mlflow.runName": name}, {"lm.d_model": "64"},
                     {"lm_ppl/text/ctx64": 30.0, "lm_ppl/text/ctx256": 25.0, "lm_ppl/text/ctx1024": 22.0})


# ---- collect ---------------------------------------------------------------------------------------------------

def test_a_beam_decoders_tag_and_the_head_metrics_a_run_logs_are_read() -> None:
    """What asr_core logs for a beam decoder (its metric and tag) and for head similarity becomes rows of the sweep."""
    from asr_core.evaluation.decoders import beam_decoding
    from asr_core.probes.heads import HeadsSummary

    beam = beam_decoding("beam", name="beam-lm1024")
    # its tag is read into the decoder's settings: a beam search without an LM
    rec = RunRecord("r", "FINISHED", {"sweep.role": "trial", "trial.seed": "0", "trial.label": "x-s0",
                                      decoder_tag(beam.name): json.dumps(dict(beam.describe), sort_keys=True)},
                    {"data.context_s": "10.24"}, {"wer/test": 10.0, beam.metric_key("test"): 9.0})
    sw = build_sweep("t", [rec])
    row = sw.decoders.iloc[0]
    assert row["decoder"] == "beam-lm1024" and row["lm"] == "none" and row["lm_context"] == str(beam.config.lm_context)
    # head similarity metrics
    heads = HeadsSummary("test", 2, 8, 10.24, {}, {r: np.array([0.5, 0.25]) for r in "AQKVY"},
                         {r: np.array([0.1, 0.3]) for r in "AQKVY"}).metrics()
    rec = RunRecord("r", "FINISHED", rec.tags, rec.params, {"wer/test": 10.0, **heads})
    h = build_sweep("t", [rec]).heads
    assert len(h) == 5 * 4  # sum, similarity, two layers per representation; the window count is not a head metric
    part = h[h["representation"] == "A"]
    assert part.loc[part["statistic"] == "sum", "value"].item() == pytest.approx(0.75)
    assert part.loc[part["statistic"] == "similarity", "value"].item() == pytest.approx(0.2)
    assert sorted(part.loc[part["statistic"] == "layer", "layer"]) == [0, 1]


def test_decoder_column_keeps_greedy_apart() -> None:
    sw = build_sweep("t", [*decoder_records(), lm_record()])
    assert sw.problems.empty, sw.problems
    assert sorted(sw.wer["decoder"].unique()) == ["beam-lm1024", "beam-lm64", GREEDY]
    assert sw.beam_decoders == ["beam-lm1024", "beam-lm64"] and sw.datasets == ["test"]
    assert len(sw.wer) == 4 * 3 and len(sw.recordings) == 4 * 3 * N_REC
    g = greedy_rows(sw.wer)
    assert "decoder" not in g.columns and len(g) == 4
    beam = sw.wer[sw.wer["decoder"] == "beam-lm1024"].set_index("run_id")["wer"]
    assert beam["r82-1"] == pytest.approx(8.0) and beam["r82-2"] == pytest.approx(9.0)
    # what assumes one WER per configuration reads greedy only: the same as a sweep that never had beams
    plain = build_sweep("t", decoder_records(beams=False))
    cols = ["config", "dataset", "condition", "n_seeds", "wer_mean"]
    pd.testing.assert_frame_equal(wer_table(sw)[cols], wer_table(plain)[cols])
    assert wer_table(sw, "beam-lm1024").set_index("config")["wer_mean"]["ctx82s-rope1.5M-2L96d4h"] == \
        pytest.approx(8.5)
    # settings from the tags; the LM run is not a trial run and no problem
    settings = sw.decoders.set_index(["run_id", "decoder"])
    assert settings.loc[("r82-1", "beam-lm64"), "lm_context"] == "64"
    assert settings.loc[("r82-1", "beam-lm1024"), "lm_run"] == LM_RUN
    ppl = sw.lm_ppl.set_index("lm_context")["ppl"]
    assert ppl.to_dict() == {64: 30.0, 256: 25.0, 1024: 22.0}
    assert set(sw.trials["run_id"]) == {r.run_id for r in decoder_records()}


def test_decoder_table_and_tag_problems_are_named() -> None:
    recs = decoder_records()
    broken = recs[0]
    tags = {k: v for k, v in broken.tags.items() if k != "eval.decoder.beam-lm64"}
    tables = {k: v for k, v in broken.tables.items() if k != "test.beam-lm1024"}
    recs[0] = RunRecord(broken.run_id, broken.status, tags, broken.params, broken.metrics, tables)
    sw = build_sweep("t", recs)
    problems = " | ".join(sw.problems["problem"])
    assert "no tag eval.decoder.beam-lm64" in problems
    assert "no artifact eval/test.beam-lm1024.csv" in problems and "decoded by beam-lm1024" in problems
    # the run keeps its beam WER (from the metric) but adds no per-recording rows for that decoder
    assert len(sw.wer[sw.wer["decoder"] == "beam-lm1024"]) == 4
    assert len(sw.recordings[sw.recordings["decoder"] == "beam-lm1024"]) == 3 * N_REC
    # its comparison with greedy is tested on the seed that has both tables, and says so
    from analysis.features.decoders import decoder_table

    row = decoder_table(sw, bootstrap_resamples=100).set_index(["config", "decoder"]).loc[
        ("ctx5s-rope1.5M-2L96d4h", "beam-lm1024")]
    assert row["seeds"] == "1,2" and row["n_recordings"] == N_REC and math.isfinite(row["p_permutation"])
    assert "the test leaves out seeds [1], whose per-recording tables are missing" in row["note"]


# ---- the Table 6 section ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def decoder_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The report of the sweep with and without its beam decoders (and the LM run)."""
    base = tmp_path_factory.mktemp("decoders")
    with_beams, plain = base / "beams", base / "plain"
    build_report(build_sweep("t", [*decoder_records(), lm_record()]), with_beams, bootstrap_resamples=200,
                 baseline_context=5.12)
    build_report(build_sweep("t", decoder_records(beams=False)), plain, bootstrap_resamples=200,
                 baseline_context=5.12)
    return with_beams, plain


def test_table6_numbers_are_the_hand_worked_ones(decoder_report: tuple[Path, Path]) -> None:
    out, _ = decoder_report
    t = pd.read_csv(out / "decoders.csv").set_index(["config", "decoder"])
    long, short = "ctx82s-rope1.5M-2L96d4h", "ctx5s-rope1.5M-2L96d4h"
    r = t.loc[(long, "beam-lm1024")]
    assert r["wer_greedy"] == pytest.approx(11.0) and r["wer"] == pytest.approx(8.5)
    assert r["werr"] == pytest.approx(100 * 2.5 / 11) and r["n_recordings"] == N_REC and r["seeds"] == "1,2"
    assert r["p_permutation"] == pytest.approx(2 / 2 ** 8) and r["permutation"] == "exact"
    r64 = t.loc[(long, "beam-lm64")]
    assert r64["wer"] == pytest.approx((9.125 + 10.25) / 2) and r64["p_permutation"] == pytest.approx(2 / 2 ** 7)
    assert t.loc[(short, "beam-lm1024"), "werr"] == pytest.approx(0.0)
    assert t.loc[(short, "beam-lm1024"), "p_permutation"] == 1.0 and t.loc[(short, "beam-lm64"), "p_permutation"] == 1.0
    # Holm across the whole table: 4 x 1/128, then 3 x 1/64, then 1
    assert r["p_holm"] == pytest.approx(4 / 128) and r64["p_holm"] == pytest.approx(3 / 64)
    assert bool(r["significant"]) and bool(r64["significant"])
    assert not t.loc[(short, "beam-lm1024"), "significant"] and r["verdict"].startswith("significantly better")
    md = (out / "report.md").read_text()
    section = md[md.index("## Beam search and LM decoding against greedy"):md.index("## LM perplexity")]
    # Table 6's layout: rows the acoustic contexts, columns greedy then the LM contexts, shortest first
    assert "| context | config | greedy | LM 64 tok | LM 1024 tok |" in section
    assert f"| 81.92 s | {long} | 11.00 | 9.69 (+11.9%, sig.) | 8.50 (+22.7%, sig.) |" in section
    assert f"| 5.12 s | {short} | 15.00 | 15.00 (+0.0%, n.s.) | 15.00 (+0.0%, n.s.) |" in section
    assert "4 comparisons with greedy decoding, 4 tested: 2 significant after Holm correction (2 of them " \
           "better" in section
    assert "+0.0% with 5.12 s of acoustic context" in section and "+22.7% with 81.92 s" in section
    assert "gains more from the LM" in section


def test_perplexity_table_and_figure(decoder_report: tuple[Path, Path]) -> None:
    out, _ = decoder_report
    md = (out / "report.md").read_text()
    section = md[md.index("## LM perplexity against LM context"):]
    assert "| LM | run | dataset | decoders | ctx64 | ctx256 | ctx1024 |" in section
    assert "| lm-tiny | lmrun000 | text | LM 64 tok, LM 1024 tok | 30.0 | 25.0 | 22.0 |" in section
    assert "perplexity falls from 30.00 at 64 tokens of context to 22.00 at 1024 (-26.7%)" in section
    assert (out / "lm_ppl_vs_context.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(pd.read_csv(out / "lm_ppl.csv")["ppl"]) == [22.0, 25.0, 30.0]


def test_greedy_sections_do_not_change_with_beams(decoder_report: tuple[Path, Path]) -> None:
    """Adding beam decoders adds sections and files; everything the greedy report had stays as it was."""
    out, plain = decoder_report
    for name in ("wer.csv", "werr.csv", "significance.csv", "snr.csv", "finding.csv"):
        assert (out / name).read_text() == (plain / name).read_text(), name
    new = ("Beam search and LM decoding against greedy (paper 004 Table 6)",
           "LM perplexity against LM context (paper 004 Table 5)")

    def sections(path: Path) -> list[str]:
        return (path / "report.md").read_text().split("\n## ")

    kept = [s for s in sections(out) if not s.startswith(new)]
    assert kept == sections(plain)
    assert len(sections(out)) == len(sections(plain)) + 2
    assert not any((plain / f).exists() for f in ("decoders.csv", "decoder_settings.csv", "lm_ppl.csv",
                                                  "heads.csv", "lm_ppl_vs_context.png"))


def test_greedy_only_sweep_keeps_its_sections(tmp_path: Path) -> None:
    rep = build_report(build_sweep(synth.EXPERIMENT, synth.make_records()), tmp_path, bootstrap_resamples=200)
    titles = [ln[3:] for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("## ")]
    assert titles == ["Overview", "The paper's finding in this sweep", "Figures",
                      "Findings: each context length against the baseline", "Findings in numbers", "WER and WERR",
                      "Error types", "Noise robustness: WERR (%) from the baseline at each SNR", "Runs left out", "Methods"]
    assert sorted(rep.csvs) == ["errors", "external", "finding", "problems", "significance", "snr", "trials", "wer", "werr"]
    assert {f.key for f in rep.figures} == {"fig1_werr_vs_context_context", "fig2_werr_vs_snr_context",
                                            "fig3_wer_vs_context_posenc"}


@pytest.mark.slow
def test_report_through_mlflow_finds_the_lm_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Read back from MLflow: the LM run a decoder names is found in its own experiment; another LM run there only
    with --lm-experiment."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("asr_core_lm", artifact_location=(tmp_path / "lm").resolve().as_uri())
    ids = {}
    for rec in (lm_record("lm-a", "lm-used"), lm_record("lm-b", "lm-other")):  # as asr_core.lm.train logs them
        ids[rec.run_id] = client.create_run(exp, run_name=rec.tags["mlflow.runName"]).info.run_id
        client.set_tag(ids[rec.run_id], "lm.data_fingerprint", rec.tags["lm.data_fingerprint"])
        client.log_batch(ids[rec.run_id], metrics=[Metric(k, v, 0, 300) for k, v in rec.metrics.items()])
    synth.write_to_mlflow(decoder_records(lm_run=ids["lm-a"]), uri, tmp_path / "artifacts", experiment="sweep")
    out = tmp_path / "report"
    args = ["report", "--experiment", "sweep", "--tracking-uri", uri, "--out", str(out), "--no-log",
            "--bootstrap", "200", "--baseline-context", "5.12"]
    assert main([*args, "--lm-experiment", "asr_core_lm"]) == 0
    assert set(pd.read_csv(out / "lm_ppl.csv")["lm_name"]) == {"lm-used", "lm-other"}
    t = pd.read_csv(out / "decoders.csv")
    assert len(t) == 4 and t["p_permutation"].notna().all()
    assert set(pd.read_csv(out / "decoder_settings.csv")["lm_name"]) == {"lm-used"}
    # without the flag, only the LM its decoders name
    assert set(col.collect("sweep", uri, progress=False).lm_ppl["lm_name"]) == {"lm-used"}
    assert main([*args, "--lm-experiment", "nope"]) == 3
    assert "no LM experiment (--lm-experiment) named 'nope'" in capsys.readouterr().err


# ---- head similarity ---------------------------------------------------------------------------------------------

CONTEXTS = (10.24, 20.48, 40.96, 81.92, 163.84)
# per heads count: clean WER and summed A similarity at each context (seed 2 adds 0.2 to WER and 0.02 to the sum,
# so the means are these + 0.1 / + 0.01 and the ranks are these ranks).
# 8 heads: WER ranks 4,2,1,3,5 and similarity ranks 4,2,1,3,5: rho = +1, exact p = 2/5! = 1/60.
# 4 heads: WER ranks 5,4,3,2,1, similarity ranks 1,3,2,5,4: sum d^2 = 36, rho = 1 - 36/20 = -0.8; |rho| >= 0.8 for
#   16 of the 120 orderings (identity, 4 adjacent swaps, 3 pairs of disjoint adjacent swaps, and their reversals):
#   p = 16/120. Holm over the two: 2/60 (significant at 0.05) and max(2/60, 16/120) = 16/120.
HEADS = {8: ([12.0, 11.0, 10.5, 11.5, 13.0], [1.2, 0.9, 0.8, 1.0, 1.4]),
         4: ([14.0, 13.0, 12.0, 11.0, 10.0], [0.5, 0.7, 0.6, 0.9, 0.8])}


def head_records(*, with_heads: bool = True) -> list[RunRecord]:
    """A heads family (4 and 8 heads at five contexts) and a sizes family (two sizes at two contexts), two seeds,
    WER on ``test`` and, with ``with_heads``, the head metrics of every representation."""
    out = []
    grid = [("heads", 6, 96, h, c, HEADS[h][0][i], HEADS[h][1][i]) for h in HEADS for i, c in enumerate(CONTEXTS)]
    grid += [("sizes", layers, 96, 4, c, 15.0 - layers - c / 100, 0.3 + layers / 10) for layers in (2, 4)
             for c in CONTEXTS[:2]]
    for fam, layers, d, h, ctx, wer, sim in grid:
        for seed in (1, 2):
            label = f"ctx{ctx:.0f}s-rope1.5M-{layers}L{d}d{h}h-s{seed}"
            tags = {"sweep.role": "trial", "trial.label": label, "trial.seed": str(seed), "trial.subgrids": fam}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": str(layers),
                      "model.d_model": str(d), "model.heads": str(h)}
            metrics = {"wer/test": wer + 0.2 * (seed - 1)}
            if with_heads:
                for k, r in enumerate("AQKVY"):
                    metrics[f"heads/test/{r}/sum"] = sim + 0.02 * (seed - 1) + k
                    metrics[f"heads/test/{r}/similarity"] = 0.5
                    metrics[f"heads/test/{r}/layer0"] = sim / 2
                metrics["heads/test/windows"] = 4.0
            out.append(RunRecord(f"{fam}-{label}", "FINISHED", tags, params, metrics))
    return out


def test_head_similarity_section(tmp_path: Path) -> None:
    rep = build_report(build_sweep("h", head_records()), tmp_path, bootstrap_resamples=200)
    keys = {f.key for f in rep.figures}
    assert {"heads_A_vs_context_heads_test", "heads_A_vs_context_sizes_test"} <= keys
    track = pd.read_csv(tmp_path / "heads_tracking.csv").set_index("series")
    eight, four = track.loc["6L-8H"], track.loc["6L-4H"]  # the series as the sweep names them
    assert eight["rho"] == pytest.approx(1.0) and eight["p_permutation"] == pytest.approx(1 / 60)
    assert four["rho"] == pytest.approx(-0.8) and four["p_permutation"] == pytest.approx(16 / 120)
    assert eight["p_holm"] == pytest.approx(2 / 60) and four["p_holm"] == pytest.approx(16 / 120)
    assert bool(eight["degrades"]) and not bool(four["degrades"])
    assert eight["wer_best"] == pytest.approx(10.6) and eight["sum_longest"] == pytest.approx(1.41)
    table = pd.read_csv(tmp_path / "heads.csv")
    assert set(table["family"]) == {"heads", "sizes"} and set(table["representation"]) == set("AQKVY")
    row = table[(table["family"] == "heads") & (table["config"] == "ctx164s-rope1.5M-6L96d8h")
                & (table["representation"] == "Q")].iloc[0]
    assert row["sum_mean"] == pytest.approx(2.41) and row["wer_mean"] == pytest.approx(13.1) and row["n_seeds"] == 2
    md = (tmp_path / "report.md").read_text()
    section = md[md.index("## Head similarity (paper 003) against context length"):md.index("## Runs left out")]
    assert ("6L-8H on test (5 context lengths): summed A similarity rises with WER: Spearman ρ = +1.00 "
            "(strong") in section
    assert "similarity tracks WER here" in section
    assert "6L-4H on test (5 context lengths): summed A similarity falls as WER rises: Spearman ρ = -0.80" in section
    assert "not significant: no evidence that it tracks WER" in section
    assert "WER degrades at long context, 10.60% at 40.96 s → 13.10% at 163.84 s" in section
    assert "too few context lengths for a rank correlation (needs 4); no claim" in section  # the sizes family
    assert ("| 6L-8H | 163.84 s | ctx164s-rope1.5M-6L96d8h | 13.10 | 2 | 1.410 | 2.410 | 3.410 | 4.410 | 5.410 "
            "| 0.500 |") in section


def test_no_head_metrics_no_head_section(tmp_path: Path) -> None:
    rep = build_report(build_sweep("h", head_records(with_heads=False)), tmp_path, bootstrap_resamples=200)
    assert not any(f.key.startswith("heads_") for f in rep.figures)
    assert "heads" not in rep.csvs and not (tmp_path / "heads.csv").exists()
    assert "Head similarity" not in (tmp_path / "report.md").read_text()


def test_heads_repr_chooses_the_representation(tmp_path: Path) -> None:
    rep = build_report(build_sweep("h", head_records()), tmp_path, bootstrap_resamples=200,
                       heads_representation="Y")
    assert "heads_Y_vs_context_heads_test" in {f.key for f in rep.figures}
    with pytest.raises(ValueError, match="heads representation 'Z' is not one of A, Q, K, V, Y"):
        build_report(build_sweep("h", head_records()), tmp_path, heads_representation="Z")


# ---- the statistics these sections add ---------------------------------------------------------------------------

def test_rank_correlation_exact_and_degenerate() -> None:
    from analysis.significance.stats import rank_correlation

    rc = rank_correlation([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert rc.rho == pytest.approx(1.0) and rc.pvalue == pytest.approx(2 / 120) and rc.exact
    rc = rank_correlation([1, 2, 3, 4], [4, 3, 2, 1])
    assert rc.rho == pytest.approx(-1.0) and rc.pvalue == pytest.approx(2 / 24)  # 4 points never reach 0.05
    assert math.isnan(rank_correlation([1, 2], [2, 1]).rho)
    assert math.isnan(rank_correlation([1, 2, 3], [5, 5, 5]).pvalue)
    many = rank_correlation(list(range(9)), list(range(9)), resamples=2000, seed=1)
    assert not many.exact and many.pvalue == pytest.approx(2 / 2001)  # twice (0 + 1) / (N + 1): never zero
    with pytest.raises(ValueError, match="1-D and of one length"):
        rank_correlation([1, 2, 3], [1, 2])


def test_shared_seed_bootstrap_draws_a_seed_for_both_sides() -> None:
    """Two seeds far apart, B one error fewer than A on every recording of every seed: drawing a seed for both
    sides at once gives ΔWER = -1 point in every resample; drawing them apart (two models) does not."""
    from analysis.significance.stats import PairedCounts, PairingError, paired_bootstrap, paired_bootstrap_shared_seeds

    a = np.array([[10.0] * 6, [30.0] * 6])
    pc = PairedCounts(tuple(f"r{i}" for i in range(6)), np.full(6, 100.0), a, a - 1, (1, 2), (1, 2))
    shared = paired_bootstrap_shared_seeds(pc, resamples=300, seed=3)
    assert np.allclose(shared.delta, -1.0)
    apart = paired_bootstrap(pc, resamples=300, seed=3)
    assert apart.delta.max() - apart.delta.min() > 10
    with pytest.raises(PairingError, match="same seeds on both sides"):
        paired_bootstrap_shared_seeds(PairedCounts(pc.recordings, pc.ref_words, a, a[:1], (1, 2), (1,)))
