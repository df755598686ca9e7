"""``lm tune``: grid search of alpha and beta over cached posteriors (pure parts; the command is exercised with a
trained LM in tests/test_lm_train.py's fixtures where one exists)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from asr_core.decoding.beam import BeamConfig
from asr_core.bench.decode import peaked_posteriors
from asr_core.decoding.decode import greedy_ids
from asr_core.lm import TransformerLM, preset
from asr_core.scoring.score import normalise
from asr_core.lm.tune import DevPosteriors, best, grid_search, parse_floats, wer_of

V = 12
TOK = SimpleNamespace(blank_id=V - 1, decode=lambda ids: " ".join(f"word{chr(97 + i)}" for i in ids))


def _dev() -> list[DevPosteriors]:
    out = []
    for seed in range(3):
        probs = peaked_posteriors(40, V, seed=seed)
        ref = normalise(TOK.decode(greedy_ids(probs, V - 1)))
        out.append(DevPosteriors(f"r{seed}", ref, probs))
    return out


def test_grid_covers_every_pair_and_alpha_zero_beta_zero_is_the_search_without_lm() -> None:
    dev = _dev()
    torch.manual_seed(0)
    lm = TransformerLM(preset("tiny", vocab_size=V)).eval()
    rows = grid_search(dev, TOK, lm, BeamConfig(beam_width=4), (0.0, 1.0), (0.0, 3.0), progress=False)
    assert [(r["alpha"], r["beta"]) for r in rows] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    no_lm = grid_search(dev, TOK, None, BeamConfig(beam_width=4), (0.0,), (0.0,), progress=False)
    assert rows[0]["wer"] == no_lm[0]["wer"]
    # the references are the greedy output of peaked posteriors: the plain search finds them
    assert no_lm[0]["wer"] == wer_of(dev, lambda p: greedy_ids(p, V - 1), TOK) == 0.0
    assert best(rows) == min(rows, key=lambda r: (r["wer"], r["alpha"], r["beta"]))


def test_best_prefers_the_simpler_decoder_on_ties_and_bad_grids_are_named() -> None:
    rows = [{"alpha": 0.5, "beta": 1.0, "wer": 10.0}, {"alpha": 0.2, "beta": 2.0, "wer": 10.0},
            {"alpha": 0.2, "beta": 1.0, "wer": 11.0}]
    assert best(rows) == rows[1]
    assert parse_floats("0, 0.5,1", "--alpha") == (0.0, 0.5, 1.0)
    for bad in ("", "a,b", "nan"):
        try:
            parse_floats(bad, "--alpha")
        except ValueError as e:
            assert "--alpha" in str(e)
        else:
            raise AssertionError(f"{bad!r} was accepted")
