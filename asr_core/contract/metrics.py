"""The names under which results reach an MLflow run, and how they are read back: each builder beside its parser.

Written by the trainer (:mod:`asr_core.evaluation.evaluate`, :mod:`asr_core.probes.heads`, :mod:`asr_core.lm.ppl`,
:mod:`asr_core.lm.train`), read by :mod:`analysis` (which needs no torch to read them). A name changes here or not
at all: runs already logged keep the names they have, so every builder is the exact inverse of its parser
(``tests/test_metrics_contract.py`` checks the round trips).

* WER in percent: ``wer/<DATASET>`` (clean) and ``wer/<DATASET>/snr<DB:g>`` for the greedy decoding;
  ``wer_<DECODER>/...`` for a beam decoder (:func:`metric_key`, :func:`parse_decoder_metric_key`);
* cue-word error rate in percent, on datasets with planted cue words: ``cue/...`` and ``cue_<DECODER>/...``
  (:func:`cue_metric_key`, :func:`parse_cue_metric_key`);
* tail-word error rate in percent (paper 002), when the evaluation is given a tail set: ``tail/...`` and
  ``tail_<DECODER>/...`` (:func:`tail_metric_key`, :func:`parse_tail_metric_key`); the tail set itself is described
  in the run's tag :data:`TAIL_TAG` (JSON);
* slot accuracy in percent on datasets with the recall plant (clean audio): ``recall/<DATASET>/<GROUP>`` and
  ``recall_<DECODER>/...`` (:func:`recall_metric_key`, :func:`parse_recall_metric_key`), and per-slot tables
  ``eval/<DATASET>[.<DECODER>].slots.csv``, columns :data:`SLOT_COLUMNS` (:func:`slot_table_name`);
* a beam decoder's settings: the run's tag ``eval.decoder.<DECODER>`` (JSON; :func:`decoder_tag`);
* window fusion (paper 001): greedy decoding with the windows joined another way than the default averaging of
  their posteriors is the decoder ``fusion-<METHOD>`` (:func:`fusion_decoder`, :func:`fusion_method`;
  :data:`FUSION_METHODS`), logged as a beam decoder is (``wer_fusion-chiu/...``, ``eval/<DATASET>.fusion-chiu.csv``)
  with the tag ``eval.decoder.fusion-<METHOD>``; the ``greedy`` decoder is the averaging method;
* another decoding window than trained (the context-or-fragmentation control): greedy decoding, windows averaged,
  at a window of W seconds is the decoder ``window-<W:g>s`` (:func:`window_decoder`, :func:`window_seconds`),
  logged as a beam decoder is (``wer_window-5.12s/...``) with the tag ``eval.decoder.window-<W:g>s``;
* per-recording tables: artifacts ``eval/<DATASET>.csv`` (greedy) and ``eval/<DATASET>.<DECODER>.csv``
  (:func:`table_name`), columns :data:`TABLE_COLUMNS` then the optional :data:`CUE_COLUMNS`, then
  :data:`TAIL_COLUMNS` in tables of an evaluation given a tail set (absent otherwise);
* head similarity: ``heads/<DATASET>/<R>/sum|similarity|layer<i>`` and ``heads/<DATASET>/windows``
  (:func:`heads_key`, :func:`parse_heads_key`);
* LM perplexity on the LM's own run: ``lm_ppl/<DATASET>/ctx<N>`` (:func:`lm_ppl_key`, :func:`parse_lm_ppl_key`),
  its perplexity over the tokens of a tail set's words (paper 002, ``lm ppl --tail``):
  ``lm_ppl_tail/<DATASET>/ctx<N>`` (:func:`lm_ppl_tail_key`, :func:`parse_lm_ppl_tail_key`), and the tag
  :data:`LM_TAG` every LM training run has.

Imports neither torch nor pandas.
"""

from __future__ import annotations

import math
import re

from asr_core.contract.trial import HEADS_DIR

