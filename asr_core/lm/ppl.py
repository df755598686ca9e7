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

MLflow: with ``--tracking-uri``, metrics ``lm_ppl/<dataset>/ctx<n>`` at the checkpoint's training step go into the
checkpoint's run (or ``--run-id``), through an outbox in ``CKPT_DIR/ppl`` (the table is also written there as
``ppl.csv``); a tracker that does not answer costs the metrics, never the table.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from asr_core.contract.metrics import lm_ppl_key
from asr_core.device import DeviceError, resolve_device, use_bf16
from asr_core.lm.data import Document, TextError, chunk_batches, read_documents
from asr_core.lm.model import KVCache, TransformerLM
from asr_core.contract.options import renamed

PPL_DIR = "ppl"


@dataclass(frozen=True)
class Score:
    """Summed negative log-likelihood (nats) of ``targets`` predicted tokens."""

    nll: float
    targets: int

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.targets) if self.targets else math.nan


@torch.no_grad()
def score_documents(model: TransformerLM, docs: Sequence[Sequence[int]], context: int, *, chunk: int = 256,
                    batch: int = 8, bf16: bool = False) -> Score:
    """The summed NLL of every token of ``docs`` (token ids, no beginning-of-document token: it is added) at LM
    context ``context`` (see the module docstring), scored ``chunk`` tokens at a time on ``batch`` lanes on the
    model's device. The model's train/eval mode is restored afterwards."""
    if context < 0 or chunk < 1 or batch < 1:
        raise ValueError(f"need context >= 0, chunk >= 1 and batch >= 1, got {context}, {chunk}, {batch}")
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=dev)
    targets = 0
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
            cache = cache.trim(context)
    finally:
        model.train(was_training)
    return Score(float(total), targets)


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
    """One dataset at one context: per-token perplexity over ``targets`` tokens (``nll`` summed, in nats)."""

    dataset: str
    context: int
    targets: int
    nll: float
    ppl: float


def perplexity_table(model: TransformerLM, datasets: dict[str, Sequence[Sequence[int]]], contexts: Sequence[int],
                     *, chunk: int, batch: int, bf16: bool = False, log: bool = True) -> list[PplRow]:
    """One row per (dataset, context), datasets in the given order, contexts as given."""
    rows: list[PplRow] = []
    for name, docs in datasets.items():
        for ctx in contexts:
            s = score_documents(model, docs, ctx, chunk=chunk, batch=batch, bf16=bf16)
            rows.append(PplRow(name, ctx, s.targets, s.nll, s.ppl))
            if log:
                print(f"[lm] ppl {name} context {ctx}: {s.ppl:.3f} over {s.targets} tokens", file=sys.stderr,
                      flush=True)
    return rows


def format_table(rows: Sequence[PplRow]) -> str:
    """Datasets down, contexts across (per-token perplexity)."""
    contexts = sorted({r.context for r in rows})
    names = list(dict.fromkeys(r.dataset for r in rows))
    width = max([7, *(len(n) for n in names)])
    lines = [f"{'dataset':<{width}} {'tokens':>9} " + " ".join(f"{'ctx' + str(c):>9}" for c in contexts)]
    for n in names:
        mine = {r.context: r for r in rows if r.dataset == n}
        tokens = next(iter(mine.values())).targets
        lines.append(f"{n:<{width}} {tokens:>9} " + " ".join(
            f"{mine[c].ppl:>9.3f}" if c in mine else f"{'':>9}" for c in contexts))
    return "\n".join(lines)


def _write_csv(path: Path, rows: Sequence[PplRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in dataclasses.fields(PplRow)])
        w.writeheader()
        w.writerows(dataclasses.asdict(r) for r in rows)
    tmp.replace(path)


def _log(out: Path, run_id: str, tracking_uri: str, step: int, rows: Sequence[PplRow],
         table: Path) -> bool:
    """Metrics and the table into the run through an outbox in ``out``; whether MLflow took everything in time."""
    from asr_core.runtime import outbox as ob

    box = ob.Outbox(out, tracking_uri=tracking_uri, run_id=run_id).start()
    try:
        box.metrics(step, {lm_ppl_key(r.dataset, r.context): r.ppl for r in rows}, first_only=False)
        box.artifact(table, PPL_DIR)
        ok = box.flush(ob.FINAL_FLUSH_S)
        if not ok:
            print(f"[lm] MLflow at {tracking_uri} has not taken the perplexities yet ({box.last_error or 'no answer'});"
                  f" ship them later: python -m asr_core outbox {out} --tracking-uri {tracking_uri} --run-id "
                  f"{run_id}", file=sys.stderr)
        return ok
    finally:
        box.close()


def cli(argv: list[str]) -> int:
    from asr_core.runtime.outbox import fail_fast_http
    from asr_core.data.tokenizer import TokenizerError

    from asr_core.lm.checkpoint import LMTrainError, load_lm
    from asr_core.training.checkpoint import CheckpointError

    ap = argparse.ArgumentParser(prog="python -m asr_core lm ppl",
                                 description="Per-token perplexity of an LM checkpoint at several contexts.")
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", action="append", required=True, metavar="[NAME=]SPEC",
                    help="text:FILE.jsonl|FILE.txt|FOLDER or a corpus spec FORMAT:PATH (repeatable)")
    renamed(ap, "--context", ap.add_argument("--lm-contexts", dest="context", default="64,256,1024",
                                             help="LM contexts in tokens, comma-separated"))
    ap.add_argument("--chunk", type=int, default=0, help="tokens scored per forward pass (0: the training chunk)")
    ap.add_argument("--batch", type=int, default=8, help="documents scored side by side")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                    help="auto: bf16 autocast on CUDA, fp32 on the CPU")
    ap.add_argument("--tracking-uri", default=None, help="log lm_ppl/<dataset>/ctx<n> to MLflow there")
    ap.add_argument("--run-id", default=None, help="the run to log into (default: the checkpoint's)")
    a = ap.parse_args(argv)
    try:
        contexts = sorted({int(c) for c in a.context.split(",") if c.strip()})
        if not contexts or min(contexts) < 0:
            raise ValueError
    except ValueError:
        print(f"lm ppl: --lm-contexts {a.context!r} must be non-negative integers separated by commas, e.g. 64,256,1024",
              file=sys.stderr)
        return 2
    try:
        device = resolve_device(a.device, setting="--device")
    except DeviceError as e:
        print(f"lm ppl: {e}", file=sys.stderr)
        return 2
    if a.precision == "bf16" and device.type != "cuda":
        print("lm ppl: --precision bf16 needs CUDA; use auto or fp32 on the CPU", file=sys.stderr)
        return 2
    try:
        lm = load_lm(a.checkpoint, device)
        tok = lm.tokenizer
        datasets: dict[str, list[list[int]]] = {}
        for spec in a.data:
            name, source = dataset_of(spec)
            if name in datasets:
                raise TextError(f"two datasets are named {name!r}; name them: NAME=SPEC")
            docs: list[Document] = read_documents(source)
            ids = [x for x in (tok.encode(d.text) for d in docs) if x]
            if not ids:
                raise TextError(f"text source {spec!r} holds no text")
            datasets[name] = ids
    except (CheckpointError, LMTrainError, TextError, TokenizerError) as e:
        print(f"lm ppl: {e}", file=sys.stderr)
        return 2
    rows = perplexity_table(lm.model, datasets, contexts, chunk=a.chunk or lm.config.chunk_len, batch=a.batch,
                            bf16=use_bf16(a.precision, device))
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
