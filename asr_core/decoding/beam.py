"""CTC prefix beam search over moving-window posteriors, with an optional Transformer LM (paper 004 §2.4, §3.4).

A hypothesis is a *labelling* (a token sequence, blanks and repeats collapsed), scored as

    score = log P_AM(labelling) + alpha * log P_LM(labelling) + beta * len(labelling)

where ``P_AM`` sums over every CTC alignment of the labelling (the prefix beam search's blank / non-blank split),
``P_LM`` is the LM's probability of the tokens given the prompt, and ``len`` counts tokens. Each frame:

* candidate tokens are those whose log-probability is within ``token_threshold`` of the frame's best (the blank
  included, like any token; impossible tokens never);
* every beam is continued by a blank, by repeating its last token, or by a candidate token; continuations that are
  the same labelling are merged (their probabilities added);
* the ``beam_width`` best are kept, less any scoring more than ``prune_threshold`` below the best;
* the beams whose labelling grew this frame are scored by the LM in ONE batched call (one new token each), their
  key-value caches gathered by parent beam (:meth:`asr_core.lm.KVCache.select`) and cut to the last ``lm_context``
  tokens. A labelling already held by a beam keeps that beam's LM state: nothing is recomputed.

The LM first reads its beginning-of-document token and the optional ``prompt`` (token ids, e.g. a document in the
style of the transcripts, paper 004 §3.4), with the same context limit: every token the LM reads sees itself and at
most ``lm_context`` earlier tokens. Without an LM (``lm=None``) ``alpha`` is ignored and ``beta`` still applies.

With ``alpha = beta = 0`` and no pruning (a beam as wide as the hypotheses, infinite thresholds) the search is exact:
it returns the labelling of highest total probability over its alignments.

The input is what :func:`asr_core.decoding.decode.posteriors` returns: per-frame probabilities (T', V), the CTC blank at
``V - 1``; the LM predicts ids ``0 .. V - 2`` (:mod:`asr_core.lm.config`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from asr_core.config.parse import ConfigError

PROMPT_CHUNK = 512  # prompt tokens per LM call (the authors' LM trained on 512-token chunks); bounds the memory
NEG_INF = float("-inf")


class LMCache(Protocol):
    """What the search needs of an LM's per-sequence state (:class:`asr_core.lm.KVCache` is one)."""

    def select(self, index: torch.Tensor) -> "LMCache": ...

    def trim(self, n: int) -> "LMCache": ...

    def concat(self, other: "LMCache") -> "LMCache": ...


class LanguageModel(Protocol):
    """``lm(tokens (B, T) long, lengths (B,) long, cache, window=n) -> (logits (B, T, V - 1), cache)``, with
    ``bos_id`` (:class:`asr_core.lm.TransformerLM` is one)."""

    bos_id: int

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, cache: Any = None, *,
                 window: int | None = None) -> tuple[torch.Tensor, LMCache]: ...


@dataclass(frozen=True)
class BeamConfig:
    """Beam search settings. Defaults: paper 004 §3.4 (width 25) and the authors' decoding of their 80 s model
    (``eval/tedlium/tlm_beam.py``: alpha 0.42, beta 1.95, p 2.96, top_am_threshold -6, max_len 1024); the project
    tunes alpha and beta on a dev set."""

    beam_width: int = 25
    alpha: float = 0.42  # weight of the LM log-probability
    beta: float = 1.95  # bonus per token: offsets the LM log-probability every token costs
    prune_threshold: float = 2.96  # beams scoring more than this below the best are dropped (inf: never)
    token_threshold: float = 6.0  # candidate tokens: log-prob within this of the frame's best (inf: every token)
    lm_context: int = 1024  # tokens the LM remembers (paper 004 Table 6's longest)

    def __post_init__(self) -> None:
        def require(cond: bool, name: str, valid: str) -> None:
            if not cond:
                raise ConfigError(f"invalid value for 'beam.{name}': {getattr(self, name)!r}; valid: {valid}")

        require(isinstance(self.beam_width, int) and self.beam_width >= 1, "beam_width", "a positive integer")
        for name in ("alpha", "beta"):
            require(math.isfinite(getattr(self, name)), name, "a finite number")
        for name in ("prune_threshold", "token_threshold"):
            require(getattr(self, name) >= 0, name, "a non-negative number (inf: no limit)")  # NaN fails too
        require(isinstance(self.lm_context, int) and self.lm_context >= 1, "lm_context", "a positive number of tokens")


@dataclass(frozen=True)
class BeamResult:
    """The best hypothesis: ``ids`` (token ids, blanks and repeats collapsed) and its ``score`` = ``am_score`` +
    alpha * ``lm_score`` + beta * len(ids); ``am_score`` is log P_AM summed over alignments, ``lm_score`` the LM's
    log-probability of ``ids`` (0 without an LM). ``lm_calls``: batched LM calls made per frame (the prompt's not
    counted), ``lm_rows``: beams they scored."""

    ids: tuple[int, ...]
    score: float
    am_score: float
    lm_score: float
    lm_calls: int
    lm_rows: int


