"""``python -m asr_core lm prompt``: the text the LM reads before each recording when it decodes (paper 004 §3.4).

The authors prime their LM with one transcript of the training corpus, the same one for every recording: a Spotify
episode (``show_00BnuPjwbyMPxVIM7NimQj/7sHyO8wLeEd1LuxfS8AIls.json``, the first show of the corpus's folders; its
words joined and ended with a full stop; ``get_init_seq`` of ``eval/earnings22/tlm_beam.py``). This command writes
such a prompt from a training text: that episode where the text holds it (:data:`AUTHORS_EPISODE`), else the
document named by ``--document``, else the first document in id order. A prompt must never be a test transcript (it
would hand the LM the answer): every ``--not-in`` text is checked, and a prompt half of whose word 8-grams occur in
one of them is refused.

    python -m asr_core lm prompt --text podcast:data/train --out runs/lm-paper/prompt.txt [--not-in SPEC ...]

``grids/decode-lm.yaml`` reads the file it writes (``prompt:``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr_core.contract.trial import EXIT_OK, EXIT_USAGE

AUTHORS_EPISODE = "7sHyO8wLeEd1LuxfS8AIls"  # the authors' prompt: a Spotify episode id of the training corpus
NGRAM = 8
SAME_TEXT = 0.5  # a prompt whose 8-grams are this much in a --not-in text is taken for one of its transcripts


def choose(docs: list, document: str | None = None):
    """The prompt's document of ``docs`` (:class:`asr_core.lm.data.Document`): ``document`` when given (ValueError
    when no document has that id), else the authors' episode when present, else the first by id."""
    by_id = {d.id: d for d in docs}
    if document is not None:
        if document not in by_id:
            raise ValueError(f"--document {document!r} is not a document of the text; some it has: "
                             f"{', '.join(sorted(by_id)[:5])}")
        return by_id[document]
    if AUTHORS_EPISODE in by_id:
        return by_id[AUTHORS_EPISODE]
    return by_id[min(by_id)]


def prompt_text(text: str) -> str:
    """The prompt as the authors feed it: the words joined by spaces, ending with a full stop."""
    words = " ".join(text.split())
    return words if words.endswith(".") else words + "."


def cli(argv: list[str]) -> int:
    from asr_core.lm.data import TextError, ngram_overlap, read_documents

    ap = argparse.ArgumentParser(prog="python -m asr_core lm prompt", description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, metavar="SPEC", help="the LM's training text or the acoustic "
                    "training corpus (text:FILE.jsonl|FILE.txt|FOLDER or FORMAT:PATH)")
    ap.add_argument("--out", required=True, type=Path, help="the prompt file to write (a text file)")
    ap.add_argument("--document", default=None, help="the id of the document to use (default: the authors' episode "
                    "where the text has it, else the first by id)")
    ap.add_argument("--not-in", action="append", default=[], metavar="SPEC",
                    help="a test or dev text the prompt must not come from (repeatable; checked by word 8-grams)")
    a = ap.parse_args(argv)
    try:
        docs = read_documents(a.text)
        if not docs:
            raise ValueError(f"--text {a.text}: no documents with words")
        doc = choose(docs, a.document)
        for spec in a.not_in:
            shared = ngram_overlap(read_documents(spec), [doc], n=NGRAM)  # of the prompt's 8-grams, in the spec
            if shared >= SAME_TEXT:
                raise ValueError(f"{shared:.0%} of the prompt's word 8-grams ({doc.id} of {a.text}) are in {spec}: a "
                                 "prompt must not be a test transcript; give --text the training text, or --document "
                                 "another document")
    except (TextError, ValueError) as e:
        print(f"lm prompt: {e}", file=sys.stderr)
        return EXIT_USAGE
    a.out.parent.mkdir(parents=True, exist_ok=True)
    text = prompt_text(doc.text)
    a.out.write_text(text + "\n")
    print(f"wrote the prompt {a.out}: document {doc.id} of {a.text}, {len(text.split())} words"
          + (f"; not a transcript of {', '.join(a.not_in)}" if a.not_in else ""))
    return EXIT_OK
