"""``train.init_from``: a trial starts from the trained weights and tokenizer of another trial of its sweep (a
curriculum), with a fresh optimiser, step count and schedule; it is part of the model key; a source that has not
finished, or whose weights do not fit, is refused in one line; a bad value is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr_core.config import ConfigError
from asr_core.contract.folder.trained import mark_trained
from asr_core.contract.trial import TOKENIZER_FILE
from asr_core.training.checkpoint import load_checkpoint
from asr_core.training.train import TrainError, train
from tests.test_train import make_corpus, tiny_cfg

STEPS = {"train.max_steps": 2, "train.warmup_steps": 1, "train.checkpoint_every": 100, "model.vocab_size": 32}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A trained trial in ``sweep/trials/KEY`` with its ``TRAINED`` record, and two corpora: its own and another."""
    root = tmp_path_factory.mktemp("init")
    recs = make_corpus(root / "corpus", 6)
    other = make_corpus(root / "other", 6, seed=7)
    cfg = tiny_cfg(**STEPS)
    trial = root / "sweep" / "trials" / cfg.key()
    result = train(cfg, trial, recordings=recs)
    mark_trained(trial, result.checkpoint, result.steps)
    return {"cfg": cfg, "trial": trial, "recs": recs, "other": other, "state": load_checkpoint(result.checkpoint)}


def _weights(state: dict) -> dict[str, torch.Tensor]:
    """The trained parameters (batch renormalisation's running statistics move with every step, whatever the LR)."""
    return {k: v for k, v in state["model"].items() if v.is_floating_point() and ".running_" not in k}


def test_a_trial_starts_from_the_named_trials_weights_and_tokenizer(source: dict) -> None:
    # a learning rate too small to move a weight (by more than about 3e-6 with Madgrad): the checkpoint after one step
    # holds the initial weights
    cfg = tiny_cfg(**{**STEPS, "train.init_from": source["cfg"].key(), "train.lr": 1e-12, "train.max_steps": 1})
    assert cfg.key() != source["cfg"].key()
    child = source["trial"].parent / cfg.key()
    result = train(cfg, child, recordings=source["other"])  # another corpus: its tokenizer is not trained again
    state = load_checkpoint(result.checkpoint)
    assert state["step"] == 1 and state["tokenizer"] == source["state"]["tokenizer"]
    assert (child / TOKENIZER_FILE).read_bytes() == source["state"]["tokenizer"]
    parent, started = _weights(source["state"]), _weights(state)
    assert all(torch.allclose(parent[k], started[k], atol=1e-4) for k in parent)
    # the control: the same trial from random weights is far from the source's
    fresh = tiny_cfg(**{**STEPS, "train.lr": 1e-12, "train.max_steps": 1})
    alone = _weights(load_checkpoint(train(fresh, child.parent / "fresh", recordings=source["other"]).checkpoint))
    assert not all(torch.allclose(parent[k], alone[k], atol=1e-4) for k in parent)


def test_a_source_that_has_not_finished_training_is_refused_naming_it(source: dict, tmp_path: Path) -> None:
    unfinished = "0123456789ab"
    (tmp_path / unfinished).mkdir()
    cfg = tiny_cfg(**STEPS, **{"train.init_from": unfinished})
    with pytest.raises(TrainError, match=f"train.init_from={unfinished}: the trial in .*{unfinished} has not "
                                         "finished training"):
        train(cfg, tmp_path / cfg.key(), recordings=source["recs"])


def test_weights_that_do_not_fit_the_model_are_refused_in_one_line(source: dict) -> None:
    cfg = tiny_cfg(**STEPS, **{"train.init_from": source["cfg"].key(), "model.d_model": 48})
    with pytest.raises(TrainError, match="weights do not fit this model") as e:
        train(cfg, source["trial"].parent / cfg.key(), recordings=source["recs"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["abc", "0123456789AB", "0123456789abc", "../elsewhere"])
def test_a_value_that_is_not_a_model_key_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid value for 'train.init_from'.*model key"):
        tiny_cfg(**{"train.init_from": value})
