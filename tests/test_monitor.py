"""The pure parts of ``status``'s one-screen view (:mod:`orchestrate.status.monitor`): failures grouped by cause, the
trials that matter now, the work and time left, the best trial so far, fitting lines to a screen; and the latest
loss and WERs read from a trial's outbox tail (:mod:`orchestrate.status.trial_metrics`), written by the trainer's own
:class:`~asr_core.runtime.outbox.Outbox`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrate.status.monitor import (best_trial, cause_of, failure_causes, fit_lines, trials_that_matter, work_left)
from orchestrate.status.trial_metrics import trial_metrics
from orchestrate.status.trial_status import TrialStatus

SCHEDULER = " (the scheduler could not be asked: a job may hold it)"


def row(key: str, status: str, reason: str = "", **kw: object) -> TrialStatus:
    base = TrialStatus(key=key, label=f"L-{key}", status=status, reason=reason, failures=0, max_failures=3,
                       gave_up=False, job_id="", held=None, live=status == "RUNNING", lease="", phase=None,
                       segments=1, code=(), pending=0, run_id="")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


# ---- failures by cause ---------------------------------------------------------------------------------------------
def test_a_cause_drops_what_differs_from_trial_to_trial() -> None:
    assert cause_of(row("a", "FAILED", "2/3 failures: killed OUT_OF_MEMORY" + SCHEDULER)) == "killed OUT_OF_MEMORY"
    assert cause_of(row("a", "FAILED", "gave up after 3 failures: killed OUT_OF_MEMORY")) == "killed OUT_OF_MEMORY"
    lost = "segment 2 (job 9000_60) ended without a word; resume asks the scheduler how it ended (1/3 failures so far)"
    assert cause_of(row("a", "LOST", lost)) == ("segment (job) ended without a word; resume asks the scheduler how "
                                                "it ended")
    assert cause_of(row("a", "LOST", "never started, and no job holds it")) == "never started, and no job holds it"
    assert cause_of(row("a", "KILLED", "cancelled; job 12_3 is still checkpointing")) == ("cancelled; job is still "
                                                                                          "checkpointing")
    assert cause_of(row("a", "FAILED", "")) == "failed"


def test_failures_are_grouped_by_state_and_cause_largest_first_with_one_example_each() -> None:
    rows = [row("a", "FAILED", "1/3 failures: killed OUT_OF_MEMORY", failures=1),
            row("b", "FAILED", "gave up after 3 failures: killed OUT_OF_MEMORY", failures=3, gave_up=True),
            row("c", "FAILED", "2/3 failures: failed RuntimeError: loss is nan", failures=2),
            row("d", "LOST", "never started, and no job holds it"),
            row("e", "LOST", "never started, and no job holds it" + SCHEDULER),
            row("f", "LOST", "never started, and no job holds it"),
            row("g", "KILLED", "cancelled"), row("h", "RUNNING", "train 3/10"), row("i", "FINISHED")]
    causes = failure_causes(rows)
    assert [(c.state, c.cause, c.count) for c in causes] == [
        ("LOST", "never started, and no job holds it", 3), ("FAILED", "killed OUT_OF_MEMORY", 2),
        ("FAILED", "failed RuntimeError: loss is nan", 1), ("KILLED", "cancelled", 1)]
    assert causes[1].example.key == "b"  # the one with the most failures
    assert causes[0].example.key == "d"
    assert failure_causes([row("h", "RUNNING"), row("i", "FINISHED")]) == []


# ---- the trials that matter ----------------------------------------------------------------------------------------
def test_the_trials_that_matter_are_the_slowest_running_and_the_newest_failures() -> None:
    running = [row(f"r{i}", "RUNNING", eta_s=float(i * 100)) for i in range(10)] + [row("new", "RUNNING")]
    failed = [row(f"f{i}", "FAILED") for i in range(6)]
    failed_at = {f"f{i}": 1000.0 + i for i in range(6)}
    rows = running + failed + [row("x", "FINISHED"), row("y", "LOST")]

    run, fail = trials_that_matter(rows, 100, failed_at)  # all fit
    assert [r.key for r in run] == [f"r{i}" for i in range(9, -1, -1)] + ["new"]  # slowest first, no rate last
    assert [r.key for r in fail] == [f"f{i}" for i in range(5, -1, -1)]  # newest first

    run, fail = trials_that_matter(rows, 9, failed_at)  # a third of the lines go to failures
    assert [r.key for r in run] == ["r9", "r8", "r7", "r6", "r5", "r4"] and [r.key for r in fail] == ["f5", "f4", "f3"]
    run, fail = trials_that_matter(rows, 1, failed_at)
    assert len(run) + len(fail) == 1 and [r.key for r in fail] == ["f5"]
    run, fail = trials_that_matter(running[:2] + failed, 6, failed_at)  # few running: failures take the rest
    assert len(run) == 2 and len(fail) == 4
    assert trials_that_matter(rows, 0, failed_at) == ([], [])


# ---- work and time left --------------------------------------------------------------------------------------------
def test_time_left_takes_measured_rates_for_running_trials_and_the_recorded_estimate_for_the_rest() -> None:
    rows = [row("run1", "RUNNING", eta_s=3600.0, progress=0.5), row("run2", "RUNNING", eta_s=7200.0, progress=0.2),
            row("wait", "LOST", progress=None), row("half", "PREEMPTED", progress=0.5),
            row("done", "FINISHED", gpu_hours=9.0), row("gone", "KILLED"),
            row("gave", "FAILED", gave_up=True), row("again", "FAILED", progress=0.75)]
    est = {"run1": 10.0, "run2": 10.0, "wait": 10.0, "half": 4.0, "done": 10.0, "gave": 10.0, "again": 8.0}
    w = work_left(rows, est)
    # measured: 1 h + 2 h; estimated: 10 h (not started) + 2 h (half of 4) + 2 h (a quarter of 8)
    assert w.hours == pytest.approx(3.0 + 14.0) and (w.measured, w.estimated, w.unknown) == (2, 3, 0)
    assert w.source == "recorded" and w.parallel == 2
    assert w.wall_s == pytest.approx(17.0 * 3600 / 2) and w.longest_s == pytest.approx(7200.0)

    # no estimate recorded: the finished trials' mean hours stand in
    w = work_left(rows, {})
    assert w.source == "finished" and w.hours == pytest.approx(3.0 + 9.0 + 4.5 + 2.25)
    # a trial the estimate lacks is unknown, not free
    assert work_left(rows, {"run1": 1.0}).unknown == 3
    # the longest running trial bounds the wall time from below
    w = work_left([row("a", "RUNNING", eta_s=36000.0), row("b", "RUNNING", eta_s=60.0)], {})
    assert w.wall_s == pytest.approx(36000.0)
    # nothing runs: the hours are known, the wall time is not
    w = work_left([row("a", "LOST"), row("d", "FINISHED", gpu_hours=2.0)], {})
    assert w.wall_s is None and w.hours == pytest.approx(2.0)
    w = work_left([row("a", "LOST")], {})
    assert (w.unknown, w.source, w.wall_s) == (1, "", None)


# ---- best so far, and fitting a screen -----------------------------------------------------------------------------
def test_the_best_trial_is_the_finished_one_with_the_lowest_mean_wer() -> None:
    rows = [row("a", "FINISHED"), row("b", "FINISHED"), row("c", "RUNNING"), row("d", "FINISHED")]
    wers = {"a": {"dev": 10.0, "test": 12.0}, "b": {"dev": 9.0, "test": 14.0}, "c": {"dev": 1.0}}
    best = best_trial(rows, wers)
    assert best is not None and best.row.key == "a" and best.wer == pytest.approx(11.0)
    assert best.datasets == ("dev", "test") and best.of == 2  # the running one does not count
    assert best_trial(rows, {"c": {"dev": 1.0}}) is None


def test_lines_are_fitted_to_a_screen_with_a_marker_for_the_rest() -> None:
    lines = [f"line {i}" for i in range(10)]
    assert fit_lines(lines, 10) == lines
    assert fit_lines(lines, 4) == ["line 0", "line 1", "line 2", "… 7 more lines (--all)"]
    assert fit_lines(["x" * 20, "short"], 5, width=10) == ["xxxxxxxxx…", "short"]


# ---- metrics from the outbox ---------------------------------------------------------------------------------------
def test_the_latest_loss_and_the_clean_greedy_wers_come_from_the_outbox_tail(tmp_path: Path) -> None:
    from asr_core.runtime.outbox import Outbox

    assert trial_metrics(tmp_path) == trial_metrics(tmp_path / "none")  # no outbox: nothing known
    assert trial_metrics(tmp_path).loss is None and trial_metrics(tmp_path).wer is None
    box = Outbox(tmp_path, segment=1, run_id=None)
    try:
        for step in range(1, 2001):
            box.metrics(step, {"train/loss": 100.0 / step, "train/lr": 0.003}, time_ms=step)
        box.metrics(2000, {"wer/dev": 10.0, "wer/test": 20.0, "wer/test/snr5": 50.0, "wer_beam/dev": 1.0},
                    time_ms=3000, first_only=False)
    finally:
        box.close()
    m = trial_metrics(tmp_path, tail_bytes=4096)  # the tail alone
    assert m.loss == pytest.approx(100.0 / 2000) and m.step == 2000
    assert m.wers == {"dev": 10.0, "test": 20.0} and m.wer == pytest.approx(15.0)
