"""An evaluation job reads one checkpoint, verified (issue 49): a model's checkpoint replaced (atomically, by another
of the same shape) before an evaluation job loads it is refused, naming both, when its step is not the one ``TRAINED``
records, when it holds another model, or when the run holds results of another checkpoint; the run's tables then
never hold rows of two checkpoints. What the job records (``evaluation.json``, the run's tags, each row it measured)
names the bytes it read, and one replaced after that read is not used.

The trial job runs in this process (:func:`asr_core.trial.run_trial`) against a real MLflow on sqlite; the model is
:func:`tests.test_eval_merge_faults.finished_model`'s.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_core.contract.evaluation import read_evaluation
from asr_core.contract.trial import EXIT_OK, EXIT_USAGE, OUTCOME_FAILED, TrialFolder, read_attempts
from asr_core.training.checkpoint import save_checkpoint
from tests.test_eval_merge_faults import STEPS, base, evaluation_job, model, model_state, run_table

__all__ = ["base", "model"]  # the fixtures, shared with test_eval_merge_faults

pytestmark = pytest.mark.timeout(600)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _run(m: dict, job: Path) -> int:
    from asr_core.trial import run_trial

    return run_trial(m["cfg"], job, tracking_uri=m["uri"], run_id=m["run_id"], evaluation=read_evaluation(job))


def _other(m: dict, step: int = STEPS, cfg=None) -> dict:
    """Another checkpoint of the same shape: other weights, whose output layer favours one token (so that its
    hypotheses differ from the model's)."""
    state = model_state(cfg or m["cfg"], m["tok"], seed=1, step=step)
    state["model"]["head.proj.bias"][5] += 50.0
    return state


def _refused(job: Path, *words: str) -> None:
    last = read_attempts(job)[-1]
    assert last.outcome == OUTCOME_FAILED and all(w in last.reason for w in words), last
    assert not (job / "DONE").exists()


def _nothing_of(m: dict, job: Path, condition: str) -> None:
    assert condition not in {r["condition"] for r in run_table(m)}
    assert f"wer/dev/{condition}" not in MlflowClient(m["uri"]).get_run(m["run_id"]).data.metrics


def test_a_checkpoint_at_another_step_than_trained_records_is_refused(model: dict) -> None:
    job = evaluation_job(model, (5.0,))
    save_checkpoint(model["model"] / "checkpoint.pt", _other(model, step=STEPS + 1))  # atomically, same shape
    assert _run(model, job) == EXIT_USAGE
    _refused(job, f"step {STEPS + 1}", f"finished at step {STEPS}")
    _nothing_of(model, job, "snr5")


def test_a_checkpoint_replaced_before_any_evaluation_read_it_is_refused_by_the_hash_training_sealed(model: dict
                                                                                                    ) -> None:
    """Same step, same model key, other bytes, before the model's first evaluation job: the hash the trial job
    sealed into TRAINED when training ended (written here as it writes it) refuses the file."""
    ckpt, trained = model["model"] / "checkpoint.pt", TrialFolder(model["model"]).trained
    record = json.loads(trained.read_text())
    record["sha256"] = sealed = _sha(ckpt)
    trained.write_text(json.dumps(record))
    save_checkpoint(ckpt, _other(model))
    job = evaluation_job(model, (5.0,))
    assert _run(model, job) == EXIT_USAGE
    _refused(job, sealed, _sha(ckpt), "TRAINED")
    _nothing_of(model, job, "snr5")


def test_a_checkpoint_of_another_model_is_refused(model: dict) -> None:
    job = evaluation_job(model, (5.0,))
    other_cfg = model["cfg"].with_overrides(["train.seed=7"])
    assert other_cfg.key() != model["cfg"].key()
    save_checkpoint(model["model"] / "checkpoint.pt", _other(model, cfg=other_cfg))
    assert _run(model, job) == EXIT_USAGE
    _refused(job, f"holds model {other_cfg.key()}", f"evaluates model {model['cfg'].key()}")
    _nothing_of(model, job, "snr5")


def test_a_checkpoint_replaced_after_an_evaluation_read_it_is_refused_by_the_next(model: dict) -> None:
    """Same step, same model key, other bytes: the run already holds results of the first checkpoint, so the second
    job refuses before merging, and the run's tables hold rows of one checkpoint only."""
    ckpt = model["model"] / "checkpoint.pt"
    first, second = evaluation_job(model, (5.0,)), evaluation_job(model, (15.0,))
    before = _sha(ckpt)
    assert _run(model, first) == EXIT_OK
    save_checkpoint(ckpt, _other(model))
    after = _sha(ckpt)
    assert _run(model, second) == EXIT_USAGE
    _refused(second, before, after)
    _nothing_of(model, second, "snr15")
    from asr_core.contract.evaluation import CHECKPOINT_COLUMN, CHECKPOINT_SHA_TAG

    assert {r[CHECKPOINT_COLUMN] for r in run_table(model) if r["condition"] != "clean"} == {before}
    tags = MlflowClient(model["uri"]).get_run(model["run_id"]).data.tags
    assert tags[CHECKPOINT_SHA_TAG.format(first.name.rsplit("-", 1)[1])] == before
    assert CHECKPOINT_SHA_TAG.format(second.name.rsplit("-", 1)[1]) not in tags
    # each job's evaluation.json names the file it read
    assert json.loads((first / "evaluation.json").read_text())["checkpoint_sha256"] == before
    assert json.loads((second / "evaluation.json").read_text())["checkpoint_sha256"] == after


def test_a_checkpoint_replaced_after_the_job_read_it_is_not_used(model: dict, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """The job reads the checkpoint's bytes once: a replacement after that read changes nothing of what it decodes
    with or records."""
    import asr_core.evaluation.checkpoint_read as cr
    from asr_core.contract.evaluation import CHECKPOINT_COLUMN, CHECKPOINT_SHA_TAG, CHECKPOINT_STEP_TAG
    from asr_core.evaluation.evaluate import Destination, EvaluationRun, evaluate

    ckpt = model["model"] / "checkpoint.pt"
    original = model["tmp"] / "original.pt"
    original.write_bytes(ckpt.read_bytes())
    read_sha = _sha(ckpt)
    verify = cr.verify

    def verify_then_replace(read, spec, model_key=None):  # the job has the bytes: the file changes under it
        verify(read, spec, model_key)
        save_checkpoint(ckpt, _other(model))

    monkeypatch.setattr(cr, "verify", verify_then_replace)
    job = evaluation_job(model, (5.0,))
    assert _run(model, job) == EXIT_OK
    assert _sha(ckpt) != read_sha  # replaced while the job ran
    ident = job.name.rsplit("-", 1)[1]
    tags = MlflowClient(model["uri"]).get_run(model["run_id"]).data.tags
    assert tags[CHECKPOINT_SHA_TAG.format(ident)] == read_sha and tags[CHECKPOINT_STEP_TAG.format(ident)] == str(STEPS)
    spec = read_evaluation(job)
    assert (spec.checkpoint_sha256, spec.checkpoint_step) == (read_sha, STEPS)
    assert {r[CHECKPOINT_COLUMN] for r in run_table(model) if r["condition"] == "snr5"} == {read_sha}
    # it decoded the bytes it read: the same hypotheses as the original checkpoint's, not the replacement's
    hyps = {}
    for name, path in (("original", original), ("replacement", ckpt)):
        out = model["tmp"] / name
        evaluate(EvaluationRun.of(path, model["cfg"].eval, conditions={"dev": [5.0]}, datasets=[model["dev"]]),
                 Destination(out_dir=out, log=False))
        hyps[name] = (out / "dev.hyp.jsonl").read_text()
    assert hyps["original"] != hyps["replacement"]
    assert (TrialFolder(job).eval_dir / "dev.hyp.jsonl").read_text() == hyps["original"]
