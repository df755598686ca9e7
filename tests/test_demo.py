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

from asr_core.contract.metrics import recall_metric_key, slot_table_file
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.recall import CODE_WORDS, NEAR_S
from tests.plugins.demo import QUICK_DEMO_LEARNED_WER, QuickDemo

GRID = yaml.safe_load((Path(__file__).parents[1] / "grids" / "demo-quick.yaml").read_text())
SNRS = [float(x) for x in GRID["base"]["eval"]["snrs"]]
CONTEXTS = tuple(f"{c:g}" for c in GRID["subgrids"]["context"]["axes"]["data.context_s"])
TRIALS = len(CONTEXTS) * len(GRID["seeds"])
LEARNED_WER = QUICK_DEMO_LEARNED_WER


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
    meta = quick_demo.root / "corpus-recall" / "meta"  # the test set, with the recall plant (demo.sh)
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


def _metas(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / "meta").glob("*.json"))]


def _planted_slots(demo: QuickDemo) -> dict[str, tuple[str, str, str]]:
    """slot id -> (code word, band, kind) of every slot planted in the quick demo's test set."""
    return {s["slot"]: (s["word"], s["band"], s["kind"]) for m in _metas(demo.root / "corpus-recall")
            for s in m["recall_slots"]}


@pytest.mark.slow
def test_quick_demo_plants_near_band_recall_slots_in_its_test_set_only(quick_demo: QuickDemo) -> None:
    """demo.sh --quick: the recall control (synth --recall) in the test set alone, near band only (recordings of
    24-30 s); the training corpus and test-shifted are made without it, and no code word is ever said there."""
    assert quick_demo.first.returncode == 0, quick_demo.first.output[-4000:]
    tests = _metas(quick_demo.root / "corpus-recall")
    assert tests and {m["split"] for m in tests} == {"test"}
    slots = [s for m in tests for s in m["recall_slots"]]
    kinds = {s["kind"] for s in slots}
    assert len(slots) >= 8 and {"masked", "no-key"} <= kinds, (len(slots), kinds)
    assert {s["band"] for s in slots} == {"near"} and all(m["recall_near_only"] for m in tests)
    keyed = [s["distance_s"] for s in slots if s["kind"] != "no-key"]
    assert keyed and all(NEAR_S[0] <= d <= NEAR_S[1] for d in keyed), keyed
    assert json.loads((quick_demo.root / "corpus-recall" / "synth.json").read_text())["args"]["recall"] == "5"
    corpus = quick_demo.root / "corpus"
    assert "recall" not in json.loads((corpus / "synth.json").read_text())["args"]
    others = _metas(corpus)
    assert {m["split"] for m in others} == {"train", "test-shifted"}
    assert not [m["id"] for m in others if any(k.startswith("recall") for k in m)]
    said = {w.text.lower() for split in ("train", "test-shifted")
            for rec in load_corpus(f"podcast:{corpus / split}", audio=False) for w in rec.words}
    assert len(said) > 50, len(said)  # the transcripts were read
    assert not said & set(CODE_WORDS), sorted(said & set(CODE_WORDS))
    tested = {w.text.lower() for rec in load_corpus(f"podcast:{quick_demo.root / 'corpus-recall' / 'test'}",
                                                    audio=False) for w in rec.words}
    assert tested & set(CODE_WORDS)  # where they are said


@pytest.mark.slow
def test_every_quick_demo_model_scores_exactly_the_planted_slots_both_ways(quick_demo: QuickDemo) -> None:
    planted = _planted_slots(quick_demo)
    assert planted
    client, runs = _trial_runs(quick_demo)
    assert len(runs) == TRIALS
    for r in runs:
        arts = {a.path for a in client.list_artifacts(r.info.run_id, "eval")}
        assert f"eval/{slot_table_file('test')}" in arts and f"eval/{slot_table_file('test-shifted')}" not in arts
        table = pd.read_csv(client.download_artifacts(r.info.run_id, f"eval/{slot_table_file('test')}"),
                            keep_default_na=False)
        for scoring in ("average", "window"):
            clean = table[(table["scoring"] == scoring) & (table["condition"] == "clean")]
            scored = {s: (w, b, k) for s, w, b, k in zip(clean["slot"], clean["word"], clean["band"], clean["kind"])}
            assert len(clean) == len(planted) and scored == planted, (r.info.run_name, scoring)
        averaged = table[table["scoring"] == "average"]  # every condition (clean and each SNR) scores every slot
        assert averaged.groupby("condition")["slot"].apply(sorted).map(lambda x: x == sorted(planted)).all()
        assert averaged["condition"].nunique() == 1 + len(SNRS), sorted(averaged["condition"].unique())
        assert 0.0 <= r.data.metrics[recall_metric_key("test", "near")] <= 100.0
        assert recall_metric_key("test", "far") not in r.data.metrics


@pytest.mark.slow
def test_quick_demo_report_reads_the_recall_control(quick_demo: QuickDemo) -> None:
    """The positive-control section holds the recall part, tables for both scorings, near band only, and per scoring
    a verdict: the models never heard a code word, so the control is not learned."""
    report = quick_demo.root / "report"
    md = (report / "report.md").read_text()
    section = md.split("## Planted cue (positive control)")[1].split("\n## ")[0]
    assert "**Recall control.**" in section
    for title in ("Family context, test: recall slot accuracy", "Family context, test, clean, one window per slot: "
                  "recall slot accuracy"):
        assert title in section, title
    assert "| near band (" in section and "| far band (" not in section
    verdicts = re.findall(r"^- Family .*no far-band slots.*$", section, re.M)
    assert len(verdicts) == 2 + len(SNRS), verdicts  # clean (both scorings) and each SNR (moving windows)
    assert sum("test (clean, one window per slot), " in v for v in verdicts) == 1, verdicts
    assert all("**the control is not learned: near-band recall is at or below chance at every context**" in v
               for v in verdicts), verdicts
    rates = pd.read_csv(report / "recall.csv")
    near = rates[(rates["group"] == "near") & (rates["condition"] == "clean")]
    assert len(near) == len(CONTEXTS) and set(near["n_seeds"]) == {len(GRID["seeds"])}, near
    assert set(near["n_slots"]) == {sum(k == "masked" for _, _, k in _planted_slots(quick_demo).values())}
