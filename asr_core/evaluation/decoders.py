"""The decoders of an evaluation, as plug-ins.

Each recording and condition (clean, or music at an SNR) is decoded once into posteriors by the moving-window
model (:func:`asr_core.decoding.decode.posteriors`; :func:`asr_core.evaluation.dataset.evaluate_dataset`), and what
that pass heard (:class:`Heard`) goes to each decoder of the evaluation, an object with

* ``name``: the decoder's name in metric keys, table names and tags (:mod:`asr_core.contract.metrics`);
* ``keeps_windows``: whether it needs each window's own output, kept during the averaging pass (window fusion);
* ``text(heard)`` → the hypothesis and what the log line adds (``""``, or ``", 12 windows"``);
* ``setting(stride, context_s)`` → the run's tag ``eval.decoder.<name>`` as a dict (None: no tag).

The decoders: greedy CTC (:class:`GreedyDecoder`, always first, the trial's own); beam search from the same
posteriors, with an LM or without (:class:`BeamDecoding`, paper 004; built from the command line's options by
:func:`beam_decoding`); the window fusion methods (:class:`FusionDecoder`, paper 001); a greedy decoder at another
window than the model's context (:class:`WindowDecoder`, ``window-<W:g>s``), which decodes posteriors of its own
made the same way with its window. :data:`asr_core.evaluation.registry.DECODERS` makes an evaluation's list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asr_core.contract.metrics import GREEDY, cue_metric_key, fusion_decoder, is_decoder_name, metric_key
from asr_core.decoding.beam import BeamConfig, beam_search
from asr_core.decoding.decode import WindowBatch, greedy_ids, plan_windows, posteriors
from asr_core.decoding.fused import WindowIds, fused_texts
from asr_core.decoding.fusion import tokenizer_pieces
from asr_core.device import resolve_device
from asr_core.training.checkpoint import read_header


@dataclass(frozen=True)
class Setup:
    """How the model decodes: the model, its feature extractor and tokenizer, its window (input frames) and the
    stride (a fraction of it), the window batch, the subsampling factor, the feature frame rate, the device and the
    precision (``fp32`` or ``bf16``)."""

    model: Any
    extractor: Any
    tokenizer: Any
    window: int
    stride: float
    batch: WindowBatch
    subsampling: int
    fps: float
    device: Any
    precision: str = "fp32"
    context_s: float = 0.0


@dataclass
class Heard:
    """What the averaging pass made of one recording and condition: its features ``(T, n_mels)``, the averaged
    posteriors ``(T', vocab)`` and, when a decoder keeps them, each window's own output (``windows``)."""

    feats: torch.Tensor
    probs: torch.Tensor
    setup: Setup
    windows: WindowIds | None = None


class GreedyDecoder:
    """Greedy CTC of the averaged posteriors: the trial's own decoder, first in every evaluation."""

    name = GREEDY
    keeps_windows = False

    def text(self, heard: Heard) -> tuple[str, str]:
        tok = heard.setup.tokenizer
        return tok.decode(greedy_ids(heard.probs, tok.blank_id)), ""

    def setting(self, stride: float, context_s: float) -> dict[str, str] | None:
        return None


@dataclass(frozen=True)
class BeamDecoding:
    """Beam search (with an LM or without) as an evaluation's decoder: its results are logged as
    ``wer_<name>/<NAME>[/snr<DB>]`` and ``eval/<NAME>.<name>.csv`` beside the greedy ones, and ``describe`` (the
    LM checkpoint, its fingerprint, alpha, beta, ...) as the run's tag ``eval.decoder.<name>``.
    ``lm``: an :class:`asr_core.decoding.beam.LanguageModel` (None: no LM); ``prompt``: token ids the LM reads first."""

    config: BeamConfig
    lm: Any = None
    prompt: tuple[int, ...] = ()
    name: str = "beam"
    describe: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not is_decoder_name(self.name):
            raise ValueError(f"decoder name {self.name!r}: letters, digits, '-', '_' and '.' only, not 'greedy'")

    def metric_key(self, dataset: str, snr_db: float | None = None) -> str:
        return metric_key(dataset, snr_db, self.name)

    def cue_metric_key(self, dataset: str, snr_db: float | None = None) -> str:
        return cue_metric_key(dataset, snr_db, self.name)

    def decode(self, probs: torch.Tensor, blank: int) -> Any:
        return beam_search(probs, blank=blank, lm=self.lm, config=self.config, prompt=self.prompt)

    keeps_windows = False

    def text(self, heard: Heard) -> tuple[str, str]:
        tok = heard.setup.tokenizer
        return tok.decode(list(self.decode(heard.probs, tok.blank_id).ids)), ""

    def setting(self, stride: float, context_s: float) -> dict[str, str] | None:
        return dict(self.describe)


def beam_decoding(decoder: str, *, lm_path: Path | None = None, alpha: float | None = None,
                  beta: float | None = None, beam_width: int | None = None, lm_context: int | None = None,
                  prompt: Path | None = None, name: str | None = None, tokenizer_of: Path | None = None,
                  device: str = "auto") -> BeamDecoding | None:
    """The :class:`BeamDecoding` the command line asks for (None for greedy); errors name the option and file.
    The LM must have been trained with the acoustic checkpoint's tokenizer (``tokenizer_of``)."""
    if decoder == GREEDY:
        if any(v is not None for v in (lm_path, alpha, beta, beam_width, lm_context, prompt, name)):
            raise ValueError("--lm, --lm-weight, --token-bonus, --beam-width, --lm-context, --prompt and "
                             "--decoder-name go with --decoder beam")
        return None
    base = BeamConfig(alpha=BeamConfig().alpha if lm_path is not None else 0.0)  # without an LM, alpha means nothing
    kw = {k: v for k, v in (("alpha", alpha), ("beta", beta), ("beam_width", beam_width),
                            ("lm_context", lm_context)) if v is not None}
    if lm_path is None and alpha is not None:
        raise ValueError("--lm-weight weighs the LM: it goes with --lm")
    cfg = BeamConfig(**{**{f: getattr(base, f) for f in ("alpha", "beta", "beam_width", "lm_context",
                                                          "prune_threshold", "token_threshold")}, **kw})
    lm, describe, ids = None, {"alpha": f"{cfg.alpha:g}", "beta": f"{cfg.beta:g}", "beam_width": str(cfg.beam_width),
                               "lm_context": str(cfg.lm_context)}, ()
    if lm_path is not None:
        from asr_core.lm.checkpoint import load_lm

        if not Path(lm_path).is_file():
            raise FileNotFoundError(f"--lm {lm_path} not found")
        loaded = load_lm(lm_path, resolve_device(device))
        lm, lm_tok = loaded.model, loaded.tokenizer
        if tokenizer_of is not None:
            ck = read_header(tokenizer_of)
            if bytes(ck["tokenizer"]) != lm_tok.to_bytes():
                raise ValueError(f"LM {lm_path} was trained with another tokenizer than acoustic checkpoint "
                                 f"{tokenizer_of}: retrain it with `lm train --tokenizer {tokenizer_of}`")
        describe.update({"lm": str(Path(lm_path).resolve()), "lm_step": str(loaded.step),
                         "lm_run": str(loaded.mlflow_run_id or "")})
        if prompt is not None:
            if not prompt.is_file():
                raise FileNotFoundError(f"--prompt {prompt} not found")
            ids = tuple(lm_tok.encode(" ".join(prompt.read_text().split())))
            describe["prompt"] = str(prompt.resolve())
    elif prompt is not None:
        raise ValueError("--prompt needs --lm")
    else:
        describe["lm"] = "none"
    default_name = "beam" if lm is None else f"beam-lm{cfg.lm_context}"
    return BeamDecoding(cfg, lm, ids, name or default_name, tuple(sorted(describe.items())))


def check_lm_vocabulary(beam: BeamDecoding, tokenizer: Any) -> None:
    """The LM must read the acoustic model's ids: same vocabulary size (its own tokenizer, when it says, the same)."""
    if beam.lm is None:
        return
    cfg = getattr(beam.lm, "cfg", None)
    if cfg is not None and getattr(cfg, "vocab_size", tokenizer.vocab_size) != tokenizer.vocab_size:
        raise ValueError(f"the LM reads {cfg.vocab_size} token ids but the acoustic model's tokenizer has "
                         f"{tokenizer.vocab_size}: train the LM with this model's tokenizer (lm train --tokenizer CKPT)")


class FusionDecoder:
    """A window fusion method of paper 001 (:mod:`asr_core.decoding.fused`) over the averaging pass's windows, as
    the decoder ``fusion-<METHOD>``; its tag: :func:`fusion_setting`."""

    keeps_windows = True

    def __init__(self, method: str) -> None:
        self.method = method
        self.name = fusion_decoder(method)  # raises naming the valid methods
        self._pieces: tuple[Any, list] | None = None

    def text(self, heard: Heard) -> tuple[str, str]:
        s = heard.setup
        if self._pieces is None or self._pieces[0] is not s.tokenizer:
            self._pieces = (s.tokenizer, tokenizer_pieces(s.tokenizer))
        return fused_texts(heard.windows, (self.method,), window=s.window, stride=s.stride, tokenizer=s.tokenizer,
                           pieces=self._pieces[1], fps=s.fps)[self.method], ""

    def setting(self, stride: float, context_s: float) -> dict[str, str] | None:
        return fusion_setting(self.method, stride)


def fusion_setting(method: str, stride: float) -> dict[str, str]:
    """The tag ``eval.decoder.fusion-<METHOD>`` describing how the method ran (strings, as a beam decoder's)."""
    from asr_core.decoding.fused import CHIU_CONFIDENCE, ROVER_PHASES, window_stride

    how = {"blockwise": {"join": "words"}, "blockwise-frames": {"join": "frames"},
           **{m: {"confidence": c} for m, c in CHIU_CONFIDENCE.items()},
           "rover": {"phases": str(ROVER_PHASES), "vote": "meth1"}}
    return {"method": method, "stride": f"{window_stride(method, stride):g}", "decoding": "greedy",
            **how.get(method, {})}


class WindowDecoder:
    """Greedy CTC at another window than the model's context, ``seconds`` long (``frames`` input frames), averaged at
    the same stride, as the decoder ``window-<W:g>s`` (the context-or-fragmentation control)."""

    keeps_windows = False

    def __init__(self, name: str, seconds: float, frames: int) -> None:
        self.name, self.seconds, self.frames = name, seconds, frames

    def text(self, heard: Heard) -> tuple[str, str]:
        s = heard.setup
        text, ran = greedy_at(s.model, heard.feats, self.frames, s.stride, s.batch, s.subsampling, s.device,
                              s.precision, s.tokenizer)
        return text, f", {ran} windows"

    def setting(self, stride: float, context_s: float) -> dict[str, str] | None:
        return {"window_s": f"{self.seconds:g}", "stride": f"{stride:g}", "decoding": "greedy",
                "trained_context_s": f"{context_s:g}"}


def greedy_at(model, feats: torch.Tensor, window: int, stride: float, batch: WindowBatch, sub: int,
              dev: torch.device, precision: str, tokenizer) -> tuple[str, int]:
    """Greedy CTC of one recording's features decoded with moving windows of ``window`` input frames (not the
    model's context), averaged at ``stride`` as :func:`~asr_core.decoding.decode.posteriors` averages: the text and
    the windows run (:func:`~asr_core.decoding.decode.plan_windows`'s, as :func:`posteriors` runs them)."""
    probs = posteriors(model, feats, window, stride=stride, batch_windows=batch, subsampling=sub, device=dev,
                       precision=precision)
    ran = len(plan_windows(feats.shape[0], window, stride, sub).starts)
    return tokenizer.decode(greedy_ids(probs, tokenizer.blank_id)), ran
