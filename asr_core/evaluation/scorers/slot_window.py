"""Single-window scoring of the recall plant's slots: for each slot, decode only the one window of the model's context
length that ends :data:`RIGHT_S` after the slot's code word, and score the slot as the moving-window decoding is
scored.

In the moving-window decoding (``evaluate``) each output frame is the average over every window covering it: most of
those windows end after the slot, and some start after the clear mention a long context would need. Here each slot
gets one window of exactly the model's context ending at its code word's end (:func:`slot_window`; shorter where the
recording starts later), so the far band tells the model's reach from the decoder's dilution of distant evidence.
The window ends :data:`RIGHT_S` after the code word, not at it: a word at the very end of a window is decoded without
the frames after it and is mostly lost (a model of the demo that transcribed every unmasked slot under moving
windows got 1 in 10 of them from a window ending at the word); the key of the far band (at most 60 s back) still
lies inside an 81.92 s window, and that of the near band (at most 4 s) inside a 10.24 s one.
The reference of a window is the transcript's words lying wholly inside it (:func:`window_words`); the slot is
correct when the hypothesis word aligned with its code word equals it (:func:`asr_core.evaluation.scorers.slots.slot_rows`,
``scoring`` :data:`~asr_core.contract.metrics.WINDOW`).

Each slot also gets a forced choice among its candidates (:attr:`~asr_core.evaluation.scorers.slots.Slot.choices`) from the
window's output posteriors (T', V): ``choice``, the candidate whose substitution for the code word in the window's
reference text has the highest CTC log-likelihood (:func:`ctc_choice`; any number of pieces a word), and
``posterior_choice``, where every candidate is one piece, the candidate whose piece has the most posterior mass summed
over the output frames of the masked span (:func:`posterior_choice`, :func:`span_frames`). A tokenizer that cannot
encode (a stand-in) leaves ``choice`` empty.

Features are computed over the whole recording (normalised as ``evaluate`` does) and then cut; the model runs in
fp32. ``evaluate`` adds these rows to a dataset's slot table (greedy, clean audio); ``python -m asr_core recall``
(:mod:`asr_core.probes.recall`) scores them on edited audio too (the causal check).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from asr_core.contract.metrics import WINDOW
from asr_core.data.corpora.base import Recording, Word
from asr_core.decoding.decode import forward_windows, greedy_ids, prepare_features
from asr_core.evaluation.scorers.slots import ForcedChoice, Slot, marked_reference, slot_rows

TIME_TOLERANCE_S = 1e-3  # word times are rounded to milliseconds
RIGHT_S = 1.0  # seconds of the recording after the slot's code word that its window still holds


def slot_window(end_s: float, window: int, frames: int, frames_per_second: float) -> tuple[int, int]:
    """The input frames ``(start, end)`` of the window of ``window`` frames that ends at ``end_s`` seconds (the
    frame holding it included), within the recording's ``frames``: shorter where the recording starts later."""
    e = min(frames, max(1, math.ceil(end_s * frames_per_second - 1e-6)))
    return max(0, e - window), e


def window_words(words: Sequence[Word], start_s: float, end_s: float) -> list[int]:
    """The indices of the ``words`` lying wholly inside [start_s, end_s] (a word cut by the window's start is not
    in its reference)."""
    return [i for i, w in enumerate(words) if w.start is not None and w.end is not None
            and w.start >= start_s - TIME_TOLERANCE_S and w.end <= end_s + TIME_TOLERANCE_S]


def span_frames(start_s: float, end_s: float, window: tuple[int, int], out_frames: int,
                frames_per_second: float) -> tuple[int, int]:
    """The output frames ``(first, end)`` (end exclusive; at least one) of a window of input frames ``window`` =
    (a, e) with ``out_frames`` output frames that cover [start_s, end_s] seconds of the recording: output frames
    come at ``out_frames / (e - a)`` per input frame (the model's subsampling)."""
    a, e = window
    if out_frames < 1 or e <= a:
        raise ValueError(f"a window of input frames {window} with {out_frames} output frames holds no span")
    rate = out_frames / (e - a)
    first = math.floor((start_s * frames_per_second - a) * rate + 1e-6)
    last = math.ceil((end_s * frames_per_second - a) * rate - 1e-6)
    first = min(max(first, 0), out_frames - 1)
    return first, min(max(last, first + 1), out_frames)