GREEDY = "greedy"  # the decoder of the trial's own evaluation: metrics wer/..., tables eval/<DATASET>.csv
# window fusion methods other than the greedy decoder's averaging (paper 001; asr_core.decoding.fused): ``select``
# each frame from the window whose centre is nearest, ``blockwise`` the words of windows side by side (stride 1)
# concatenated (paper 001 §4.1), ``blockwise-frames`` their frames concatenated then collapsed (averaging at stride
# 1), ``chiu`` Chiu et al.'s overlapping inference (50%) with the paper's word-position confidence,
# ``chiu-seconds`` the same with a word's seconds from its window's centre, ``lcs`` longest-common-run merge (50%),
# ``rover`` SCTK's rover over the 8 phase-shifted block-wise decodings
FUSION_METHODS = ("select", "blockwise", "blockwise-frames", "chiu", "chiu-seconds", "lcs", "rover")
AVERAGING = "average"  # the greedy decoder's method: each frame the mean of the windows covering it
FUSION_PREFIX = "fusion-"
WINDOW_PREFIX = "window-"  # greedy decoding at another window than the model's context: window-<W:g>s
CLEAN = "clean"  # the condition without added music
WER = "wer"
CUE = "cue"
TAIL = "tail"
TAIL_TAG = "eval.tail"  # JSON: the tail set's source, size, share of its text and of each dataset's references
LM_PPL = "lm_ppl"
LM_PPL_TAIL = "lm_ppl_tail"  # perplexity over the tokens of tail words only (lm ppl --tail)
DECODER_TAG_PREFIX = "eval.decoder."
LM_TAG = "lm.data_fingerprint"  # every LM training run has it
# every per-recording table has these columns; the cue columns follow (empty for datasets without planted words)
TABLE_COLUMNS = ("dataset", "condition", "snr_db", "recording", "ref_words", "substitutions", "deletions",
                 "insertions", "hyp_words", "wer")
CUE_COLUMNS = ("cue_words", "cue_errors")
# the tail words of the reference (paper 002) and the errors on them; only in tables of an evaluation given a tail set
TAIL_COLUMNS = ("tail_words", "tail_errors")
# the per-slot table of a dataset with the recall plant (eval/<DATASET>[.<DECODER>].slots.csv), one row per slot,
# condition and scoring; ``correct`` 0/1, ``hyp`` the aligned hypothesis word ("" where the alignment deletes the
# code word); ``scoring``: AVERAGE (the moving-window decoding of the whole recording, each frame the average of every
# window covering it) or WINDOW (greedy, clean: the one window of the model's context that ends 1 s after the slot's code
# word). A table written before the column holds AVERAGE rows only.
RECALL = "recall"
# what the training cuts drop (asr_core.data.chunking.lost_to_cuts at data.context_s), logged at step 0 of training:
# the share of words, and of their speech in seconds, that lie wholly in no window
WORDS_LOST = "data/words_lost_pct"
SPEECH_LOST = "data/speech_lost_pct"
AVERAGE, WINDOW = "average", "window"
SCORINGS = (AVERAGE, WINDOW)
# The forced choice among the slot's candidates (scoring WINDOW only; empty in AVERAGE rows and in tables written before
# the columns): ``choice`` (the candidate whose substitution into the window's reference has the highest CTC
# likelihood), ``choice_correct``, ``onset_correct`` (the aligned hypothesis word starts with the code word's onset),
# ``posterior_choice`` (the candidate piece with the most posterior mass over the masked span; empty unless every
# candidate is one piece), ``posterior_correct`` and ``n_choices`` (the candidates: chance is 1/n_choices).
SLOT_COLUMNS = ("recording", "condition", "snr_db", "slot", "word", "band", "kind", "distance_s", "hyp", "correct",
                "scoring", "choice", "choice_correct", "onset_correct", "posterior_choice", "posterior_correct",
                "n_choices")
RECALL_GROUPS = ("near", "far", "unmasked", "no-key")  # masked slots with a key by band, then the two controls
SLOTS_SUFFIX = ".slots"
HEADS_STATISTICS = ("sum", "similarity", "layer")  # "layer" with the layer's index: layer<i>

_NUMBER = r"[-+]?[0-9.]+(?:e[-+]?[0-9]+)?"
_SNR = rf"(?:/snr(?P<snr>{_NUMBER}))?"
_DECODER = r"[A-Za-z0-9._-]+"
_RATE_RE = {kind: (re.compile(rf"^{kind}/(?P<dataset>.+?){_SNR}$"),
                   re.compile(rf"^{kind}_(?P<decoder>{_DECODER})/(?P<dataset>.+?){_SNR}$")) for kind in (WER, CUE, TAIL)}
_HEADS_RE = re.compile(rf"^{HEADS_DIR}/(?P<dataset>.+)/(?P<repr>[AQKVY])/"
                       r"(?P<stat>sum|similarity|layer(?P<layer>[0-9]+))$")
