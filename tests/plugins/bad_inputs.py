"""The table of bad inputs to the three tools, one owner for the test that checks each refusal
(``tests/test_bad_inputs.py``) and the benchmark that times them (``scripts/refusal_times.py``).

A :class:`Case` is one bad input: the tool (``python -m asr_core|orchestrate|analysis``), its arguments (``{d}`` is the
scratch folder :func:`make_scratch` fills with the bad files) and what the refusal must name. :func:`run_tool` runs one
as a subprocess and measures its CPU and wall time; :func:`problems` says what is wrong with its answer (exit status
not 2, a traceback or torch's advice to load with code, a name missing).
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NEVER = ("Traceback", "weights_only=False", "add_safe_globals", "safe_globals(")


@dataclass(frozen=True)
class Case:
    """One bad input: the tool, its arguments (``{d}`` is the scratch folder) and what the message must name."""

    id: str
    tool: str
    args: tuple[str, ...]
    names: tuple[str, ...]
    fast: bool = False
    never: tuple[str, ...] = field(default=())


def _grid(body: str) -> str:
    return "name: g\nseeds: [1]\nbase:\n  preset: tiny\n" + body


GRIDS = {
    "unknown-top.yaml": "name: g\nseeds: [1]\nbasis: {}\nsubgrids: {a: {axes: {data.context_s: [5.12]}}}\n",
    "unknown-sub.yaml": _grid("subgrids:\n  a:\n    axis: {data.context_s: [5.12]}\n"),
    "unknown-field.yaml": _grid("subgrids:\n  a:\n    axes: {model.dmodel: [64]}\n"),
    "bad-kind.yaml": _grid("  data: {train: 'podcsat:/nope'}\nsubgrids:\n  a:\n    axes: {data.context_s: [5.12]}\n"),
    "bad-eval-kind.yaml": _grid("  eval: {datasets: ['dev=podcats:/nope']}\nsubgrids:\n  a:\n"
                                "    axes: {data.context_s: [5.12]}\n"),
    "bad-seed.yaml": "name: g\nseeds: [-1]\nbase: {preset: tiny}\nsubgrids: {a: {axes: {data.context_s: [5.12]}}}\n",
    "bad-type.yaml": _grid("subgrids:\n  a:\n    axes: {model.d_model: [wide]}\n"),
    "negative.yaml": _grid("subgrids:\n  a:\n    axes: {data.context_s: [-5]}\n"),
    "list-top.yaml": "- a\n- b\n",
    "empty.yaml": "",
    "broken.yaml": "name: g\nseeds: [1\n",
}

CASES: tuple[Case, ...] = (
    # ---- asr_core: checkpoints --------------------------------------------------------------------------------
    Case("evaluate-text-as-pt", "asr_core", ("evaluate", "{d}/text.pt"),
         ("not a checkpoint of this project", "{d}/text.pt"), fast=True),
    Case("evaluate-random-pickle", "asr_core", ("evaluate", "{d}/pickle.pt"),
         ("not a checkpoint of this project", "{d}/pickle.pt")),
    Case("evaluate-torch-without-config", "asr_core", ("evaluate", "{d}/noconfig.pt"),
         ("not a checkpoint of this project", "{d}/noconfig.pt", "config")),
    Case("evaluate-empty-file", "asr_core", ("evaluate", "{d}/empty.pt"), ("{d}/empty.pt",)),
    Case("evaluate-directory", "asr_core", ("evaluate", "{d}"), ("{d}",)),
    Case("evaluate-trial-folder", "asr_core", ("evaluate", "{d}/trial"), ("did you mean", "{d}/trial/checkpoint.pt")),
    Case("heads-trial-folder", "asr_core", ("heads", "{d}/trial"), ("did you mean", "{d}/trial/checkpoint.pt")),
    Case("reach-trial-folder", "asr_core", ("reach", "{d}/trial"), ("did you mean", "{d}/trial/checkpoint.pt")),
    Case("evaluate-missing", "asr_core", ("evaluate", "{d}/missing.pt"), ("{d}/missing.pt", "not found")),
    Case("evaluate-bad-config", "asr_core", ("evaluate", "{d}/badconfig.pt"), ("{d}/badconfig.pt",)),
    Case("heads-text-as-pt", "asr_core", ("heads", "{d}/text.pt"), ("not a checkpoint of this project", "{d}/text.pt")),
    Case("heads-random-pickle", "asr_core", ("heads", "{d}/pickle.pt"),
         ("not a checkpoint of this project", "{d}/pickle.pt")),
    Case("reach-text-as-pt", "asr_core", ("reach", "{d}/text.pt"), ("not a checkpoint of this project", "{d}/text.pt")),
    Case("reach-random-pickle", "asr_core", ("reach", "{d}/pickle.pt"),
         ("not a checkpoint of this project", "{d}/pickle.pt")),
    Case("lm-ppl-random-pickle", "asr_core", ("lm", "ppl", "{d}/pickle.pt", "--data", "text:{d}/t.txt"),
         ("not a checkpoint of this project", "{d}/pickle.pt")),
    Case("lm-ppl-acoustic-checkpoint", "asr_core", ("lm", "ppl", "{d}/noconfig.pt", "--data", "text:{d}/t.txt"),
         ("{d}/noconfig.pt",)),
    Case("evaluate-unknown-corpus-kind", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--data",
                                                      "d=podcsat:{d}"), ("podcsat", "podcast")),
    Case("evaluate-missing-corpus", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--data", "d=podcast:{d}/nope"),
         ("{d}/nope",)),
    Case("evaluate-negative-stride", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--data",
                                                  "d=podcast:{d}/noaudio", "--stride", "-1"), ("stride", "-1")),
    Case("evaluate-acoustic-checkpoint-as-lm", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--decoder", "beam",
                                                            "--lm", "{d}/real.pt"), ("{d}/real.pt", "not an LM")),
    Case("evaluate-lm-checkpoint", "asr_core", ("evaluate", "{d}/lm.pt", "--no-log"), ("{d}/lm.pt", "LM checkpoint")),
    Case("heads-zero-rows", "asr_core", ("heads", "{d}/real.pt", "--no-log", "--data", "d=podcast:{d}/noaudio",
                                         "--rows", "0"), ("rows (0)",)),
    Case("reach-negative-targets", "asr_core", ("reach", "{d}/real.pt", "--data", "d=podcast:{d}/noaudio",
                                                "--targets", "-1"), ("targets (-1)",)),
    # ---- asr_core: configs, corpora, options ---------------------------------------------------------------------
    Case("recall-window-too-short", "asr_core", ("recall", "{d}/real.pt", "--data", "x=podcast:{d}/noaudio",
                                                 "--window-s", "1"), ("--window-s 1", "at least 2.56")),
    Case("tailset-unknown-unseen", "asr_core", ("tailset", "{d}/t.txt", "--out", "{d}/tail.json", "--unseen", "rare"),
         ("--unseen", "'rare'", "tail", "head")),
    Case("train-missing-config", "asr_core", ("train", "{d}/nope.yaml"), ("{d}/nope.yaml",)),
    Case("train-config-directory", "asr_core", ("train", "{d}"), ("{d}",)),
    Case("train-unknown-key", "asr_core", ("train", "{d}/unknown-key.yaml"), ("modle",)),
    Case("train-set-wrong-type", "asr_core", ("params", "{d}/tiny.yaml", "--set", "model.d_model=wide"),
         ("model.d_model", "wide")),
    Case("train-set-unknown-key", "asr_core", ("params", "{d}/tiny.yaml", "--set", "model.dmodel=4"),
         ("model.dmodel",)),
    Case("train-set-bad-kind", "asr_core", ("train", "{d}/tiny.yaml", "--set", "data.train=podcsat:/nope",
                                            "--out", "{d}/out"), ("podcsat",)),
    Case("train-missing-corpus", "asr_core", ("train", "{d}/tiny.yaml", "--set", "data.train=podcast:{d}/nope",
                                              "--out", "{d}/out2"), ("{d}/nope", "does not exist")),
    Case("train-set-bad-seed", "asr_core", ("params", "{d}/tiny.yaml", "--set", "train.seed=-1"), ("train.seed", "-1")),
    Case("prepare-unknown-kind", "asr_core", ("prepare", "podcsat:{d}", "--out", "{d}/prep"), ("podcsat", "podcast")),
    Case("prepare-folder-without-audio", "asr_core", ("prepare", "podcast:{d}/noaudio", "--out", "{d}/prep2"),
         ("{d}/noaudio",)),
    Case("prepare-transcripts-without-audio", "asr_core", ("prepare", "podcast:{d}/transcripts", "--out", "{d}/prep3"),
         ("{d}/transcripts", "no audio file")),
    Case("evaluate-transcripts-without-audio", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--data",
                                                            "d=podcast:{d}/transcripts"), ("{d}/transcripts",
                                                                                           "no audio file")),
    Case("synth-negative-hours", "asr_core", ("synth", "--out", "{d}/synth", "--hours", "-1", "--seed", "1"),
         ("--hours",)),
    Case("score-missing-hyp", "asr_core", ("score", "--ref", "e=earnings22:{d}/noref", "--hyp", "{d}/nohyp",
                                           "--system", "s", "--sweep", "x"), ("{d}/no",)),
    Case("unknown-command", "asr_core", ("evalute",), ("evalute", "evaluate"), fast=True),
    Case("outbox-not-a-trial-folder", "asr_core", ("outbox", "{d}/noaudio", "--tracking-uri", "sqlite:///{d}/m.db",
                                                   "--run-id", "r"), ("{d}/noaudio", "outbox")),
    Case("lm-tune-random-pickle-lm", "asr_core", ("lm", "tune", "{d}/text.pt", "--lm", "{d}/pickle.pt", "--data",
                                                  "d=podcast:{d}/noaudio"), ("not a checkpoint of this project",)),
    Case("lm-train-empty-tokenizer", "asr_core", ("lm", "train", "--text", "text:{d}/t.txt", "--tokenizer",
                                                  "{d}/empty.pt", "--out", "{d}/lm1"), ("{d}/empty.pt", "empty")),
    Case("lm-train-text-as-tokenizer", "asr_core", ("lm", "train", "--text", "text:{d}/t.txt", "--tokenizer",
                                                    "{d}/t.txt", "--out", "{d}/lm2"), ("{d}/t.txt", "SentencePiece")),
    Case("lm-train-unknown-reading", "asr_core", ("lm", "train", "--text", "text:{d}/t.txt", "--tokenizer",
                                                  "{d}/real.pt", "--out", "{d}/lm3", "--set", "lm.tie_embeddings=true",
                                                  "--set", "lm.memory.combine=concat"),
         ("lm.memory.combine", "'concat'", "replace, add")),
    Case("lm-train-buckets-zero", "asr_core", ("lm", "train", "--text", "text:{d}/t.txt", "--tokenizer",
                                               "{d}/real.pt", "--out", "{d}/lm4", "--set", "lm.tie_embeddings=true",
                                               "--set", "lm.memory.buckets=0"), ("lm.memory.buckets", ": 0;")),
    Case("evaluate-unknown-fusion", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--fusion", "chiu,median"),
         ("'median'", "not a window fusion method", "chiu-seconds")),
    Case("evaluate-snr-not-a-number", "asr_core", ("evaluate", "{d}/text.pt", "--snr", "loud"), ("--snr", "loud")),
    Case("evaluate-window-zero", "asr_core", ("evaluate", "{d}/real.pt", "--no-log", "--window-s", "5.12,0"),
         ("--window-s", "'5.12,0'", "positive numbers of seconds")),
    # ---- orchestrate -----------------------------------------------------------------------------------------
    Case("plan-directory", "orchestrate", ("plan", "{d}/grids"), ("{d}/grids", "grid file"), fast=True),
    Case("plan-missing", "orchestrate", ("plan", "{d}/nope.yaml"), ("{d}/nope.yaml",)),
    Case("plan-empty-file", "orchestrate", ("plan", "{d}/grids/empty.yaml"), ("{d}/grids/empty.yaml",)),
    Case("plan-broken-yaml", "orchestrate", ("plan", "{d}/grids/broken.yaml"), ("{d}/grids/broken.yaml:3:1",)),
    Case("plan-list-top", "orchestrate", ("plan", "{d}/grids/list-top.yaml"), ("{d}/grids/list-top.yaml", "mapping")),
    Case("plan-unknown-top-key", "orchestrate", ("plan", "{d}/grids/unknown-top.yaml"), ("basis", "subgrids")),
    Case("plan-unknown-subgrid-key", "orchestrate", ("plan", "{d}/grids/unknown-sub.yaml"), ("axis", "axes"),
         fast=True),
    Case("plan-unknown-field", "orchestrate", ("plan", "{d}/grids/unknown-field.yaml"), ("model.dmodel",)),
    Case("plan-unknown-corpus-kind", "orchestrate", ("plan", "{d}/grids/bad-kind.yaml"),
         ("podcsat", "{d}/grids/bad-kind.yaml", "podcast"), fast=True),
    Case("plan-unknown-eval-kind", "orchestrate", ("plan", "{d}/grids/bad-eval-kind.yaml"), ("podcats", "podcast")),
    Case("plan-negative-seed", "orchestrate", ("plan", "{d}/grids/bad-seed.yaml"), ("-1", "seed")),
    Case("plan-wrong-type", "orchestrate", ("plan", "{d}/grids/bad-type.yaml"), ("model.d_model", "wide")),
    Case("plan-negative-context", "orchestrate", ("plan", "{d}/grids/negative.yaml"), ("data.context_s",)),
    Case("plan-set-wrong-type", "orchestrate", ("plan", "{d}/grids/good.yaml", "--set", "model.d_model=wide"),
         ("model.d_model", "wide")),
    Case("plan-unknown-profile", "orchestrate", ("plan", "{d}/grids/good.yaml", "--estimate", "--profile", "a1000"),
         ("a1000",)),
    Case("plan-profile-unknown-key", "orchestrate", ("plan", "{d}/grids/good.yaml", "--estimate", "--profile",
                                                      "{d}/profile.yaml"), ("{d}/profile.yaml", "partitoin")),
    Case("plan-missing-calibration", "orchestrate", ("plan", "{d}/grids/good.yaml", "--estimate", "--calibration",
                                                      "{d}/nocal.json"), ("{d}/nocal.json",)),
    Case("plan-span-not-positive", "orchestrate", ("plan", "{d}/grids/good.yaml", "--set", "model.attention_span_s=0"),
         ("model.attention_span_s", "positive")),
    Case("plan-span-over-window", "orchestrate", ("plan", "{d}/grids/good.yaml", "--set",
                                                   "model.attention_span_s=600"), ("model.attention_span_s", "600",
                                                                                  "data.context_s")),
    Case("plan-set-without-value", "orchestrate", ("plan", "{d}/grids/good.yaml", "--set", "nokey"),
         ("nokey", "section.field=value")),
    Case("evaluate-decode-file-wrong-field", "orchestrate", ("evaluate", "nosweep", "--spec", "{d}/decode.yaml",
                                                             "--sweep-root", "{d}/runs"), ("alpah", "alpha")),
    Case("evaluate-decode-file-lm-not-a-checkpoint", "orchestrate", ("evaluate", "nosweep", "--spec",
                                                                     "{d}/decode-text-lm.yaml", "--sweep-root",
                                                                     "{d}/runs"),
         ("decode-text-lm.yaml", "not a checkpoint of this project", "{d}/text.pt")),
    Case("evaluate-decode-file-window-zero", "orchestrate", ("evaluate", "nosweep", "--spec",
                                                             "{d}/decode-window-zero.yaml", "--sweep-root", "{d}/runs"),
         ("decode-window-zero.yaml", "'window_s'", ": 0;", "positive numbers of seconds")),
    Case("evaluate-decode-file-window-negative", "orchestrate", ("evaluate", "nosweep", "--spec",
                                                                 "{d}/decode-window-negative.yaml", "--sweep-root",
                                                                 "{d}/runs"),
         ("decode-window-negative.yaml", "'window_s'", "-5.12", "positive numbers of seconds")),
    Case("evaluate-decode-file-name-without-decoder", "orchestrate", ("evaluate", "nosweep", "--spec",
                                                                      "{d}/decode-no-decoder.yaml", "--sweep-root",
                                                                      "{d}/runs"),
         ("decode-no-decoder.yaml", "no decoder", "'lm'", "leave out 'name'")),
    Case("evaluate-plain-test-set-with-stride", "orchestrate", ("evaluate", "nosweep", "--spec",
                                                                "{d}/decode-plain-stride.yaml", "--sweep-root",
                                                                "{d}/runs"),
         ("decode-plain-stride.yaml", "'stride'", "only 'datasets'")),
    Case("evaluate-decode-file-unknown-fusion", "orchestrate", ("evaluate", "nosweep", "--spec",
                                                                "{d}/decode-fusion-unknown.yaml", "--sweep-root",
                                                                "{d}/runs"),
         ("decode-fusion-unknown.yaml", "'fusion'", "'median'", "blockwise-frames")),
    Case("logs-missing-sweep", "orchestrate", ("logs", "nosuchsweep", "somekey", "--sweep-root", "{d}/runs"),
         ("nosuchsweep",)),
    Case("evaluate-bad-where", "orchestrate", ("evaluate", "nosweep", "--spec", "{d}/decode-good.yaml", "--where",
                                               "foo", "--sweep-root", "{d}/runs"), ("--where 'foo'", "KEY=VALUE")),
    Case("status-missing-sweep", "orchestrate", ("status", "nosuchsweep", "--sweep-root", "{d}/runs"),
         ("nosuchsweep",)),
    Case("submit-bad-max-failures", "orchestrate", ("submit", "{d}/grids/good.yaml", "--max-failures", "-3"),
         ("--max-failures", "-3")),
    Case("dashboard-missing-sweep", "asr_study", ("dashboard", "nosuchsweep", "--sweep-root", "{d}/runs"),
         ("nosuchsweep",)),
    # ---- analysis ----------------------------------------------------------------------------------------------
    Case("report-bad-tracking-uri", "analysis", ("report", "--experiment", "x", "--out", "{d}/rep", "--tracking-uri",
                                                 "bogus://x"), ("bogus://x",)),
    Case("report-significance-out-of-range", "analysis", ("report", "x", "--out", "{d}/rep", "--significance", "2"),
         ("--significance 2", "(0, 1)"), fast=True),
    Case("report-unknown-heads-repr", "analysis", ("report", "x", "--out", "{d}/rep", "--heads-repr", "Z"),
         ("--heads-repr", "'Z'")),
    Case("report-out-is-a-file", "analysis", ("report", "x", "--out", "{d}/t.txt"), ("--out", "{d}/t.txt", "is a file"),
         fast=True),
    Case("report-cache-is-a-file", "analysis", ("report", "x", "--out", "{d}/rep", "--cache", "{d}/t.txt"),
         ("--cache", "{d}/t.txt", "is a file"), fast=True),
    Case("bench-too-few-runs", "analysis", ("bench", "--runs", "1"), ("--runs 1", "at least 2"), fast=True),
    Case("compare-level-out-of-range", "analysis", ("compare", "x", "a", "b", "--level", "1.5"), ("--level 1.5",)),
    Case("compare-bad-bootstrap", "analysis", ("compare", "x", "a", "b", "--bootstrap", "-5",
                                               "--tracking-uri", "sqlite:///{d}/m.db"), ("--bootstrap", "-5")),
)


def make_scratch(d: Path) -> Path:
    """Write the bad files the cases name into the folder ``d`` (and the good ones some cases need beside them)."""
    import torch

    (d / "text.pt").write_text("hello, I am not a checkpoint\n")
    (d / "pickle.pt").write_bytes(pickle.dumps({"config": {1, 2, 3}, "model": [1.5]}))
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3}, d / "noconfig.pt")
    torch.save({"config": {"model": {"d_model": "wide"}}, "model": {}, "tokenizer": b"x", "format_version": 1},
               d / "badconfig.pt")
    (d / "empty.pt").write_bytes(b"")
    _acoustic_checkpoints(d)
    (d / "t.txt").write_text("some words\n")
    (d / "trial").mkdir(exist_ok=True)
    (d / "trial" / "checkpoint.pt").write_text("a trial folder's checkpoint\n")
    (d / "tiny.yaml").write_text("preset: tiny\n")
    (d / "unknown-key.yaml").write_text("preset: tiny\nmodle: {d_model: 4}\n")
    (d / "noaudio").mkdir()
    (d / "noaudio" / "readme.txt").write_text("no audio here\n")
    (d / "transcripts").mkdir()  # a podcast transcript whose audio is missing
    words = [{"startTime": "0.5s", "endTime": "1.0s", "word": "hello"}]
    (d / "transcripts" / "ep1.json").write_text(json.dumps({"results": [{"alternatives": [
        {"transcript": "hello", "confidence": 1.0, "words": words}]}]}))
    (d / "profile.yaml").write_text("name: p\npartitoin: gpu\n")
    (d / "decode.yaml").write_text("name: x\nlm: lm.pt\nalpah: 0.5\n")
    decoder = "alpha: 0.5\nbeta: 1\nbeam_width: 4\nlm_context: 64\n"
    (d / "decode-text-lm.yaml").write_text("name: x\nlm: text.pt\n" + decoder)
    (d / "decode-good.yaml").write_text("name: x\nlm: real.pt\n" + decoder)
    (d / "decode-window-zero.yaml").write_text("name: w\nwindow_s: [5.12, 0]\n")
    (d / "decode-no-decoder.yaml").write_text("name: w\ndatasets: [x=podcast:noaudio]\n")
    (d / "decode-plain-stride.yaml").write_text("datasets: [x=podcast:noaudio]\nstride: 0.5\n")
    (d / "decode-window-negative.yaml").write_text("name: w\nwindow_s: -5.12\n")
    (d / "decode-fusion-unknown.yaml").write_text("name: f\nfusion: [chiu, median]\n")
    grids = d / "grids"
    grids.mkdir()
    for name, text in GRIDS.items():
        (grids / name).write_text(text)
    (grids / "good.yaml").write_text(_grid("subgrids:\n  a:\n    axes: {data.context_s: [5.12]}\n"))
    return d


def _acoustic_checkpoints(d: Path) -> None:
    """``real.pt``: an untrained tiny model's checkpoint, as the trainer writes one; ``mismatch.pt``: the same with
    a weight missing (a damaged file); ``lm.pt``: one marked as an LM's."""
    import random

    import torch

    from asr_core.config import preset
    from asr_core.data.tokenizer import Tokenizer
    from asr_core.model.acoustic import build_model
    from asr_core.training.checkpoint import FORMAT_VERSION, save_checkpoint

    cfg = preset("tiny")
    rng = random.Random(0)
    words = "alpha beta gamma delta river stone cloud light sound water paper glass".split()
    tok = Tokenizer.train([" ".join(rng.choice(words) for _ in range(20)) for _ in range(100)], cfg.model.vocab_size)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        weights = build_model(cfg.model, cfg.data.features.n_mels).state_dict()
    state = {"config": cfg.to_dict(), "model": weights, "tokenizer": tok.to_bytes(), "format_version": FORMAT_VERSION,
             "step": 0}
    save_checkpoint(d / "real.pt", state)
    save_checkpoint(d / "mismatch.pt", {**state, "model": dict(list(weights.items())[1:])})
    save_checkpoint(d / "lm.pt", {**state, "kind": "lm", "config": {"lm": {}}})  # the shape of an LM's



