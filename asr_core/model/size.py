"""``python -m asr_core params CONFIG.yaml [--set k=v ...]``: parameter counts per module and in total.

CONFIG may also be a preset name (``main``, ``9L-768``, ...). The model is built on the ``meta`` device, so even
the 315M-parameter family is counted instantly without allocating its weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from asr_core.config import PRESETS, Config, preset
from asr_core.config.parse import ConfigError
from asr_core.model.acoustic import build_model, count_parameters
from asr_core.model.receptive import receptive_field


def load_config(spec: str, overrides: list[str]) -> Config:
    """A YAML file path, or a preset name."""
    if Path(spec).exists():
        return Config.from_yaml(spec, overrides)
    if spec in PRESETS:
        return preset(spec).with_overrides(overrides)
    raise ConfigError(f"{spec!r} is neither a config file nor a preset; presets: {', '.join(sorted(PRESETS))}")


def parameter_table(cfg: Config) -> dict[str, int]:
    with torch.device("meta"):
        model = build_model(cfg.model, cfg.data.features.n_mels, cfg.data.features.frames_per_second)
    return count_parameters(model)


def run_cli(args: argparse.Namespace) -> int:
    """``python -m asr_core params ...`` as parsed by :func:`asr_core.model.params_args.parser`: the counts printed
    (exit 2 and one line for a bad config)."""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = parameter_table(cfg)
    m = cfg.model
    print(f"{m.layers} layers, d={m.d_model}, {m.heads} heads, vocab {m.vocab_size}, posenc {m.posenc}")
    print(receptive_field(cfg).describe())
    width = max(len(k) for k in table)
    for name, n in table.items():
        if name == "total":
            print("-" * (width + 16))
        print(f"{name:<{width}}  {n:>12,d}")
    print(f"{'':<{width}}  {table['total'] / 1e6:>11.1f}M")
    return 0
