"""``orchestrate evaluate SWEEP --decode FILE`` (the same as ``--spec``): beam-search decoding of a finished
sweep's models as evaluation jobs of the sweep.

A tiny real sweep (two models of the tiny preset, trained a few steps and evaluated greedily on a one-recording dev
set) is finished once on the ``local`` backend. Invalid decode files exit 2 having written nothing; a decode without
an LM logs ``wer_<name>/dev`` into the runs of the models ``--where`` selects, a second call decodes only the rest,
a third submits nothing; a name reused with another setting is refused naming both files; the models' keys,
folders and runs never change. On the SLURM test cluster the same decode goes out as the sweep's arrays (one per
``MaxArraySize`` jobs, named as its training arrays) whose results land in the runs, and a call while they are
queued or running submits nothing new.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

from asr_core.contract.trial import FINISHED
from orchestrate.backends import slurm_commands
from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.sweep.folder import SweepDir
from tests.folder_snapshot import snapshot
from tests.test_backend import smoke_corpus, squeue_states, wait_until, write_profile

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

# the tests that share the module's finished sweep run on one worker, so it is trained once
# slow: every test reads a sweep trained for the module (about a minute), so the fast tier leaves the module out
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("orchestrate_evaluate"), pytest.mark.slow]

GRID = """
name: %s
seeds: [1]
base:
  preset: tiny
  data: {train: "podcast:%s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: 2, warmup_steps: 2, checkpoint_every: 2, device: cpu, precision: fp32}
  eval: {datasets: ["dev=podcast:%s"], stride: 1.0}
subgrids:
  heads:
    axes: {model.heads: [2, 4]}
"""
# beam search without an LM, narrow and with windows that do not overlap: seconds per trial on a CPU
DECODE = """
name: %s
lm: null
beta: 0.5
beam_width: 4
stride: 1.0
"""


def _dev_set(corpus: Path, out: Path) -> Path:
    """A podcast folder holding the corpus's shortest recording (about 30 s)."""
    shortest = min(corpus.glob("train/*.wav"), key=lambda p: p.stat().st_size)
    out.mkdir(parents=True)
    for p in (shortest, shortest.with_suffix(".json")):
        shutil.copy(p, out / p.name)
    return out


def _submit(tmp: Path, corpus: Path, name: str, *extra: str) -> tuple[Path, SweepDir]:
    dev = _dev_set(corpus, tmp / "dev")
    grid = tmp / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID % (name, corpus, dev)))
    root = tmp / "runs"
    assert main(["submit", str(grid), "--sweep-root", str(root), *extra]) == 0
    return root, SweepDir(root, name)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, smoke_corpus: Path) -> tuple[Path, SweepDir]:
    """(sweep root, sweep) of a local sweep whose two trials are FINISHED."""
    root, sweep = _submit(tmp_path_factory.mktemp("evaluate"), smoke_corpus, "dec", "--backend", "local")
    runs = Ledger(sweep.read_manifest().tracking_uri, sweep.name).trial_runs()
    assert len(runs) == 2 and {r.status for r in runs.values()} == {FINISHED}
    return root, sweep


def _decode_file(folder: Path, name: str, text: str | None = None) -> Path:
    p = folder / f"{name}-{uuid.uuid4().hex[:6]}.yaml"
    p.write_text(textwrap.dedent(text if text is not None else DECODE % name))
    return p


def _evaluate(root: Path, sweep: SweepDir, decode: Path, *extra: str) -> int:
    return main(["evaluate", sweep.name, "--decode", str(decode), "--sweep-root", str(root), *extra])


def _metrics(sweep: SweepDir) -> dict[str, dict[str, float]]:
    """{trial key: its run's wer metrics}."""
    uri = sweep.read_manifest().tracking_uri
    client = MlflowClient(uri)
    return {k: {m: v for m, v in client.get_run(r.run_id).data.metrics.items() if m.startswith("wer")}
            for k, r in Ledger(uri, sweep.name).trial_runs().items()}


def _trial_files(sweep: SweepDir) -> dict[str, Any]:
    """Everything of the models: their folders (files, bytes, times) and their entries in the sweep's trial list
    (evaluation jobs are added beside them)."""
    models = [t for t in json.loads((sweep.path / "trials.json").read_text()) if not t.get("evaluation")]
    return {"folders": {t["key"]: snapshot(sweep.trial_dir(t["key"])) for t in models}, "trials.json": models}


