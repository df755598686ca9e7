"""The MLflow ledger: schema (docs/ARCHITECTURE.md), idempotent run creation, run states, a sweep's ownership of its
experiment, and validation before any state changes (exit 2, nothing created). ``orchestrate status`` reads the
trial folders: its tests are in tests/test_status.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrate.cli.commands import main
from orchestrate.plan.grid import load_grid
from asr_core.contract import trial as tc
from orchestrate.ledger import ledger as ledger_module
from orchestrate.ledger.ledger import (RUN_NAME_CHARS, Ledger, LedgerError, SweepOwnershipError, TrialRun, counts,
                                       run_names)
from asr_core.contract.tracking import default_tracking_uri

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "grids" / "smoke.yaml"


@pytest.fixture()
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(default_tracking_uri(tmp_path), "smoke")


def test_runs_follow_the_schema_and_are_created_once(ledger: Ledger) -> None:
    trials = list(load_grid(SMOKE).trials)
    parent = ledger.ensure_sweep("grids/smoke.yaml", "local", "id-a", "/runs/smoke")
    assert ledger.ensure_sweep("grids/smoke.yaml", "local", "id-a", "/runs/smoke") == parent  # one parent, always
    ids = ledger.create_trial_runs(parent, trials, "local")
    again = ledger.create_trial_runs(parent, trials, "local")
    assert ids == again and len(set(ids.values())) == len(trials)
    c = ledger.client
    runs = c.search_runs([ledger.experiment_id], max_results=100)
    assert len(runs) == len(trials) + 1
    exp = c.get_experiment(ledger.experiment_id)
    assert exp.name == "smoke"
    assert exp.tags[tc.TAG_SWEEP_ID] == "id-a" and exp.tags[tc.TAG_SWEEP_ROOT] == "/runs/smoke"
    p = c.get_run(parent)
    assert p.info.run_name == "smoke"
    assert p.data.tags["sweep.role"] == "parent" and p.data.tags["sweep.backend"] == "local"
    assert p.data.tags["sweep.grid"] == "grids/smoke.yaml"
    t = trials[0]
    r = c.get_run(ids[t.key])
    assert r.info.status == "SCHEDULED" and r.info.run_name == run_names(trials)[t.key]
    assert len(r.info.run_name) <= RUN_NAME_CHARS  # shown whole in the UI's Run Name column
    tags = r.data.tags
    assert tags["mlflow.parentRunId"] == parent and tags["sweep.role"] == "trial"
    assert tags["trial.key"] == t.key and tags["trial.label"] == t.label and tags["trial.seed"] == str(t.seed)
    assert tags["trial.subgrids"] == ",".join(t.subgrids) and tags["trial.backend"] == "local"
    assert "trial.job_id" in tags
    assert r.data.params == {}  # the trial job logs its config (params) when it first starts


def test_trial_runs_reads_states_tags_and_errors(ledger: Ledger) -> None:
    trials = list(load_grid(SMOKE).trials)
    parent = ledger.ensure_sweep("g", "slurm")
    ids = ledger.create_trial_runs(parent, trials, "slurm")
    a, b = trials[0].key, trials[1].key
    ledger.tag_runs({ids[a]: {"trial.job_id": "12_0"}})
    ledger.set_status([ids[b]], "FAILED", tags={"trial.error": "RuntimeError: boom"})
    runs = ledger.trial_runs()
    assert runs[a].job_id == "12_0" and runs[a].status == "SCHEDULED"
    assert runs[b].status == "FAILED" and runs[b].error == "RuntimeError: boom"
    c = counts(runs.values(), len(trials) + 2)
    assert c["SCHEDULED"] == len(trials) - 1 and c["FAILED"] == 1 and c["MISSING"] == 2


@pytest.mark.parametrize("extra,needle", [
    (["--tracking-uri", "http://127.0.0.1:9"], "unreachable"),
    (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
    (["--tracking-uri", "./mlruns"], "sqlite:///"),
])
def test_invalid_submission_exits_2_and_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        extra: list[str], needle: str) -> None:
    root = tmp_path / "runs"
    rc = main(["submit", str(SMOKE), "--backend", "local", "--sweep-root", str(root), "--no-check-data", *extra])
    assert rc == 2
    assert needle in capsys.readouterr().err
    assert not (root / "smoke").exists() and not (root / "mlflow.db").exists()


def test_missing_data_exits_2_naming_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    rc = main(["submit", str(SMOKE), "--backend", "local", "--sweep-root", str(root),
               "--set", f"data.train=podcast:{tmp_path}/nowhere"])
    assert rc == 2
    assert f"{tmp_path}/nowhere" in capsys.readouterr().err
    assert not root.exists() or not any(root.iterdir())


def test_unknown_sweep_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "nope", "--sweep-root", str(tmp_path)]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err


# ---- a sweep owns its experiment --------------------------------------------------------------------------------
def test_states_are_the_trial_contracts() -> None:
    assert ledger_module.STATES is tc.STATES


def test_check_owner_is_read_only_before_the_ledger_exists(tmp_path: Path) -> None:
    ledger = Ledger(default_tracking_uri(tmp_path), "smoke")
    ledger.check_owner("id-a", str(tmp_path / "smoke"))  # no database: nothing to own, nothing created
    assert not (tmp_path / "mlflow.db").exists()
    ledger.client.create_experiment("other")
    ledger.check_owner("id-a", str(tmp_path / "smoke"))  # a database without this sweep's experiment


def test_a_sweep_owns_its_experiment_and_another_sweep_of_that_name_is_refused(ledger: Ledger) -> None:
    trials = list(load_grid(SMOKE).trials)[:2]
    parent = ledger.ensure_sweep("g", "local", "id-a", "/home/ann/runs/smoke")
    ids = ledger.create_trial_runs(parent, trials, "local")
    ledger.check_owner("id-a", "/home/ann/runs/smoke")
    before = ledger.client.search_runs([ledger.experiment_id], max_results=100)

    other = Ledger(ledger.uri, "smoke")
    with pytest.raises(SweepOwnershipError) as err:
        other.check_owner("id-b", "/home/bob/runs/smoke")
    msg = str(err.value)
    for needle in ("'smoke'", ledger.uri, "/home/ann/runs/smoke", "id-a", "/home/bob/runs/smoke", "--sweep NAME"):
        assert needle in msg, (needle, msg)
    with pytest.raises(SweepOwnershipError):
        other.ensure_sweep("g", "local", "id-b", "/home/bob/runs/smoke")
    with pytest.raises(SweepOwnershipError):  # a folder without an id owns no tagged experiment
        other.ensure_sweep("g", "local")
    assert isinstance(err.value, LedgerError)  # the CLI's exit 2 path

    after = ledger.client.search_runs([ledger.experiment_id], max_results=100)
    assert sorted((r.info.run_id, r.info.status) for r in after) == sorted((r.info.run_id, r.info.status)
                                                                           for r in before)
    exp = ledger.client.get_experiment(ledger.experiment_id)
    assert exp.tags[tc.TAG_SWEEP_ID] == "id-a" and exp.tags[tc.TAG_SWEEP_ROOT] == "/home/ann/runs/smoke"
    assert set(ledger.trial_runs()) == set(ids)


def test_an_experiment_made_before_sweep_ids_is_adopted_only_by_its_own_folder(ledger: Ledger) -> None:
    """An untagged experiment with trial runs names no owner: a brand-new folder reusing the name is refused (its
    resume would resubmit the old sweep's unfinished runs); the old sweep's own folder (``adopt=True``) adopts it."""
    trials = list(load_grid(SMOKE).trials)[:2]
    parent = ledger.ensure_sweep("g", "local")  # an old sweep: no id, so the experiment carries no owner
    ids = ledger.create_trial_runs(parent, trials, "local")
    assert tc.TAG_SWEEP_ID not in ledger.client.get_experiment(ledger.experiment_id).tags
    before = sorted((r.info.run_id, r.info.status) for r in ledger.client.search_runs([ledger.experiment_id]))

    new = Ledger(ledger.uri, "smoke")
    with pytest.raises(SweepOwnershipError) as err:
        new.check_owner("id-new", "/runs/new/smoke")
    msg = str(err.value)
    for needle in ("'smoke'", ledger.uri, "predates sweep ids", "1 or more trial runs", "/runs/new/smoke",
                   "that sweep's own folder", "--sweep NAME"):
        assert needle in msg, (needle, msg)
    with pytest.raises(SweepOwnershipError, match="predates sweep ids"):
        new.ensure_sweep("g", "local", "id-new", "/runs/new/smoke")
    assert tc.TAG_SWEEP_ID not in ledger.client.get_experiment(ledger.experiment_id).tags  # nothing claimed
    assert sorted((r.info.run_id, r.info.status) for r in ledger.client.search_runs([ledger.experiment_id])) == before

    ledger.check_owner("id-a", "/runs/smoke", adopt=True)  # read-only: still untagged afterwards
    assert tc.TAG_SWEEP_ID not in ledger.client.get_experiment(ledger.experiment_id).tags
    assert Ledger(ledger.uri, "smoke").ensure_sweep("g", "local", "id-a", "/runs/smoke", adopt=True) == parent
    exp = ledger.client.get_experiment(ledger.experiment_id)
    assert exp.tags[tc.TAG_SWEEP_ID] == "id-a" and exp.tags[tc.TAG_SWEEP_ROOT] == "/runs/smoke"
    assert {k: r.run_id for k, r in ledger.trial_runs().items()} == ids  # same runs, nothing recreated
    Ledger(ledger.uri, "smoke").check_owner("id-a", "/runs/smoke")  # adopted: its own from now on, adopt or not
    for adopt in (False, True):  # adopted: every other folder is refused as another sweep's, naming the owner
        with pytest.raises(SweepOwnershipError, match="/runs/smoke"):
            Ledger(ledger.uri, "smoke").check_owner("id-b", "/elsewhere/smoke", adopt=adopt)


def test_an_experiment_made_before_sweep_ids_without_trial_runs_is_adopted_by_any_folder(ledger: Ledger) -> None:
    parent = ledger.ensure_sweep("g", "local")  # an old sweep's experiment and parent run, but no trial runs
    ledger.check_owner("id-new", "/runs/new/smoke")
    assert Ledger(ledger.uri, "smoke").ensure_sweep("g", "local", "id-new", "/runs/new/smoke") == parent
    assert ledger.client.get_experiment(ledger.experiment_id).tags[tc.TAG_SWEEP_ID] == "id-new"


def test_a_folder_without_an_id_keeps_using_an_untagged_experiment(ledger: Ledger) -> None:
    """A sweep folder without an id is itself from before sweep ids: it claims nothing, so it is never refused an
    untagged experiment, runs or not."""
    parent = ledger.ensure_sweep("g", "local")
    ledger.create_trial_runs(parent, list(load_grid(SMOKE).trials)[:1], "local")
    Ledger(ledger.uri, "smoke").check_owner("", "/runs/smoke")
    assert Ledger(ledger.uri, "smoke").ensure_sweep("g", "local") == parent
    assert tc.TAG_SWEEP_ID not in ledger.client.get_experiment(ledger.experiment_id).tags


def test_a_moved_sweep_folder_keeps_its_experiment_and_records_where_it_is(ledger: Ledger) -> None:
    parent = ledger.ensure_sweep("g", "local", "id-a", "/old/runs/smoke")
    assert Ledger(ledger.uri, "smoke").ensure_sweep("g", "local", "id-a", "/new/runs/smoke") == parent
    assert ledger.client.get_experiment(ledger.experiment_id).tags[tc.TAG_SWEEP_ROOT] == "/new/runs/smoke"


def test_an_experiment_created_by_another_sweep_meanwhile_is_refused(ledger: Ledger,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    Ledger(ledger.uri, "smoke").ensure_sweep("g", "local", "id-a", "/runs/a/smoke")
    real = ledger.client.get_experiment_by_name
    calls = iter([None])  # our first lookup ran before the other sweep created the experiment

    monkeypatch.setattr(ledger.client, "get_experiment_by_name", lambda name: next(calls, real(name)))
    with pytest.raises(SweepOwnershipError, match="/runs/a/smoke"):
        ledger.ensure_sweep("g", "local", "id-b", "/runs/b/smoke")


def test_a_deleted_experiment_of_that_name_says_how_to_free_it(ledger: Ledger) -> None:
    ledger.ensure_sweep("g", "local", "id-a", "/runs/smoke")
    eid = ledger.experiment_id
    ledger.client.delete_experiment(eid)
    for call in (lambda lg: lg.check_owner("id-a", "/runs/smoke"),
                 lambda lg: lg.check_owner("id-b", "/other/smoke"),
                 lambda lg: lg.ensure_sweep("g", "local", "id-b", "/other/smoke"),
                 lambda lg: lg.trial_runs()):
        with pytest.raises(LedgerError) as err:
            call(Ledger(ledger.uri, "smoke"))
        assert not isinstance(err.value, SweepOwnershipError)
        msg = str(err.value)
        for needle in ("'smoke'", "deleted", f"mlflow experiments restore --experiment-id {eid}", "mlflow gc",
                       f"--experiment-ids {eid}", "--sweep NAME"):
            assert needle in msg, (needle, msg)


# ---- what the trial job recorded ----------------------------------------------------------------------------------
def test_trial_runs_read_the_code_and_segments_of_each_trial(ledger: Ledger) -> None:
    trials = list(load_grid(SMOKE).trials)[:3]
    ids = ledger.create_trial_runs(ledger.ensure_sweep("g", "local", "id-a", "/r"), trials, "local")
    a, b, c = (t.key for t in trials)
    ledger.tag_runs({ids[a]: {tc.TAG_CODE: "3c079aa,3c079aa", tc.TAG_SEGMENTS: "2"},
                     ids[b]: {tc.TAG_CODE: "3c079aa,c21a890+dirty.9a8b7c6d,3c079aa", tc.TAG_SEGMENTS: "3"}})
    runs = ledger.trial_runs()
    assert (runs[a].code, runs[a].segments, runs[a].mixed_code) == ("3c079aa,3c079aa", 2, False)
    assert runs[a].code_labels == ("3c079aa",)
    assert (runs[b].segments, runs[b].mixed_code) == (3, True)
    assert runs[b].code_labels == ("3c079aa", "c21a890+dirty.9a8b7c6d")
    assert (runs[c].code, runs[c].segments, runs[c].mixed_code, runs[c].code_labels) == ("", 0, False, ())


@pytest.mark.parametrize("code,labels", [("", ()), ("a", ("a",)), (" a , b ,", ("a", "b")), ("b,a,b", ("b", "a"))])
def test_code_labels_are_distinct_in_first_run_order(code: str, labels: tuple[str, ...]) -> None:
    run = TrialRun(run_id="r", key="k", label="l", status=tc.RUNNING, job_id="", backend="local", subgrids="",
                   error="", preemptions=0, code=code, segments=len(labels))
    assert run.code_labels == labels and run.mixed_code == (len(labels) > 1)


def test_the_first_submission_saves_the_view_of_every_wer_column_and_leaves_a_later_one_alone(tmp_path: Path) -> None:
    """Submitting the demo grid: the experiment gets the saved view of wer/test and wer/test-shifted and a description
    line linking to it before any trial ran; a view written since (the report's) survives the next submission."""
    import json

    from asr_core.contract import ledger as sv
    from orchestrate.dispatch.dispatch import eval_dataset_names

    trials = list(load_grid(ROOT / "grids" / "demo.yaml").trials)
    assert eval_dataset_names(trials) == ["test", "test-shifted"]
    ledger = Ledger(default_tracking_uri(tmp_path), "demo")
    ledger.client.create_experiment("demo")
    ledger.client.set_experiment_tag(ledger.client.get_experiment_by_name("demo").experiment_id, sv.NOTE_TAG,
                                     "notes people wrote")
    ledger.ensure_sweep("grids/demo.yaml", "local", datasets=eval_dataset_names(trials))
    tags = ledger.client.get_experiment(ledger.experiment_id).tags
    state = json.loads(json.loads(tags[sv.VIEW_TAG_PREFIX + sv.VIEW_ID])["state"])
    assert state["selectedColumns"] == sv.view_columns(["wer/test", "wer/test-shifted"])
    first, _, rest = tags[sv.NOTE_TAG].partition("\n")
    assert first.startswith(sv.NOTE_START) and sv.view_link(ledger.experiment_id) in first
    assert "orchestrate submit" in first and rest.strip() == "notes people wrote"
    later = sv.saved_view_value(["wer/test"], created_ms=1, now_ms=2)
    ledger.client.set_experiment_tag(ledger.experiment_id, sv.VIEW_TAG_PREFIX + sv.VIEW_ID, later)
    Ledger(ledger.uri, "demo").ensure_sweep("grids/demo.yaml", "local", datasets=["test", "test-shifted"])
    assert ledger.client.get_experiment(ledger.experiment_id).tags[sv.VIEW_TAG_PREFIX + sv.VIEW_ID] == later


def test_a_trial_that_a_later_grid_shares_is_tagged_with_both_sub_grids(ledger: Ledger) -> None:
    """A later ``submit`` of another grid into the sweep that shares a trial (the fragmentation grid's dense models in
    the full demo's sweep) adds its sub-grid to the run's ``trial.subgrids``: the report reads a configuration's
    seeds by family, and a seed tagged with the first grid's sub-grid only would sit apart from the seeds the second
    grid added."""
    trials = list(load_grid(SMOKE).trials)[:2]
    parent = ledger.ensure_sweep("g", "local")
    ids = ledger.create_trial_runs(parent, trials, "local")
    later = [replace(trials[0], subgrids=(*trials[0].subgrids, "dense")), trials[1]]
    assert ledger.create_trial_runs(parent, later, "local") == ids  # no run created
    assert ledger.join_subgrids(later, ledger.trial_runs()) == 1
    runs = ledger.trial_runs()
    assert runs[trials[0].key].subgrids == ",".join((*trials[0].subgrids, "dense"))
    assert runs[trials[1].key].subgrids == ",".join(trials[1].subgrids)  # not in the later grid: as it was
