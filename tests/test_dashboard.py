"""analysis.dashboard: the report on the sweep's parent run, replaced (not duplicated) by a rerun; the saved view of
the WER columns and the description line that links to both; ``analysis report`` with no parent run and with
``--no-log``. A real MLflow sqlite store with a local artifact root (the browser test uses a real server)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from analysis import dashboard
from asr_core.contract import ledger as sweep_view
from analysis.__main__ import main
from analysis.ledger.fetch import RunRecord
from asr_core.contract.metrics import CLEAN, parse_metric_key

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402

VIEW_TAG = sweep_view.VIEW_TAG_PREFIX + sweep_view.VIEW_ID


# ---- pure ------------------------------------------------------------------------------------------------------

def test_headline_metrics_are_the_clean_wer_the_trials_log() -> None:
    metrics = sweep_view.headline_metrics(["test", "dev", "dev", "bad`name"])
    assert metrics == ["wer/dev", "wer/test"]  # sorted, once each; a backtick cannot be a UI column
    assert [parse_metric_key(m)[:2] for m in metrics] == [("dev", CLEAN), ("test", CLEAN)]


def test_the_saved_view_is_the_envelope_the_ui_reads() -> None:
    value = json.loads(sweep_view.saved_view_value(["wer/dev", "wer/test"], created_ms=5, now_ms=9))
    assert {k: value[k] for k in ("createdAt", "updatedAt")} == {"createdAt": 5, "updatedAt": 9}
    assert isinstance(value["name"], str) and value["name"]
    state = json.loads(value["state"])  # the state travels as JSON text inside the envelope
    # the trial's label as `orchestrate status` prints it, then the rounded WERs
    assert state["selectedColumns"] == ["tags.`trial.label`", "tags.`WER dev`", "tags.`WER test`"]
    # sorted by anything but the start time, the UI lists child runs flat; the parent run is left out
    assert state["orderByKey"] != "attributes.start_time"
    assert state["searchFilter"] == "tags.`sweep.role` != 'parent'"
    assert sweep_view.view_created_ms(json.dumps(value), default=7) == 5
    assert sweep_view.view_created_ms("not json", default=7) == sweep_view.view_created_ms(None, default=7) == 7


def test_the_view_shows_clean_wers_rounded_to_two_decimals() -> None:
    metrics = {"wer/test": 18.197260273972602, "wer/dev": 9.996, "wer/dev/snr-5": 40.1234, "wer_beam/dev": 8.0,
               "cue/dev": 50.0, "wer/nan": float("nan"), "train/loss": 1.23456}
    # clean WERs only, of every decoder
    assert sweep_view.shown_tags(metrics) == {"WER test": " 18.20", "WER dev": " 10.00", "WER dev beam": "  8.00"}
    assert sweep_view.decoder_metrics([*metrics, "wer_beam/dev", "wer_fusion-chiu/test", "wer_beam/dev/snr-5"]) == \
        ["wer_beam/dev", "wer_fusion-chiu/test"]
    assert sweep_view.view_columns(["wer/dev", "wer_beam/dev"]) == [
        "tags.`trial.label`", "tags.`WER dev`", "tags.`WER dev beam`"]
    assert sweep_view.shown_value(100.0) == "100.00" and sweep_view.shown_value(0.004) == "  0.00"
    wers = [9.5, 100.0, 18.197, 0.0, 35.1, 123.4]
    assert sorted(wers, key=sweep_view.shown_value) == sorted(wers)  # the column sorts as text: numeric order
    with pytest.raises(ValueError, match="wer/dev/snr-5"):
        sweep_view.view_columns(["wer/dev/snr-5"])


def test_the_description_line_comes_first_once_and_keeps_what_people_wrote() -> None:
    line1 = sweep_view.note_line("#/v", "#/r", "then")
    line2 = sweep_view.note_line("#/v", None, "now")
    assert line1.startswith(sweep_view.NOTE_START) and "(#/r)" in line1 and "(#/v)" in line1
    assert "(#/r)" not in line2
    assert sweep_view.with_note_line("", line1) == line1
    people = "Context sweep of the paper.\n\nSecond paragraph."
    once = sweep_view.with_note_line(people, line1)
    assert once == f"{line1}\n\n{people}"
    twice = sweep_view.with_note_line(once, line2)
    assert twice == f"{line2}\n\n{people}"


# ---- MLflow ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module (making one takes seconds); each test uses experiments of its own."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def _sweep(uri: str, root: Path, name: str, *, parent: bool = True) -> tuple[str, str | None, str]:
    """An experiment with (optionally) a parent run and one trial run: (experiment id, parent id, trial id)."""
    client = MlflowClient(uri)
    exp = client.create_experiment(name, artifact_location=(root / name).resolve().as_uri())
    pid = client.create_run(exp, run_name=name, tags={"sweep.role": "parent"}).info.run_id if parent else None
    tags = {"sweep.role": "trial", **({"mlflow.parentRunId": pid} if pid else {})}
    tid = client.create_run(exp, run_name="ctx10s-s0", tags=tags).info.run_id
    client.log_metric(tid, "wer/dev", 20.0 + 1 / 3)
    client.set_terminated(tid)
    return exp, pid, tid


def _files(folder: Path, contents: dict[str, str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (folder / name).write_text(text)
    return [folder / n for n in contents]


def _artifacts(client: MlflowClient, run_id: str, tmp: Path) -> dict[str, str]:
    """The run's report artifacts as {path: text}."""
    paths = dashboard.remote_files(client, run_id, dashboard.ARTIFACT_DIR)
    return {p: Path(client.download_artifacts(run_id, p, str(tmp))).read_text() for p in paths}


