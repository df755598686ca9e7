"""Trial identity (asr_core.contract.identity): the key covers the science and nothing about how or where a trial runs."""

from __future__ import annotations

import dataclasses

from asr_core.config import Config, preset, resolve
from asr_core.contract.identity import EXECUTION, science, trial_key


# What the authors' recipe (the defaults since it was adopted) departs from the frozen baseline: the recipe the
# project ran before. Every trial of that recipe has a new key; the old recipe is these fields' baseline values.
RECIPE = {"data.batching": "interleaved", "train.loss_norm": "audio", "data.seqlen_warmup": "code",
          "data.seqlen_warmup_start_s": 5.12, "data.features.variant": "code", "model.batch_renorm_schedule": "code",
          "model.batch_renorm_warmup_steps": 40000, "model.decoder_norm": True, "model.ff_activation": "gelu_tanh",
          "model.ff_bias": False, "train.init_seed": 12345, "train.lr_decay_over": "recordings"}


def test_the_papers_main_model_at_seed_0_departs_only_by_the_authors_recipe() -> None:
    assert science(Config()) == RECIPE
    assert science(preset("main")) == RECIPE
    # the key is SHA-256 of the sorted JSON of the departures, as docs/ARCHITECTURE.md says
    import hashlib
    import json

    def digest(d: dict) -> str:
        return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]

    assert trial_key(Config()) == digest(RECIPE)
    ctx = resolve({"data": {"context_s": 81.92}})
    assert ctx.key() == digest({**RECIPE, "data.context_s": 81.92})
    old = resolve({"data": {"batching": "consecutive", "seqlen_warmup": "paper", "seqlen_warmup_start_s": 5.0,
                            "features": {"variant": "paper"}},
                   "model": {"batch_renorm_schedule": "linear", "batch_renorm_warmup_steps": 25000,
                             "decoder_norm": False, "ff_activation": "silu", "ff_bias": True},
                   "train": {"loss_norm": "tokens", "init_seed": None, "lr_decay_over": "steps"},
                   "eval": {"precision": "fp32"}})
    assert science(old) == {} and old.key() == hashlib.sha256(b"{}").hexdigest()[:12]  # the keys before it


def test_a_config_stored_before_a_field_existed_keeps_the_old_behaviour_and_its_key() -> None:
    """A checkpoint or trials.json written before the recipe fields existed lacks them: reading it gives what the
    project ran then (identity.BASELINE), so the half-trained model resumes as it began, under its own key."""
    d = Config().to_dict()
    old_recipe = {"data": ("batching",), "train": ("loss_norm", "init_seed", "lr_decay_over"),
                  "eval": ("noisy", "precision"),
                  "model": ("batch_renorm_schedule", "decoder_norm", "ff_activation", "ff_bias")}
    for section, fields in old_recipe.items():
        for f in fields:
            del d[section][f]
    d["data"]["seqlen_warmup"], d["data"]["seqlen_warmup_start_s"] = "paper", 5.0
    d["data"]["features"]["variant"], d["model"]["batch_renorm_warmup_steps"] = "paper", 25000
    stored = Config.from_stored(d)
    assert stored.data.batching == "consecutive" and stored.train.loss_norm == "tokens"
    assert stored.model.ff_activation == "silu" and stored.model.ff_bias and not stored.model.decoder_norm
    assert stored.eval.precision == "fp32" and stored.eval.noisy == ()
    assert stored.train.init_seed is None  # the weights from train.seed, as before the field existed
    assert stored.train.lr_decay_over == "steps"
    assert science(stored) == {}
    assert Config.from_dict(d).key() != stored.key()  # read as new, it would be another experiment


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
    assert science(a) == science(b) == {**RECIPE, "data.train": "pods"}
    assert a.key() == b.key()
    # an unnamed corpus is the trials' one corpus, wherever it lies; a named one is another
    unnamed = [resolve({"data": {"train": spec}}) for spec in ("podcast:/a", "podcast:/b", "manifest:/c/x.jsonl")]
    assert len({c.key() for c in unnamed}) == 1 and "data.train" not in science(unnamed[0])
    assert resolve({"data": {"train": "spotify=podcast:/a"}}).key() != unnamed[0].key()


def test_the_model_key_leaves_out_every_evaluation_setting() -> None:
    """A model is trained once: what it is evaluated on, and how, never renames it (issue 28)."""
    base = resolve({"preset": "tiny", "data": {"context_s": 5.12}})
    for ev in ({"datasets": ["test=podcast:/x/test"]}, {"snrs": [0, 5]}, {"stride": 0.5}, {"precision": "fp32"},
               {"noise": "/music/musan.wav"}, {"datasets": ["a=podcast:/a", "b=podcast:/b"], "noisy": ["b"],
                                                "snrs": [10]}):
        other = resolve({"preset": "tiny", "data": {"context_s": 5.12}, "eval": ev})
        assert other.key() == base.key(), ev
        assert not any(k.startswith("eval.") for k in science(other))


def test_an_evaluation_key_is_the_model_key_and_a_digest_of_its_setting() -> None:
    from asr_core.contract.identity import evaluation_key

    k = Config().key()
    a = evaluation_key(k, {"name": "greedy", "conditions": {"test": [None, 5.0]}})
    assert a.startswith(k + "-") and len(a) == len(k) + 9
    assert a == evaluation_key(k, {"conditions": {"test": [None, 5.0]}, "name": "greedy"})  # order-free
    assert a != evaluation_key(k, {"name": "greedy", "conditions": {"test": [None, 10.0]}})


def test_a_field_added_later_uses_its_own_default_as_baseline() -> None:
    Grown = dataclasses.make_dataclass("Grown", [("new_knob", str, dataclasses.field(default="off"))],
                                       bases=(type(Config().train),), frozen=True)
    c = Config()
    grown = dataclasses.replace(c, train=Grown(**dataclasses.asdict(c.train)))
    assert trial_key(grown) == c.key()
    assert trial_key(dataclasses.replace(grown, train=dataclasses.replace(grown.train, new_knob="on"))) != c.key()