class _Node:
    """A labelling as a link to its prefix: appending is O(1); ``key`` hashes the whole labelling."""

    __slots__ = ("parent", "token", "length", "key")

    def __init__(self, parent: "_Node | None", token: int) -> None:
        self.parent = parent
        self.token = token
        self.length = 0 if parent is None else parent.length + 1
        self.key = hash(()) if parent is None else hash((parent.key, token))

    def ids(self) -> tuple[int, ...]:
        out, node = [], self
        while node.parent is not None:
            out.append(node.token)
            node = node.parent
        return tuple(reversed(out))


def _same(a: _Node, b: _Node) -> bool:
    """Whether two nodes hold the same labelling (equal keys almost always mean so; this makes sure)."""
    while a is not b:
        if a.parent is None or b.parent is None or a.token != b.token:
            return False
        a, b = a.parent, b.parent
    return True


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest finite ``scores``, best first (ties: lower index first)."""
    finite = np.flatnonzero(scores > NEG_INF)
    if finite.size > k:
        finite = finite[np.argpartition(-scores[finite], k - 1)[:k]]
    return finite[np.lexsort((finite, -scores[finite]))]


def _model_device(lm: Any) -> torch.device:
    params = getattr(lm, "parameters", None)
    if params is not None:
        for p in params():
            return p.device
    return torch.device("cpu")


@torch.no_grad()
def prime(lm: LanguageModel, prompt: Sequence[int], context: int) -> tuple[torch.Tensor, LMCache]:
    """The LM after its beginning-of-document token and ``prompt``: next-token log-probs (V - 1,) float64 on the CPU
    and the cache (one row, at most ``context`` tokens). Fed in chunks of :data:`PROMPT_CHUNK`, each token seeing
    at most ``context`` earlier ones (as it would in one pass with that window)."""
    device = _model_device(lm)
    ids = [int(lm.bos_id)] + [int(i) for i in prompt]
    cache: Any = None
    logits = None
    for s in range(0, len(ids), PROMPT_CHUNK):
        chunk = torch.tensor([ids[s: s + PROMPT_CHUNK]], dtype=torch.long, device=device)
        logits, cache = lm(chunk, torch.tensor([chunk.shape[1]], device=device), cache, window=context)
        cache = cache.trim(context)
    assert logits is not None
    return torch.log_softmax(logits[0, -1].double(), -1).cpu(), cache


@dataclass
class _Beams:
    """The beams between two frames, as parallel arrays. Beam ``i``'s LM state is row ``i`` of the LM's next-token
    log-probs and of its cache."""

    nodes: list[_Node]
    pb: np.ndarray  # log P_AM of the labelling over alignments ending in a blank
    pnb: np.ndarray  # ... ending in its last token
    lm: np.ndarray  # log P_LM of the labelling (0 without an LM)

    def scores(self, alpha: float, beta: float) -> np.ndarray:
        length = np.array([nd.length for nd in self.nodes], dtype=np.float64)
        return np.logaddexp(self.pb, self.pnb) + alpha * self.lm + beta * length


def _frame(beams: _Beams, lp: dict[int, float], blank: int, lm_next: torch.Tensor | None, alpha: float,
           beta: float, config: BeamConfig) -> tuple[_Beams, np.ndarray, np.ndarray, list[int]]:
    """One frame of the search; ``lp``: the frame's candidate tokens and their log-probs. Returns the kept beams
    (those that stayed the same labelling first, in their old order, then those that grew), the old rows of the
    ones that stayed, and the parent rows and tokens of the ones that grew."""
    nodes, pb, pnb, lm_sum = beams.nodes, beams.pb, beams.pnb, beams.lm
    ext = [c for c in lp if c != blank]
    n, k = len(nodes), len(ext)
    length = np.array([nd.length for nd in nodes], dtype=np.float64)
    total = np.logaddexp(pb, pnb)
    # a beam stays the same labelling by a blank, or by its last token again ...
    stay_pb = total + lp.get(blank, NEG_INF)
    stay_pnb = pnb + np.array([lp.get(nd.token, NEG_INF) for nd in nodes])
    # ... or grows by a candidate token (repeating its last token only after a blank)
    last = np.array([nd.token for nd in nodes])
    ext_am = np.where(last[:, None] == np.array(ext, dtype=np.int64)[None, :], pb[:, None], total[:, None]) + \
        np.array([lp[c] for c in ext])[None, :]
    ext_lm = lm_sum[:, None] + (lm_next[:, ext].numpy() if lm_next is not None and k else np.zeros((n, k)))
    if k:  # a grown labelling that a beam already holds is merged into that beam, which keeps its LM state
        where: dict[int, list[int]] = {}
        for i, nd in enumerate(nodes):
            where.setdefault(nd.key, []).append(i)
        col = {c: j for j, c in enumerate(ext)}
        for b, nd in enumerate(nodes):
            if nd.parent is not None and nd.token in col:
                for i in where.get(nd.parent.key, ()):
                    if _same(nodes[i], nd.parent):
                        stay_pnb[b] = np.logaddexp(stay_pnb[b], ext_am[i, col[nd.token]])
                        ext_am[i, col[nd.token]] = NEG_INF
    scores = np.concatenate([np.logaddexp(stay_pb, stay_pnb) + alpha * lm_sum + beta * length,
                             (ext_am + alpha * ext_lm + beta * (length[:, None] + 1)).ravel()])
    chosen = _topk(scores, config.beam_width)
    if chosen.size == 0:
        raise ValueError("every token has probability 0: nothing can be decoded")
    chosen = chosen[scores[chosen] >= scores[chosen[0]] - config.prune_threshold]
    stays = np.sort(chosen[chosen < n])
    gi, gj = np.divmod(chosen[chosen >= n] - n, max(k, 1))
    kept = _Beams(nodes=[nodes[int(m)] for m in stays] + [_Node(nodes[int(i)], ext[int(j)]) for i, j in zip(gi, gj)],
                  pb=np.concatenate([stay_pb[stays], np.full(gi.size, NEG_INF)]),
                  pnb=np.concatenate([stay_pnb[stays], ext_am[gi, gj]]),
                  lm=np.concatenate([lm_sum[stays], ext_lm[gi, gj]]))
    return kept, stays, gi, [ext[int(j)] for j in gj]


@torch.no_grad()
def beam_search(probs: torch.Tensor, *, blank: int, lm: LanguageModel | None = None,
                config: BeamConfig = BeamConfig(), prompt: Sequence[int] = ()) -> BeamResult:
    """The best labelling of one recording's posteriors ``probs`` (T', V) (probabilities, as
    :func:`asr_core.decoding.decode.posteriors` returns them), CTC blank id ``blank``; ``lm`` and ``prompt`` optional (see the
    module docstring)."""
    if probs.dim() != 2:
        raise ValueError(f"probs must be (T', V), got shape {tuple(probs.shape)}")
    v = probs.shape[1]
    if not 0 <= blank < v:
        raise ValueError(f"blank id {blank} is outside the vocabulary 0..{v - 1}")
    log_probs = probs.detach().to("cpu", torch.float64).log()
    alpha = config.alpha if lm is not None else 0.0
    ctx = config.lm_context
    beams = _Beams([_Node(None, -1)], np.zeros(1), np.full(1, NEG_INF), np.zeros(1))
    lm_next: torch.Tensor | None = None  # (beams, V - 1) each beam's next-token LM log-probs, float64 on the CPU
    cache: Any = None
    device = _model_device(lm)
    if lm is not None:
        first, cache = prime(lm, prompt, ctx)
        if first.shape[0] != v - 1 or blank != v - 1:
            raise ValueError(f"the LM predicts {first.shape[0]} tokens; it decodes posteriors of V = its tokens + 1 "
                             f"with the blank last (got V = {v}, blank = {blank})")
        lm_next = first[None]
    lm_calls = lm_rows = 0

    keep = (log_probs >= log_probs.max(dim=1, keepdim=True).values - config.token_threshold) & (log_probs > NEG_INF)
    frames, tokens = keep.nonzero(as_tuple=True)
    counts = torch.bincount(frames, minlength=log_probs.shape[0]).tolist()
    tokens_l, lps_l = tokens.tolist(), log_probs[frames, tokens].tolist()
    offset = 0
    for t, count in enumerate(counts):
        lp = dict(zip(tokens_l[offset: offset + count], lps_l[offset: offset + count]))
        offset += count
        n = len(beams.nodes)
        try:
            beams, stays, parents, grown = _frame(beams, lp, blank, lm_next, alpha, config.beta, config)
        except ValueError as e:
            raise ValueError(f"frame {t} of the posteriors: {e}") from None
        if lm is None or lm_next is None or t + 1 == len(counts):
            continue  # the last frame's new labellings need no next-token probabilities
        if stays.size == n:  # the same beams in the same rows: nothing to copy (most frames are blank)
            next_cache, next_lm = cache, lm_next
        else:
            next_cache = cache.select(torch.from_numpy(stays)) if stays.size else None
            next_lm = lm_next[torch.from_numpy(stays)]
        if grown:  # ONE batched call: each grown beam's new token on its parent's cache
            logits, grown_cache = lm(torch.tensor(grown, dtype=torch.long, device=device)[:, None],
                                     torch.ones(len(grown), dtype=torch.long, device=device),
                                     cache.select(torch.from_numpy(parents)), window=ctx)
            grown_cache = grown_cache.trim(ctx)
            lm_calls += 1
            lm_rows += len(grown)
            next_cache = grown_cache if next_cache is None else next_cache.concat(grown_cache)
            next_lm = torch.cat([next_lm, torch.log_softmax(logits[:, -1].double(), -1).cpu()])
        cache, lm_next = next_cache, next_lm

    final = beams.scores(alpha, config.beta)
    b = int(np.argmax(final))
    return BeamResult(ids=beams.nodes[b].ids(), score=float(final[b]),
                      am_score=float(np.logaddexp(beams.pb[b], beams.pnb[b])),
                      lm_score=float(beams.lm[b]), lm_calls=lm_calls, lm_rows=lm_rows)