_RECALL_RE = re.compile(rf"^{RECALL}(?:_(?P<decoder>{_DECODER}))?/(?P<dataset>.+)/"
                        rf"(?P<group>{'|'.join(map(re.escape, RECALL_GROUPS))})$")
_LM_PPL_RE = re.compile(rf"^{LM_PPL}/(?P<dataset>.+)/ctx(?P<context>[0-9]+)$")
_LM_PPL_TAIL_RE = re.compile(rf"^{LM_PPL_TAIL}/(?P<dataset>.+)/ctx(?P<context>[0-9]+)$")


# ---- conditions --------------------------------------------------------------------------------------------------

def condition_name(snr_db: float | None) -> str:
    """``None``/NaN -> ``"clean"``; -7.5 -> ``"snr-7.5"``; 10.0 -> ``"snr10"`` (the ``:g`` spelling of the metrics)."""
    if snr_db is None or (isinstance(snr_db, float) and math.isnan(snr_db)):
        return CLEAN
    return f"snr{float(snr_db):g}"


def snr_of(condition: str) -> float:
    """The inverse of :func:`condition_name`: ``"snr-7.5"`` -> -7.5; ``"clean"`` (or anything else) -> NaN."""
    m = re.fullmatch(rf"snr({_NUMBER})", condition)
    return float(m.group(1)) if m else math.nan


# ---- WER, cue-word and tail-word error rates -----------------------------------------------------------------------

def _rate_key(kind: str, dataset: str, condition: str, decoder: str) -> str:
    prefix = kind if decoder == GREEDY else f"{kind}_{decoder}"
    return f"{prefix}/{dataset}" + ("" if condition == CLEAN else f"/{condition}")


def is_decoder_name(name: str) -> bool:
    """Whether ``name`` may name a decoder (its metrics ``wer_<name>/...``, its tables, a sweep's folder): letters,
    digits, '-', '_' and '.', and not ``greedy`` (the trial's own decoding)."""
    return bool(name) and all(c.isalnum() or c in "-_." for c in name) and name != GREEDY


def metric_key(dataset: str, snr_db: float | None = None, decoder: str = GREEDY) -> str:
    """A WER metric: ``("test", -5.0)`` -> ``"wer/test/snr-5"``, ``("dev", None, "beam")`` -> ``"wer_beam/dev"``."""
    return _rate_key(WER, dataset, condition_name(snr_db), decoder)


def cue_metric_key(dataset: str, snr_db: float | None = None, decoder: str = GREEDY) -> str:
    """``cue/<NAME>[/snr<DB>]`` (``cue_<DECODER>/...`` for a beam decoder): the cue-word error rate of a dataset
    with planted words."""
    return _rate_key(CUE, dataset, condition_name(snr_db), decoder)


def tail_metric_key(dataset: str, snr_db: float | None = None, decoder: str = GREEDY) -> str:
    """``tail/<NAME>[/snr<DB>]`` (``tail_<DECODER>/...`` for a beam decoder): the tail-word error rate of a dataset,
    given a tail set (paper 002; :mod:`asr_core.scoring.tail`)."""
    return _rate_key(TAIL, dataset, condition_name(snr_db), decoder)


def metric_name(dataset: str, condition: str, decoder: str = GREEDY) -> str:
    """:func:`metric_key` by condition name: ``("test", "snr-5", "beam")`` -> ``"wer_beam/test/snr-5"``."""
    return _rate_key(WER, dataset, condition, decoder)


def _dataset_condition(m: re.Match) -> tuple[str, str, float]:
    snr = m.group("snr")
    if snr is None:
        return m.group("dataset"), CLEAN, math.nan
    value = float(snr)
    return m.group("dataset"), condition_name(value), value


def _parse_rate(kind: str, key: str) -> tuple[str, str, str, float] | None:
    greedy, beam = _RATE_RE[kind]
    m = greedy.match(key)
    if m:
        return (GREEDY, *_dataset_condition(m))
    m = beam.match(key)
    if not m or m.group("decoder") == GREEDY:
        return None
    return (m.group("decoder"), *_dataset_condition(m))


def parse_metric_key(key: str) -> tuple[str, str, float] | None:
    """A greedy WER metric: ``"wer/test/snr-5"`` -> ``("test", "snr-5", -5.0)``; ``"wer/dev"`` -> ``("dev",
    "clean", nan)``; else None."""
    m = _RATE_RE[WER][0].match(key)
    return _dataset_condition(m) if m else None


