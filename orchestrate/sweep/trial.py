"""A trial: one model of a sweep, i.e. a resolved :class:`~asr_core.config.Config` with its seed.

The key is :meth:`Config.key` of the config with ``train.seed`` set: the science only (:mod:`asr_core.contract.identity`).
The same settings reached from two sub-grids (or written differently in YAML) are one trial, and moving the data,
changing loader workers or adding an option between ``submit`` and ``resume`` leaves every key as it was.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from asr_core.config import Config


@dataclass(frozen=True)
class Trial:
    """One unit of work: ``config`` (seed included as ``train.seed``) plus bookkeeping for the ledger."""

    key: str  # Config.key() of ``config``: 12 hex digits (an evaluation job: its evaluation key)
    label: str  # human-readable run name, e.g. ctx82s-rope1.5M-6L768d6h-s2 (unique within a sweep)
    subgrids: tuple[str, ...]  # every sub-grid that produced this trial, in file order
    seed: int
    config: Config
    # an evaluation job of a trained model (asr_core.contract.evaluation.EvaluationSpec.to_dict()); None: training
    evaluation: dict[str, Any] | None = None

    @property
    def model(self) -> str:
        """The key of the model this trial trains, or evaluates."""
        return self.evaluation["model"] if self.evaluation else self.key

    @property
    def is_evaluation(self) -> bool:
        return self.evaluation is not None

    @classmethod
    def make(cls, config: Config, seed: int, subgrid: str) -> "Trial":
        cfg = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=seed))
        return cls(key=cfg.key(), label=trial_label(cfg), subgrids=(subgrid,), seed=seed, config=cfg)

    def to_dict(self) -> dict[str, Any]:
        """JSON form used by ``plan --json``, ``tasks.json`` and the sweep manifest."""
        d = {"key": self.key, "label": self.label, "subgrids": list(self.subgrids), "seed": self.seed,
             "config": self.config.to_dict()}
        if self.evaluation is not None:
            d["evaluation"] = self.evaluation
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trial":
        return cls(key=d["key"], label=d["label"], subgrids=tuple(d["subgrids"]), seed=int(d["seed"]),
                   config=Config.from_stored(d["config"], source=f"trial {d['key']}"), evaluation=d.get("evaluation"))


def _si(x: float) -> str:
    """1.5e6 -> '1.5M', 1e4 -> '10k', 1e7 -> '10M', 500 -> '500'."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:g}{suffix}"
    return f"{x:g}"


# the positional encodings' short names in labels and run names (rotary: rope<theta>)
POSENC_SHORT = {"learnable-fourier": "lfourier", "sinusoidal": "sin", "fourier": "fourier", "none": "nopos"}


def trial_label(cfg: Config) -> str:
    """``ctx{seconds}s-{posenc}-{L}L{d}d{h}h-s{seed}``, the name a person reads in the MLflow UI.

    Context is rounded to whole seconds (81.92 -> 82) as the paper writes it; rotary encodings carry their theta.
    The context-or-fragmentation controls say what they change after the context: ``-band{S}s`` for attention
    banded to S seconds a layer (``model.attention_span_s``), ``-{cut}cut`` for cuts other than fixed ones
    (``data.cut``), e.g. ``ctx82s-band1.08s-rope...``, ``ctx5s-pausescut-rope...``.
    """
    m = cfg.model
    ctx = cfg.data.context_s
    ctx_txt = f"{ctx:.0f}" if ctx >= 1 else f"{ctx:g}"
    pe = f"rope{_si(m.rotary_theta)}" if m.posenc == "rotary" else POSENC_SHORT.get(m.posenc, m.posenc)
    control = (f"-band{m.attention_span_s:g}s" if m.attention_span_s is not None else "") + (
        f"-{cfg.data.cut}cut" if cfg.data.cut != "fixed" else "")
    return f"ctx{ctx_txt}s{control}-{pe}-{m.layers}L{m.d_model}d{m.heads}h-s{cfg.train.seed}"
