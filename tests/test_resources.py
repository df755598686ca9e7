"""Per-trial resources (``orchestrate/budget/resources.py``): each trial's time limit from its estimate, capped,
``--time-min`` for backfill, memory from the model and the loader; trials grouped into arrays by what they ask.

Pure rules and profile validation without a cluster; on the session's real SLURM cluster, a long-context trial's
array task is submitted with a longer ``TimeLimit`` than a short one's (read back from ``scontrol show job``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrate.backends.base import Job
from orchestrate.plan.profile import (BackendError, Profile, format_minutes, load_profile, parse_minutes,
                                      time_limit_minutes)
from orchestrate.budget.resources import Resources, group_by_resources, memory_gb, trial_resources
from orchestrate.plan.grid import load_grid
from orchestrate.sweep.folder import SweepDir

REPO = Path(__file__).resolve().parents[1]

# the main model at the paper grid's shortest and longest context, on a training corpus that is not on disk here
# (the estimate assumes the paper's: 58k hours), so the built-in A100 calibration gives them 15 h and ~58 h
GRID = """
name: limits
seeds: [1]
base:
  preset: main
  data: {{train: "podcast:{train}", context_s: 10.24}}
subgrids:
  ctx:
    axes:
      data.context_s: [10.24, 3600]
"""


def _grid(tmp_path: Path):  # noqa: ANN202
    p = tmp_path / "grid.yaml"
    p.write_text(GRID.format(train=tmp_path / "not-here"))
    return load_grid(p)


def test_durations_parse_and_print_as_slurm_writes_them() -> None:
    assert parse_minutes("48:00:00") == 2880
    assert parse_minutes("2-00:00:00") == 2880
    assert parse_minutes("00:10:30") == 11  # seconds round up
    assert parse_minutes(90) == 90
    assert format_minutes(2880) == "2-00:00:00" and format_minutes(1140) == "19:00:00"
    for bad in ("abc", "-5", "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_minutes(bad)


def test_time_limit_is_the_estimate_with_margin_rounded_up_and_capped() -> None:
    assert time_limit_minutes(13.6, 1.25, 2880, 120) == 17 * 60  # 17.0 h exactly
    assert time_limit_minutes(13.7, 1.25, 2880, 120) == 18 * 60  # 17.1 h -> 18 h
    assert time_limit_minutes(15.2, 1.25, 2880, 120) == 19 * 60
    assert time_limit_minutes(57.6, 1.25, 2880, 120) == 2880  # capped at 48 h
    assert time_limit_minutes(57.6, 1.25, None, 120) == 72 * 60  # no cap
    assert time_limit_minutes(0.001, 1.25, None, 120) == 60  # at least an hour
    assert time_limit_minutes(0.001, 1.0, None, 7200) == 180  # longer than the USR2 delay with time to train


def test_memory_grows_with_model_loader_threads_and_longest_recording() -> None:
    base = memory_gb(90_000_000, 7, 3600, 10.24, 4 * 3600, True)
    assert memory_gb(900_000_000, 7, 3600, 10.24, 4 * 3600, True) > base
    assert memory_gb(90_000_000, 15, 3600, 10.24, 4 * 3600, True) > base
    assert memory_gb(90_000_000, 7, 3600, 10.24, 3600, True) < base
    assert memory_gb(90_000_000, 7, 3600, 10.24, 4 * 3600, False) < base  # no whole-recording statistics reads
    # a window longer than a step's audio is held whole
    assert memory_gb(90_000_000, 7, 600, 3600, 3600, False) > memory_gb(90_000_000, 7, 600, 600, 3600, False)
    assert 16 <= base <= 64  # the paper's setting fits the a100 profile's 64 GB


def test_rules_give_long_contexts_more_time_and_group_the_arrays(tmp_path: Path) -> None:
    grid = _grid(tmp_path)
    short, long_ = sorted(grid.trials, key=lambda t: t.config.data.context_s)
    prof = Profile(time_limit="estimate", time_margin=1.25, time_min="04:00:00", mem_gb="estimate",
                   cpus_per_task=8)
    res = trial_resources([short, long_], prof, cap_min=None)
    assert 15 * 60 <= res[short.key].time_min <= 22 * 60, res[short.key]
    assert res[long_.key].time_min > res[short.key].time_min + 30 * 60
    assert res[short.key].start_min == 240 and res[long_.key].start_min == 240
    assert res[short.key].mem_mb > 8 * 1024 and "estimate" in res[short.key].why
    capped = trial_resources([short, long_], Profile(time_limit="estimate", time_max="40:00:00"))
    assert capped[long_.key].time_min == 2400 and "(the cap)" in capped[long_.key].why
    partition = trial_resources([short, long_], Profile(time_limit="estimate"), cap_min=1800)
    assert partition[long_.key].time_min == 1800
    # fixed values: every trial the same; a time_min not below the limit is left out
    fixed = trial_resources([short, long_], Profile(time_limit="10:00:00", time_min="12:00:00", mem_gb=2))
    assert set(fixed.values()) == {Resources(600, 0, 2048, fixed[short.key].why)}
    jobs = [Job(long_, "r1", tmp_path), Job(short, "r2", tmp_path), Job(long_, "r3", tmp_path)]
    groups = group_by_resources(jobs, res)
    assert [[j.run_id for j in g] for _, g in groups] == [["r2"], ["r1", "r3"]]  # shortest first, order kept


def test_an_evaluation_job_asks_the_time_of_its_decoding_not_of_its_models_training(tmp_path: Path) -> None:
    """Under ``time_limit: estimate`` an evaluation job of the 10 s main model asks for its greedy decoding of
    TED-LIUM (2.6 h, known by name) at two conditions, not its model's 15 h of training; a beam decoder, or a test
    set of unknown size, gets the cap; with no cap that is refused, naming the job."""
    from orchestrate.plan.evaluations import evaluation_trial

    short = min(_grid(tmp_path).trials, key=lambda t: t.config.data.context_s)
    sweep = SweepDir(tmp_path / "runs", "s")
    ted = {"tedlium": f"tedlium=tedlium:{tmp_path / 'not-here'}"}
    greedy = evaluation_trial(sweep, short, "greedy", {"decoder": "greedy"}, {"tedlium": (None, 5.0)}, ted)
    beam = evaluation_trial(sweep, short, "b1", {"decoder": "beam"}, {"tedlium": (None,)}, ted, decoder={"beta": 1})
    unknown = evaluation_trial(sweep, short, "greedy", {"decoder": "greedy"}, {"gone": (None,)},
                               {"gone": f"gone=podcast:{tmp_path / 'gone'}"})
    prof = Profile(time_limit="estimate", time_margin=1.25, time_max="40:00:00")
    res = trial_resources([short, greedy, beam, unknown], prof)
    assert res[greedy.key].time_min < res[short.key].time_min / 4, (res[greedy.key], res[short.key])
    assert "evaluation estimate" in res[greedy.key].why
    assert res[beam.key].time_min == res[unknown.key].time_min == 2400 and "the cap" in res[beam.key].why
    with pytest.raises(Exception, match=f"evaluation job {re.escape(beam.label)}.*time_max"):
        trial_resources([beam], Profile(time_limit="estimate"), cap_min=None)


@pytest.mark.parametrize("body,names", [
    ("time_limit: soon\n", "time_limit"),
    ("time_limit: estimate\ntime_max: later\n", "time_max"),
    ("time_min: 1:2:3:4\n", "time_min"),
    ("mem_gb: lots\n", "mem_gb"),
    ("time_margin: 0.5\n", "time_margin"),
    ("calibration: nowhere.json\n", "calibration"),
])
def test_profile_rules_are_validated_naming_file_and_key(tmp_path: Path, body: str, names: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(BackendError, match=rf"{re.escape(str(p))}.*{names}"):
        load_profile(str(p))


def test_shipped_backfill_profile_plans_the_paper_grid(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrate.cli.commands import main

    prof = load_profile("a100-backfill")
    assert prof.time_rule and prof.time_max == "48:00:00" and prof.mem_gb == "estimate"
    assert main(["plan", str(REPO / "grids" / "paper.yaml"), "--estimate", "--profile", "a100-backfill",
                 "--trials"]) == 0
    out = capsys.readouterr().out
    assert "its estimate x 1.25" in out
    limits = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(ctx(?:10|3600)s-rope1\.5M-6L768d6h-s1)\s.*?\s(\d+(?:\.\d+)?)\s+\d+\s*$", out, re.M)}
    assert limits["ctx10s-rope1.5M-6L768d6h-s1"] < 24 and limits["ctx3600s-rope1.5M-6L768d6h-s1"] == 48


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_long_context_task_asks_more_time_than_a_short_one(slurm_cluster, tmp_path: Path,  # noqa: ANN001
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrate.backends.slurm import SlurmBackend

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    grid = _grid(tmp_path)
    sweep = SweepDir(tmp_path / "runs", "limits")
    # submitted held: only what the tasks ask is looked at, nothing runs
    profile = Profile(name="rules", partition="gpu", account="asr", cpus_per_task=1, time_limit="estimate",
                      time_min="04:00:00", mem_gb=1, additional=(("hold", True),))
    backend = SlurmBackend(sweep, "sqlite:///unused.db", profile)
    backend.validate()
    jobs = [Job(t, f"run-{i}", sweep.trial_dir(t.key)) for i, t in enumerate(grid.trials)]
    ids: dict[str, str] = {}
    try:
        backend.submit(jobs, ids.update)
        short, long_ = sorted(grid.trials, key=lambda t: t.config.data.context_s)
        shown = {k: slurm_cluster.run("scontrol", "show", "job", ids[k]).stdout for k in (short.key, long_.key)}
    finally:
        slurm_cluster.cancel_all()
    limit = {k: parse_minutes(re.search(r"\bTimeLimit=(\S+)", s).group(1)) for k, s in shown.items()}
    start = {k: re.search(r"\bTimeMin=(\S+)", s).group(1) for k, s in shown.items()}
    assert limit[long_.key] > limit[short.key] >= 15 * 60, limit
    assert limit[long_.key] >= 60 * 60  # the test partition has no MaxTime: the estimate is not capped
    assert all(parse_minutes(v) == 240 for v in start.values()), start
    assert len(sweep.submissions()) == 2  # one array per (limit, time-min, memory)


def test_an_unquoted_duration_in_a_profile_is_a_duration_not_a_base60_number(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1:30:00`` as the integer 5400, which the limit would take as 5400 minutes (90 h)."""
    p = tmp_path / "unquoted.yaml"
    p.write_text("time_limit: 1:30:00\ntime_min: 0:45:00\nmax_parallel: 4\n")
    prof = load_profile(str(p))
    assert prof.time_limit_min() == 90 and parse_minutes(prof.time_min) == 45 and prof.max_parallel == 4


@pytest.mark.parametrize("kw,needs", [({"time_limit": "estimate"}, "time_max"), ({"mem_gb": "estimate"}, "mem_gb")])
def test_ray_slurm_refuses_per_trial_rules_it_cannot_honour(tmp_path: Path, kw: dict, needs: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrate.backends import ray_slurm, slurm_commands

    monkeypatch.setattr(slurm_commands, "check_cluster", lambda profile: None)  # no cluster needed to refuse
    backend = ray_slurm.RaySlurmBackend(SweepDir(tmp_path / "runs", "r"), "sqlite:///unused.db",
                                        Profile(name="rules", **kw))
    with pytest.raises(BackendError, match=needs):
        backend.validate()
