"""``python -m asr_core lm SUBCOMMAND ...``: the language model's commands.

- ``lm text --out OUT.jsonl --docs N --seed S [--min-words A --max-words B] [--against SPEC ...]``: generated documents in
  the synthetic corpus's language (:func:`asr_core.lm.data.generate_documents`); with ``--against``, the fraction
  of each SPEC's word 8-grams that the generated text contains (0: disjoint);
- ``lm train --text SPEC [--text SPEC ...] --tokenizer FILE --out DIR [--preset tiny|paper] [--set k=v ...]
  [--dev-text SPEC ...] [--tracking-uri U --sweep E]``: train or resume (:mod:`asr_core.lm.train`); exit 75
  after SIGUSR2/SIGTERM (checkpointed: run the same command again);
- ``lm prompt --text SPEC --out prompt.txt [--not-in SPEC ...]``: the text the LM reads before each recording
  when it decodes, one training transcript as the authors' (:mod:`asr_core.lm.prompt`);
- ``lm ppl CKPT --data SPEC [--data SPEC ...] --context 64,256,1024 [--tracking-uri U --run-id R]``: per-token
  perplexity at each context (:mod:`asr_core.lm.ppl`).

Each subcommand's heavy imports happen only when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from asr_core.contract.trial import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE
from asr_core.contract.options import positional_alias, renamed, take_positional
from asr_core.contract.tracking import tracking_uri as ledger_uri



def text_cli(argv: list[str]) -> int:
    from asr_core.lm.data import TextError, generate_documents, ngram_overlap, read_documents, write_documents

    ap = argparse.ArgumentParser(prog="python -m asr_core lm text",
                                 description="Write generated documents (JSON lines) for LM training.")
    ap.add_argument("--out", type=Path, default=None, help="the file to write, OUT.jsonl (required)")
    positional_alias(ap, "out", "--out")
    ap.add_argument("--docs", type=int, required=True, help="how many documents")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--min-words", type=int, default=300)
    ap.add_argument("--max-words", type=int, default=1500)
    ap.add_argument("--against", action="append", default=[], metavar="SPEC",
                    help="print the 8-gram overlap with this text or corpus (e.g. the test set: podcast:DIR)")
    a = ap.parse_args(argv)
    take_positional(ap, a, "out", "--out")
    try:
        docs = generate_documents(a.docs, a.seed, min_words=a.min_words, max_words=a.max_words)
    except ValueError as e:
        print(f"lm text: {e}", file=sys.stderr)
        return EXIT_USAGE
    write_documents(a.out, docs)
    print(f"wrote {len(docs)} documents, {sum(len(d.text.split()) for d in docs)} words, to {a.out}")
    for spec in a.against:
        try:
            other = read_documents(spec)
        except TextError as e:
            print(f"lm text: {e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"8-gram overlap with {spec}: {ngram_overlap(docs, other, n=8):.4f} of its 8-grams occur in {a.out}")
    return EXIT_OK


def train_cli(argv: list[str]) -> int:
    from asr_core.runtime import signals

    with signals.installed():  # before anything heavy: a stop signal during the imports or the setup is honoured
        return _train(argv)


def _train(argv: list[str]) -> int:
    from asr_core.config.parse import ConfigError
    from asr_core.training.checkpoint import CheckpointError
    from asr_core.runtime.outbox import fail_fast_http
    from asr_core.data.tokenizer import TokenizerError

    from asr_core.lm.checkpoint import LMTrainError, load_tokenizer
    from asr_core.lm.config import resolve_config
    from asr_core.lm.train import DEFAULT_EXPERIMENT, Preempted, train_lm

    ap = argparse.ArgumentParser(prog="python -m asr_core lm train",
                                 description="Train (or resume) the Transformer LM, Transformer-XL style.")
    ap.add_argument("--text", action="append", required=True, metavar="SPEC",
                    help="text:FILE.jsonl|FILE.txt|FOLDER or a corpus spec FORMAT:PATH (repeatable)")
    ap.add_argument("--tokenizer", required=True, type=Path,
                    help="an acoustic checkpoint (its tokenizer) or a SentencePiece .model file")
    ap.add_argument("--out", required=True, type=Path, help="run folder: checkpoint.pt, outbox/")
    ap.add_argument("--preset", default="paper", help="paper (default) or tiny (CPU tests and demos)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="e.g. lm.d_model=128, lr=1e-3, max_steps=500 (repeatable)")
    ap.add_argument("--dev-text", action="append", default=[], metavar="SPEC",
                    help="perplexity of this text is logged at each checkpoint (lm/dev_ppl)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI; "
                    "neither: nothing is logged to MLflow)")
    renamed(ap, "--experiment", ap.add_argument("--sweep", dest="experiment", default=DEFAULT_EXPERIMENT,
                                                help="the sweep (MLflow experiment) of a new run (default "
                                                     f"{DEFAULT_EXPERIMENT})"))
    ap.add_argument("--run-id", default=None, help="continue this MLflow run")
    a = ap.parse_args(argv)
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    try:
        tok = load_tokenizer(a.tokenizer)
        cfg = resolve_config(a.preset, a.overrides, vocab_size=tok.vocab_size)
    except (LMTrainError, ConfigError, CheckpointError, TokenizerError) as e:
        print(f"lm train: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = train_lm(cfg, a.text, tok, a.out, dev_texts=a.dev_text,
                          tracking_uri=ledger_uri(a.tracking_uri, local_default=False), run_id=a.run_id,
                          experiment=a.experiment)
    except Preempted as e:
        print(f"[lm] preempted ({e}); resume with the same command", file=sys.stderr)
        return EXIT_PREEMPTED
    except (LMTrainError, CheckpointError, ConfigError) as e:
        print(f"lm train: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"checkpoint: {result.checkpoint}")
    if result.dev_ppl is not None:
        print(f"dev ppl: {result.dev_ppl:.3f}")
    return EXIT_OK


def ppl_cli(argv: list[str]) -> int:
    from asr_core.lm.ppl_args import cli

    return cli(argv)


def _prompt(argv: list[str]) -> int:
    from asr_core.lm.prompt import cli

    return cli(argv)


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "text": (text_cli, "generated documents: text --out OUT.jsonl --docs N --seed S [--against SPEC]"),
    "train": (train_cli, "train the LM: train --text SPEC --tokenizer FILE --out DIR [--preset P] [--set k=v]"),
    "prompt": (lambda argv: _prompt(argv),
               "the decoding prompt: prompt --text TRAIN_SPEC --out prompt.txt [--not-in TEST_SPEC]"),
    "ppl": (ppl_cli, "perplexity vs context: ppl CKPT --data SPEC --context 64,256,1024"),
    "tune": (lambda argv: _tune(argv), "alpha and beta on a dev set: tune AM_CKPT --lm LM_CKPT --data NAME=FORMAT:PATH"),
}


def _tune(argv: list[str]) -> int:
    from asr_core.lm.tune import cli as tune_cli

    return tune_cli(argv)


def cli(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m asr_core lm SUBCOMMAND [ARGS]\n\nsubcommands:")
        for name, (_, text) in SUBCOMMANDS.items():
            print(f"  {name:6s} {text}")
        return EXIT_OK if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"lm: unknown subcommand {name!r}; valid: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    return int(SUBCOMMANDS[name][0](rest) or 0)
