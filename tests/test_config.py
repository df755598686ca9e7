"""Config: presets, overrides, validation messages and the stable hash."""

import pytest

from asr_core.config import PRESETS, Config, preset, resolve
from asr_core.config.parse import ConfigError


def test_main_preset_is_the_papers_model():
    c = preset("main")
    assert (c.model.layers, c.model.d_model, c.model.heads) == (6, 768, 6)
    assert c.model.posenc == "rotary" and c.model.rotary_theta == 1.5e6
    assert c.model.vocab_size == 4096 and c.data.batch_audio_s == 3600.0


def test_every_preset_validates():
    for name in PRESETS:
        assert preset(name).model.d_model % preset(name).model.heads == 0


def test_override_changes_one_field_and_the_key():
    c = preset("main")
    d = c.with_overrides(["model.layers=9", "eval.snrs=[-7.5, 0, 10]"])
    assert d.model.layers == 9 and d.eval.snrs == (-7.5, 0.0, 10.0)
    assert d.key() != c.key()
    assert resolve(c.to_dict()).key() == c.key()


def test_key_ignores_spelling_of_numbers():
    a = resolve({"data": {"context_s": 20}})
    b = resolve({"data": {"context_s": 20.0}})
    assert a.key() == b.key()


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.heads=5", "model.heads"),
        ("model.posenc=alibi", "'rotary', 'learnable-fourier', 'sinusoidal', 'fourier', 'none'"),
        ("model.nope=1", "unknown key 'model.nope'"),
        ("data.context_s=-3", "data.context_s"),
        ("train.lr=fast", "train.lr"),
        ("layers=3", "unknown key 'layers'"),
    ],
)
def test_invalid_values_name_the_key_and_what_is_valid(override, needle):
    with pytest.raises(ConfigError, match="valid"):
        preset("main").with_overrides([override])
    with pytest.raises(ConfigError) as e:
        preset("main").with_overrides([override])
    assert needle in str(e.value)


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="9L-768"):
        resolve({"preset": "huge"})


def test_yaml_roundtrip(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("preset: tiny\nmodel:\n  layers: 3\n")
    c = Config.from_yaml(p, ["train.seed=4"])
    assert c.model.layers == 3 and c.train.seed == 4 and c.model.d_model == PRESETS["tiny"]["model"]["d_model"]
    with pytest.raises(ConfigError, match="not found"):
        Config.from_yaml(tmp_path / "missing.yaml")


def test_yaml_exponents_without_a_dot_are_numbers(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 3e-3\n  eps: 1e-6\n")
    c = Config.from_yaml(p, ["model.rotary_theta=1e4"])
    assert c.train.lr == 3e-3 and c.train.eps == 1e-6 and c.model.rotary_theta == 1e4
    j = tmp_path / "c.json"
    j.write_text(__import__("json").dumps(c.to_dict()))
    assert Config.from_yaml(j) == c
