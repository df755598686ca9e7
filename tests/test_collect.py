"""analysis.ledger.collect: a synthetic sweep written into a real MLflow sqlite database and read back."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.ledger import collect
from analysis.ledger.collect import build_sweep
from analysis.ledger.fetch import CollectError, RunRecord
from asr_core.contract.metrics import parse_metric_key

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402


@pytest.fixture(scope="module")
def records() -> list[RunRecord]:
    return synth.make_records()


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory, records: list[RunRecord]) -> str:
    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    synth.write_to_mlflow(records, uri, d / "artifacts")
    return uri


@pytest.fixture(scope="module")
def sweep(mlflow_uri: str) -> collect.Sweep:
    return collect.collect(synth.EXPERIMENT, mlflow_uri, progress=False)


def test_reads_every_trial_whatever_its_status(sweep: collect.Sweep) -> None:
    t = sweep.trials
    assert len(t) == 18  # 5 configurations x 3 seeds finished + 3 unfinished; the parent is not a trial
    assert t["status"].value_counts().to_dict() == {"FINISHED": 15, "RUNNING": 1, "FAILED": 1, "SCHEDULED": 1}
    assert sorted(t["config"].unique()) == ["ctx10s-rope1.5M-2L96d4h", "ctx10s-sin-2L96d4h",
                                            "ctx20s-rope1.5M-2L96d4h", "ctx20s-sin-2L96d4h",
                                            "ctx41s-rope1.5M-2L96d4h", "ctx82s-rope1.5M-2L96d4h"]
    assert t["config_id"].nunique() == 6 and t["series_id"].nunique() == 2
    assert set(t["series"]) == {"rotary", "sinusoidal"}
    shared = t[t["config"] == "ctx10s-rope1.5M-2L96d4h"]
    assert set(shared["families"]) == {"context,posenc"} and sorted(shared["seed"]) == [0, 1, 2]
    assert sweep.families == ["context", "posenc"]
    assert sorted(t["context_s"].unique()) == [10.24, 20.48, 40.96, 81.92]
    assert set(t["layers"]) == {2} and set(t["heads"]) == {4} and set(t["posenc"]) == {"rotary", "sinusoidal"}


def test_unfinished_runs_and_a_missing_metric_are_listed(sweep: collect.Sweep) -> None:
    p = sweep.problems.set_index("label")
    assert "RUNNING" in p.loc["ctx82s-rope1.5M-2L96d4h-s0", "problem"]
    assert "FAILED: RuntimeError: CUDA out of memory" in p.loc["ctx82s-rope1.5M-2L96d4h-s1", "problem"]
    assert "SCHEDULED" in p.loc["ctx82s-rope1.5M-2L96d4h-s2", "problem"]
    assert "lacks metric wer/test-shifted/snr-5" in p.loc["ctx41s-rope1.5M-2L96d4h-s2", "problem"]
    assert len(p) == 4
    # the run lacking one metric still contributes everything else it has
    r = sweep.recordings
    mine = r[r["label"] == "ctx41s-rope1.5M-2L96d4h-s2"]
    assert set(mine["condition"]) == {"clean", "snr10", "snr0"}
    assert len(mine) == 10 + 24 * 3


def test_tidy_frame_matches_what_was_logged(sweep: collect.Sweep, records: list[RunRecord]) -> None:
    r = sweep.recordings
    assert len(r) == 15 * (10 + 24 * 4) - 24
    for col in ("config", "seed", "families", "context_s", "dataset", "condition", "snr_db", "recording",
                "ref_words", "substitutions", "deletions", "insertions", "hyp_words", "errors", "wer"):
        assert col in r.columns
    assert (r["errors"] == r["substitutions"] + r["deletions"] + r["insertions"]).all()
    assert r.loc[r["condition"] == "clean", "snr_db"].isna().all()
    assert set(r.loc[r["condition"] != "clean", "snr_db"]) == {10.0, 0.0, -5.0}
    # metric and table agree, and equal the values logged
    w = sweep.wer
    assert (w["wer"] - w["wer_table"]).abs().max() < 1e-9
    logged = {(rec.tags["trial.label"], k): v for rec in records for k, v in rec.metrics.items()}
    for _, row in w.iterrows():
        key = f"wer/{row['dataset']}" + ("" if row["condition"] == "clean" else f"/{row['condition']}")
        assert row["wer"] == pytest.approx(logged[(row["label"], key)])
    # reading MLflow gives what the records give directly
    direct = build_sweep(synth.EXPERIMENT, records)
    cols = ["label", "dataset", "condition", "recording", "errors", "ref_words"]
    a = r[cols].sort_values(cols[:4]).reset_index(drop=True)
    b = direct.recordings[cols].sort_values(cols[:4]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_unknown_experiment_lists_the_existing_ones(mlflow_uri: str) -> None:
    with pytest.raises(CollectError, match="no MLflow experiment named 'nope'.*'synth-sweep'"):
        collect.collect("nope", mlflow_uri, progress=False)


# ---- pure checks on hand-made records ------------------------------------------------------------------------

CSV_HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer\n"


def _rec(run_id: str, seed: int = 0, ctx: float = 10.24, *, metrics: dict | None = None, tables: dict | None = None,
         status: str = "FINISHED", role: str = "trial", extra: dict | None = None) -> RunRecord:
    tags = {"sweep.role": role, "trial.label": f"ctx{ctx:.0f}s-x-s{seed}", "trial.seed": str(seed),
            "trial.subgrids": "context"}
    params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2", **(extra or {})}
    metrics = {"wer/dev": 10.0} if metrics is None else metrics
    tables = {"dev": CSV_HEAD + "dev,clean,,a,50,3,1,1,50,10.0\ndev,clean,,b,50,2,2,1,49,10.0\n"} \
        if tables is None else tables
    return RunRecord(run_id, status, tags, params, metrics, tables)


def test_parse_metric_key() -> None:
    assert parse_metric_key("wer/dev") == ("dev", "clean", pytest.approx(math.nan, nan_ok=True))
    assert parse_metric_key("wer/test-shifted/snr-7.5") == ("test-shifted", "snr-7.5", -7.5)
    assert parse_metric_key("wer/rev16/snr10") == ("rev16", "snr10", 10.0)
    assert parse_metric_key("train/loss") is None


def test_table_problems_are_named_and_the_run_is_kept_where_possible() -> None:
    recs = [
        _rec("ok"),
        _rec("nocsv", seed=1, tables={}),
        _rec("badcols", seed=2, tables={"dev": "dataset,recording\ndev,a\n"}),
        _rec("mismatch", seed=3, metrics={"wer/dev": 30.0}),
        _rec("dup", seed=4, tables={"dev": CSV_HEAD + "dev,clean,,a,50,3,1,1,50,10\ndev,clean,,a,50,3,1,1,50,10\n"}),
        _rec("nometric", seed=5, metrics={}),
        _rec("stray", seed=6, role=""),
        _rec("noctx", seed=7, ctx=float("nan")),
    ]
    sw = build_sweep("t", recs)
    p = dict(zip(sw.problems["run_id"], sw.problems["problem"]))
    assert "no artifact eval/dev.csv" in p["nocsv"]
    assert "lacks columns" in p["badcols"] and "'condition'" in p["badcols"]
    assert "metric wer/dev = 30.000 but eval/dev.csv gives 10.000" in p["mismatch"]
    assert "lists recordings ['a'] twice" in p["dup"]
    assert "no wer/ metrics" in p["nometric"]
    assert "not a trial run" in p["stray"]
    assert "no param data.context_s" in p["noctx"]
    assert "ok" not in p
    # runs without a usable table keep their WER (from the metric) but add no per-recording rows
    assert set(sw.wer["run_id"]) == {"ok", "nocsv", "badcols", "mismatch", "dup"}
    assert set(sw.recordings["run_id"]) == {"ok", "mismatch"}


def test_a_run_that_writes_nothing_is_flagged_and_kept() -> None:
    deleted = CSV_HEAD + "dev,clean,,a,50,0,50,0,0,100.0\n"
    recs = [_rec("ok"),
            _rec("blank", seed=1, metrics={"wer/dev": 100.0, "wer/test": 99.5},
                 tables={"dev": deleted, "test": deleted.replace("dev,", "test,").replace("100.0", "99.5")}),
            _rec("one-bad-set", seed=2, metrics={"wer/dev": 100.0, "wer/test": 40.0}, tables={})]
    sw = build_sweep("t", recs)
    flagged = sw.problems[sw.problems["problem"].str.contains("has not learned to transcribe")]
    assert list(flagged["run_id"]) == ["blank"], sw.problems
    assert "dev 100.0%, test 99.5%" in flagged["problem"].iloc[0]
    assert "blank" in set(sw.wer["run_id"])  # kept: it is what that seed trained


def test_condition_spelling_in_tables_is_normalised() -> None:
    table = CSV_HEAD + "dev,clean,,a,50,3,1,1,50,10\ndev,snr10.0,10.0,a,50,6,2,2,50,20\n"
    sw = build_sweep("t", [_rec("r", metrics={"wer/dev": 10.0, "wer/dev/snr10": 20.0}, tables={"dev": table})])
    assert sw.problems.empty
    assert sorted(sw.recordings["condition"]) == ["clean", "snr10"]


def test_a_noisy_row_without_its_snr_keeps_the_condition_it_names() -> None:
    table = CSV_HEAD + "dev,clean,,a,50,3,1,1,50,10\ndev,snr-5,,a,50,6,2,2,50,20\n"
    sw = build_sweep("t", [_rec("r", metrics={"wer/dev": 10.0, "wer/dev/snr-5": 20.0}, tables={"dev": table})])
    assert sw.problems.empty
    assert sorted(sw.recordings["condition"]) == ["clean", "snr-5"]


def test_ignore_params_keeps_seeds_of_one_configuration_together() -> None:
    recs = [_rec(f"r{s}", seed=s, extra={"notes.out_dir": f"/trials/{s}"}) for s in range(3)]
    assert build_sweep("t", recs).trials["config_id"].nunique() == 3
    sw = build_sweep("t", recs, ignore_params=["notes.out_dir"])
    assert sw.trials["config_id"].nunique() == 1
    assert set(sw.trials["config"]) == {"ctx10s-x"}


def test_execution_settings_and_data_locations_do_not_split_a_configuration() -> None:
    """Seeds of one configuration run with other loader workers, or from a corpus that moved, are still one
    configuration (asr_core.contract.identity); another dataset name or model is not."""
    recs = [_rec(f"r{s}", seed=s, extra={"data.num_workers": str(s), "train.checkpoint_every": str(100 * (s + 1)),
                                         "data.train": f"podcast:/fs{s}/podcasts/train",
                                         "eval.datasets": str([f"dev=podcast:/fs{s}/dev"])}) for s in range(3)]
    sw = build_sweep("t", recs)
    assert sw.trials["config_id"].nunique() == 1 and sw.trials["series_id"].nunique() == 1
    other = _rec("o", seed=0, extra={"data.num_workers": "0", "data.train": "spotify=podcast:/fs0/podcasts/train",
                                     "eval.datasets": str(["dev=podcast:/fs0/dev"])})
    assert build_sweep("t", [*recs, other]).trials["config_id"].nunique() == 2


def test_seeds_evaluated_on_other_test_sets_are_one_configuration() -> None:
    """Evaluation is not in a model's identity (issue 28): a seed trained after the grid gained a test set, an SNR
    or another stride logs other eval.* params, and is still a seed of the same configuration."""
    recs = [_rec("a", seed=0, extra={"eval.datasets": str(["dev=podcast:/d/dev"]), "eval.snrs": "[]"}),
            _rec("b", seed=1, extra={"eval.datasets": str(["dev=podcast:/d/dev", "t=podcast:/d/t"]),
                                     "eval.snrs": "[5.0]", "eval.stride": "0.25"})]
    sw = build_sweep("t", recs)
    assert sw.trials["config_id"].nunique() == 1 and sw.trials["series_id"].nunique() == 1


def test_the_evaluations_a_run_records_are_read_and_named_in_the_report() -> None:
    """A run's ``eval.evaluation.<id>`` tags (its own evaluation, then an evaluation job's) become
    ``Sweep.evaluations``, and the report's note says which evaluation its greedy tables read and what jobs added;
    runs without such tags get no note."""
    from asr_core.contract.evaluation import evaluation_tag
    from analysis.significance.werr import evaluation_notes

    setting = {"decoder": "greedy", "stride": 0.125, "precision": "auto", "noise": "synthetic"}
    tags = {**evaluation_tag("own", "greedy", {"dev": (None,)}, setting),
            **evaluation_tag("1a2b3c4d", "greedy", {"dev": (5.0,), "t": (None, 5.0)}, setting)}
    rec = _rec("a", seed=0)
    rec = RunRecord(rec.run_id, rec.status, {**rec.tags, **tags}, rec.params, rec.metrics, rec.tables)
    sw = build_sweep("t", [rec, _rec("b", seed=1)])
    ev = sw.evaluations
    assert sorted(zip(ev["job"], ev["dataset"], ev["condition"])) == [
        ("1a2b3c4d", "dev", "snr5"), ("1a2b3c4d", "t", "clean"), ("1a2b3c4d", "t", "snr5"), ("own", "dev", "clean")]
    (note,) = evaluation_notes(sw)
    assert "evaluation greedy (stride 0.125, precision auto, noise synthetic) of 1 runs" in note
    assert "evaluation jobs measured dev snr5, t clean, t snr5 on 1 of them" in note
    assert evaluation_notes(build_sweep("t", [_rec("b", seed=1)])) == []


def test_no_trial_runs_is_an_error() -> None:
    with pytest.raises(CollectError, match="no trial runs"):
        build_sweep("t", [_rec("p", role="parent")])


def test_an_option_added_mid_sweep_does_not_split_a_configuration() -> None:
    """Runs made after a field was added log it at its default; older runs lack it: still one configuration, and
    series keep readable names from baseline values (posenc=rotary beside posenc=none)."""
    recs = [_rec("old", seed=0), _rec("new", seed=1, extra={"eval.stride": "0.125", "model.posenc": "rotary"}),
            _rec("nopos", seed=0, ctx=20.48, extra={"model.posenc": "none"})]
    sw = build_sweep("t", recs)
    ids = dict(zip(sw.trials["run_id"], sw.trials["config_id"]))
    assert ids["old"] == ids["new"] != ids["nopos"]
    series = dict(zip(sw.trials["run_id"], sw.trials["series"]))
    assert "rotary" in series["old"] and "none" in series["nopos"], series


def test_the_per_recording_frame_holds_its_names_as_categories(sweep: collect.Sweep) -> None:
    """Each run's and recording's names repeat on every row; as categories the frame at 3,000 runs is a third of
    the memory (docs/results), and reads the same."""
    rec = sweep.recordings
    text = ["run_id", "label", "config", "config_id", "series", "dataset", "condition", "recording", "decoder"]
    assert all(isinstance(rec[c].dtype, pd.CategoricalDtype) for c in text)
    plain = rec.astype({c: str for c in text})
    assert (rec["config"] == plain["config"]).all()
    assert rec.groupby("config_id").size().to_dict() == plain.groupby("config_id").size().to_dict()
    order = rec.sort_values(["series", "recording"], kind="stable").index
    assert list(order) == list(plain.sort_values(["series", "recording"], kind="stable").index)
