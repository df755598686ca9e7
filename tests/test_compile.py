"""Compiled training (``train.compile``, asr_core.training.compile) and a step with no host synchronisation.

- Every Conformer layer traces into one graph in training mode, padded or not (``fullgraph=True`` refuses any read of
  a device value back to the host: ``bool(mask.all())``, ``int(num_batches_tracked)``), and the whole training
  forward and loss need no host value beyond the lengths the trainer already has.
- A compiled step (inductor, on this CPU) gives the plain step's losses, gradients and weights over three optimiser
  steps within float32 tolerance (rtol 1e-4, atol 1e-5: inductor sums in another order), with the same state dict.
- The setting never enters a key, and where compiling cannot work the trainer says why and trains uncompiled.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_backend import smoke_corpus

from asr_core.config import Config, ModelConfig, TrainConfig
from asr_core.data.batching import MicroBatch
from asr_core.model.acoustic import build_model
from asr_core.training.compile import (compile_model, compile_problem, cpu_level, forced_level_problem,
                                       keep_uncompiled, prepare_model)

torch.set_num_threads(2)
__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend


def _small() -> ModelConfig:
    return ModelConfig(d_model=32, layers=2, heads=4, subsampling_channels=16, vocab_size=11,
                       batch_renorm_warmup_steps=8)


def _micro(lengths: list[int], seed: int, n_mels: int = 80) -> MicroBatch:
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    x = torch.randn(len(lengths), t, n_mels, generator=g)
    for i, n in enumerate(lengths):
        x[i, n:] = 0
    targets = [[int(v) for v in torch.randint(0, 10, (max(1, n // 40),), generator=g)] for n in lengths]
    return MicroBatch(x, torch.tensor(lengths), targets)


@pytest.mark.parametrize("padded", [False, True])
def test_a_conformer_layer_traces_with_no_host_read(padded: bool) -> None:
    """A training layer traces with one deliberate break and no other: batch renormalisation's correction (run
    uncompiled, see asr_core.model.batchrenorm); a read of a device value on the host (``bool(mask.all())``,
    ``int(num_batches_tracked)``) would add a break of its own, "data-dependent"."""
    torch._dynamo.reset()
    model = build_model(_small()).train()
    layer = model.layers[0]
    b, t = 3, 20
    lengths = torch.tensor([20, 13, 7] if padded else [20, 20, 20])
    mask = torch.arange(t)[None, :] < lengths[:, None]
    x = torch.randn(b, t, 32) * mask[:, :, None]
    keep_uncompiled(model)
    explained = torch._dynamo.explain(layer)(x, mask, lengths, not padded)
    reasons = [str(r.reason) for r in explained.break_reasons]
    # the break is taken in each enclosing frame (layer, convolution module, batch renorm): one reason, a few graphs
    assert reasons and all("compiler.disable" in r and "MaskedBatchRenorm.correction" in r for r in reasons), reasons
    # in evaluation mode (decoding) the layer is one graph
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer.eval())(x, mask, lengths, not padded)
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]


def test_batch_renorm_compiled_gives_the_plain_gradients_after_its_statistics_moved() -> None:
    """A compiled batch renormalisation that moved its running statistics inside the graph gave other weight
    gradients from the second forward on (the backward pass recomputed (r, d) from the moved statistics)."""
    from asr_core.model.batchrenorm import MaskedBatchRenorm

    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = MaskedBatchRenorm(8, warmup_steps=0).train()  # full renormalisation from the start: r, d matter
    compiled = copy.deepcopy(plain)
    keep_uncompiled(compiled)
    compiled.compile(backend="aot_eager")  # the graph as inductor gets it, without inductor's own rounding
    upstream = torch.randn(3, 10, 8)
    mask = torch.ones(3, 10, dtype=torch.bool)
    for step in range(3):
        x = torch.randn(3, 10, 8)
        grads = []
        for m in (plain, compiled):
            m.zero_grad(set_to_none=True)
            xx = x.clone().requires_grad_(True)
            (m(xx, mask, True) * upstream).sum().backward()
            grads.append((m.weight.grad.clone(), xx.grad.clone(), m.running_var.clone()))
        for ours, theirs in zip(*grads):
            torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6, msg=f"step {step}")


def test_the_model_reads_padding_from_host_lengths_and_the_step_reads_back_once() -> None:
    """The model given host lengths with features elsewhere works out the padding without the device (here a
    'meta' device stands in for a GPU: any read of a meta tensor's value raises)."""
    model = build_model(_small()).train().to("meta")
    mb = _micro([160, 100], seed=1)
    logits, out_lengths = model(mb.features.to("meta"), mb.lengths)
    assert logits.shape == (2, 20, 11) and out_lengths.device.type == "meta"
    mb = _micro([160, 160], seed=1)
    logits, _ = model(mb.features.to("meta"), mb.lengths)
    assert logits.shape == (2, 20, 11)


def test_compile_is_never_in_a_key_and_is_validated() -> None:
    plain = Config()
    compiled = Config.from_dict({"train": {"compile": True}})
    assert compiled.train.compile is True
    assert compiled.key() == plain.key()
    from asr_core.config.parse import ConfigError

    with pytest.raises(ConfigError, match="train.compile"):
        TrainConfig(compile="yes")  # type: ignore[arg-type]


def test_where_compiling_cannot_work_training_goes_on_uncompiled_and_says_why() -> None:
    cpu = torch.device("cpu")
    said: list[str] = []
    cfg = Config.from_dict({"train": {"compile": True}, "model": {"activation_checkpointing": True}})
    model = build_model(_small())
    assert compile_problem(cfg, cpu) is not None and "activation_checkpointing" in compile_problem(cfg, cpu)
    assert prepare_model(model, cfg, cpu, said.append) is False
    assert "training uncompiled" in said[-1] and "activation_checkpointing" in said[-1]
    assert not hasattr(model.layers[0], "_compiled_call_impl") or model.layers[0]._compiled_call_impl is None
    cfg = Config.from_dict({"train": {"compile": True, "head_diversity_weight": 0.1}})
    assert "head-diversity" in compile_problem(cfg, cpu)
    assert prepare_model(model, Config(), cpu, said.append) is False  # off: nothing said, nothing done
    assert len(said) == 1


def test_without_a_cpp_compiler_the_cpu_trains_uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """(The compiler's absence is simulated: PATH emptied for the check.)"""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    problem = compile_problem(Config.from_dict({"train": {"compile": True}}), torch.device("cpu"))
    assert problem is not None and "C++ compiler" in problem


# torch.compile under ATEN_CPU_CAPABILITY forced below the CPU's own level gives wrong results (a torch defect the
# trainer refuses to compile under: test_a_forced_lower_kernel_level_trains_uncompiled); the comparisons of compiled
# with plain steps are not this project's to make there
FORCED = forced_level_problem()
compiled_here = pytest.mark.skipif(FORCED is not None, reason=FORCED or "")


@pytest.mark.slow
@compiled_here
def test_compiled_steps_give_the_plain_steps_losses_gradients_and_weights() -> None:
    from asr_core.training.step import build_optimizer, step_gradients

    torch._dynamo.reset()
    cfg = Config.from_dict({"model": {"d_model": 32, "layers": 2, "heads": 4, "subsampling_channels": 16,
                                      "vocab_size": 11, "batch_renorm_warmup_steps": 8},
                            "train": {"optimizer": "madgrad", "lr": 1e-3}})
    torch.manual_seed(0)
    plain = build_model(cfg.model).train()
    compiled = copy.deepcopy(plain)
    assert list(compiled.state_dict()) == list(plain.state_dict())
    compile_model(compiled)
    assert list(compiled.state_dict()) == list(plain.state_dict())  # the checkpoint format is the plain model's
    opts = [build_optimizer(m, cfg.train) for m in (plain, compiled)]
    cpu = torch.device("cpu")
    # unpadded, padded, and another length (the recompile with dynamic shapes)
    batches = [[_micro([160, 160, 160], 1)], [_micro([160, 120, 64], 2)], [_micro([240, 200], 3)]]
    for step, micro in enumerate(batches):
        losses = [step_gradients(m, micro, cpu, False, step, "tokens") for m in (plain, compiled)]
        assert losses[1].ctc == pytest.approx(losses[0].ctc, rel=1e-4, abs=1e-5)
        for (name, p), q in zip(plain.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=f"step {step}: grad of {name}")
        for o in opts:
            o.step()
    for (name, p), q in zip(plain.state_dict().items(), compiled.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"after 3 steps: {name}")
    # control: another step's batch is told apart at this tolerance
    other = step_gradients(copy.deepcopy(plain), batches[0], cpu, False, 3, "tokens").ctc
    assert other != pytest.approx(step_gradients(copy.deepcopy(plain), batches[1], cpu, False, 3, "tokens").ctc,
                                  rel=1e-4, abs=1e-5)


@pytest.mark.slow
@compiled_here
def test_a_compiled_run_checkpoints_in_the_plain_format_and_resumes(tmp_path, smoke_corpus) -> None:
    """``python -m asr_core train tiny --set train.compile=true``: 4 steps, checkpoint every 2; the same run stopped
    by a fault at step 3 and resumed from its step-2 checkpoint ends with the uninterrupted run's weights (within the
    compiled step's tolerance: the resumed process compiles its graphs afresh), and the plain model reads them."""
    common = ["tiny", "--set", f"data.train=podcast:{smoke_corpus}/train", "--set", "train.max_steps=4",
              "--set", "train.checkpoint_every=2", "--set", "data.context_s=5.12", "--set", "data.batch_audio_s=20.48",
              "--set", "data.seqlen_warmup=none", "--set", "train.device=cpu", "--set", "train.precision=fp32",
              "--set", "eval.datasets=[]", "--set", "train.compile=true"]

    def train(out: str, fault: str = "") -> subprocess.CompletedProcess:
        env = {**os.environ, "ASR_CORE_FAULT": fault, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        env.pop("MLFLOW_TRACKING_URI", None)
        return subprocess.run([sys.executable, "-m", "asr_core", "train", *common, "--out", str(tmp_path / out)],
                              capture_output=True, text=True, env=env, timeout=1200, cwd=tmp_path)

    whole = train("whole")
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    assert "model compiled" in whole.stdout and "done: 4 steps" in whole.stdout
    stopped = train("resumed", fault="raise-at-step:3")
    assert stopped.returncode != 0 and "fault injected at step 3" in stopped.stdout + stopped.stderr
    resumed = train("resumed")
    assert resumed.returncode == 0 and "resuming" in resumed.stdout and "at step 2/4" in resumed.stdout, \
        resumed.stdout[-3000:] + resumed.stderr[-3000:]
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True, map_location="cpu")
            for d in ("whole", "resumed"))
    assert a["step"] == b["step"] == 4 and list(a["model"]) == list(b["model"])
    for name in a["model"]:
        torch.testing.assert_close(b["model"][name], a["model"][name], rtol=1e-4, atol=1e-5, msg=name)
    plain = build_model(Config.from_dict(a["config"]).model)
    plain.load_state_dict(a["model"])  # the plain model reads the compiled run's weights as they are


@pytest.mark.parametrize("forced", ["avx2", "default", ""])
def test_a_forced_lower_kernel_level_trains_uncompiled(monkeypatch: pytest.MonkeyPatch, forced: str) -> None:
    """Compiling under ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU gave the subsampling outputs 0.12 away from the
    plain model's: training goes on uncompiled and says why; the portable level and the CPU's own compile."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", forced)
    cfg = Config.from_dict({"train": {"compile": True}})
    problem = compile_problem(cfg, torch.device("cpu"))
    if forced == "avx2" and cpu_level() == "avx512":
        assert problem is not None and "ATEN_CPU_CAPABILITY=avx2" in problem and "(avx512)" in problem
    elif shutil.which("g++") or shutil.which("c++"):
        assert problem is None
