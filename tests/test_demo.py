"""End to end: ``./scripts/demo.sh --quick`` as a user types it — corpus, grid through the local backend, MLflow,
report — and a rerun that reuses every finished trial."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.plugins.demo import QuickDemo

GRID = yaml.safe_load((Path(__file__).parents[1] / "grids" / "demo-quick.yaml").read_text())
SNRS = [float(x) for x in GRID["base"]["eval"]["snrs"]]
CONTEXTS = tuple(f"{c:g}" for c in GRID["subgrids"]["context"]["axes"]["data.context_s"])
TRIALS = len(CONTEXTS) * len(GRID["seeds"])
LEARNED_WER = 95.0  # clean in-domain WER every quick-demo model must be under: it transcribes, not the blank plateau


def _trial_runs(demo: QuickDemo):
    client = MlflowClient(tracking_uri=demo.tracking_uri)
    exp = client.get_experiment_by_name("demo-quick")
    assert exp is not None, "the demo sweep's experiment is missing"
    return client, client.search_runs([exp.experiment_id], filter_string="tags.`sweep.role` = 'trial'",
                                      max_results=100)


@pytest.mark.slow
def test_quick_demo_trains_every_trial_and_logs_every_wer(quick_demo: QuickDemo) -> None:
    assert quick_demo.first.returncode == 0, quick_demo.first.output[-4000:]
    client, runs = _trial_runs(quick_demo)
    assert len(runs) == TRIALS, [r.info.run_name for r in runs]
    assert {r.info.status for r in runs} == {"FINISHED"}
    wers = {r.info.run_name: r.data.metrics.get("wer/test", 100.0) for r in runs}
    assert max(wers.values()) < LEARNED_WER, f"a quick-demo model did not learn to transcribe: {wers}"
    assert sorted({r.data.params["data.context_s"] for r in runs}) == sorted(CONTEXTS, key=float) or \
        {r.data.params["data.context_s"] for r in runs} == set(CONTEXTS)
    for r in runs:
        for ds in ("test", "test-shifted"):
            assert len(SNRS) == 3
            for key in [f"wer/{ds}"] + [f"wer/{ds}/snr{snr:g}" for snr in SNRS]:
                assert key in r.data.metrics, (r.info.run_name, key, sorted(r.data.metrics))
        arts = {a.path for a in client.list_artifacts(r.info.run_id, "eval")}
        assert {"eval/test.csv", "eval/test-shifted.csv"} <= arts
        # the corpus carries a planted cue (demo.sh: synth --cue), so the cue-word error rate reaches MLflow
        for key in ["cue/test"] + [f"cue/test/snr{snr:g}" for snr in SNRS]:
            assert 0.0 <= r.data.metrics.get(key, -1.0) <= 100.0, (r.info.run_name, key, sorted(r.data.metrics))


@pytest.mark.slow
def test_quick_demo_counts_the_planted_words_per_recording(quick_demo: QuickDemo) -> None:
    meta = quick_demo.root / "corpus" / "meta"
    metas = [json.loads(p.read_text()) for p in meta.glob("*.json")]
    planted = {m["id"]: len(m.get("cues", ())) for m in metas if m["split"] == "test"}
    assert sum(planted.values()) > 0, planted  # the quick corpus's short band fits its 30 s test recordings
    client, runs = _trial_runs(quick_demo)
    for r in runs:
        table = pd.read_csv(client.download_artifacts(r.info.run_id, "eval/test.csv"))
        clean = table[table["condition"] == "clean"]
        counted = {rec: int(n) for rec, n in zip(clean["recording"], clean["cue_words"])}
        assert counted == planted, (r.info.run_name, counted, planted)


@pytest.mark.slow
def test_quick_demo_writes_the_report_and_says_where_it_is(quick_demo: QuickDemo) -> None:
    out = quick_demo.first.output
    report = quick_demo.root / "report"
    assert f"{report.resolve()}/index.html" in out
    assert "mlflow ui --backend-store-uri" in out
    html = (report / "index.html").read_text()
    assert "No figure is drawn" not in html and "none has learned" not in html  # the models transcribe
    assert html.count("data:image/png;base64,") >= 2  # WERR vs context and WERR vs SNR at least
    assert list(report.glob("*.png"))
    md = (report / "report.md").read_text()
    for ctx in CONTEXTS:  # written "5.12 s" or "10 s"
        assert re.search(rf"\b{ctx.split('.')[0]}(\.\d+)? ?s\b", md), f"context {ctx} s missing from report.md"
    assert re.search(r"significan", md, re.I)
    assert list(report.glob("*.csv"))
    # the report says, claim by claim, whether the paper's finding holds (whatever the answer is)
    finding = md[md.index("## The paper's finding in this sweep"):]
    verdicts = re.findall(r"^- \*\*(Holds|Does not hold|Cannot be checked)\*\*: ", finding, re.M)
    assert len(verdicts) == 3, verdicts
    assert "Left out" not in md[md.index("## Findings"):md.index("## WER and WERR")], "a learned model was left out"


@pytest.mark.slow
def test_rerunning_the_demo_retrains_nothing(quick_demo: QuickDemo) -> None:
    second = quick_demo.rerun()
    assert second.returncode == 0, second.output[-4000:]
    client, runs = _trial_runs(quick_demo)
    assert len(runs) == TRIALS and {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:  # one history per run: no step logged twice, nothing trained again
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert len(steps) == len(set(steps))
    assert second.seconds < quick_demo.first.seconds / 2, (second.seconds, quick_demo.first.seconds)
    db = quick_demo.root / "runs" / "mlflow.db"
    with sqlite3.connect(db) as con:  # the rerun created no runs
        assert con.execute("select count(*) from runs").fetchone()[0] == TRIALS + 1  # the trials + the sweep's parent
