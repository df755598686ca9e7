"""Tail-token perplexity (paper 002) in ``python -m asr_core lm ppl --tail FILE`` (``asr_core/lm/ppl.py``): the
perplexity over exactly the tokens of tail words, counted by hand; the words recovered from SentencePiece pieces;
the table, CSV and MLflow metrics with a tail set; without one, everything as before; a bad tail file."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asr_core.contract.metrics import lm_ppl_tail_key
from asr_core.data.tokenizer import Tokenizer
from asr_core.scoring.tail import TailSet
from asr_core.lm.checkpoint import load_lm
from asr_core.lm.cli import cli
from asr_core.lm.config import LMConfig, resolve_config
from asr_core.lm.data import Document, generate_documents, write_documents
from asr_core.lm.model import build_lm
from asr_core.lm.ppl import (PLAIN_COLUMNS, TAIL_COLUMNS, PplRow, format_table, perplexity_table, piece_words,
                             score_documents, tail_flags, tail_test)
from asr_core.lm.train import train_lm

V = 11  # 10 pieces + the beginning-of-document id
BOS = V - 1
MICRO = ["batch=4", "chunk_len=16", "cache_len=32", "lm.d_model=32", "lm.heads=2", "lm.dpb_width=8",
         "warmup_steps=1", "lr=5e-3", "log_every=1", "max_steps=2", "checkpoint_every=2"]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    docs = generate_documents(12, seed=1, min_words=40, max_words=90)
    return Tokenizer.train([d.text for d in docs], 64)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tok: Tokenizer) -> dict:
    """A two-step LM with an MLflow run, a dev text with tail words and their tail set."""
    root = tmp_path_factory.mktemp("tailppl")
    train = generate_documents(8, seed=1, min_words=40, max_words=90)
    write_documents(root / "train.jsonl", train)
    dev = [Document("a", "the Zebra, walked past the quokka and the zebra"),
           *generate_documents(2, seed=2, min_words=30, max_words=60)]
    write_documents(root / "dev.jsonl", dev)
    TailSet(frozenset({"zebra", "quokka"}), "hand", 0.05, 100, 0.03).write(root / "tail.json")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = resolve_config("tiny", MICRO, vocab_size=tok.vocab_size)
    res = train_lm(cfg, [f"text:{root / 'train.jsonl'}"], tok, root / "run", tracking_uri=uri)
    return {"root": root, "ckpt": root / "run" / "checkpoint.pt", "uri": uri, "run_id": res.run_id,
            "dev": root / "dev.jsonl", "tail": root / "tail.json"}


def test_tail_perplexity_is_the_mean_nll_over_exactly_the_flagged_tokens() -> None:
    torch.manual_seed(0)
    model = build_lm(LMConfig(vocab_size=V, d_model=16, layers=2, heads=2, dpb_width=8)).eval()
    docs = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3], [8, 9, 7, 9, 3, 2, 3]]
    flags = [[0, 1, 1, 0, 0, 0, 0, 1], [0, 0], [1, 0, 0, 0, 0, 1, 1]]
    context = 3
    nll = []  # per token, from one forward pass over each document
    with torch.no_grad():
        for d in docs:
            seq = torch.tensor([[BOS, *d]])
            logits, _ = model(seq[:, :-1], torch.tensor([len(d)]), window=context)
            nll.append(F.cross_entropy(logits[0], seq[0, 1:], reduction="none").tolist())
    # by hand: tokens 1, 2 and 7 of the first document, 0, 5 and 6 of the third, none of the second
    picked = [nll[0][1], nll[0][2], nll[0][7], nll[2][0], nll[2][5], nll[2][6]]
    got = score_documents(model, docs, context, chunk=3, batch=2, flags=[[bool(x) for x in f] for f in flags])
    assert got.tail_targets == 6 and got.targets == 17
    assert got.tail_nll == pytest.approx(sum(picked), rel=1e-5)
    assert got.tail_ppl == pytest.approx(math.exp(sum(picked) / 6), rel=1e-5)
    plain = score_documents(model, docs, context, chunk=3, batch=2)
    assert plain.nll == got.nll and plain.targets == got.targets  # the overall sum is untouched by the flags
    assert plain.tail_targets == 0 and math.isnan(plain.tail_ppl)
    none = score_documents(model, docs, context, chunk=3, batch=2, flags=[[False] * len(d) for d in docs])
    assert none.tail_targets == 0 and math.isnan(none.tail_ppl)
    with pytest.raises(ValueError, match="one flag per token"):
        score_documents(model, docs, context, flags=[[True]])


def test_pieces_map_to_their_words(tok: Tokenizer) -> None:
    text = "the Zebra, walked past quokka"
    ids = tok.encode(text)
    pieces = [tok.sp.id_to_piece(i) for i in ids]
    words, of = piece_words(tok, text, ids)
    assert words == text.split()
    assert len(of) == len(ids) and of[0] == 0 and of[-1] == 4 and of == sorted(of)
    for i, p in enumerate(pieces):  # a word starts exactly at a marked piece
        assert p.startswith("\u2581") == (i == 0 or of[i] != of[i - 1]), (pieces, of)
    for k, w in enumerate(text.split()):  # each word's pieces decode to it (case-folded; "," is unknown here)
        assert tok.decode([x for x, j in zip(ids, of) if j == k]).replace(" \u2047 ", ",") == w.lower()
    assert len([j for j in of if j == 1]) > 1  # "Zebra," takes several pieces of this small vocabulary
    flags = tail_flags(tok, text, ids, tail_test(frozenset({"zebra", "quokka"})))
    assert flags == [j in (1, 4) for j in of]  # every piece of "Zebra," and of "quokka", nothing else
    # words the text cannot give (counts that differ): the text the pieces decode to
    other = tok.encode("past the zebra")
    assert piece_words(tok, "two words", other)[0] == ["past", "the", "zebra"]
    assert piece_words(tok, "", []) == ([], [])


def test_tail_test_normalises_each_word() -> None:
    is_tail = tail_test(frozenset({"zebra", "color", "not"}))
    assert is_tail("Zebra,") and is_tail("ZEBRA") and is_tail("colour")  # Whisper's spellings: colour -> color
    assert is_tail("don't")  # "do not": one of its words is a tail word
    assert not is_tail("zebras") and not is_tail("the") and not is_tail("--")


def test_lm_ppl_with_tail_adds_columns_and_metrics(run: dict, tok: Tokenizer, capsys: pytest.CaptureFixture) -> None:
    rc = cli(["ppl", str(run["ckpt"]), "--data", f"dev=text:{run['dev']}", "--context", "4,32", "--batch", "2",
              "--tail", str(run["tail"]), "--tracking-uri", run["uri"]])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["dataset", "tokens", "ctx4", "ctx32", "tail_tokens", "tail_ctx4", "tail_ctx32"]
    rows = list(csv.DictReader(open(run["ckpt"].parent / "ppl" / "ppl.csv")))
    assert tuple(rows[0]) == PLAIN_COLUMNS + TAIL_COLUMNS
    # the tail tokens: every piece of "Zebra,", "quokka" and "zebra" in the first document (the others have none)
    words, of = piece_words(tok, "the Zebra, walked past the quokka and the zebra",
                            tok.encode("the Zebra, walked past the quokka and the zebra"))
    want = sum(words[j].strip(",").lower() in ("zebra", "quokka") for j in of)
    assert {int(r["tail_tokens"]) for r in rows} == {want}
    by_ctx = {int(r["context"]): r for r in rows}
    for r in by_ctx.values():
        assert float(r["tail_ppl"]) == pytest.approx(math.exp(float(r["tail_nll"]) / want))
    cells = out[2].split()
    assert cells[0] == "dev" and int(cells[4]) == want
    assert [float(x) for x in cells[5:]] == pytest.approx([float(by_ctx[c]["tail_ppl"]) for c in (4, 32)], abs=1e-3)
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(run["uri"]).get_metric_history(run["run_id"], lm_ppl_tail_key("dev", 32))
    assert [m.value for m in logged] == [pytest.approx(float(by_ctx[32]["tail_ppl"]))]


def test_without_tail_the_output_is_as_before(run: dict, capsys: pytest.CaptureFixture) -> None:
    rc = cli(["ppl", str(run["ckpt"]), "--data", f"dev=text:{run['dev']}", "--context", "4,32", "--batch", "2"])
    assert rc == 0
    out = capsys.readouterr().out
    table = run["ckpt"].parent / "ppl" / "ppl.csv"
    rows = list(csv.DictReader(open(table)))
    assert table.read_text().splitlines()[0] == "dataset,context,targets,nll,ppl"
    lm = load_lm(run["ckpt"])
    docs = [lm.tokenizer.encode(json.loads(x)["text"]) for x in run["dev"].read_text().splitlines()]
    again = perplexity_table(lm.model, {"dev": docs}, [4, 32], chunk=lm.config.chunk_len, batch=2, log=False)
    assert out == f"per-token perplexity of {run['ckpt']} (step {lm.step})\n{format_table(again)}\n"
    assert [(r["context"], r["targets"], r["nll"], r["ppl"]) for r in rows] == [
        (str(r.context), str(r.targets), str(r.nll), str(r.ppl)) for r in again]
    assert all(r.tail_tokens is None for r in again)
    # with a tail set the overall columns keep their values
    assert cli(["ppl", str(run["ckpt"]), "--data", f"dev=text:{run['dev']}", "--context", "4,32", "--batch", "2",
                "--tail", str(run["tail"])]) == 0
    tailed = capsys.readouterr().out.splitlines()
    assert [x.split()[:4] for x in tailed] == [x.split()[:4] for x in out.splitlines()]
    assert [{k: r[k] for k in PLAIN_COLUMNS} for r in csv.DictReader(open(table))] == rows


def test_the_plain_table_keeps_its_layout() -> None:
    rows = [PplRow("dev", 64, 1200, 3000.0, 12.18249), PplRow("dev", 1024, 1200, 2900.0, 11.2),
            PplRow("longer-name", 64, 35, 90.0, 13.1)]
    assert format_table(rows) == (
        "dataset        tokens     ctx64   ctx1024\n"
        "dev              1200    12.182    11.200\n"
        "longer-name        35    13.100          ")
    tail = [PplRow("dev", 64, 1200, 3000.0, 12.18249, 40, 200.0, 148.4)]
    assert format_table(tail).splitlines()[1].split() == ["dev", "1200", "12.182", "40", "148.400"]


@pytest.mark.parametrize("content", [None, "not json", json.dumps({"words": ["a"]}), "folder"])
def test_a_bad_tail_file_exits_2_naming_it(run: dict, tmp_path: Path, content: str | None,
                                           capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "tail.json"
    if content == "folder":
        bad.mkdir()
    elif content is not None:
        bad.write_text(content)
    rc = cli(["ppl", str(run["ckpt"]), "--data", f"dev=text:{run['dev']}", "--context", "4", "--tail", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--tail {bad}" in err and "tailset" in err, err
