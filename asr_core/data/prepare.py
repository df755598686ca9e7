"""``python -m asr_core prepare [NAME=]FORMAT:PATH --out OUT [--jobs N]``: read a corpus once and store it prepared
(:mod:`asr_core.data.corpora.prepared`), so that every trial opens it in seconds and maps it instead of holding it.

The podcast corpus (about 105,000 transcripts, tens of GB of JSON) is read in shards of ``--shard-size``
transcripts by ``--jobs`` processes; each finished shard is a small prepared corpus under ``OUT/shards/``, so a
preparation that is stopped (or a node that fails) continues where it was with the same command. The shards are then
merged into OUT, the fingerprint is computed, and the tokenizers are trained once on all transcripts. Other formats
(the test sets: at most a few hundred recordings) are read in one piece. A progress bar shows each stage.

The prepared corpus has its source's content fingerprint, so a trial may switch from ``NAME=podcast:RAW`` to
``NAME=prepared:OUT`` (same NAME) and keep its key and its checkpoints; a different NAME makes new trials.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from asr_core.contract.specs import split_named_spec, split_spec
from asr_core.data.corpora import CorpusError, read_corpus
from asr_core.data.corpora.base import Problems
from asr_core.data.corpora.prepared import MANIFEST, PreparedCorpus, merge_prepared, write_prepared
from asr_core.data.tokenizer import TokenizerError
from asr_core.contract.options import positional_alias, take_positional

SHARD_SIZE = 2000  # transcripts a shard holds: a few minutes of one core, a few hundred MB at most
PAPER_VOCAB = 4096
FAULT_ENV = "ASR_CORE_FAULT"  # tests only: "kill-after-shards:N" SIGKILLs the process group after N shards


def prepare_podcast(root: Path, out: Path, *, name: str, spec: str, jobs: int, shard_size: int, strict: bool,
                    vocab_sizes: list[int]) -> tuple[Path, list[tuple[str, str]]]:
    """The sharded preparation of a ``podcast`` corpus; (OUT, every skipped file with why)."""
    from tqdm import tqdm

    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.json") if p.is_file())
    if not files:
        raise CorpusError(f"corpus spec {spec!r}: no *.json transcripts under {root}")
    base = root if root.is_dir() else root.parent
    shards = [files[i:i + shard_size] for i in range(0, len(files), shard_size)]
    folder = out / "shards"
    plan = folder / "plan.json"  # the shards' files: a rerun with other files must not mix two listings
    listing = {"source": spec, "shard_size": shard_size, "files": len(files), "first": str(files[0]),
               "last": str(files[-1])}
    folder.mkdir(parents=True, exist_ok=True)
    if plan.exists() and json.loads(plan.read_text()) != listing:
        raise CorpusError(f"{folder} holds shards of another listing ({plan}: {plan.read_text().strip()}); "
                          f"remove {folder} to start again")
    plan.write_text(json.dumps(listing) + "\n")
    dirs = [folder / f"{k:05d}" for k in range(len(shards))]
    todo = [k for k, d in enumerate(dirs) if not (d / MANIFEST).exists()]
    done_files = len(files) - sum(len(shards[k]) for k in todo)
    if done_files:
        print(f"[prepare] {len(shards) - len(todo)} of {len(shards)} shards done before; continuing", file=sys.stderr)
    with tqdm(total=len(files), initial=done_files, desc="[prepare] reading", unit="file", file=sys.stderr) as bar:
        with ProcessPoolExecutor(max(1, jobs)) as pool:
            futures = {pool.submit(_shard, [str(f) for f in shards[k]], str(base), str(dirs[k]), spec, name,
                                   strict): k for k in todo}
            for n_done, fut in enumerate(as_completed(futures), 1):
                fut.result()  # a strict failure or a crash names its file here
                bar.update(len(shards[futures[fut]]))
                if os.environ.get(FAULT_ENV) == f"kill-after-shards:{n_done}":  # tests: the job killed, workers too
                    os.killpg(os.getpgid(0), signal.SIGKILL)
    skipped = [tuple(x) for d in dirs for x in json.loads((d / "skipped.json").read_text())]
    counts = {d: PreparedCorpus(d).manifest["recordings"] for d in dirs}
    if not any(counts.values()):
        raise CorpusError(f"corpus spec {spec!r}: no usable recordings under {root} ({len(skipped)} files skipped"
                          + (f", first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ")"))
    with tqdm(total=2 * sum(counts.values()), desc="[prepare] merging, fingerprint", unit="rec",
              file=sys.stderr) as bar:
        merge_prepared([d for d in dirs if counts[d]], out, name=name, source=spec, vocab_sizes=vocab_sizes,
                       progress=bar)
    shutil.rmtree(folder)
    return out, skipped  # type: ignore[return-value]


def _shard(files: list[str], base: str, out: str, spec: str, name: str, strict: bool) -> None:
    """One shard (in a worker process): its transcripts read, stored prepared, with what was skipped."""
    from asr_core.data.corpora.podcast import read_file

    problems = Problems(spec, strict=strict)
    recs = [r for f in files if (r := read_file(Path(f), Path(base), problems)) is not None]
    folder = Path(out)
    if folder.exists():  # an unfinished shard of a stopped preparation
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "skipped.json").write_text(json.dumps(problems.items))
    write_prepared(recs, folder, name=name, source=spec)


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m asr_core prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", metavar="[NAME=]FORMAT:PATH", help="the source corpus, e.g. podcasts=podcast:/data/sp")
    p.add_argument("--out", default=None, metavar="OUT",
                   help="the folder to write (required; must not hold a prepared corpus yet)")
    positional_alias(p, "out", "--out")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes reading podcast transcripts (default: this machine's cores)")
    p.add_argument("--shard-size", type=int, default=SHARD_SIZE, help=f"transcripts a shard (default {SHARD_SIZE})")
    p.add_argument("--strict", action="store_true", help="fail at the first bad file instead of skipping it")
    p.add_argument("--vocab-size", type=int, action="append", default=None, metavar="V",
                   help="train the tokenizer of V outputs (model.vocab_size, blank included) on all transcripts, "
                        f"once, for every trial of that size (repeatable; default: {PAPER_VOCAB}, the paper's)")
    args = p.parse_args(argv)
    take_positional(p, args, "out", "--out")
    if args.jobs < 1 or args.shard_size < 1:
        print(f"prepare: --jobs {args.jobs} and --shard-size {args.shard_size} must be positive", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        name, spec = split_named_spec(args.corpus)
        fmt, root = split_spec(spec)
        if (out / MANIFEST).exists():
            raise CorpusError(f"{out} already holds a prepared corpus ({out / MANIFEST}); remove it or choose "
                              "another OUT")
        if not root.exists():
            raise CorpusError(f"corpus spec {spec!r}: {root} does not exist")
        t0 = time.perf_counter()
        vocab = args.vocab_size or [PAPER_VOCAB]
        if fmt == "podcast":
            _, skipped = prepare_podcast(root, out, name=name, spec=spec, jobs=args.jobs, shard_size=args.shard_size,
                                         strict=args.strict, vocab_sizes=vocab)
        else:
            from tqdm import tqdm

            print(f"[prepare] reading {spec}", file=sys.stderr, flush=True)
            report = read_corpus(spec, strict=args.strict)
            skipped = report.skipped
            with tqdm(total=len(report.recordings), desc="[prepare] writing", unit="rec", file=sys.stderr) as bar:
                write_prepared(report.recordings, out, name=name, source=spec, progress=bar, vocab_sizes=vocab)
    except (CorpusError, TokenizerError) as e:
        print(f"prepare: {e}", file=sys.stderr)
        return 2
    m = PreparedCorpus(out).manifest
    print(f"[prepare] {m['recordings']} recordings, {m['hours']} h, {m['words']} words ({m['lexicon']} distinct, "
          f"times in {m['time_unit']}; tokenizers {', '.join(m['tokenizers']) or 'none'}); {len(skipped)} files "
          f"skipped; {time.perf_counter() - t0:.1f}s; fingerprint {m['fingerprint']}", file=sys.stderr)
    print(f"use it as: data.train={name + '=' if name else ''}prepared:{out}")
    if not name:
        print("[prepare] the corpus has no NAME: trials that name their data (NAME=FORMAT:PATH) keep their keys only "
              "when they keep the NAME", file=sys.stderr)
    return 0