def _new_submissions(sweep: SweepDir, before: list[str]) -> list[Any]:
    return [s for s in sweep.submissions() if s.id not in before]


BAD = {
    "unknown key": ("name: b\nlm: null\nbeta: 1\nbeam: 4\n", "unknown key 'beam'"),
    "missing lm file": ("name: b\nlm: no-such-lm.pt\nalpha: 0.4\nbeta: 1\n", "lm 'no-such-lm.pt' not found"),
    "bad alpha": ("name: b\nlm: lm.pt\nalpha: high\nbeta: 1\n", "invalid value for 'alpha': 'high'"),
    "alpha without an LM": ("name: b\nlm: null\nalpha: 0.4\nbeta: 1\n", "'alpha' is 0.4 but lm is null"),
    "bad name": ("name: greedy\nlm: null\nbeta: 1\n", "invalid value for 'name': 'greedy'"),
    "missing dataset": ("name: b\nlm: null\nbeta: 1\ndatasets: [x=podcast:nowhere]\n", "dataset 'x=podcast:nowhere'"),
    "unknown fusion method": ("name: f\nfusion: [chiu, median]\n", "invalid value in 'fusion': 'median'; valid: a "
                              "list of select, blockwise, blockwise-frames, chiu, chiu-seconds, lcs, rover"),
    "fusion with a beam setting": ("name: f\nfusion: all\nbeta: 1\n", "'beta' is a beam search setting"),
    "missing tail set": ("name: b\nlm: null\nbeta: 1\ntail: none.json\n", "tail 'none.json' not found"),
    "a name and no decoder": ("name: b\ndatasets: [x=podcast:.]\n", "no decoder: give 'lm'"),
    "a plain test set with a stride": ("datasets: [x=podcast:.]\nstride: 0.5\n", "'stride' is given, but a file of "
                                       "only 'datasets'"),
    "a plain file without datasets": ("snrs: [0]\n", "missing key 'datasets'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_an_invalid_decode_file_exits_2_naming_file_and_key_having_written_nothing(
        case: str, finished: tuple[Path, SweepDir], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, sweep = finished
    torch.save({"model": {"w": torch.zeros(2)}, "config": {}, "tokenizer": b"x", "format_version": 1},
               tmp_path / "lm.pt")  # an existing, readable checkpoint
    text, expected = BAD[case]
    decode = _decode_file(tmp_path, "bad", text)
    before = snapshot(sweep.path)
    assert _evaluate(root, sweep, decode) == 2
    err = capsys.readouterr().err
    assert expected in err and str(decode) in err, err
    assert snapshot(sweep.path) == before


def test_an_unknown_where_field_exits_2_listing_valid_ones(finished: tuple[Path, SweepDir], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    root, sweep = finished
    before = snapshot(sweep.path)
    assert _evaluate(root, sweep, _decode_file(tmp_path, "w"), "--where", "model.head=2") == 2
    err = capsys.readouterr().err
    assert "--where 'model.head=2'" in err and "model.heads" in err, err
    assert snapshot(sweep.path) == before


@pytest.mark.slow
def test_local_decode_logs_into_selected_runs_then_the_rest_then_nothing_and_never_touches_the_trials(
        finished: tuple[Path, SweepDir], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, sweep = finished
    trials = {t.config.model.heads: t for t in sweep.read_trials()}
    uri = sweep.read_manifest().tracking_uri
    runs_before = Ledger(uri, sweep.name).trial_runs()
    files_before = _trial_files(sweep)
    greedy_before = _metrics(sweep)
    decode = _decode_file(tmp_path, "beam0")

    # a dry run says what it would decode and writes nothing
    before = snapshot(sweep.path)
    assert _evaluate(root, sweep, decode, "--where", "model.heads=2", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "1 evaluation jobs, 0 models evaluated already, 0 not trained yet, 1 not matching --where" in out
    assert trials[2].key in out and trials[4].key not in out, out
    assert snapshot(sweep.path) == before

    # --where: only the 2-head model
    assert _evaluate(root, sweep, decode, "--where", "model.heads=2") == 0
    assert "1 new evaluation jobs, 0 models not trained yet" in capsys.readouterr().out
    m = _metrics(sweep)
    assert "wer_beam0/dev" in m[trials[2].key] and "wer_beam0/dev" not in m[trials[4].key], m
    assert 0 <= m[trials[2].key]["wer_beam0/dev"]
    run2 = MlflowClient(uri).get_run(runs_before[trials[2].key].run_id)
    assert json.loads(run2.data.tags["eval.decoder.beam0"]) == {"alpha": "0", "beta": "0.5", "beam_width": "4",
                                                                "lm_context": "1024", "lm": "none"}
    assert "eval/dev.beam0.csv" in [a.path for a in MlflowClient(uri).list_artifacts(run2.info.run_id, "eval")]

    # everything: the decoded model is skipped, the other decoded
    assert _evaluate(root, sweep, decode) == 0
    assert "1 new evaluation jobs" in capsys.readouterr().out
    m = _metrics(sweep)
    assert all("wer_beam0/dev" in m[t.key] for t in trials.values()), m

    # again: nothing new, no submission
    subs = [s.id for s in sweep.submissions()]
    listed = (sweep.path / "trials.json").read_bytes()
    assert _evaluate(root, sweep, decode) == 0
    assert "0 new evaluation jobs" in capsys.readouterr().out
    assert [s.id for s in sweep.submissions()] == subs and (sweep.path / "trials.json").read_bytes() == listed
    assert "name: beam0" in (sweep.path / "decode" / "beam0" / "decode.yaml").read_text()

    # the same name with another setting is refused, naming both files, and changes nothing
    other = _decode_file(tmp_path, "beam0", (DECODE % "beam0").replace("beta: 0.5", "beta: 1.5"))
    before = snapshot(sweep.path)
    assert _evaluate(root, sweep, other) == 2
    err = capsys.readouterr().err
    assert str(decode.resolve()) in err and str(other.resolve()) in err and "beta: 0.5 there, 1.5 here" in err, err
    assert snapshot(sweep.path) == before

    # the trials are as they were: keys, folders, runs and their status; the greedy figures unchanged
    assert _trial_files(sweep) == files_before
    runs_after = Ledger(uri, sweep.name).trial_runs()
    assert {k: (r.run_id, r.status) for k, r in runs_after.items()} == \
           {k: (r.run_id, r.status) for k, r in runs_before.items()}
    assert {k: {n: v for n, v in ms.items() if n.startswith("wer/")} for k, ms in _metrics(sweep).items()} == \
           greedy_before


def test_a_fusion_spec_decodes_every_model_each_way_under_its_own_metrics(
        finished: tuple[Path, SweepDir], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Paper 001's window fusion as an evaluation of the sweep's models: wer_fusion-<METHOD>/... in each model's run,
    decoded once; the greedy figures untouched."""
    root, sweep = finished
    greedy_before = {k: {n: v for n, v in ms.items() if n.startswith("wer/")} for k, ms in _metrics(sweep).items()}
    decode = _decode_file(tmp_path, "fused", "name: fused\nfusion: [blockwise-frames, chiu, rover]\n")
    assert _evaluate(root, sweep, decode) == 0
    out = capsys.readouterr().out
    assert "2 new evaluation jobs" in out and "wer_fusion-chiu/..." in out, out
    m = _metrics(sweep)
    for k in m:
        assert {f"wer_fusion-{x}/dev" for x in ("blockwise-frames", "chiu", "rover")} <= set(m[k]), m[k]
        # the trials evaluate at stride 1.0, where block-wise by frames is the averaging itself
        assert m[k]["wer_fusion-blockwise-frames/dev"] == pytest.approx(m[k]["wer/dev"])
    assert _evaluate(root, sweep, decode) == 0
    assert "0 new evaluation jobs" in capsys.readouterr().out
    assert {k: {n: v for n, v in ms.items() if n.startswith("wer/")} for k, ms in _metrics(sweep).items()} == \
           greedy_before


def test_a_lookup_memory_lm_decodes_the_sweeps_models_like_any_lm(
        finished: tuple[Path, SweepDir], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Paper 002's lookup-memory LM (lm.memory) trained with a model's tokenizer is an LM of a decode file like any
    other: its jobs decode every model by beam search with it, and the decoder's tag names the LM."""
    from asr_core.__main__ import main as core_main
    from asr_core.data.corpora import load_corpus

    root, sweep = finished
    model = sweep.read_trials()[0]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(r.text for r in load_corpus(model.config.data.train)))  # the models' training text
    lm_dir = tmp_path / "lm"
    trained = subprocess.run(  # as a user runs it (in-process, the command would keep its signal handlers)
        [sys.executable, "-m", "asr_core", "lm", "train", "--text", f"text:{text}", "--tokenizer",
         str(sweep.trial_dir(model.key) / "checkpoint.pt"), "--out", str(lm_dir), "--preset", "tiny",
         "--set", "max_steps=4", "--set", "batch=2", "--set", "chunk_len=16", "--set", "lm.d_model=32",
         "--set", "lm.heads=2", "--set", "lm.tie_embeddings=true", "--set", "lm.memory.hash=ordered",
         "--set", "lm.memory.order=4", "--set", "lm.memory.buckets=64", "--set", "lm.memory.slots=4",
         "--set", "lm.memory.warmup_steps=2"], capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-2000:]
    ckpt = torch.load(lm_dir / "checkpoint.pt", weights_only=True)
    assert "memory.D" in ckpt["model"]  # a lookup-memory LM
    tail = tmp_path / "tail.json"  # the tail words of the LM's text: the decode file adds the tail-word error rate
    assert core_main(["tailset", str(text), "--out", str(tail)]) == 0
    prompt = tmp_path / "prompt.txt"  # one training transcript, checked against the dev set the models decode
    assert core_main(["lm", "prompt", "--text", f"text:{text}", "--out", str(prompt), "--not-in",
                      model.config.eval.datasets[0].split("=", 1)[1]]) == 0
    decode = _decode_file(tmp_path, "lookup", f"name: lookup\nlm: {lm_dir / 'checkpoint.pt'}\nalpha: 0.3\n"
                                              f"beta: 0.5\nbeam_width: 4\nstride: 1.0\ntail: {tail}\n"
                                              f"prompt: {prompt}\n")
    assert _evaluate(root, sweep, decode) == 0
    assert "2 new evaluation jobs" in capsys.readouterr().out
    uri = sweep.read_manifest().tracking_uri
    for t, r in Ledger(uri, sweep.name).trial_runs().items():
        data = MlflowClient(uri).get_run(r.run_id).data
        assert "wer_lookup/dev" in data.metrics and "tail_lookup/dev" in data.metrics, (t, data.metrics)
        assert json.loads(data.tags["eval.tail"])["source"] == str(text.resolve())
        decoder = json.loads(data.tags["eval.decoder.lookup"])
        assert decoder["lm"] == str((lm_dir / "checkpoint.pt").resolve()) and decoder["prompt"] == str(prompt.resolve())


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_slurm_decode_is_a_job_array_whose_results_land_and_a_second_call_submits_nothing(
        tmp_path: Path, smoke_corpus: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    request.getfixturevalue("slurm_cluster")
    profile = write_profile(tmp_path, "a100:1")
    name = f"dec-slurm-{uuid.uuid4().hex[:6]}"
    root, sweep = _submit(tmp_path, smoke_corpus, name, "--backend", "slurm", "--profile", str(profile),
                          "--allow-sqlite")  # every job runs on this host: the test cluster is one machine
    ledger = Ledger(sweep.read_manifest().tracking_uri, name)
    keys = [t.key for t in sweep.read_trials()]
    runs = wait_for(ledger, keys, timeout=600)
    assert {r.status for r in runs.values()} == {FINISHED}
    files_before = _trial_files(sweep)
    capsys.readouterr()

    decode = _decode_file(tmp_path, "beam0")
    before = [s.id for s in sweep.submissions()]
    monkeypatch.setattr(slurm_commands, "max_array_size", lambda: 1)  # split as a cluster of MaxArraySize 1 would
    assert _evaluate(root, sweep, decode) == 0
    assert "2 new evaluation jobs" in capsys.readouterr().out
    subs = _new_submissions(sweep, before)
    assert len(subs) == 2  # one array (here a lone job) per MaxArraySize jobs, as training's
    assert all(s.data["backend"] == "slurm" and s.job_id and len(s.keys) == 1 for s in subs), [s.data for s in subs]
    jobs = {t["key"]: t["evaluation"]["model"] for t in json.loads((sweep.path / "trials.json").read_text())
            if t.get("evaluation")}
    assert sorted(jobs[s.keys[0]] for s in subs) == sorted(keys)

    # at once again: queued, running or decoded by now; either way nothing new is submitted
    assert _evaluate(root, sweep, decode) == 0
    assert "0 new evaluation jobs" in capsys.readouterr().out
    assert [s.id for s in _new_submissions(sweep, before)] == [s.id for s in subs]

    wait_until(lambda: all("wer_beam0/dev" in m for m in _metrics(sweep).values()), 300,
               "the evaluation jobs' metrics never landed in the runs", poll=2)
    wait_until(lambda: all((sweep.trial_dir(k) / "DONE").exists() for k in jobs), 120,
               "the evaluation jobs never finished", poll=2)
    wait_until(lambda: not squeue_states(f"orch.{name}."), 120, "the evaluation tasks never left the queue", poll=2)
    def accounted() -> dict[str, list[str]]:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State", "-j",
                              ",".join(str(s.job_id) for s in subs)], capture_output=True, text=True, check=True)
        return {ln.split("|")[0]: ln.split("|")[1:] for ln in out.stdout.split()}

    expected = {str(s.job_id): [s.job_name(), "COMPLETED"] for s in subs}
    # slurmdbd records a job's end a moment after it has left the queue
    wait_until(lambda: accounted() == expected, 60, f"the accounting never said {expected}: {accounted()}", poll=1)
    assert _trial_files(sweep) == files_before
    assert {r.status for r in ledger.trial_runs().values()} == {FINISHED}


def test_a_packaged_spec_is_found_by_name_and_reads_its_paths_from_the_working_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--spec decode-lm`` (or ``grids/decode-lm.yaml`` outside a checkout) is the packaged spec; its relative LM path
    reads as from ./grids/ of the folder the command runs in; an unknown name lists the packaged ones."""
    from orchestrate.plan.decode_file import DecodeFileError, load_decode_file

    lm = tmp_path / "runs" / "lm-paper" / "checkpoint.pt"
    lm.parent.mkdir(parents=True)
    lm.write_bytes(b"")  # checked before any job is made: named as not a checkpoint, so the path it read is seen
    monkeypatch.chdir(tmp_path)
    for name in ("decode-lm", "decode-lm.yaml", "grids/decode-lm.yaml"):
        with pytest.raises(DecodeFileError) as e:
            load_decode_file(name)
        assert "decode-lm.yaml: lm: not a checkpoint" in str(e.value) and str(lm) in str(e.value), (name, e.value)
    with pytest.raises(DecodeFileError, match="packaged ones, by name: decode-fusion, decode-lm"):
        load_decode_file("decode-nope")


def test_a_plain_test_set_joins_each_models_own_evaluation_and_the_main_wer_table(
        finished: tuple[Path, SweepDir], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file of only ``datasets``: another test set decoded as each model's own evaluation (wer/<NAME>, the report's
    main WER table, :func:`analysis.significance.werr.wer_table`), once; a name that is a model's own test set with another path is
    refused before anything is written."""
    from analysis.ledger.collect import collect
    from analysis.significance.werr import wer_table

    root, sweep = finished
    uri = sweep.read_manifest().tracking_uri
    other = tmp_path / "other"
    dev = Path(next(d for d in next(t for t in sweep.read_trials() if not t.is_evaluation).config.eval.datasets
                    ).split(":", 1)[1])
    shutil.copytree(dev, other)
    greedy_before = {k: {n: v for n, v in ms.items() if n.startswith("wer/dev")} for k, ms in _metrics(sweep).items()}
    clash = _decode_file(tmp_path, "plain", f"datasets: [dev=podcast:{other}]\n")
    before = snapshot(sweep.path)
    assert _evaluate(root, sweep, clash) == 2
    err = capsys.readouterr().err
    assert "dataset name 'dev' is model" in err and "give this one another name" in err, err
    assert snapshot(sweep.path) == before
    plain = _decode_file(tmp_path, "plain", f"datasets: [other=podcast:{other}]\n")
    assert _evaluate(root, sweep, plain, "--dry-run") == 0
    assert "2 evaluation jobs" in capsys.readouterr().out
    assert snapshot(sweep.path) == before
    assert _evaluate(root, sweep, plain) == 0
    out = capsys.readouterr().out
    assert "2 new evaluation jobs" in out and "wer/... (the report's main WER table)" in out, out
    m = _metrics(sweep)
    for k in m:  # the same recording under another name: the same greedy WER, the model's own untouched
        assert m[k]["wer/other"] == pytest.approx(m[k]["wer/dev"]), m[k]
        assert {n: v for n, v in m[k].items() if n.startswith("wer/dev")} == greedy_before[k]
        assert not any(n.startswith("wer_greedy") for n in m[k]), m[k]
    table = wer_table(collect(sweep.name, uri, progress=False))
    assert set(table.dataset) >= {"dev", "other"} and (table[table.dataset == "other"].n_seeds == 1).all()
    assert _evaluate(root, sweep, plain) == 0
    assert "0 new evaluation jobs" in capsys.readouterr().out
