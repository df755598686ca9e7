"""Atomic, weights_only checkpoints that rebuild their model alone."""

import os
import pickle

import pytest
import torch

from asr_core.training.checkpoint import CheckpointError, drop_optimizer_state, load_checkpoint, load_for_eval, rng_state, \
    save_checkpoint, set_rng_state
from asr_core.training.step import build_optimizer
from asr_core.config import preset
from asr_core.model.acoustic import build_model
from asr_core.data.tokenizer import Tokenizer


def _state(cfg, model, tok):
    return {"format_version": 1, "config": cfg.to_dict(), "model": model.state_dict(), "tokenizer": tok.to_bytes(),
            "rng": rng_state(), "step": 3}


def test_round_trip_and_load_for_eval(tmp_path) -> None:
    cfg = preset("tiny").with_overrides(["model.vocab_size=40"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    tok = Tokenizer.train(["alpha beta gamma delta", "epsilon zeta eta theta"], 40)
    path = save_checkpoint(tmp_path / "ck.pt", _state(cfg, model, tok))
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]  # no temporary file left behind
    m2, cfg2, tok2 = load_for_eval(path)
    assert cfg2 == cfg and not m2.training and tok2.blank_id == 39
    x = torch.randn(1, 64, 80)
    with torch.no_grad():
        torch.testing.assert_close(m2(x, torch.tensor([64]))[0], model.eval()(x, torch.tensor([64]))[0])


def test_a_trained_models_checkpoint_drops_its_optimizer_state_and_keeps_everything_else(tmp_path) -> None:
    cfg = preset("tiny").with_overrides(["model.vocab_size=40"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.train)
    model(torch.randn(1, 64, 80), torch.tensor([64]))[0].sum().backward()
    opt.step()  # Madgrad now holds state for every parameter
    tok = Tokenizer.train(["alpha beta gamma delta", "epsilon zeta eta theta"], 40)
    path = save_checkpoint(tmp_path / "ck.pt", {**_state(cfg, model, tok), "optimizer": opt.state_dict()})
    before = load_checkpoint(path)
    size = path.stat().st_size
    saved = drop_optimizer_state(path)
    after = load_checkpoint(path)
    assert saved == size - path.stat().st_size and saved > size / 2  # the optimizer was most of the file
    assert "optimizer" not in after and set(after) == set(before) - {"optimizer"}
    assert all(torch.equal(t, after["model"][k]) for k, t in before["model"].items())
    assert drop_optimizer_state(path) == 0 and [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_rng_state_round_trip(tmp_path) -> None:
    import random

    import numpy as np

    save_checkpoint(tmp_path / "r.pt", {"format_version": 1, "config": {}, "model": {}, "tokenizer": b"x",
                                        "rng": rng_state()})
    a = (random.random(), np.random.rand(), torch.rand(1))
    set_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == a


def test_untrusted_pickles_are_refused(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    bad = tmp_path / "evil.pt"
    bad.write_bytes(pickle.dumps({"config": Evil()}))
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"x": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(tmp_path / "other.pt")


def test_failed_save_keeps_the_previous_checkpoint(tmp_path) -> None:
    path = save_checkpoint(tmp_path / "ck.pt", {"format_version": 1, "config": {}, "model": {}, "tokenizer": b"1"})
    with pytest.raises(Exception):
        save_checkpoint(path, {"format_version": 1, "bad": lambda: None})  # cannot be pickled
    assert load_checkpoint(path)["tokenizer"] == b"1" and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_checkpoint_gets_the_mode_the_umask_gives_a_new_file(tmp_path, umask: int) -> None:
    """0666 less the umask, like open(): mkstemp's 0600 kept a teammate's `evaluate` on a shared sweep from reading
    the checkpoints."""
    old = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path / "ck.pt", {"format_version": 1, "config": {}, "model": {}, "tokenizer": b"1"})
        (tmp_path / "plain").write_text("x")
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct((tmp_path / "plain").stat().st_mode & 0o777) == oct(0o666 & ~umask)
