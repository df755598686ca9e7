"""analysis report/compare end to end: a synthetic sweep in a real MLflow sqlite database -> the report folder."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.ledger.collect import build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    synth.write_to_mlflow(synth.make_records(), uri, d / "artifacts")
    return uri


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Path:
    out = tmp_path_factory.mktemp("report")
    rc = main(["report", "--experiment", synth.EXPERIMENT, "--tracking-uri", mlflow_uri, "--out", str(out),
               "--baseline-context", "10.24"])
    assert rc == 0
    return out


@pytest.mark.slow
def test_report_folder_has_every_output(report_dir: Path) -> None:
    for name in ("index.html", "report.md", "wer.csv", "werr.csv", "significance.csv", "snr.csv", "problems.csv",
                 "trials.csv", "finding.csv", "fig1_werr_vs_context_context.png", "fig2_werr_vs_snr_context.png",
                 "fig3_wer_vs_context_posenc.png"):
        assert (report_dir / name).stat().st_size > 0, name
    for png in report_dir.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sig = pd.read_csv(report_dir / "significance.csv")
    assert {"p_permutation", "p_holm", "significant", "delta_lo", "delta_hi", "werr_lo", "werr_hi", "p_wilcoxon",
            "p_sign", "p_welch", "verdict"} <= set(sig.columns)
    snr = pd.read_csv(report_dir / "snr.csv")
    assert set(snr["snr_db"].dropna()) == {10.0, 0.0, -5.0}
    wer = pd.read_csv(report_dir / "wer.csv")
    assert {"wer_mean", "wer_sd", "wer_min", "wer_max", "n_seeds"} <= set(wer.columns)


def test_html_is_self_contained(report_dir: Path) -> None:
    html = (report_dir / "index.html").read_text()
    sources = re.findall(r'src="([^"]*)"', html)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    for s in sources:
        assert base64.b64decode(s.split(",", 1)[1])[:4] == b"\x89PNG"
    assert "<link" not in html and "http://" not in html and "https://" not in html
    assert "<script" not in html


@pytest.mark.browser
def test_html_renders_offline_with_every_figure(report_dir: Path, browser_page) -> None:
    """In headless Chromium: every embedded figure decodes, and the page asks for nothing but itself."""
    from tests.plugins.browser import save_screenshot

    requested: list[str] = []
    browser_page.on("request", lambda r: requested.append(r.url))
    browser_page.goto((report_dir / "index.html").resolve().as_uri())
    widths = browser_page.eval_on_selector_all("img", "els => els.map(e => e.complete ? e.naturalWidth : 0)")
    assert len(widths) == 3 and min(widths) > 300
    shown = browser_page.eval_on_selector_all("img", "els => els.map(e => e.getBoundingClientRect().width)")
    assert min(shown) >= 800, shown  # sized to read, not left at a small native size
    assert all(u.startswith(("file:", "data:")) for u in requested), requested
    body = browser_page.locator("body").inner_text()
    assert "significantly better" in body and "no significant difference" in body
    assert save_screenshot(browser_page, "analysis-synthetic-report").stat().st_size > 20_000


def test_report_states_significance_plainly_and_honestly(report_dir: Path) -> None:
    md = (report_dir / "report.md").read_text()
    lines = md.splitlines()

    def line(context: str, dataset: str) -> str:
        hits = [ln for ln in lines if ln.startswith(f"- {context} against 10.24 s on {dataset}:")]
        assert hits, (context, dataset)
        return hits[0]  # family context's, the first

    # one plain sentence per finding: the verdict and the two WERs, no more numbers than that
    planted = line("40.96 s", "test-shifted")
    assert re.fullmatch(r"- 40\.96 s against 10\.24 s on test-shifted: \*\*significantly better\*\*, "
                        r"WER \d+\.\d\d% → \d+\.\d\d%\.", planted), planted
    null = line("20.48 s", "test-shifted")
    assert "**no significant difference**" in null
    for ln in lines:  # no sentence of the findings strings statistics together
        if ln.startswith("- ") and " against 10.24 s on " in ln:
            assert "p = " not in ln and "CI" not in ln and len(ln) < 160, ln
    # ... and its numbers are in the table after the sentences
    numbers = md[md.index("## Findings in numbers"):]
    assert "| p Holm |" in numbers and "| WERR CI |" in numbers and "significantly better" in numbers
    assert "95% intervals" in numbers
    # unfinished runs and the run lacking a metric are in the report, not silently dropped
    for text in ("ctx82s-rope1.5M-2L96d4h-s0", "RUNNING", "CUDA out of memory", "SCHEDULED",
                 "lacks metric wer/test-shifted/snr-5"):
        assert text in md
    assert "Fig. 4" in md and "not drawn: no family whose series differ in model size" in md
    assert "Fig. 5" in md and "not drawn" in md
    assert "Holm-corrected across the context lengths" in md  # the methods say what was done
    # the paper's claims are checked and stated near the top (the planted effect is 10 -> 41 s on both sets)
    finding = md[md.index("## The paper's finding in this sweep"):md.index("## Figures")]
    assert "**Holds**: WER falls as context grows (10.24 s → 40.96 s, clean audio, every test set)" in finding


def test_compare_prints_one_comparison(mlflow_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", synth.EXPERIMENT, "ctx10s-rope1.5M-2L96d4h", "41s", "--tracking-uri", mlflow_uri,
               "--dataset", "dev", "--bootstrap", "500"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "A = ctx10s-rope1.5M-2L96d4h (10.24 s), B = ctx41s-rope1.5M-2L96d4h (40.96 s)" in out
    assert "permutation p=0.001953 (exact, 10 recordings)" in out  # all 10 better: 2 / 2^10
    assert "95% CI" in out and "Wilcoxon p=" in out and "Welch" in out
    rc = main(["compare", synth.EXPERIMENT, "10.24", "20s", "--tracking-uri", mlflow_uri])
    assert rc == 2 and "matches 2 configurations" in capsys.readouterr().err


def _family_records() -> list[RunRecord]:
    """Size and head families (WER only): enough for figures 4 and 5, and nothing else."""
    recs = []
    for fam, archs in (("sizes", [(6, 768, 6), (3, 768, 6)]), ("heads", [(9, 768, 6), (9, 768, 12)])):
        for layers, d, h in archs:
            for ctx in (10.24, 20.48, 40.96):
                for seed in (0, 1):
                    label = f"ctx{ctx:.0f}s-rope1.5M-{layers}L{d}d{h}h-s{seed}"
                    params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": str(layers),
                              "model.d_model": str(d), "model.heads": str(h), "model.posenc": "rotary",
                              "train.lr": "0.003" if layers == 6 else "0.002"}
                    tags = {"sweep.role": "trial", "trial.label": label, "trial.seed": str(seed),
                            "trial.subgrids": fam}
                    wer = 20.0 - ctx / 20.0 + layers / 10.0 + h / 100.0 + seed / 10.0
                    recs.append(RunRecord(f"{fam}-{label}", "FINISHED", tags, params, {"wer/earnings": wer}))
    return recs


def test_size_and_head_families_get_figures_4_and_5(tmp_path: Path) -> None:
    rep = build_report(build_sweep("sizes", _family_records()), tmp_path, bootstrap_resamples=200)
    keys = {f.key for f in rep.figures}
    assert keys == {"fig1_werr_vs_context_heads", "fig4_werr_vs_context_sizes", "fig5_wer_vs_context_heads"}
    assert {s.key for s in rep.skipped} == {"fig2", "fig3"}
    md = (tmp_path / "report.md").read_text()
    # without per-recording tables nothing can be tested, and the report says so rather than inventing p-values
    assert "**not tested**" in md and "no per-recording results" in md


def _unlearned(records: list[RunRecord], context: str | None = None) -> list[RunRecord]:
    """``records`` with the clean WER of every run (or of those at ``context``, e.g. "ctx20s") at 99.5% or more:
    models that never left the CTC blank plateau."""
    return [RunRecord(r.run_id, r.status, r.tags, r.params, {k: 99.5 + v / 100 for k, v in r.metrics.items()})
            if context is None or context in r.run_id else r for r in records]


def test_a_sweep_whose_models_learned_nothing_gets_no_figures(tmp_path: Path) -> None:
    """The quick demo's report drew flat-zero WERR figures after saying every run was left out."""
    rep = build_report(build_sweep("blank", _unlearned(_family_records())), tmp_path, bootstrap_resamples=200)
    assert rep.figures == [] and not list(tmp_path.glob("*.png"))
    md = (tmp_path / "report.md").read_text()
    assert "![" not in md and "WERR (%) from" not in md
    assert "**Left out**: every configuration" in md and "not learned to transcribe" in md
    assert "No figure is drawn: every configuration at 99% WER" in md  # and says why, once


