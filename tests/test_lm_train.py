"""LM training (``asr_core/lm/train.py``), perplexity vs context (``asr_core/lm/ppl.py``) and the ``lm`` commands
(``asr_core/lm/cli.py``), on the CPU with a micro model and generated text."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asr_core.runtime import signals
from asr_core.lm.cli import cli
from asr_core.lm.data import generate_documents, read_documents, write_documents
from asr_core.lm.model import build_lm
from asr_core.lm.ppl import score_documents
from asr_core.lm.checkpoint import LMTrainError, load_lm, load_tokenizer
from asr_core.lm.config import LMTrainConfig, resolve_config
from asr_core.lm.train import Preempted, encode, train_lm
from asr_core.data.tokenizer import Tokenizer

# a micro model: every component of the tiny preset, a few milliseconds a step
MICRO = ["batch=4", "chunk_len=16", "cache_len=32", "lm.d_model=32", "lm.heads=2", "lm.dpb_width=8",
         "warmup_steps=5", "lr=5e-3", "log_every=5"]
# the fixture's run: the tiny preset's LM (d=64), more tokens a step, a higher LR; about 0.1 s a step
TRAINED = [*MICRO, "lm.d_model=64", "lm.heads=4", "batch=8", "chunk_len=32", "cache_len=64", "lr=1e-2",
           "max_steps=40", "checkpoint_every=20"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> object:
    """Micro models run fastest on one thread, and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lmtext")
    write_documents(root / "train.jsonl", generate_documents(24, seed=1, min_words=40, max_words=90))
    write_documents(root / "dev.jsonl", generate_documents(4, seed=2, min_words=40, max_words=90))
    docs = [json.loads(line)["text"] for line in (root / "train.jsonl").read_text().splitlines()]
    Tokenizer.train(docs, 64, root / "tok.model")
    return {"root": root, "train": root / "train.jsonl", "dev": root / "dev.jsonl", "tok": root / "tok.model"}


def _cfg(text: dict[str, Path], *extra: str) -> LMTrainConfig:
    return resolve_config("tiny", [*MICRO, *extra], vocab_size=load_tokenizer(text["tok"]).vocab_size)


