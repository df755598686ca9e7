"""Perplexity of the language model at a given context (paper 004 Table 5): :func:`score_documents`,
:func:`perplexity_table` and ``python -m asr_core lm ppl CKPT --data SPEC --context 64,256,1024``.

Context. At context ``n`` every token attends to itself and at most ``n`` earlier tokens of its document, *at every
layer* (the semantics of ``TransformerLM.forward(window=n)`` and of beam search with the cache trimmed to ``n``
tokens after each step, :mod:`asr_core.lm.model`). A document is scored in chunks of ``chunk`` tokens with
``forward(window=n)``, the cache trimmed to its last ``n`` tokens after each chunk: the same numbers as one forward
pass with ``window=n`` over the whole document (tests/test_lm_train.py checks it), at memory proportional to
``chunk x (chunk + n)`` instead of the document's length squared, and several documents at once on ``batch`` lanes.

Unit. Perplexity **per token** of the acoustic tokenizer (the LM's vocabulary): ``exp(summed NLL / targets)`` over
every target of every document of a dataset, the first piece after the beginning-of-document token included (there
is no end-of-document token). Per-word perplexity would be ``exp(summed NLL / words)``; the table reports tokens,
as paper 004's does for its own vocabulary.

Tail tokens (paper 002). With ``--tail FILE`` (a tail set, :mod:`asr_core.scoring.tail`) the table also gives
the perplexity over the *tail tokens* alone: ``exp(summed NLL / tail targets)`` over the pieces of the words whose
normalised form is a tail word, every piece of such a word counted (its first, with the word-start marker, and the
ones after it), each predicted with the same context as in the overall perplexity (the overall numbers do not
change). Words are recovered from the pieces the document is scored as (:func:`piece_words`): SentencePiece never
lets a piece span a space and starts every word's first piece with the marker ``▁`` (its own piece ``▁`` where the
next character has none), so the pieces from one marked piece up to the next are one word; the ``k``-th such word
is the ``k``-th whitespace word of the document's text, or, where the counts differ (normalisation that drops or
splits a word), the text its pieces decode to. A word is a tail word (:func:`tail_flags`) when one of the words
Whisper's normaliser makes of it alone is in the tail set; a number written in several words is thus read word
by word, where the tail set read the whole text (a tail set built from such numbers may miss them).

MLflow: with ``--tracking-uri``, metrics ``lm_ppl/<dataset>/ctx<n>`` at the checkpoint's training step go into the
checkpoint's run (or ``--run-id``), through an outbox in ``CKPT_DIR/ppl`` (the table is also written there as
``ppl.csv``); a tracker that does not answer costs the metrics, never the table. With ``--tail``, also
``lm_ppl_tail/<dataset>/ctx<n>`` (none for a dataset without tail tokens) and the table's columns ``tail_tokens``,
``tail_nll`` and ``tail_ppl``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from asr_core.contract.metrics import lm_ppl_key, lm_ppl_tail_key
from asr_core.device import DeviceError, resolve_device, use_bf16
from asr_core.lm.data import Document, TextError, chunk_batches, read_documents
from asr_core.lm.model import KVCache, TransformerLM
from asr_core.data.tokenizer import Tokenizer

PPL_DIR = "ppl"
WORD_START = "\u2581"  # "▁": SentencePiece's marker of a word's first piece


@dataclass(frozen=True)
class Score:
    """Summed negative log-likelihood (nats) of ``targets`` predicted tokens; of them, ``tail_targets`` flagged ones
    (tail tokens) with the summed NLL ``tail_nll`` (0 when nothing was flagged)."""

    nll: float
    targets: int
    tail_nll: float = 0.0
    tail_targets: int = 0

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.targets) if self.targets else math.nan

    @property
    def tail_ppl(self) -> float:
        """Perplexity over the flagged tokens; NaN when there are none."""
        return math.exp(self.tail_nll / self.tail_targets) if self.tail_targets else math.nan


@torch.no_grad()
def score_documents(model: TransformerLM, docs: Sequence[Sequence[int]], context: int, *, chunk: int = 256,
                    batch: int = 8, bf16: bool = False, flags: Sequence[Sequence[bool]] | None = None) -> Score:
    """The summed NLL of every token of ``docs`` (token ids, no beginning-of-document token: it is added) at LM
    context ``context`` (see the module docstring), scored ``chunk`` tokens at a time on ``batch`` lanes on the
    model's device. The model's train/eval mode is restored afterwards. ``flags``: one flag per token of each
    document (tail tokens, :func:`tail_flags`); the flagged tokens' NLL is summed apart as well (``tail_nll``),
    the overall sum being the same as without them."""
    if context < 0 or chunk < 1 or batch < 1:
        raise ValueError(f"need context >= 0, chunk >= 1 and batch >= 1, got {context}, {chunk}, {batch}")
    if flags is not None and [len(f) for f in flags] != [len(d) for d in docs]:
        raise ValueError("flags must hold one flag per token of each document")
    # the flags read in the same chunks as the tokens (the same lanes and lengths; the added first token unflagged)
    flag_chunks = None if flags is None else chunk_batches([[int(bool(x)) for x in f] for f in flags], batch,
                                                           chunk, bos=0)
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=dev)
    tail_total = torch.zeros((), dtype=torch.float64, device=dev)
    targets = tail_targets = 0
    cache: KVCache | None = None
    try:
        for ch in chunk_batches(docs, batch, chunk, bos=model.bos_id):
            tokens, lengths = ch.tokens.to(dev), ch.lengths.to(dev)
            if cache is not None:
                cache = cache.forget(ch.reset)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                logits, cache = model(tokens[:, :-1], lengths, cache, window=context)
            valid = torch.arange(chunk, device=dev)[None, :] < lengths[:, None]  # (B, T)
            total += F.cross_entropy(logits[valid].float(), tokens[:, 1:][valid], reduction="sum").double()
            targets += int(lengths.sum())
            if flag_chunks is not None:
                tail = valid & next(flag_chunks).tokens[:, 1:].to(dev).bool()
                if bool(tail.any()):
                    tail_total += F.cross_entropy(logits[tail].float(), tokens[:, 1:][tail], reduction="sum").double()
                    tail_targets += int(tail.sum())
            cache = cache.trim(context)
    finally:
        model.train(was_training)
    return Score(float(total), targets, float(tail_total), tail_targets)


def piece_words(tok: Tokenizer, text: str, ids: Sequence[int]) -> tuple[list[str], list[int]]:
    """The words of ``text`` as its pieces ``ids`` (``tok.encode(text)``) hold them, and the index of the word each
    piece belongs to. A word starts at each piece that begins with the marker ``▁`` (and at the first piece). The
    words are ``text``'s whitespace words when there are as many of them; otherwise each word is the text its
    pieces decode to (the tokenizer's normalised spelling)."""
    of: list[int] = []
    for i in ids:
        starts = not of or tok.sp.id_to_piece(int(i)).startswith(WORD_START)
        of.append(of[-1] + starts if of else 0)
    count = of[-1] + 1 if of else 0
    words = text.split()
    if len(words) != count:
        groups: list[list[int]] = [[] for _ in range(count)]
        for i, w in zip(ids, of):
            groups[w].append(int(i))
        words = [tok.decode(g) for g in groups]
    return words, of


def tail_flags(tok: Tokenizer, text: str, ids: Sequence[int], is_tail: Callable[[str], bool]) -> list[bool]:
    """One flag per piece of ``ids`` (``tok.encode(text)``): whether it belongs to a word (:func:`piece_words`)
    for which ``is_tail`` holds; every piece of such a word is flagged."""
    words, of = piece_words(tok, text, ids)
    tail = [is_tail(w) for w in words]
    return [tail[w] for w in of]


def tail_test(words: Container[str]) -> Callable[[str], bool]:
    """Whether a word is a tail word: one of the words Whisper's normaliser makes of it alone is in ``words`` (a
    tail set, :class:`asr_core.scoring.tail.TailSet`: its rare words, and the words its text never says where it
    counts those); each distinct spelling is normalised once."""
    from asr_core.scoring.score import normalise

    seen: dict[str, bool] = {}

    def is_tail(word: str) -> bool:
        if word not in seen:
            seen[word] = any(w in words for w in normalise(word).split())
        return seen[word]

    return is_tail


def dataset_of(spec: str) -> tuple[str, str]:
    """``[NAME=]SOURCE`` -> (name, source for :func:`asr_core.lm.data.read_documents`). Unnamed: the file's stem
    (``text:PATH``) or the folder's name (``FORMAT:PATH``)."""
    from asr_core.contract.specs import dataset_name

    name = dataset_name(spec)
    if name:
        rest = spec.split("=", 1)[1]
        return name, rest if rest.startswith("text:") else spec  # a corpus reader takes its own NAME=
    path = Path(spec.split(":", 1)[1] if ":" in spec else spec)
    return (path.stem if spec.startswith("text:") else path.name) or spec, spec


@dataclass(frozen=True)
class PplRow:
    """One dataset at one context: per-token perplexity over ``targets`` tokens (``nll`` summed, in nats); with a
    tail set, the same over its ``tail_tokens`` tail tokens (None without one; ``tail_ppl`` NaN when there are
    none)."""

    dataset: str
    context: int
    targets: int
    nll: float
    ppl: float
    tail_tokens: int | None = None
    tail_nll: float | None = None
    tail_ppl: float | None = None


PLAIN_COLUMNS = ("dataset", "context", "targets", "nll", "ppl")  # ppl.csv without a tail set
TAIL_COLUMNS = ("tail_tokens", "tail_nll", "tail_ppl")  # after them, with one


def perplexity_table(model: TransformerLM, datasets: dict[str, Sequence[Sequence[int]]], contexts: Sequence[int],
                     *, chunk: int, batch: int, bf16: bool = False, log: bool = True,
                     flags: dict[str, Sequence[Sequence[bool]]] | None = None) -> list[PplRow]:
    """One row per (dataset, context), datasets in the given order, contexts as given. ``flags``: each dataset's
    tail-token flags (:func:`tail_flags`), for the rows' tail columns."""
    rows: list[PplRow] = []
    for name, docs in datasets.items():
        mine = None if flags is None else flags[name]
        for ctx in contexts:
            s = score_documents(model, docs, ctx, chunk=chunk, batch=batch, bf16=bf16, flags=mine)
            if mine is None:
                rows.append(PplRow(name, ctx, s.targets, s.nll, s.ppl))
            else:
                rows.append(PplRow(name, ctx, s.targets, s.nll, s.ppl, s.tail_targets, s.tail_nll, s.tail_ppl))
            if log:
                tail = "" if mine is None else f"; tail {s.tail_ppl:.3f} over {s.tail_targets} tail tokens"
                print(f"[lm] ppl {name} context {ctx}: {s.ppl:.3f} over {s.targets} tokens{tail}", file=sys.stderr,
                      flush=True)
    return rows


def has_tail(rows: Sequence[PplRow]) -> bool:
    """Whether the rows were scored with a tail set."""
    return any(r.tail_tokens is not None for r in rows)


def format_table(rows: Sequence[PplRow]) -> str:
    """Datasets down, contexts across (per-token perplexity); rows scored with a tail set add ``tail_tokens`` and
    the tail-token perplexity at each context (``tail_ctx<N>``) after them."""
    contexts = sorted({r.context for r in rows})
    names = list(dict.fromkeys(r.dataset for r in rows))
    width = max([7, *(len(n) for n in names)])
    tail = has_tail(rows)
    tw = max([11, *(len(f"tail_ctx{c}") for c in contexts)]) if tail else 0
    head = f"{'dataset':<{width}} {'tokens':>9} " + " ".join(f"{'ctx' + str(c):>9}" for c in contexts)
    if tail:
        head += f" {'tail_tokens':>{tw}} " + " ".join(f"{'tail_ctx' + str(c):>{tw}}" for c in contexts)
    lines = [head]
    for n in names:
        mine = {r.context: r for r in rows if r.dataset == n}
        first = next(iter(mine.values()))
        line = f"{n:<{width}} {first.targets:>9} " + " ".join(
            f"{mine[c].ppl:>9.3f}" if c in mine else f"{'':>9}" for c in contexts)
        if tail:
            line += f" {first.tail_tokens if first.tail_tokens is not None else '':>{tw}} " + " ".join(
                f"{mine[c].tail_ppl:>{tw}.3f}" if c in mine and mine[c].tail_ppl is not None else f"{'':>{tw}}"
                for c in contexts)
        lines.append(line)
    return "\n".join(lines)


def _write_csv(path: Path, rows: Sequence[PplRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    columns = PLAIN_COLUMNS + (TAIL_COLUMNS if has_tail(rows) else ())
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows({k: v for k, v in dataclasses.asdict(r).items() if k in columns} for r in rows)
    tmp.replace(path)


def _log(out: Path, run_id: str, tracking_uri: str, step: int, rows: Sequence[PplRow],
         table: Path) -> bool:
    """Metrics and the table into the run through an outbox in ``out``; whether MLflow took everything in time."""
    from asr_core.runtime import outbox as ob

    box = ob.Outbox(out, tracking_uri=tracking_uri, run_id=run_id).start()
    try:
        metrics = {lm_ppl_key(r.dataset, r.context): r.ppl for r in rows}
        metrics.update({lm_ppl_tail_key(r.dataset, r.context): r.tail_ppl for r in rows
                        if r.tail_ppl is not None and r.tail_tokens})
        box.metrics(step, metrics, first_only=False)
        box.artifact(table, PPL_DIR)
        ok = box.flush(ob.FINAL_FLUSH_S)
        if not ok:
            print(f"[lm] MLflow at {tracking_uri} has not taken the perplexities yet ({box.last_error or 'no answer'});"
                  f" ship them later: python -m asr_core outbox {out} --tracking-uri {tracking_uri} --run-id "
                  f"{run_id}", file=sys.stderr)
        return ok
    finally:
        box.close()


def run(a: argparse.Namespace, contexts: list[int]) -> int:
    """``lm ppl`` with its parsed options (:func:`asr_core.lm.ppl_args.cli` checks them first); the exit status."""
    from asr_core.runtime.outbox import fail_fast_http
    from asr_core.data.tokenizer import TokenizerError

    from asr_core.lm.checkpoint import LMTrainError, load_lm
    from asr_core.training.checkpoint import CheckpointError

    try:
        device = resolve_device(a.device, setting="--device")
    except DeviceError as e:
        print(f"lm ppl: {e}", file=sys.stderr)
        return 2
    if a.precision == "bf16" and device.type != "cuda":
        print("lm ppl: --precision bf16 needs CUDA; use auto or fp32 on the CPU", file=sys.stderr)
        return 2
    is_tail = None
    if a.tail is not None:
        from asr_core.scoring.tail import load_tail

        try:
            tail_set = load_tail(a.tail, "--tail")
        except (FileNotFoundError, ValueError) as e:
            print(f"lm ppl: {e}", file=sys.stderr)
            return 2
        if not len(tail_set):
            print(f"lm ppl: --tail {a.tail} holds no tail word: the tail-token perplexity is undefined (nan)",
                  file=sys.stderr)
        is_tail = tail_test(tail_set)
    try:
        lm = load_lm(a.checkpoint, device)
        tok = lm.tokenizer
        datasets: dict[str, list[list[int]]] = {}
        flags: dict[str, list[list[bool]]] | None = None if is_tail is None else {}
        for spec in a.data:
            name, source = dataset_of(spec)
            if name in datasets:
                raise TextError(f"two datasets are named {name!r}; name them: NAME=SPEC")
            docs: list[Document] = read_documents(source)
            encoded = [(d.text, x) for d, x in ((d, tok.encode(d.text)) for d in docs) if x]
            if not encoded:
                raise TextError(f"text source {spec!r} holds no text")
            datasets[name] = [x for _, x in encoded]
            if flags is not None and is_tail is not None:
                flags[name] = [tail_flags(tok, text, x, is_tail) for text, x in encoded]
    except (CheckpointError, LMTrainError, TextError, TokenizerError) as e:
        print(f"lm ppl: {e}", file=sys.stderr)
        return 2
    rows = perplexity_table(lm.model, datasets, contexts, chunk=a.chunk or lm.config.chunk_len, batch=a.batch,
                            bf16=use_bf16(a.precision, device), flags=flags)
    print(f"per-token perplexity of {a.checkpoint} (step {lm.step})")
    print(format_table(rows))
    out = a.checkpoint.parent / PPL_DIR
    table = out / "ppl.csv"
    _write_csv(table, rows)
    if a.tracking_uri:
        fail_fast_http()
        run_id = a.run_id or lm.mlflow_run_id
        if not run_id:
            print("lm ppl: no MLflow run (none given with --run-id, none in the checkpoint): not logged",
                  file=sys.stderr)
        elif _log(out, run_id, a.tracking_uri, lm.step, rows, table):
            print(f"[lm] logged {len(rows)} perplexities to run {run_id}", file=sys.stderr)
    return 0
