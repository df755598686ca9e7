"""The calibration as the estimate uses it: a calibration file (:mod:`asr_core.contract.calibration`, written by
``python -m asr_core bench calibrate``) read into the numbers of the cost model, and the built-in ones found by name.

A step of ``batch_audio_s`` padded audio in windows of ``L`` seconds takes ``a + b * L`` seconds (``overhead_s``
of it whatever the audio); a measured calibration's departure from that line at its own contexts is kept
(:meth:`Calibration.residual`), and its decoding speed per context (:meth:`Calibration.decode_fps`). The built-in
calibration, ``orchestrate/calibrations/a100-paper.json`` (``"source": "paper 000 Table 1 and training times"``), is
derived in :func:`orchestrate.budget.paper_fit.paper_fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asr_core.contract.calibration import (CalibrationError, CalibrationFile, CalibrationNotFound,
                                           read_calibration)
from orchestrate.assets import calibrations_dir

BUILTIN = calibrations_dir() / "a100-paper.json"  # packaged (orchestrate.assets): the same in a checkout and a wheel
PAPER_SOURCE = "paper 000 Table 1 and training times"


class EstimateError(ValueError):
    """A calibration file or corpus the estimate cannot use; the message names it."""


@dataclass(frozen=True)
class Calibration:
    """What the estimate needs of a calibration file (format: :mod:`asr_core.contract.calibration`)."""

    path: str
    source: str
    device: str
    a: float  # seconds per step of batch_audio_s padded audio at window L: a + b L (overhead included)
    b: float
    overhead_s: float
    batch_audio_s: float
    attention: str  # flash: attention over unpadded windows; sdpa: padded
    macs_linear: float
    macs_attention: float
    params: int
    model: str  # e.g. "main 6L d=768 6H"
    resid: tuple[tuple[float, float], ...]  # (L, measured full-step seconds - fit) at measured contexts
    decode: tuple[tuple[float, float], ...]  # (L, window-frames decoded per second)
    features_s_per_audio_s: float
    music_s_per_audio_s: float
    music_s_per_call: float  # composing the music, per recording and noisy condition
    stats_s_per_audio_s: float
    checkpoint_s: float
    startup_s: float
    num_workers: int
    file: CalibrationFile | None = field(repr=False, compare=False, default=None)

    @property
    def builtin(self) -> bool:
        return self.source == PAPER_SOURCE

    def residual(self, length: float) -> float:
        """A measured calibration's full-step seconds minus its line at window ``length``: interpolated between
        its contexts, the end values beyond them (0 for the built-in one)."""
        if not self.resid:
            return 0.0
        xs = [x for x, _ in self.resid]
        ys = [y for _, y in self.resid]
        return float(np.interp(length, xs, ys))

    def decode_fps(self, length: float) -> float:
        """Window-frames decoded per second at window ``length`` (log-linear between measured contexts)."""
        if len(self.decode) == 1:
            return self.decode[0][1]
        xs = [math.log(x) for x, _ in self.decode]
        ys = [math.log(y) for _, y in self.decode]
        return math.exp(float(np.interp(math.log(length), xs, ys)))


def calibration_from_file(cf: CalibrationFile, path: str) -> Calibration:
    """The cost model's numbers of a calibration file read from ``path``."""
    fit, m, ev, data = cf.train.fit, cf.model, cf.eval, cf.data
    a, b = float(fit.a), float(fit.b)
    resid = [(float(c.context_s), float(c.full_step_s) - (a + b * float(c.context_s))) for c in cf.train.contexts]
    model = f"{cf.preset or ''} {m.layers}L d={m.d_model} {m.heads}H".strip()
    return Calibration(
        path=path, source=str(cf.source if cf.source is not None else ""),
        device=str(cf.device if cf.device is not None else "?"), a=a, b=b, overhead_s=float(cf.train.overhead_s),
        batch_audio_s=float(data.batch_audio_s),
        attention=str(cf.attention if cf.attention is not None else "sdpa"),
        macs_linear=float(m.macs_linear_per_s), macs_attention=float(m.macs_attention_per_s2), params=int(m.params),
        model=model, resid=tuple(sorted(resid)), decode=ev.decode_speeds(),
        features_s_per_audio_s=float(ev.features_s_per_audio_s or 0.0),
        music_s_per_audio_s=float(ev.music_s_per_audio_s or 0.0),
        music_s_per_call=float(ev.music_s_per_call or 0.0),
        stats_s_per_audio_s=float(data.stats_s_per_audio_s or 0.0),
        checkpoint_s=float(cf.checkpoint.save_s), startup_s=float(cf.startup_s),
        num_workers=int(data.num_workers or 0), file=cf)


def calibration_from_dict(raw: Any, path: str) -> Calibration:
    """A :class:`Calibration` from a calibration file's JSON; :class:`EstimateError` naming ``path`` and the field
    when something is missing or wrong."""
    try:
        return calibration_from_file(CalibrationFile.from_dict(raw, path), path)
    except CalibrationError as e:
        raise EstimateError(str(e)) from None


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The calibration in ``path``, or a built-in one by name (packaged; ``orchestrate/calibrations/NAME.json``:
    ``a100-paper``, derived from paper 000 and the default; ``h100-measured``, measured by ``bench calibrate``)."""
    p = Path(path) if path else BUILTIN
    if path and not p.exists() and (BUILTIN.parent / f"{path}.json").is_file():
        p = BUILTIN.parent / f"{path}.json"
    try:
        return calibration_from_file(read_calibration(p), str(p))
    except CalibrationNotFound as e:
        names = ", ".join(sorted(f.stem for f in BUILTIN.parent.glob("*.json")))
        raise EstimateError(f"{e} (built-in calibrations by name: {names})") from None
    except CalibrationError as e:
        raise EstimateError(str(e)) from None