def test_the_report_lands_on_the_parent_run_and_a_rerun_replaces_it(store: str, tmp_path: Path) -> None:
    exp, parent, trial = _sweep(store, tmp_path / "art", "sweep-a")
    client = MlflowClient(store)
    client.set_experiment_tag(exp, sweep_view.NOTE_TAG, "Written by a person.")
    first = _files(tmp_path / "r1", {"index.html": "<h1>one</h1>", "report.md": "# one", "fig9_old.png": "png",
                                     "wer.csv": "a\n1\n"})
    pub = dashboard.publish("sweep-a", first, ["dev"], store)
    assert pub.parent_run_id == parent and pub.removed == () and pub.shown == 1
    assert _artifacts(client, parent, tmp_path / "d1") == {
        "report/index.html": "<h1>one</h1>", "report/report.md": "# one", "report/fig9_old.png": "png",
        "report/wer.csv": "a\n1\n"}
    assert dashboard.remote_files(client, trial, dashboard.ARTIFACT_DIR) == []  # trials are left alone
    created = json.loads(client.get_experiment(exp).tags[VIEW_TAG])["createdAt"]

    # the next report has no fig9 and other contents: the folder is replaced, nothing is left twice or stale
    second = _files(tmp_path / "r2", {"index.html": "<h1>two</h1>", "report.md": "# two", "wer.csv": "a\n2\n"})
    pub = dashboard.publish("sweep-a", second, ["dev", "test"], store)
    assert pub.removed == ("report/fig9_old.png",)
    assert sorted(pub.files) == ["report/index.html", "report/report.md", "report/wer.csv"]
    assert _artifacts(client, parent, tmp_path / "d2") == {
        "report/index.html": "<h1>two</h1>", "report/report.md": "# two", "report/wer.csv": "a\n2\n"}

    tags = client.get_experiment(exp).tags
    assert [k for k in tags if k.startswith(sweep_view.VIEW_TAG_PREFIX)] == [VIEW_TAG]  # one view, rewritten
    view = json.loads(tags[VIEW_TAG])
    assert view["createdAt"] == created and view["updatedAt"] >= created
    assert json.loads(view["state"])["selectedColumns"] == ["tags.`trial.label`", "tags.`WER dev`", "tags.`WER test`"]
    # the trial logged wer/dev without its shown tag (as runs before evaluate wrote it): publish wrote it
    assert client.get_run(trial).data.tags["WER dev"] == " 20.33" and pub.shown == 0  # written by the first
    note = tags[sweep_view.NOTE_TAG]
    assert note.count(sweep_view.NOTE_START) == 1 and note.endswith("Written by a person.")

    # a beam decoder's WER logged by an evaluation job: its column joins the view, and its shown tag the run
    client.log_metric(trial, "wer_beam-lm64/dev", 18.0)
    pub = dashboard.publish("sweep-a", second, ["dev", "test"], store)
    assert pub.metrics == ("wer/dev", "wer/test", "wer_beam-lm64/dev") and pub.shown == 1
    assert json.loads(json.loads(client.get_experiment(exp).tags[VIEW_TAG])["state"])["selectedColumns"][-1] == \
        "tags.`WER dev beam-lm64`"
    assert client.get_run(trial).data.tags["WER dev beam-lm64"] == " 18.00"
    assert f"({pub.report_link})" in note and f"({pub.view_link})" in note
    assert pub.report_link == f"#/experiments/{exp}/runs/{parent}/artifacts/report/index.html"
    assert pub.url(pub.view_link, "http://host:5000/") == f"http://host:5000/{pub.view_link}"
    assert pub.url(pub.view_link, store).startswith(f"{pub.view_link} (in an MLflow UI serving {store}")


