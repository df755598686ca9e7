"""The progress line the local backend prints, read from trial folders as the trial job writes them: structured
records (:class:`asr_core.contract.trial.ProgressLog`), never the text of the trainer's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr_core.contract.trial import ProgressLog, TrialFolder
from orchestrate.sweep.progress import ProgressPrinter, trial_phase


def _started(d: Path) -> TrialFolder:
    """A trial folder as the runner leaves it when the job starts: the log exists, no record yet."""
    folder = TrialFolder(d)
    d.mkdir(parents=True)
    folder.log.write_text("==== 2025-01-01 00:00:00 pid 1: python -m asr_core trial ...\n")
    return folder


def test_phase_follows_the_progress_records(tmp_path: Path) -> None:
    d = tmp_path / "t"
    assert trial_phase(d) is None  # no folder yet
    d.mkdir()
    TrialFolder(d).config.write_text("{}\n")
    assert trial_phase(d) is None  # folder and config.json written at submission: not started
    folder = _started(tmp_path / "t2")
    assert trial_phase(folder.path) == "starting"
    log = ProgressLog(folder.path)
    log.write("start")
    assert trial_phase(folder.path) == "starting"
    log.write("train", 3, 60)
    log.write("train", 4, 60)
    assert trial_phase(folder.path) == "train 4/60"  # the last record wins
    log.write("eval", 2, 5, dataset="test")
    assert trial_phase(folder.path) == "eval test 2/5"
    log.write("preempted")
    assert trial_phase(folder.path) == "preempted"
    log.write("start")  # the requeued job starts again
    log.write("train", 30, 60)
    assert trial_phase(folder.path) == "train 30/60"
    folder.done.write_text("finished\n")
    assert trial_phase(folder.path) == "done"  # DONE means done whatever the last record says


def test_phase_is_never_read_from_the_log_text(tmp_path: Path) -> None:
    folder = _started(tmp_path / "t")
    with folder.log.open("a") as f:
        f.write("[train] step 3/60 loss 4.1\n[eval] test 2/5 test-0001 clean: WER 40.0%\n")
    assert trial_phase(folder.path) == "starting"
    ProgressLog(folder.path).write("train", 1, 60)
    with folder.log.open("a") as f:
        f.write("[train] step 59/60 loss 0.1\n")
    assert trial_phase(folder.path) == "train 1/60"


def test_a_record_being_written_is_skipped(tmp_path: Path) -> None:
    folder = _started(tmp_path / "t")
    ProgressLog(folder.path).write("train", 7, 9)
    with folder.progress.open("a") as f:
        f.write('{"phase": "train", "do')  # the writer is half-way through the next record
    assert trial_phase(folder.path) == "train 7/9"


def test_done_record_counts_as_finished(tmp_path: Path) -> None:
    folder = _started(tmp_path / "t")
    ProgressLog(folder.path).write("done")
    assert trial_phase(folder.path) == "done"


def test_line_counts_finished_running_and_waiting(tmp_path: Path) -> None:
    dirs = {k: tmp_path / k for k in "abcd"}
    _started(dirs["a"]).done.write_text("")
    ProgressLog(_started(dirs["b"]).path).write("train", 7, 9)
    ProgressLog(_started(dirs["c"]).path).write("eval", 4, 12, dataset="test")
    line = ProgressPrinter(dirs, {"b": "ctx5s-s1", "c": "ctx5s-s2"}).line()
    assert line == ("[orchestrate] 1/4 finished, 2 running, 1 waiting: ctx5s-s1 train 7/9, "
                    "ctx5s-s2 eval test 4/12")


def test_line_counts_failed_and_preempted_trials_apart_from_running_ones(tmp_path: Path) -> None:
    dirs = {k: tmp_path / k for k in "abcdefgh"}
    for k in "ab":
        _started(dirs[k]).done.write_text("")
    ProgressLog(_started(dirs["c"]).path).write("train", 30, 60)
    for k, last in (("d", "failed"), ("e", "preempted")):
        log = ProgressLog(_started(dirs[k]).path)
        log.write("train", 5, 60)
        log.write(last)
    labels = {"c": "ctx10s-s1", "d": "ctx10s-s2", "e": "ctx10s-s3"}
    line = ProgressPrinter(dirs, labels).line()
    assert line == ("[orchestrate] 2/8 finished, 1 running, 1 failed, 1 preempted, 3 waiting: ctx10s-s1 train 30/60, "
                    "ctx10s-s2 failed, ctx10s-s3 preempted")

    log = ProgressLog(dirs["e"])
    log.write("start")  # the preempted trial's job runs again
    log.write("train", 6, 60)
    assert ProgressPrinter(dirs, labels).line() == (
        "[orchestrate] 2/8 finished, 2 running, 1 failed, 3 waiting: ctx10s-s1 train 30/60, ctx10s-s3 train 6/60, "
        "ctx10s-s2 failed")


def test_tick_prints_only_when_due_and_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "a"
    log = ProgressLog(_started(d).path)
    log.write("train", 1, 9)
    printer = ProgressPrinter({"a": d}, {"a": "lbl"}, every_s=3600)
    assert printer.tick() is False and capsys.readouterr().err == ""  # not due yet
    printer.every_s = 0
    assert printer.tick() is False
    assert capsys.readouterr().err == "[orchestrate] 0/1 finished, 1 running, 0 waiting: lbl train 1/9\n"
    printer.tick()
    assert capsys.readouterr().err == ""  # unchanged: nothing printed
    log.write("train", 2, 9)
    printer.tick()
    assert capsys.readouterr().err == "[orchestrate] 0/1 finished, 1 running, 0 waiting: lbl train 2/9\n"


def test_phase_text_is_trial_phase_from_what_was_already_read(tmp_path: Path) -> None:
    """``orchestrate status`` reads each folder once and asks :func:`phase_text` for the phase from what it read:
    the same answer as :func:`trial_phase` reading the folder itself."""
    from asr_core.contract.trial import read_progress
    from orchestrate.sweep.progress import phase_text

    folder = _started(tmp_path / "t")
    cases = [lambda: None, lambda: ProgressLog(folder.path).write("train", 3, 9),
             lambda: ProgressLog(folder.path).write("eval", 1, 4, dataset="test"),
             lambda: ProgressLog(folder.path).write("preempted"), lambda: folder.done.write_text("")]
    for change in cases:
        change()
        assert phase_text(folder.done.exists(), read_progress(folder.path), True) == trial_phase(folder.path)
    assert phase_text(False, None, False) is None and phase_text(False, None, True) == "starting"