def parse_decoder_metric_key(key: str) -> tuple[str, str, str, float] | None:
    """Any decoder's WER metric: ``"wer/dev"`` -> ``("greedy", "dev", "clean", nan)``, ``"wer_beam-lm64/test/snr-5"``
    -> ``("beam-lm64", "test", "snr-5", -5.0)``; else None."""
    return _parse_rate(WER, key)


def parse_cue_metric_key(key: str) -> tuple[str, str, str, float] | None:
    """Any decoder's cue-word error rate: ``"cue_beam/dev/snr10"`` -> ``("beam", "dev", "snr10", 10.0)``; else
    None."""
    return _parse_rate(CUE, key)


def parse_tail_metric_key(key: str) -> tuple[str, str, str, float] | None:
    """Any decoder's tail-word error rate: ``"tail/dev"`` -> ``("greedy", "dev", "clean", nan)``,
    ``"tail_beam/dev/snr10"`` -> ``("beam", "dev", "snr10", 10.0)``; else None."""
    return _parse_rate(TAIL, key)


# ---- recall slots (the recall plant, asr_core.data.synth.recall) -----------------------------------------------

RECALL_KEY_EDITS = ("swap", "silence")  # the causal check's re-renderings of a key (asr_core.data.synth.recall)

def recall_metric_key(dataset: str, group: str, decoder: str = GREEDY) -> str:
    """``recall/<NAME>/<GROUP>`` (``recall_<DECODER>/...`` for a beam decoder): slot accuracy in percent on clean
    audio, ``group`` one of :data:`RECALL_GROUPS` (``near``/``far``: masked slots with a key sentence by band;
    ``unmasked``, ``no-key``: the controls)."""
    if group not in RECALL_GROUPS:
        raise ValueError(f"recall group {group!r}: one of {', '.join(RECALL_GROUPS)}")
    prefix = RECALL if decoder == GREEDY else f"{RECALL}_{decoder}"
    return f"{prefix}/{dataset}/{group}"


def parse_recall_metric_key(key: str) -> tuple[str, str, str] | None:
    """``"recall/dev/far"`` -> ``("greedy", "dev", "far")``, ``"recall_beam/dev/no-key"`` -> ``("beam", "dev",
    "no-key")``; else None."""
    m = _RECALL_RE.match(key)
    if not m or m.group("decoder") == GREEDY:
        return None
    return m.group("decoder") or GREEDY, m.group("dataset"), m.group("group")


def slot_table_name(dataset: str, decoder: str = GREEDY) -> str:
    """The stem of a run's per-slot table: ``eval/<dataset>.slots.csv``, ``eval/<dataset>.<decoder>.slots.csv``."""
    return table_name(dataset, decoder) + SLOTS_SUFFIX


def slot_table_file(dataset: str, decoder: str = GREEDY) -> str:
    """The file name of a per-slot table (in the run's artifact folder ``eval``): :func:`slot_table_name` + .csv."""
    return f"{slot_table_name(dataset, decoder)}.csv"


# ---- beam decoders and tables ------------------------------------------------------------------------------------

def fusion_decoder(method: str) -> str:
    """The decoder name of a window fusion method: ``"chiu"`` -> ``"fusion-chiu"``; :data:`AVERAGING` is the greedy
    decoder itself."""
    if method == AVERAGING:
        return GREEDY
    if method not in FUSION_METHODS:
        raise ValueError(f"window fusion method {method!r}: valid are {', '.join((AVERAGING, *FUSION_METHODS))}")
    return FUSION_PREFIX + method


def fusion_method(decoder: str) -> str | None:
    """The inverse of :func:`fusion_decoder`: ``"fusion-chiu"`` -> ``"chiu"``, ``"greedy"`` -> ``"average"``; None
    for a beam decoder."""
    if decoder == GREEDY:
        return AVERAGING
    method = decoder[len(FUSION_PREFIX):] if decoder.startswith(FUSION_PREFIX) else None
    return method if method in FUSION_METHODS else None