@dataclass(frozen=True)
class Ran:
    """One finished run of a case: its exit status, its stdout and stderr together, its CPU and wall seconds."""

    returncode: int
    out: str
    cpu_s: float
    wall_s: float


def run_tool(tool: str, args: list[str], cwd: Path, env: dict[str, str] | None = None, repo: Path = REPO) -> Ran:
    """The finished ``python -m TOOL ARGS`` run in ``cwd`` with ``repo`` on the path (the CPU time is the child's
    user + system time, from the resource usage of this process's children)."""
    full_env = {**os.environ, "PYTHONPATH": str(repo), "XDG_CACHE_HOME": str(cwd / "cache"),
                "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db", **(env or {})}
    full_env.pop("ASR_DEBUG", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", tool, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                       timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Ran(r.returncode, r.stdout + r.stderr, cpu, wall)


def case_args(case: Case, scratch: Path) -> list[str]:
    """The case's arguments with ``{d}`` replaced by the scratch folder."""
    return [a.replace("{d}", str(scratch)) for a in case.args]


def problems(case: Case, scratch: Path, ran: Ran) -> list[str]:
    """What is wrong with a case's answer: an exit status other than 2, a forbidden text, a name not given."""
    found = [] if ran.returncode == 2 else [f"exit {ran.returncode}, not 2"]
    found += [f"{bad!r} in its output" for bad in NEVER + case.never if bad in ran.out]
    found += [f"{name!r} not named" for name in (n.replace("{d}", str(scratch)) for n in case.names)
              if name not in ran.out]
    return found
