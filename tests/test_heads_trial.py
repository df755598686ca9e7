"""Paper 003 in the trainer and the trial job (issue 17): the config fields and trial keys, the auxiliary loss in
training, the ``heads`` command and the trial's heads stage, which a preempted trial runs again without evaluating
again. Real MLflow (sqlite), a small espeak-ng corpus."""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from asr_core.config import HEAD_REPRESENTATIONS, Config, preset
from asr_core.config.parse import ConfigError
from asr_core.model.heads import REPRESENTATIONS, HeadCapture, head_diversity_loss, head_similarity
from tests.test_train import make_corpus

torch.set_num_threads(2)
REPO = Path(__file__).resolve().parents[1]
TINY = ["model.vocab_size=40", "data.context_s=2.0", "data.batch_audio_s=8", "data.seqlen_warmup=none",
        "train.warmup_steps=2", "train.checkpoint_every=1000"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Manifests of 8 training and 3 test recordings of spoken words (5-9 s each): {"train": spec, "test": spec}."""
    root = tmp_path_factory.mktemp("heads-corpus")
    recs = make_corpus(root / "audio", 11, seed=5, words_per=(8, 12))
    specs = {}
    for split, part in (("train", recs[:8]), ("test", recs[8:])):
        path = root / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"id": r.id, "audio": str(r.audio), "duration": r.duration,
                                            "words": [{"text": w.text, "start": w.start, "end": w.end}
                                                      for w in r.words]}) + "\n" for r in part))
        specs[split] = f"manifest:{path}"
    return specs


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, MlflowClient, str]:
    """A sqlite MLflow store with the experiment ``heads``: (tracking URI, client, experiment id)."""
    root = tmp_path_factory.mktemp("heads-mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    return uri, client, client.create_experiment("heads", artifact_location=(root / "artifacts").as_uri())


# ---- config and keys -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, needle", [
    ("train.head_diversity_weight=-0.5", "train.head_diversity_weight"),
    ("train.head_diversity_repr=Z", "train.head_diversity_repr"),
    ("train.head_diversity_rows=0", "train.head_diversity_rows"),
    ("eval.head_rows=0", "eval.head_rows"),
    ("eval.head_windows=0", "eval.head_windows"),
    ("eval.head_diversity=maybe", "eval.head_diversity"),
])
def test_head_fields_refuse_bad_values_naming_the_field(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match="valid") as e:
        preset("tiny").with_overrides([override])
    assert needle in str(e.value)


def test_the_loss_enters_trial_keys_only_when_on_and_the_measurement_never() -> None:
    from orchestrate.plan.grid import load_grid

    assert HEAD_REPRESENTATIONS == REPRESENTATIONS  # config.py validates what asr_core.model.heads computes
    golden = json.loads((REPO / "tests/golden/keys.json").read_text())["grids/paper.yaml"]
    off = ["train.head_diversity_weight=0", "train.head_diversity_repr=Y", "train.head_diversity_rows=64"]
    keys = {t.key for t in load_grid(REPO / "grids/paper.yaml", off + ["eval.head_diversity=false",
                                                                       "eval.head_rows=7", "eval.head_windows=3"]).trials}
    assert keys == set(golden)  # the defaults, spelled out, and the measurement's settings: the golden keys
    on = {t.key for t in load_grid(REPO / "grids/paper.yaml", ["train.head_diversity_weight=0.1"]).trials}
    assert len(on) == 321 and not on & set(golden)  # a model trained with the loss is another experiment

    base = preset("main")
    for change in ("train.head_diversity_weight=1", "train.head_diversity_repr=A", "train.head_diversity_rows=8"):
        assert base.with_overrides([change]).key() != base.key(), change
    # a config stored before the fields existed reads them as off, under its own key
    stored = base.to_dict()
    for section, fields in (("train", ("head_diversity_weight", "head_diversity_repr", "head_diversity_rows")),
                            ("eval", ("head_diversity", "head_rows", "head_windows"))):
        for f in fields:
            del stored[section][f]
    old = Config.from_stored(stored)
    assert old == base and old.key() == base.key()


# ---- the auxiliary loss in training -----------------------------------------------------------------------------------
def _batch(corpus: dict[str, str], tmp_path: Path, windows: int = 4):
    from asr_core.data.batching import BatchMaker
    from asr_core.data.chunking import WindowStream
    from asr_core.data.corpora import load_corpus
    from asr_core.data.features import FeatureExtractor
    from asr_core.data.tokenizer import Tokenizer

    cfg = preset("tiny").with_overrides(TINY + [f"data.batch_audio_s={2.0 * windows}", "data.batching=consecutive"])
    recs = load_corpus(corpus["train"])
    tok = Tokenizer.train([r.text for r in recs], 40, tmp_path / "tok.model")
    maker = BatchMaker(recs, FeatureExtractor(cfg.data.features), tok)
    found, _ = next(WindowStream(recs, cfg.data, 0).batches())
    return cfg, found, maker


@pytest.mark.slow
def test_the_step_gradient_adds_the_weighted_head_loss_and_nothing_when_off(corpus: dict[str, str],
                                                                             tmp_path: Path) -> None:
    from asr_core.model.batchrenorm import MaskedBatchRenorm
    from asr_core.training.loss import step_frames
    from asr_core.model.acoustic import build_model
    from asr_core.training.step import HeadDiversity, accumulate_gradients, step_gradients

    cfg, windows, maker = _batch(corpus, tmp_path)
    whole = [maker(windows)]
    frames = step_frames(windows, cfg.data)
    torch.manual_seed(0)
    base = build_model(cfg.model, cfg.data.features.n_mels).train()
    cpu = torch.device("cpu")

    def grads(micro, head: HeadDiversity | None, renorm_eval: bool = False):
        model = copy.deepcopy(base)
        for m in model.modules():
            if isinstance(m, MaskedBatchRenorm) and renorm_eval:
                m.eval()  # each window normalised alone: passes are comparable with the whole step
        out = step_gradients(model, micro, cpu, False, 3, "audio", frames, head)
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    # off: the CTC loss's gradient, bit for bit (accumulate_gradients, the other callers' entry, is the same)
    plain, g0 = grads(whole, None)
    model = copy.deepcopy(base)
    assert accumulate_gradients(model, whole, cpu, False, 3, "audio", frames) == plain.ctc and plain.head_div is None
    assert all(torch.equal(p.grad, g0[n]) for n, p in model.named_parameters() if p.grad is not None)

    # on: the gradient of CTC + weight x the head loss; the head loss's own gradient from HeadCapture directly
    for rep in ("Y", "A"):
        head = HeadDiversity(weight=3.0, representation=rep, rows=8, seed=1)
        with_head, g = grads(whole, head)
        model = copy.deepcopy(base)
        with HeadCapture(model, [rep]) as cap:
            model(whole[0].features, whole[0].lengths)
            alone = head_diversity_loss(cap.layers, rep, sample_rows=8, generator=head.generator(3))
        alone.backward()
        assert with_head.ctc == pytest.approx(plain.ctc, rel=1e-6) and with_head.head_div == pytest.approx(
            float(alone.detach()), rel=1e-6)
        moved = 0
        for n, p in model.named_parameters():
            if p.grad is None:
                continue
            torch.testing.assert_close(g[n], g0[n] + 3.0 * p.grad, atol=1e-5, rtol=1e-4, msg=n)
            moved += bool(p.grad.abs().max() > 1e-6)
        assert moved > 10, rep  # the attention weights of every layer (and what feeds them) get the push

    # split into passes, the term is still the step's mean over windows (each pass weighted by its share)
    parts = [maker(windows[:3]), maker(windows[3:])]  # unequal passes: their shares matter
    head = HeadDiversity(weight=3.0, representation="Y", rows=8, seed=1)
    (a, ga), (b, gb) = grads(whole, head, renorm_eval=True), grads(parts, head, renorm_eval=True)
    assert b.head_div == pytest.approx(a.head_div, rel=1e-5)
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-5, rtol=1e-4, msg=n)
    # the rows of A drawn at a step depend on (seed, step) only
    draws = [torch.randperm(50, generator=HeadDiversity(1.0, "A", 8, s).generator(k)) for s, k in
             ((1, 3), (1, 3), (1, 4), (2, 3))]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert not torch.equal(draws[0], draws[3])


@pytest.mark.slow
def test_a_tiny_run_with_the_loss_has_less_alike_heads_and_resumes_exactly(
        corpus: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same seed, same data, 8 steps: lambda = 10 on Y against lambda = 0. The targeted similarity (sum of eq. 6 over
    layers, measured on held-out windows) falls by more than half. What 12 CPU steps of a 0.5M-parameter model can
    say about WER: nothing (both are still at the blank stage), so only the CTC loss is compared, loosely (seeds 0-2
    gave Y 0.058 -> 0.010, 0.042 -> 0.017, 0.051 -> 0.013, the loss no worse). The run with the loss on A, stopped
    after its checkpoint at step 2 and resumed, ends bit for bit where the uninterrupted run does."""
    from asr_core.data.audio import load_audio
    from asr_core.training.checkpoint import load_checkpoint, load_for_eval
    from asr_core.data.corpora import load_corpus
    from asr_core.data.features import FeatureExtractor
    from asr_core.training.train import train

    recs = load_corpus(corpus["train"])
    held = load_corpus(corpus["test"])
    measured = {}
    for weight in (0.0, 10.0):
        cfg = preset("tiny").with_overrides(TINY + ["train.max_steps=8", f"train.head_diversity_weight={weight}"])
        result = train(cfg, tmp_path / f"w{weight:g}", recordings=recs)
        model, _, _ = load_for_eval(result.checkpoint)
        fx = FeatureExtractor(cfg.data.features)
        feats = [fx(load_audio(r.audio))[:200] for r in held]
        x = torch.zeros(len(feats), 200, 80)
        for i, f in enumerate(feats):
            x[i, : len(f)] = f
        got = head_similarity(model, x, torch.tensor([len(f) for f in feats]), sample_rows=16,
                              generator=torch.Generator().manual_seed(0))
        measured[weight] = (got["diversity_sum"]["Y"], result.final_loss)
    (y0, loss0), (y1, loss1) = measured[0.0], measured[10.0]
    print(f"targeted Y similarity: {y0:.4f} (lambda 0) -> {y1:.4f} (lambda 10); CTC loss {loss0:.3f} -> {loss1:.3f}")
    assert y1 < 0.5 * y0
    assert loss1 < 1.2 * loss0

    cfg = preset("tiny").with_overrides(TINY + ["train.max_steps=4", "train.head_diversity_weight=5",
                                                "train.head_diversity_repr=A", "train.head_diversity_rows=4"])
    straight = train(cfg, tmp_path / "straight", recordings=recs)
    with monkeypatch.context() as m:
        m.setenv("ASR_CORE_FAULT", "raise-at-step:3")
        with pytest.raises(RuntimeError, match="fault injected at step 3"):
            train(cfg.with_overrides(["train.checkpoint_every=2"]), tmp_path / "resumed", recordings=recs)
    resumed = train(cfg, tmp_path / "resumed", recordings=recs)
    a, b = load_checkpoint(straight.checkpoint), load_checkpoint(resumed.checkpoint)
    assert a["step"] == b["step"] == 4 and resumed.final_loss == straight.final_loss
    assert all(torch.equal(t, b["model"][n]) for n, t in a["model"].items())


# ---- the heads command --------------------------------------------------------------------------------------------------
def test_plan_head_windows_takes_windows_in_turn_without_overlap() -> None:
    from asr_core.probes.heads import plan_head_windows

    frames = [250, 40, 530, 100]  # window 100: 2 whole (+ tail), 1 short, 5 whole (+ tail), 1 exact
    assert plan_head_windows(frames, 100, 4) == [(0, 0, 100), (1, 0, 40), (2, 0, 100), (3, 0, 100)]
    six = plan_head_windows(frames, 100, 6)
    assert six == [(0, 0, 100), (0, 100, 200), (1, 0, 40), (2, 0, 100), (2, 100, 200), (3, 0, 100)]
    every = plan_head_windows(frames, 100, 100)
    assert len(every) == 2 + 1 + 5 + 1 and all(e - s == 100 for i, s, e in every if i != 1)
    assert plan_head_windows([0, 30], 100, 5) == [(1, 0, 30)]
    with pytest.raises(ValueError):
        plan_head_windows(frames, 100, 0)


@pytest.mark.slow
def test_heads_command_logs_metrics_and_artifacts_into_the_checkpoints_run(
        corpus: dict[str, str], mlflow_store: tuple[str, MlflowClient, str], tmp_path: Path) -> None:
    from asr_core.data.corpora import load_corpus
    from asr_core.probes.heads import measure_dataset, plan_head_windows
    from asr_core.probes.heads_args import cli
    from asr_core.training.train import train

    uri, client, _ = mlflow_store
    cfg = preset("tiny").with_overrides(TINY + ["train.max_steps=3"])
    result = train(cfg, tmp_path / "run", recordings=load_corpus(corpus["train"]), tracking_uri=uri,
                   experiment="heads")
    assert cli([str(result.checkpoint), "--data", f"test={corpus['test']}", "--rows", "8", "--max-windows", "4",
                "--batch-windows", "3"]) == 0
    run = client.get_run(result.run_id)
    metrics = run.data.metrics
    layers = cfg.model.layers
    for r in REPRESENTATIONS:
        per_layer = [metrics[f"heads/test/{r}/layer{i}"] for i in range(layers)]
        assert metrics[f"heads/test/{r}/sum"] == pytest.approx(sum(per_layer), rel=1e-5)
        assert all(0 <= v <= (cfg.model.heads - 1) / cfg.model.heads + 1e-5 for v in per_layer)
        assert -1 <= metrics[f"heads/test/{r}/similarity"] <= 1
    assert metrics["heads/test/windows"] == 4  # 3 test recordings of 5-9 s: their first windows of 2 s, then a second
    listed = {a.path for a in client.list_artifacts(result.run_id, "heads")}
    assert listed == {"heads/test.npz", *(f"heads/test-{r}.png" for r in REPRESENTATIONS)}
    saved = np.load(tmp_path / "run" / "heads" / "test.npz")
    assert saved["matrix_Y"].shape == (layers, cfg.model.heads, cfg.model.heads) and int(saved["windows"]) == 4
    assert float(saved["diversity_K"].sum()) == pytest.approx(metrics["heads/test/K/sum"], rel=1e-5)
    assert run.data.tags["eval.test.fingerprint"]  # the name now stands for this content in the run

    # the averages are those of each window measured on its own (Q, K, V, Y: no sampling), whatever the batching
    from asr_core.data.audio import load_audio
    from asr_core.training.checkpoint import load_for_eval
    from asr_core.decoding.decode import WindowBatch, prepare_features
    from asr_core.data.features import FeatureExtractor

    model, _, _ = load_for_eval(result.checkpoint)
    fx = FeatureExtractor(cfg.data.features)
    recs = load_corpus(corpus["test"])
    summary = measure_dataset(model, recs, fx, dataset="test", context_s=2.0, window=200, subsampling=8,
                              frames_per_second=100.0, rows=8, max_windows=4, batch=WindowBatch(3))
    alone = []
    for i, s, e in plan_head_windows([int(r.duration * 100) + 1 for r in recs], 200, 4):
        piece = prepare_features(fx, load_audio(recs[i].audio), recs[i].ignore, 100.0)[s:e]
        alone.append(head_similarity(model, piece[None], torch.tensor([len(piece)]), sample_rows=8,
                                     generator=torch.Generator().manual_seed(0)))
    for r in "QKVY":
        expect = torch.stack([g["per_recording"][r][0] for g in alone]).mean(0)
        np.testing.assert_allclose(summary.matrix[r], expect.numpy(), atol=1e-5)
        np.testing.assert_allclose(summary.diversity[r], np.mean([g["diversity"][r].numpy() for g in alone], 0),
                                   atol=1e-5)
    np.testing.assert_allclose(summary.matrix["Y"], saved["matrix_Y"], atol=1e-5)


# ---- the trial's stage ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_trial_measures_the_heads_after_evaluation_and_a_preempted_stage_reruns_alone(
        corpus: dict[str, str], mlflow_store: tuple[str, MlflowClient, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asr_core.evaluation.evaluate
    import asr_core.probes.heads
    from asr_core.trial import run_trial
    from asr_core.contract.trial import EVALUATED_FILE
    from asr_core.contract.trial import TrialFolder

    uri, client, exp = mlflow_store
    run_id = client.create_run(exp, run_name="t").info.run_id
    cfg = preset("tiny").with_overrides(TINY + [
        f"data.train={corpus['train']}", "train.max_steps=4", "train.head_diversity_weight=2",
        f"eval.datasets=[test={corpus['test']}]", "eval.stride=1.0", "eval.head_diversity=true", "eval.head_rows=8",
        "eval.head_windows=3"])
    folder = TrialFolder(tmp_path / "trial")
    monkeypatch.setenv("ORCHESTRATE_JOB_ID", "job-1")
    evaluations = []
    real_evaluate, real_measure = asr_core.evaluation.evaluate.evaluate, asr_core.probes.heads.measure_dataset
    monkeypatch.setattr(asr_core.evaluation.evaluate, "evaluate", lambda *a, **k: evaluations.append(1) or real_evaluate(*a, **k))

    def preempted(*args, **kwargs):  # the scheduler's signal arrives while the heads are measured
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(5)
        raise AssertionError("the stop signal did not interrupt the stage")

    monkeypatch.setattr(asr_core.probes.heads, "measure_dataset", preempted)
    assert run_trial(cfg, folder.path, tracking_uri=uri, run_id=run_id) == 75
    assert evaluations == [1] and (folder.path / EVALUATED_FILE).exists() and not folder.done.exists()
    assert client.get_run(run_id).info.status == "SCHEDULED"

    monkeypatch.setattr(asr_core.probes.heads, "measure_dataset", real_measure)
    monkeypatch.setenv("ORCHESTRATE_JOB_ID", "job-2")
    assert run_trial(cfg, folder.path, tracking_uri=uri, run_id=run_id) == 0
    assert evaluations == [1]  # the second segment measured the heads only
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "wer/test" in run.data.metrics
    assert run.data.metrics["heads/test/windows"] == 3 and "heads/test/A/sum" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run_id, "heads")} == {
        "heads/test.npz", *(f"heads/test-{r}.png" for r in REPRESENTATIONS)}
    # the auxiliary loss was logged at every step beside the CTC loss
    head = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/head_div_loss"))
    assert [s for s, _ in head] == [1, 2, 3, 4] and all(v > 0 for _, v in head)
    assert len(client.get_metric_history(run_id, "train/loss")) == 4
    records = [json.loads(line) for line in folder.progress.read_text().splitlines()]
    second = records[max(i for i, r in enumerate(records) if r["phase"] == "start"):]
    assert [(r["dataset"], r["done"], r["total"]) for r in second if r["phase"] == "eval"] == [
        ("heads:test", 0, 3), ("heads:test", 3, 3)]  # one batch of 3 windows
    assert [r["phase"] for r in records].count("preempted") == 1 and records[-1]["phase"] == "done"