def window_decoder(seconds: float) -> str:
    """The decoder name of greedy decoding at a window of ``seconds``: ``5.12`` -> ``"window-5.12s"``; raises
    ValueError for a window that is not a positive finite number of seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"decoding window {seconds!r}: valid is a positive number of seconds, e.g. 5.12")
    return f"{WINDOW_PREFIX}{float(seconds):g}s"


def window_seconds(decoder: str) -> float | None:
    """The inverse of :func:`window_decoder`: ``"window-5.12s"`` -> ``5.12``; None for any other decoder."""
    if not (decoder.startswith(WINDOW_PREFIX) and decoder.endswith("s")):
        return None
    try:
        seconds = float(decoder[len(WINDOW_PREFIX):-1])
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 and window_decoder(seconds) == decoder else None


def decoder_tag(decoder: str) -> str:
    """The run's tag holding a beam decoder's settings (JSON): ``eval.decoder.<DECODER>``."""
    return DECODER_TAG_PREFIX + decoder


def parse_decoder_tag(tag: str) -> str | None:
    """The decoder a tag :func:`decoder_tag` names; None for any other tag."""
    return tag[len(DECODER_TAG_PREFIX):] if tag.startswith(DECODER_TAG_PREFIX) else None


def table_name(dataset: str, decoder: str = GREEDY) -> str:
    """The stem of a run's per-recording table: ``eval/<dataset>.csv`` (greedy), ``eval/<dataset>.<decoder>.csv``."""
    return dataset if decoder == GREEDY else f"{dataset}.{decoder}"


def table_file(dataset: str, decoder: str = GREEDY) -> str:
    """The file name of a per-recording table (in the run's artifact folder ``eval``): :func:`table_name` + .csv."""
    return f"{table_name(dataset, decoder)}.csv"


# ---- head similarity -----------------------------------------------------------------------------------------------

def heads_prefix(dataset: str, representation: str) -> str:
    """``heads/<DATASET>/<R>``: what every head-similarity metric of one representation starts with."""
    return f"{HEADS_DIR}/{dataset}/{representation}"


def heads_key(dataset: str, representation: str, statistic: str, layer: int | None = None) -> str:
    """``heads/<DATASET>/<R>/sum``, ``.../similarity``, or ``.../layer<i>`` (``statistic="layer"`` with ``layer``)."""
    if statistic not in HEADS_STATISTICS or (statistic == "layer") != (layer is not None):
        raise ValueError(f"head statistic {statistic!r} (layer {layer!r}): sum, similarity, or layer with its index")
    return f"{heads_prefix(dataset, representation)}/{statistic}{'' if layer is None else layer}"


def heads_windows_key(dataset: str) -> str:
    """``heads/<DATASET>/windows``: how many windows the head similarity of a dataset was measured on."""
    return f"{HEADS_DIR}/{dataset}/windows"


def parse_heads_key(key: str) -> tuple[str, str, str, int | None] | None:
    """``"heads/test/A/layer3"`` -> ``("test", "A", "layer", 3)``, ``"heads/test/Q/sum"`` -> ``("test", "Q", "sum",
    None)``; None for anything else (the window count included)."""
    m = _HEADS_RE.match(key)
    if not m:
        return None
    layer = m.group("layer")
    if layer is not None:
        return m.group("dataset"), m.group("repr"), "layer", int(layer)
    return m.group("dataset"), m.group("repr"), m.group("stat"), None


# ---- LM perplexity -----------------------------------------------------------------------------------------------

def lm_ppl_key(dataset: str, context: int) -> str:
    """``lm_ppl/<DATASET>/ctx<N>``: an LM's perplexity per token on a text with ``context`` tokens of context."""
    return f"{LM_PPL}/{dataset}/ctx{context}"


def is_lm_ppl_key(key: str) -> bool:
    """Whether a metric is an LM perplexity (of any form: an LM run is told by the prefix alone)."""
    return key.startswith(f"{LM_PPL}/")


def parse_lm_ppl_key(key: str) -> tuple[str, int] | None:
    """``"lm_ppl/text/ctx1024"`` -> ``("text", 1024)``; else None."""
    m = _LM_PPL_RE.match(key)
    return (m.group("dataset"), int(m.group("context"))) if m else None


def lm_ppl_tail_key(dataset: str, context: int) -> str:
    """``lm_ppl_tail/<DATASET>/ctx<N>``: an LM's perplexity per token over the tokens of a tail set's words only
    (paper 002; :func:`asr_core.lm.ppl.tail_flags`) on a text with ``context`` tokens of context. Not an
    :func:`is_lm_ppl_key` (logged beside the ``lm_ppl/...`` metrics of the same run, never alone)."""
    return f"{LM_PPL_TAIL}/{dataset}/ctx{context}"


def parse_lm_ppl_tail_key(key: str) -> tuple[str, int] | None:
    """``"lm_ppl_tail/text/ctx1024"`` -> ``("text", 1024)``; else None (``lm_ppl/...`` included)."""
    m = _LM_PPL_TAIL_RE.match(key)
    return (m.group("dataset"), int(m.group("context"))) if m else None