def test_an_experiment_without_a_parent_run_gets_no_report(store: str, tmp_path: Path) -> None:
    exp, _, trial = _sweep(store, tmp_path / "art", "no-parent", parent=False)
    pub = dashboard.publish("no-parent", _files(tmp_path / "r", {"index.html": "x"}), ["dev"], store)
    assert pub.parent_run_id is None and pub.files == () and pub.report_link is None
    client = MlflowClient(store)
    assert dashboard.remote_files(client, trial, dashboard.ARTIFACT_DIR) == []
    assert VIEW_TAG in client.get_experiment(exp).tags  # the view of the runs table needs no parent


def test_publish_names_a_missing_experiment(store: str, tmp_path: Path) -> None:
    with pytest.raises(dashboard.DashboardError, match="'nope'"):
        dashboard.publish("nope", [], [], store)


# ---- the command -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_store(store: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two small synthetic sweeps (the 10 s and 41 s rotary trials): ``with-parent`` as the ledger lays it out, and
    ``orphans``, the same trials without their parent run."""
    d = tmp_path_factory.mktemp("cli")
    uri = store
    records = [r for r in synth.make_records()
               if r.tags.get("sweep.role") == "parent" or r.tags.get("trial.label", "").startswith(("ctx10s-rope",
                                                                                                   "ctx41s-rope"))]
    synth.write_to_mlflow(records, uri, d / "a", experiment="with-parent")
    orphans = [RunRecord(r.run_id, r.status, {k: v for k, v in r.tags.items() if k != "mlflow.parentRunId"},
                               r.params, r.metrics, r.tables) for r in records if r.tags["sweep.role"] != "parent"]
    synth.write_to_mlflow(orphans, uri, d / "b", experiment="orphans")
    return uri


def _report(uri: str, experiment: str, out: Path, *extra: str) -> int:
    return main(["report", "--experiment", experiment, "--tracking-uri", uri, "--out", str(out), "--bootstrap", "100",
                 *extra])


def test_report_no_log_writes_nothing_to_mlflow(cli_store: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    client = MlflowClient(cli_store)
    exp = client.get_experiment_by_name("with-parent")
    parent = dashboard.parent_run_id(client, exp.experiment_id)
    assert _report(cli_store, "with-parent", tmp_path / "out", "--no-log") == 0
    assert (tmp_path / "out" / "index.html").is_file() and "mlflow:" not in capsys.readouterr().out
    assert dashboard.remote_files(client, parent, dashboard.ARTIFACT_DIR) == []
    assert not {VIEW_TAG, sweep_view.NOTE_TAG} & set(client.get_experiment(exp.experiment_id).tags)

    assert _report(cli_store, "with-parent", tmp_path / "out") == 0
    out = capsys.readouterr().out
    logged = sorted(Path(p).name for p in dashboard.remote_files(client, parent, dashboard.ARTIFACT_DIR))
    assert logged == sorted(p.name for p in (tmp_path / "out").iterdir())  # the whole folder
    assert f"logged to report/ of the sweep's parent run {parent}" in out and "wer/dev, wer/test-shifted" in out


def test_report_without_a_parent_run_says_so_and_succeeds(cli_store: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(cli_store, "orphans", tmp_path / "out") == 0
    captured = capsys.readouterr()
    assert "has no parent run (tag sweep.role=parent), so the report is not logged" in captured.err
    client = MlflowClient(cli_store)
    exp = client.get_experiment_by_name("orphans").experiment_id
    runs = client.search_runs([exp])
    assert all(dashboard.remote_files(client, r.info.run_id, dashboard.ARTIFACT_DIR) == [] for r in runs)
    assert VIEW_TAG in client.get_experiment(exp).tags
