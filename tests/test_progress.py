"""The progress line the local backend prints, read from trial folders as the trainer writes them."""

from pathlib import Path

from orchestrate.progress import ProgressPrinter, trial_phase


def test_phase_follows_the_trial_log(tmp_path: Path) -> None:
    d = tmp_path / "t"
    assert trial_phase(d) is None
    d.mkdir()
    (d / "trial.log").write_text("[train] 0.5M parameters on cpu\n")
    assert trial_phase(d) == "starting"
    with (d / "trial.log").open("a") as f:
        f.write("[train] step 3/60 loss 4.1\n[train] step 4/60 loss 4.0\n")
    assert trial_phase(d) == "train 4/60"
    with (d / "trial.log").open("a") as f:
        f.write("[eval] test 2/5 test-0001 clean: WER 40.0%\n")
    assert trial_phase(d) == "eval test 2/5"
    (d / "DONE").write_text("finished\n")
    assert trial_phase(d) == "done"


def test_line_counts_finished_running_and_waiting(tmp_path: Path) -> None:
    dirs = {k: tmp_path / k for k in "abc"}
    dirs["a"].mkdir()
    (dirs["a"] / "DONE").write_text("")
    dirs["b"].mkdir()
    (dirs["b"] / "trial.log").write_text("[train] step 7/9 loss 1\n")
    line = ProgressPrinter(dirs, {"b": "ctx5s-s1"}).line()
    assert line == "[orchestrate] 1/3 finished, 1 running, 1 waiting: ctx5s-s1 train 7/9"
