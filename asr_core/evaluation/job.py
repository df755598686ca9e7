"""The stage an evaluation job runs in place of training (:mod:`asr_core.contract.evaluation`).

``python -m asr_core trial`` runs it when its folder holds ``evaluation.json``: the trial job's lease, segments,
attempts, progress, signals and outbox all apply, but it trains nothing, writes nothing into the model's folder, and
tells the model's run only metrics, tags and tables (never its status).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from asr_core.runtime import signals
from asr_core.contract.evaluation import EvaluationSpec, evaluation_tag, read_evaluation
from asr_core.contract.trial import TrialFolder, trained_checkpoint

if TYPE_CHECKING:
    from asr_core.config import Config
    from asr_core.runtime.outbox import Outbox
    from asr_core.contract.trial import ProgressLog


class EvaluationInterrupted(Exception):
    """SIGUSR2/SIGTERM during evaluation: evaluation has no checkpoint, so it simply starts again on requeue."""


def _fault(progress: "ProgressLog") -> None:
    """``ASR_CORE_FAULT=sleep-in-eval:S`` (tests of the orchestration only, as the trainer's faults): the job
    sleeps S seconds before decoding, with an ``eval`` progress record, so a test can kill it there."""
    fault = os.environ.get("ASR_CORE_FAULT", "")
    if fault.startswith("sleep-in-eval:"):
        progress.write("eval", 0, 1, "fault")
        time.sleep(float(fault.split(":", 1)[1]))


def earlier_tables(spec: EvaluationSpec) -> list[Path]:
    """The folders whose tables the job merges into its own: the model's own evaluation (``eval/``), then every
    finished evaluation job of the same model and name, oldest first (:func:`asr_core.evaluation.evaluate.evaluate`'s
    ``tables_from``)."""
    model = TrialFolder(Path(spec.model_dir))
    out = [model.eval_dir]
    siblings = []
    for d in model.path.parent.glob(f"{spec.model}-*"):
        if d.name == spec.key or not TrialFolder(d).done.exists():
            continue
        try:
            other = read_evaluation(d)
        except ValueError:
            continue
        if other is not None and other.name == spec.name and other.model == spec.model:
            siblings.append((other.created, d))
    out += [TrialFolder(d).eval_dir for _, d in sorted(siblings)]
    return out


def check_model(spec: EvaluationSpec) -> Path:
    """The model's checkpoint, once its training is finished; an error saying what to do otherwise. An unreadable
    ``TRAINED`` counts as absent (with a warning); the checkpoint itself then says whether training finished
    (:func:`asr_core.training.checkpoint.training_finished`), as it does for the model's own job."""
    model = TrialFolder(Path(spec.model_dir))
    if not (model.done.exists() or trained_checkpoint(model.path) is not None or _finished_checkpoint(spec.checkpoint)):
        raise RuntimeError(f"evaluation {spec.key}: model {spec.model} has not finished training ({model.path} has "
                           "no readable TRAINED marker); its own job evaluates it at the end of training (and "
                           "writes TRAINED again: `orchestrate resume` runs it)")
    if not spec.checkpoint.is_file():
        raise FileNotFoundError(f"evaluation {spec.key}: the checkpoint of model {spec.model} is missing "
                                f"({spec.checkpoint})")
    return spec.checkpoint


def _finished_checkpoint(path: Path) -> bool:
    """Whether the checkpoint at ``path`` is a finished training's (False when there is none or it is unreadable)."""
    from asr_core.training.checkpoint import read_header, training_finished

    try:
        return path.is_file() and training_finished(read_header(path))
    except Exception:  # noqa: BLE001 - a checkpoint being written or broken: not finished, as far as we can tell
        return False


def run_evaluation(spec: EvaluationSpec, cfg: "Config", folder: TrialFolder, tracking_uri: str | None,
                   run_id: str | None, progress: "ProgressLog", outbox: "Outbox | None") -> None:
    """Decode ``spec.conditions`` of ``spec.datasets`` with the model's checkpoint (greedy, the spec's beam
    decoder, or greedy with its window fusion methods and at its other windows: the decoder's ``fusion`` and
    ``windows``, seconds) into ``folder/eval`` and the model's run; a stop signal interrupts it at once
    (:class:`EvaluationInterrupted`)."""
    from asr_core.evaluation.decoders import beam_decoding
    from asr_core.evaluation.evaluate import Destination, EvaluationRun, evaluate

    checkpoint = check_model(spec)
    beam = None
    stride = cfg.eval.stride
    fusion: tuple[str, ...] = ()
    windows: tuple[float, ...] = ()
    if spec.decoder is not None and (spec.decoder.get("fusion") or spec.decoder.get("windows")):
        fusion = tuple(spec.decoder.get("fusion") or ())  # window fusion methods, greedy (paper 001)
        windows = tuple(float(w) for w in spec.decoder.get("windows") or ())  # greedy at other windows (seconds)
        stride = spec.decoder.get("stride") or stride
    elif spec.decoder is not None:
        d = spec.decoder
        beam = beam_decoding("beam", lm_path=Path(d["lm"]) if d.get("lm") else None,
                             alpha=d.get("alpha") if d.get("lm") else None, beta=d.get("beta"),
                             beam_width=d.get("beam_width"), lm_context=d.get("lm_context"),
                             prompt=Path(d["prompt"]) if d.get("prompt") else None, name=spec.name,
                             tokenizer_of=checkpoint)
        stride = d.get("stride") or stride
    tail = {"tail": Path(spec.decoder["tail"])} if spec.decoder is not None and spec.decoder.get("tail") else {}
    with signals.installed(), signals.raising(EvaluationInterrupted):
        _fault(progress)
        evaluate(EvaluationRun.of(checkpoint, cfg.eval, datasets=list(spec.datasets), snrs=[], noisy=(), stride=stride,
                                  **tail,
                                  beam=beam, conditions=spec.conditions, tables_from=earlier_tables(spec),
                                  fusion=fusion, windows=windows),
                 Destination(out_dir=folder.eval_dir, log=outbox is not None, run_id=run_id, tracking_uri=tracking_uri,
                             outbox=outbox, progress=progress))
    if outbox is not None:
        outbox.tags(evaluation_tag(spec.key.rsplit("-", 1)[-1], spec.name, spec.conditions, spec.setting))