@pytest.fixture(scope="module")
def trained(text: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """40 steps with dev text and an MLflow run (SQLite store)."""
    out = tmp_path_factory.mktemp("lmrun")
    losses: list[float] = []
    uri = f"sqlite:///{out / 'mlflow.db'}"
    res = train_lm(_cfg(text, *TRAINED), [f"text:{text['train']}"],
                   load_tokenizer(text["tok"]), out / "run", dev_texts=[f"text:{text['dev']}"], tracking_uri=uri,
                   progress=lambda step, loss: losses.append(loss))
    return {"result": res, "losses": losses, "uri": uri, "out": out / "run"}


def test_loss_falls_and_the_run_is_logged(trained: dict) -> None:
    losses = trained["losses"]
    assert len(losses) == 40 and trained["result"].steps == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)  # 4.24 -> 3.26 nats here
    from mlflow.tracking import MlflowClient

    client = MlflowClient(trained["uri"])
    run = client.get_run(trained["result"].run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["lm.d_model"] == "64" and run.data.params["chunk_len"] == "32"
    history = client.get_metric_history(run.info.run_id, "lm/train_loss")
    assert sorted(m.step for m in history) == list(range(1, 41))
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(losses)
    dev = client.get_metric_history(run.info.run_id, "lm/dev_ppl")
    assert sorted(m.step for m in dev) == [20, 40] and dev[-1].value == pytest.approx(trained["result"].dev_ppl)


def test_checkpoint_loads_with_weights_only_and_holds_what_resume_needs(trained: dict) -> None:
    state = torch.load(trained["out"] / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert state["kind"] == "lm" and state["step"] == 40 and state["format_version"] == 1
    assert {"config", "model", "optimizer", "schedule", "rng", "data_position", "cache", "tokenizer",
            "data_fingerprint", "text", "mlflow_run_id", "tracking_uri", "precision"} <= set(state)
    assert state["cache"]["keys"].shape[:2] == (2, 8) and int(state["cache"]["lengths"].max()) <= 64
    lm = load_lm(trained["out"] / "checkpoint.pt")
    assert not lm.model.training and lm.step == 40 and lm.mlflow_run_id == trained["result"].run_id


def test_ppl_at_a_longer_context_is_lower_after_training(trained: dict, text: dict[str, Path]) -> None:
    lm = load_lm(trained["out"] / "checkpoint.pt")
    ids = encode(lm.tokenizer, read_documents(f"text:{text['dev']}"))
    ppl = {c: score_documents(lm.model, ids, c, chunk=32, batch=4).ppl for c in (2, 32)}
    assert ppl[32] < ppl[2], ppl  # 28.3 vs 43.6 here (the generator's documents repeat their topic's terms)


def test_chunks_can_start_anywhere_and_be_counted_without_building_them() -> None:
    import random

    from asr_core.lm.data import chunk_batches, count_chunks

    rng = random.Random(0)
    for _ in range(40):
        docs = [[rng.randint(1, 9) for _ in range(rng.randint(0, 30))] for _ in range(rng.randint(1, 9))]
        batch, length = rng.randint(1, 4), rng.randint(1, 7)
        full = list(chunk_batches(docs, batch, length, bos=0))
        assert count_chunks(docs, batch, length) == len(full)
        for start in (0, 1, len(full) // 2, len(full) - 1, len(full) + 1):
            part = list(chunk_batches(docs, batch, length, bos=0, start=max(start, 0)))
            assert len(part) == len(full[max(start, 0):])
            for x, y in zip(full[max(start, 0):], part):
                assert torch.equal(x.tokens, y.tokens) and torch.equal(x.lengths, y.lengths)
                assert torch.equal(x.reset, y.reset)


@pytest.mark.parametrize("context,chunk", [(0, 7), (3, 5), (12, 4), (6, 40)])
def test_chunked_scoring_equals_one_forward_with_that_window(text: dict[str, Path], context: int,
                                                             chunk: int) -> None:
    cfg = _cfg(text)
    torch.manual_seed(3)
    model = build_lm(cfg.lm).eval()
    docs = [torch.randint(0, cfg.lm.pieces, (n,)).tolist() for n in (23, 9, 31)]
    want = 0.0
    with torch.no_grad():
        for d in docs:
            seq = torch.tensor([[cfg.lm.bos_id, *d]])
            logits, _ = model(seq[:, :-1], torch.tensor([len(d)]), window=context)
            want += float(F.cross_entropy(logits[0], seq[0, 1:], reduction="sum"))
    got = score_documents(model, docs, context, chunk=chunk, batch=2)
    assert got.targets == sum(map(len, docs))
    assert got.nll == pytest.approx(want, rel=1e-5)


def test_resume_after_an_interruption_equals_the_uninterrupted_run(text: dict[str, Path], tmp_path: Path) -> None:
    # 8 short documents (about 65 tokens) on 4 lanes of 16 tokens: epochs of about 10 steps, so the 20 steps cross
    # into a second epoch (a fresh order); the stop at step 7 leaves a memory in every lane
    write_documents(tmp_path / "short.jsonl", generate_documents(8, seed=4, min_words=12, max_words=20))
    cfg, tok, texts = _cfg(text, "max_steps=20", "checkpoint_every=4"), load_tokenizer(text["tok"]), \
        [f"text:{tmp_path / 'short.jsonl'}"]
    straight: list[float] = []
    train_lm(cfg, texts, tok, tmp_path / "a", progress=lambda s, v: straight.append(v))

    def stop_at_7(step: int, loss: float) -> None:
        resumed.append(loss)
        if step == 7:
            os.kill(os.getpid(), signal.SIGUSR2)

    resumed: list[float] = []
    with pytest.raises(Preempted):
        train_lm(cfg, texts, tok, tmp_path / "b", progress=stop_at_7)
    signals.clear()
    mid = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert mid["step"] == 7 and int(mid["cache"]["lengths"].min()) > 0
    train_lm(cfg, texts, tok, tmp_path / "b", progress=lambda s, v: resumed.append(v))
    assert resumed == straight  # the same losses, bit for bit
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in "ab")
    assert a["step"] == b["step"] == 20 and a["data_position"] == b["data_position"]
    assert a["data_position"]["epoch"] >= 1
    for key in ("model", "optimizer", "cache"):
        _assert_identical(a[key], b[key], key)


def _assert_identical(x: object, y: object, where: str) -> None:
    """Nested dicts/lists of tensors and plain values, equal bit for bit."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), where
        for k in x:
            _assert_identical(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        assert isinstance(y, (list, tuple)) and len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            _assert_identical(u, v, f"{where}[{i}]")
    elif isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor) and torch.equal(x, y), where
    else:
        assert x == y, where


def test_resume_refuses_another_config(text: dict[str, Path], trained: dict, tmp_path: Path) -> None:
    import shutil

    shutil.copy(trained["out"] / "checkpoint.pt", tmp_path / "checkpoint.pt")
    with pytest.raises(LMTrainError, match=r"another config \(lr: 0\.01 -> 0\.001\)"):
        train_lm(_cfg(text, *TRAINED, "lr=1e-3"), [f"text:{text['train']}"], load_tokenizer(text["tok"]), tmp_path)
    # an execution setting (log_every) may change, the text may not
    with pytest.raises(LMTrainError, match="other content"):
        train_lm(_cfg(text, *TRAINED, "log_every=7"), [f"text:{text['dev']}"], load_tokenizer(text["tok"]),
                 tmp_path)


def _sets(*items: str) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def _run(args: list[str]) -> subprocess.Popen:
    code = "import sys; from asr_core.lm.cli import cli; sys.exit(cli(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_sigusr2_checkpoints_and_exits_75(text: dict[str, Path], tmp_path: Path) -> None:
    proc = _run(["train", "--text", f"text:{text['train']}", "--tokenizer", str(text["tok"]), "--out",
                 str(tmp_path), "--preset", "tiny", *_sets(*MICRO, "max_steps=100000", "log_every=1")])
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[lm] step 2/"):
            proc.send_signal(signal.SIGUSR2)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 75, "".join(seen) + rest
    assert "SIGUSR2 received" in rest
    assert 2 <= torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] < 100000


def test_a_tracker_that_is_down_does_not_stop_training(text: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    rc = cli(["train", "--text", f"text:{text['train']}", "--tokenizer", str(text["tok"]), "--out",
              str(tmp_path), "--preset", "tiny", "--tracking-uri", "http://127.0.0.1:9", *_sets(*MICRO, "max_steps=3")])
    assert rc == 0 and not signals.is_installed()  # the command's handlers are gone with it
    assert "cannot create an MLflow run" in capsys.readouterr().err
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 3


def test_lm_text_is_deterministic_and_prints_the_overlap(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--docs", "3", "--seed", "5", "--min-words", "30", "--max-words", "40"]
    assert cli(["text", str(tmp_path / "a.jsonl"), *args]) == 0
    assert cli(["text", str(tmp_path / "b.jsonl"), *args, "--against", f"text:{tmp_path / 'a.jsonl'}"]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"8-gram overlap with text:{tmp_path / 'a.jsonl'}: 1.0000")
    assert cli(["text", str(tmp_path / "c.jsonl"), "--docs", "3", "--seed", "6", "--min-words", "30",
                "--max-words", "40", "--against", f"text:{tmp_path / 'a.jsonl'}"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert (tmp_path / "c.jsonl").read_bytes() != (tmp_path / "a.jsonl").read_bytes()
    assert float(line.split(": ")[1].split()[0]) < 1.0


def test_bad_input_is_named_before_training_starts(text: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    base = ["train", "--text", f"text:{text['train']}", "--out", str(tmp_path / "out"), "--preset", "tiny"]
    assert cli([*base, "--tokenizer", str(tmp_path / "nope.model")]) == 2
    assert f"tokenizer file not found: {tmp_path / 'nope.model'}" in capsys.readouterr().err
    assert cli([*base, "--tokenizer", str(text["tok"]), "--set", "lm.widht=3"]) == 2
    assert "unknown key 'lm.widht'" in capsys.readouterr().err
    assert cli([*base, "--tokenizer", str(text["tok"]), "--set", "batch=0"]) == 2
    assert "invalid value for 'batch'" in capsys.readouterr().err
    assert cli([*base, "--tokenizer", str(text["tok"]), "--preset", "huge"]) == 2
    assert "unknown LM preset 'huge'; valid: paper, tiny" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    empty = ["train", "--text", f"text:{tmp_path / 'empty.jsonl'}", "--tokenizer", str(text["tok"]), "--out",
             str(tmp_path / "out"), "--preset", "tiny"]
    assert cli(empty) == 1
    assert f"text source 'text:{tmp_path / 'empty.jsonl'}' holds no text" in capsys.readouterr().err
    assert not (tmp_path / "out" / "checkpoint.pt").exists()


def test_the_tokenizer_comes_from_an_acoustic_checkpoint_or_a_model_file(text: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    from asr_core.training.checkpoint import save_checkpoint

    proto = text["tok"].read_bytes()
    save_checkpoint(tmp_path / "am.pt", {"config": {}, "model": {}, "tokenizer": proto, "format_version": 1})
    assert load_tokenizer(tmp_path / "am.pt").to_bytes() == proto == load_tokenizer(text["tok"]).to_bytes()
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(LMTrainError, match="junk.model: neither a checkpoint nor a SentencePiece model"):
        load_tokenizer(tmp_path / "junk.model")


def test_lm_ppl_prints_a_table_per_dataset_and_context(trained: dict, text: dict[str, Path],
                                                       capsys: pytest.CaptureFixture) -> None:
    rc = cli(["ppl", str(trained["out"] / "checkpoint.pt"), "--data", f"dev=text:{text['dev']}", "--data",
              f"text:{text['train']}", "--context", "4,32", "--tracking-uri", trained["uri"]])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[2:] == ["ctx4", "ctx32"] and out[2].split()[0] == "dev" and out[3].split()[0] == "train"
    dev = {int(r["context"]): float(r["ppl"]) for r in csv.DictReader(open(trained["out"] / "ppl" / "ppl.csv"))
           if r["dataset"] == "dev"}
    assert [float(x) for x in out[2].split()[2:]] == pytest.approx([dev[4], dev[32]], abs=1e-3)
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(trained["uri"]).get_metric_history(trained["result"].run_id, "lm_ppl/dev/ctx32")
    assert [(m.step, m.value) for m in logged] == [(40, pytest.approx(dev[32]))]
