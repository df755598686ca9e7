"""``python -m asr_core prepare [NAME=]FORMAT:PATH OUT``: read a corpus once and store it prepared
(:mod:`asr_core.corpora.prepared`), so that every trial opens it in seconds and maps it instead of holding it.

The prepared corpus has its source's content fingerprint, so a trial may switch from ``NAME=podcast:RAW`` to
``NAME=prepared:OUT`` (same NAME) and keep its key and its checkpoints; a different NAME makes new trials.
"""

from __future__ import annotations

import argparse
import sys
import time

from asr_core.corpora import CorpusError, dataset_name, read_corpus, split_named_spec
from asr_core.corpora.prepared import write_prepared
from asr_core.tokenizer import TokenizerError


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m asr_core prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", metavar="[NAME=]FORMAT:PATH", help="the source corpus, e.g. podcasts=podcast:/data/sp")
    p.add_argument("out", metavar="OUT", help="the folder to write (must not hold a prepared corpus yet)")
    p.add_argument("--strict", action="store_true", help="fail at the first bad file instead of skipping it")
    p.add_argument("--vocab-size", type=int, action="append", default=None, metavar="V",
                   help="train the tokenizer of V outputs (model.vocab_size, blank included) on all transcripts, "
                        "once, for every trial of that size (repeatable; default: 4096, the paper's)")
    args = p.parse_args(argv)
    from tqdm import tqdm

    try:
        name, spec = split_named_spec(args.corpus)
        t0 = time.perf_counter()
        print(f"[prepare] reading {spec}", file=sys.stderr, flush=True)
        report = read_corpus(spec, strict=args.strict)
        t_read = time.perf_counter() - t0
        with tqdm(total=len(report.recordings), desc="[prepare] writing", unit="rec", file=sys.stderr) as bar:
            out = write_prepared(report.recordings, args.out, name=name, source=spec, progress=bar,
                                 vocab_sizes=args.vocab_size or [4096])
    except (CorpusError, TokenizerError) as e:
        print(f"prepare: {e}", file=sys.stderr)
        return 2
    from asr_core.corpora.prepared import PreparedCorpus

    m = PreparedCorpus(out).manifest
    use = f"{dataset_name(args.corpus) + '=' if name else ''}prepared:{out}"
    print(f"[prepare] {m['recordings']} recordings, {m['hours']} h, {m['words']} words ({m['lexicon']} distinct, "
          f"times in {m['time_unit']}; tokenizers {', '.join(m['tokenizers']) or 'none'}); {len(report.skipped)} files skipped; read in {t_read:.1f}s, "
          f"total {time.perf_counter() - t0:.1f}s; fingerprint {m['fingerprint']}", file=sys.stderr)
    print(f"use it as: data.train={use}")
    if not name:
        print("[prepare] the corpus has no NAME: trials that name their data (NAME=FORMAT:PATH) keep their keys only "
              "when they keep the NAME", file=sys.stderr)
    return 0