def test_an_unlearned_configuration_is_left_out_of_figures_and_comparisons(tmp_path: Path) -> None:
    rep = build_report(build_sweep("some", _unlearned(_family_records(), "ctx20s")), tmp_path,
                       bootstrap_resamples=200)
    assert {f.key for f in rep.figures} == {"fig1_werr_vs_context_heads", "fig4_werr_vs_context_sizes",
                                            "fig5_wer_vs_context_heads"}
    md = (tmp_path / "report.md").read_text()
    assert "**Left out**: 4 of 12 configurations" in md
    findings = md[md.index("## Findings: each"):md.index("## WER and WERR")]
    assert "20.48 s against" not in findings and "40.96 s against 10.24 s" in findings
    werr = pd.read_csv(tmp_path / "werr.csv")  # the CSVs keep every configuration
    assert (werr["context_s"] == 20.48).any()


def test_a_sweep_with_one_context_says_there_is_nothing_to_compare(tmp_path: Path) -> None:
    recs = [r for r in _family_records() if "ctx10s" in r.run_id]
    rep = build_report(build_sweep("one", recs), tmp_path, bootstrap_resamples=200)
    assert rep.figures == [] and len(rep.skipped) == 5
    md = (tmp_path / "report.md").read_text()
    assert "No comparison with a baseline could be made" in md


