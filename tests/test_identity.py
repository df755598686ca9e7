"""Trial identity (asr_core.identity): the key covers the science and nothing about how or where a trial runs."""

from __future__ import annotations

import dataclasses

from asr_core.config import Config, preset, resolve
from asr_core.identity import BASELINE, EXECUTION, execution_changes, science, trial_key


def test_the_papers_main_model_at_seed_0_departs_from_nothing() -> None:
    assert science(Config()) == {}
    assert science(preset("main")) == {}
    assert trial_key(Config()) == Config().key()


def test_only_departures_from_the_baseline_enter_the_key() -> None:
    c = resolve({"preset": "tiny", "data": {"context_s": 81.92}, "train": {"seed": 2}})
    s = science(c)
    assert s["data.context_s"] == 81.92 and s["train.seed"] == 2 and s["model.layers"] == 2
    assert not set(s) & set(EXECUTION)
    assert all(s[k] != BASELINE[k] for k in s)


def test_datasets_are_named_not_located() -> None:
    a = resolve({"data": {"train": "podcast:/home/me/podcasts"},
                 "eval": {"datasets": ["test=podcast:/x/test", "dev=podcast:/x/dev"], "snrs": [10, 0],
                          "noise": "/data/music/musan.wav"}})
    b = resolve({"data": {"train": "manifest:/lustre/prepared/podcasts.jsonl"},
                 "eval": {"datasets": ["dev=rev16:/y/dev", "test=podcast:/y/test"], "snrs": [0.0, 10.0],
                          "noise": "/scratch/musan.wav"}})
    assert science(a) == science(b) == {"data.train": "podcasts", "eval.datasets": ["dev", "test"],
                                        "eval.snrs": [0.0, 10.0], "eval.noise": "musan.wav"}
    assert a.key() == b.key()
    renamed = resolve({"data": {"train": "spotify=podcast:/home/me/podcasts"}})
    assert renamed.key() != resolve({"data": {"train": "podcast:/home/me/podcasts"}}).key()


def test_execution_changes_lists_what_differs() -> None:
    a = preset("tiny")
    b = a.with_overrides(["data.num_workers=4", "data.train=podcast:/new/train"])
    assert execution_changes(a, b) == {"data.num_workers": (0, 4), "data.train": ("", "podcast:/new/train")}
    assert execution_changes(a, a) == {}


def test_a_field_added_later_uses_its_own_default_as_baseline() -> None:
    Grown = dataclasses.make_dataclass("Grown", [("new_knob", str, dataclasses.field(default="off"))],
                                       bases=(type(Config().train),), frozen=True)
    c = Config()
    grown = dataclasses.replace(c, train=Grown(**dataclasses.asdict(c.train)))
    assert trial_key(grown) == c.key()
    assert trial_key(dataclasses.replace(grown, train=dataclasses.replace(grown.train, new_knob="on"))) != c.key()