def ctc_choice(log_probs: torch.Tensor, words: Sequence[str], position: int, candidates: Sequence[str],
               encode: Callable[[str], list[int]], blank: int) -> str:
    """The candidate whose text (``words`` with ``words[position]`` replaced by it, joined by spaces and encoded)
    has the highest CTC log-likelihood under ``log_probs`` (T', V) (one ``ctc_loss`` over the candidates); "" when
    no candidate's text fits the frames. Ties go to the earlier candidate."""
    targets = [encode(" ".join([*words[:position], c, *words[position + 1:]])) for c in candidates]
    lengths = torch.tensor([len(t) for t in targets], dtype=torch.long)
    if not len(targets) or int(lengths.min()) == 0 or log_probs.shape[0] == 0:
        return ""
    padded = torch.zeros(len(targets), int(lengths.max()), dtype=torch.long)
    for i, t in enumerate(targets):
        padded[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    lp = log_probs.float().cpu()[:, None, :].expand(-1, len(targets), -1)
    nll = torch.nn.functional.ctc_loss(lp, padded, torch.full((len(targets),), lp.shape[0], dtype=torch.long),
                                       lengths, blank=blank, reduction="none", zero_infinity=False)
    if not bool(torch.isfinite(nll).any()):
        return ""
    return candidates[int(torch.argmin(nll))]


def posterior_choice(probs: torch.Tensor, frames: tuple[int, int], candidates: Sequence[str],
                     encode: Callable[[str], list[int]]) -> str:
    """The candidate whose one piece has the largest posterior of ``probs`` (T', V) summed over the output frames
    ``frames`` (first, end); "" unless every candidate encodes to exactly one piece. Ties go to the earlier."""
    pieces = [encode(c) for c in candidates]
    if not candidates or any(len(p) != 1 for p in pieces):
        return ""
    mass = probs[frames[0]: frames[1]].float().sum(dim=0).cpu()
    scores = torch.stack([mass[p[0]] for p in pieces])
    return candidates[int(torch.argmax(scores))]


@dataclass(frozen=True)
class WindowModel:
    """What decoding one window needs: the model, its window in input frames, the feature frame rate, the
    tokenizer (``decode`` and ``blank_id``), the device, how many windows run at once, and how far past the code
    word a window ends (``right_s``)."""

    model: object
    window: int
    frames_per_second: float
    tokenizer: object
    device: torch.device | str = "cpu"
    batch_windows: int = 8
    right_s: float = RIGHT_S


def score_recording(wm: WindowModel, features: torch.Tensor, rec: Recording, slots: Sequence[Slot],
                    extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows (:data:`~asr_core.contract.metrics.SLOT_COLUMNS`, scoring ``window``, then ``extra``'s columns) of
    ``rec``'s slots, each decoded from its own window of ``features`` (ending ``wm.right_s`` after its code word)
    ((T, F), normalised over the whole recording), with its forced choice (module docstring)."""
    fps = wm.frames_per_second
    spans = [slot_window(s.end + wm.right_s, wm.window, features.shape[0], fps) for s in slots]
    insides = []
    for s, (a, e) in zip(slots, spans):
        inside = window_words(rec.words, a / fps, e / fps)
        if s.index not in inside:
            raise ValueError(f"{rec.id}: slot {s.slot}'s code word ({rec.words[s.index].start}-{s.end} s) is not "
                             f"inside its window ({a / fps:g}-{e / fps:g} s): "
                             "the corpus's word times do not match its audio; regenerate it")
        insides.append(inside)
    feats = features.to(device=wm.device, dtype=torch.float32)
    blank = wm.tokenizer.blank_id  # type: ignore[attr-defined]
    encode = getattr(wm.tokenizer, "encode", None)
    texts: list[str] = []
    picks: list[ForcedChoice] = []
    with torch.no_grad():
        for b0 in range(0, len(spans), wm.batch_windows):
            chunk = spans[b0: b0 + wm.batch_windows]
            probs, lengths = forward_windows(wm.model, feats, chunk, wm.device)  # type: ignore[arg-type]
            for i in range(len(chunk)):
                p = probs[i, : int(lengths[i])].cpu()
                texts.append(wm.tokenizer.decode(greedy_ids(p, blank)))  # type: ignore[attr-defined]
                s, inside = slots[b0 + i], insides[b0 + i]
                if encode is None or p.shape[0] == 0:
                    picks.append(ForcedChoice())
                    continue
                word = rec.words[s.index]
                picks.append(ForcedChoice(
                    ctc_choice(p.clamp_min(1e-30).log(), [rec.words[j].text for j in inside], inside.index(s.index),
                               s.choices, encode, blank),
                    posterior_choice(p, span_frames(float(word.start if word.start is not None else s.end), s.end,
                                                     chunk[i], p.shape[0], fps), s.choices, encode)))
    rows: list[dict[str, Any]] = []
    for s, inside, text, pick in zip(slots, insides, texts, picks):
        ref = marked_reference([rec.words[i].text for i in inside], [dataclasses.replace(s, index=inside.index(
            s.index))])
        rows += slot_rows(ref, text, rec.id, extra=extra, scoring=WINDOW, choices=[pick])
    return rows


def window_rows(wm: WindowModel, recordings: Sequence[Recording], slots: Mapping[str, Sequence[Slot]],
                extractor: Callable[[torch.Tensor], torch.Tensor]) -> list[dict[str, Any]]:
    """The single-window rows of every recording of ``recordings`` that has slots, its clean audio read from disk
    and its features made by ``extractor`` (as ``evaluate`` makes them)."""
    from asr_core.data.audio import load_audio

    rows: list[dict[str, Any]] = []
    for rec in recordings:
        if slots.get(rec.id):
            feats = prepare_features(extractor, load_audio(rec.audio), rec.ignore, wm.frames_per_second)
            rows += score_recording(wm, feats, rec, slots[rec.id])
    return rows