def _with_kernels(records: list[RunRecord], levels: list[str]) -> list[RunRecord]:
    """``records`` tagged ``trial.kernels`` with ``levels`` in turn ("" leaves a run without the tag)."""
    out = []
    for i, r in enumerate(records):
        level = levels[i % len(levels)]
        tags = {**r.tags, "trial.kernels": level} if level else dict(r.tags)
        out.append(RunRecord(r.run_id, r.status, tags, r.params, r.metrics))
    return out


def test_the_report_names_the_cpu_kernels_that_trained_the_runs(tmp_path: Path) -> None:
    sweep = build_sweep("one", _with_kernels(_family_records(), ["avx512"]))
    assert set(sweep.trials["kernels"]) == {"avx512"}
    build_report(sweep, tmp_path, bootstrap_resamples=100)
    md = (tmp_path / "report.md").read_text()
    assert "trained with the CPU kernels avx512 (24 runs)" in md and "different CPU kernel levels" not in md
    assert set(pd.read_csv(tmp_path / "trials.csv")["kernels"]) == {"avx512"}


def test_the_report_warns_when_runs_trained_on_different_kernel_levels(tmp_path: Path) -> None:
    build_report(build_sweep("mixed", _with_kernels(_family_records(), ["avx2", "avx512", "avx2,avx512", ""])),
                 tmp_path, bootstrap_resamples=100)
    md = (tmp_path / "report.md").read_text()
    assert ("The runs trained with different CPU kernel levels: avx2 (6 runs), avx2,avx512 (6 runs), avx512 "
            "(6 runs); 6 finished runs recorded none.") in md


def test_runs_that_recorded_no_kernel_level_get_no_note(tmp_path: Path) -> None:
    build_report(build_sweep("old", _family_records()), tmp_path, bootstrap_resamples=100)
    assert "CPU kernel" not in (tmp_path / "report.md").read_text()


def test_the_report_says_what_the_training_cuts_dropped_per_context(tmp_path: Path) -> None:
    recs = []
    for r in _family_records():
        ctx = float(r.params["data.context_s"])
        cut = "pauses" if r.params["train.seed"] == "1" else "fixed"
        params = {**r.params, "data.cut": cut}
        recs.append(RunRecord(r.run_id, r.status, r.tags, params,
                              {**r.metrics, "data/words_lost_pct": 0.0 if cut == "pauses" else 40.0 / ctx}))
    sweep = build_sweep("cuts", recs)
    assert set(sweep.trials["cut"]) == {"fixed", "pauses"}
    build_report(sweep, tmp_path, bootstrap_resamples=100)
    md = (tmp_path / "report.md").read_text()
    assert ("Words dropped by the training cuts (lying wholly in no window; `data.cut`): 10.24 s fixed cuts 3.91%, "
            "20.48 s fixed cuts 1.95%, 40.96 s fixed cuts 0.98%, 10.24 s pauses cuts 0.00%") in md
