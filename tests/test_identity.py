"""Trial identity (asr_core.identity): the key covers the science and nothing about how or where a trial runs."""

from __future__ import annotations

import dataclasses

from asr_core.config import Config, preset, resolve
from asr_core.identity import EXECUTION, science, trial_key


def test_the_papers_main_model_at_seed_0_departs_from_nothing() -> None:
    assert science(Config()) == {}
    assert science(preset("main")) == {}
    # the key is SHA-256 of the sorted JSON of the departures, as docs/ARCHITECTURE.md says
    import hashlib

    assert trial_key(Config()) == hashlib.sha256(b"{}").hexdigest()[:12]
    ctx = resolve({"data": {"context_s": 81.92}})
    assert ctx.key() == hashlib.sha256(b'{"data.context_s":81.92}').hexdigest()[:12]


def test_only_departures_from_the_baseline_enter_the_key() -> None:
    c = resolve({"preset": "tiny", "data": {"context_s": 81.92}, "train": {"seed": 2}})
    s = science(c)
    assert s["data.context_s"] == 81.92 and s["train.seed"] == 2 and s["model.layers"] == 2
    assert not set(s) & set(EXECUTION)
    assert "model.d_model" in s and "model.heads" in s and "train.lr" not in s  # tiny's lr is the baseline's


def test_datasets_are_named_not_located() -> None:
    a = resolve({"data": {"train": "pods=podcast:/home/me/podcasts"},
                 "eval": {"datasets": ["test=podcast:/x/test", "dev=podcast:/x/dev"], "snrs": [10, 0],
                          "noise": "/data/music/musan.wav"}})
    b = resolve({"data": {"train": "pods=manifest:/lustre/prepared/podcasts.jsonl"},
                 "eval": {"datasets": ["dev=rev16:/y/dev", "test=podcast:/y/test"], "snrs": [0.0, 10.0],
                          "noise": "/scratch/musan.wav"}})
    assert science(a) == science(b) == {"data.train": "pods", "eval.datasets": ["dev", "test"],
                                        "eval.snrs": [0.0, 10.0], "eval.noise": "file:musan.wav"}
    assert a.key() == b.key()
    # an unnamed corpus is the trials' one corpus, wherever it lies; a named one is another
    unnamed = [resolve({"data": {"train": spec}}) for spec in ("podcast:/a", "podcast:/b", "manifest:/c/x.jsonl")]
    assert len({c.key() for c in unnamed}) == 1 and "data.train" not in science(unnamed[0])
    assert resolve({"data": {"train": "spotify=podcast:/a"}}).key() != unnamed[0].key()
    # a noise file called "synthetic" is not the built-in synthetic music
    assert resolve({"eval": {"noise": "/music/synthetic"}}).key() != Config().key()


def test_a_field_added_later_uses_its_own_default_as_baseline() -> None:
    Grown = dataclasses.make_dataclass("Grown", [("new_knob", str, dataclasses.field(default="off"))],
                                       bases=(type(Config().train),), frozen=True)
    c = Config()
    grown = dataclasses.replace(c, train=Grown(**dataclasses.asdict(c.train)))
    assert trial_key(grown) == c.key()
    assert trial_key(dataclasses.replace(grown, train=dataclasses.replace(grown.train, new_knob="on"))) != c.key()
