"""``orchestrate evaluate SWEEP --decode FILE``: beam-search decoding (paper 004, with an LM or without) of a sweep's
finished trials, as jobs on the sweep's backend. Evaluation is not training: trial keys, ``trials.json``, the trial
folders and their attempts are never touched; the results go into each trial's own MLflow run
(``wer_<name>/<dataset>[/snr<DB>]``, ``eval/<dataset>.<name>.csv``, tag ``eval.decoder.<name>``) beside its greedy
figures, which stay as they are.

What is decoded (:func:`plan_decode`): the trials matching ``--where`` whose run is FINISHED and whose checkpoint is
on disk, less those whose run already has the decoder's metric for every dataset and condition (a trial missing some
decodes only those datasets) and, on SLURM, those a decode task of this decoder still holds in the queue. Running
``evaluate`` again therefore submits nothing new, like ``resume``.

The decoder's folder, ``<sweep>/decode/<name>/``::

    decode.yaml            the decode file that first defined the name (a copy, for people)
    spec.json              that setting, validated and resolved (:class:`~orchestrate.decode_file.DecodeSpec`),
                           with the SHA-256 of the LM and prompt: a later file under this name must repeat it
    submissions/<id>.json  one per submission, written before anything runs: backend, job id, and per task index the
                           trial key, run id, label, checkpoint, datasets and SNRs
    logs/<key>.log         each trial's decoding output (every attempt appended)
    out/<key>/             evaluate's tables, hypotheses and outbox (never the trial's own eval/)
    slurm/<id>/            submitit's files of a SLURM array

``local`` runs the tasks one after another as child processes of the command, holding the sweep's lock, with a
progress line per trial. ``slurm`` and ``ray-slurm`` submit submitit job arrays (:class:`DecodeTask`), split at the
cluster's ``MaxArraySize``, named ``orch.<sweep>.decode.<name>.<submission>`` (never a training job's name), with
the sweep's profile: its partition, account, QOS, CPUs, memory (a number; ``estimate`` is training's and leaves
the partition's default), setup lines and extra options, one GPU of the profile's kind per task, the profile's fixed
time limit (with ``time_limit: estimate``, its ``time_max`` or the partition's ``MaxTime``) and at most
``max_parallel`` tasks of an array at once. A task (:func:`decode_one`) calls :func:`asr_core.evaluate.evaluate`
with a :class:`~asr_core.evaluate.BeamDecoding` built by :func:`asr_core.evaluate.beam_decoding`, in the sweep's
working folder, with the trial's run id and the sweep's tracking URI. A task that fails leaves its trial undecoded;
the next ``evaluate`` submits it again.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from orchestrate.backends.base import BackendError
from orchestrate.decode_file import DecodeSpec
from orchestrate.sweep import SweepDir
from orchestrate.trial import Trial

if TYPE_CHECKING:
    from orchestrate.backends.profile import Profile
    from orchestrate.sweep import Manifest

DECODE_DIR = "decode"  # in the sweep folder
SELECTORS = ("subgrid", "key", "evaluation")  # --where keys that are not config fields
SLURM_BACKENDS = ("slurm", "ray-slurm")


class DecodeError(RuntimeError):
    """The decoding cannot be planned or submitted as asked; the message says what to do (exit 2)."""


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---- --where --------------------------------------------------------------------------------------------------------
def parse_where(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["data.context_s=10.24", "model.heads=6"]`` → {field: [values]}, each value parsed as the grid and ``--set``
    parse it (:func:`asr_core.config.parse_field`); ``subgrid=NAME`` selects a sub-grid's trials, ``key=KEY`` a
    model (and its evaluation jobs) or one evaluation job by its key, ``evaluation=NAME`` the evaluation jobs of
    that name (``evaluation=none``: the models themselves). Values of one key are alternatives, different keys must
    all hold. Raises :class:`DecodeError` naming the bad item."""
    from asr_core.config import ConfigError, parse_field, parse_override

    out: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise DecodeError(f"--where {item!r}: valid: KEY=VALUE, a config field (data.context_s=10.24), "
                              "subgrid=NAME, key=KEY or evaluation=NAME")
        try:
            key, value = parse_override(item)
            if key not in SELECTORS:
                value = parse_field(key, value, source=f"--where {item!r}")
        except ConfigError as e:
            raise DecodeError(f"{e} (or subgrid=NAME, key=KEY, evaluation=NAME)") from None
        out.setdefault(key, []).append(str(value) if key in SELECTORS else value)
    return out


def matches(trial: Trial, where: dict[str, list[Any]]) -> bool:
    """Whether ``trial`` satisfies every ``--where`` key (one of its values each)."""
    from asr_core.config import parse_field

    flat = trial.config.flat()
    ev = getattr(trial, "evaluation", None)
    for key, values in where.items():
        if key == "subgrid":
            if not set(values) & set(trial.subgrids):
                return False
        elif key == "key":
            if not {trial.key, ev["model"] if ev else trial.key} & set(values):
                return False
        elif key == "evaluation":
            if (ev["name"] if ev else "none") not in values:
                return False
        elif parse_field(key, flat[key], source=f"trial {trial.key}") not in values:
            return False
    return True


# ---- the decoder's folder and its submissions -----------------------------------------------------------------------
class DecoderDir:
    """``<sweep>/decode/<name>/`` (see the module docstring)."""

    def __init__(self, sweep: SweepDir, name: str) -> None:
        self.sweep = sweep
        self.name = name
        self.path = sweep.path / DECODE_DIR / name

    @property
    def spec_path(self) -> Path:
        return self.path / "spec.json"

    def log(self, key: str) -> Path:
        return self.path / "logs" / f"{key}.log"

    def out_dir(self, key: str) -> Path:
        return self.path / "out" / key

    def read_spec(self) -> DecodeSpec:
        return DecodeSpec.from_dict(json.loads(self.spec_path.read_text())["spec"])

    def check_setting(self, spec: DecodeSpec, setting: dict[str, Any]) -> bool:
        """True when the name is new here; False when it holds ``setting`` already; :class:`DecodeError` naming both
        files and what differs when it holds another."""
        if not self.spec_path.exists():
            return True
        recorded = json.loads(self.spec_path.read_text())
        before = recorded["setting"]
        differ = [k for k in before if before.get(k) != setting.get(k)]
        if not differ:
            return False
        what = "; ".join(f"{k}: {before.get(k)!r} there, {setting.get(k)!r} here" for k in differ)
        raise DecodeError(f"decoder name {self.name!r} of sweep {self.sweep.name!r} is the setting of "
                          f"{recorded['spec']['source']} (copied to {self.path / 'decode.yaml'}), and "
                          f"{spec.source} gives it another ({what}); one name means one setting: give this one "
                          "another name")

    def claim(self, spec: DecodeSpec, setting: dict[str, Any]) -> None:
        """Record the setting under this name (the caller holds the sweep's lock and checked it is new)."""
        text = Path(spec.source).read_text()
        _atomic_write(self.path / "decode.yaml", f"# copied from {spec.source} (relative paths are relative to its "
                      f"folder) by `orchestrate evaluate` at {time.strftime('%Y-%m-%d %H:%M:%S')}\n{text}")
        _atomic_write(self.spec_path, json.dumps({"spec": spec.to_dict(), "setting": setting}, indent=1))

    # ---- submissions ----
    @property
    def submissions_dir(self) -> Path:
        return self.path / "submissions"

    def new_submission(self, backend: str, items: list["DecodeItem"], code: str) -> "DecodeSubmission":
        sub_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
        s = DecodeSubmission(self, sub_id, {"id": sub_id, "backend": backend, "decoder": self.name, "code": code,
                                            "job_id": None, "created": time.time(),
                                            "tasks": [i.to_dict() for i in items]})
        s.save()
        return s

    def submissions(self) -> list["DecodeSubmission"]:
        if not self.submissions_dir.exists():
            return []
        return [DecodeSubmission(self, p.stem, json.loads(p.read_text()))
                for p in sorted(self.submissions_dir.glob("*.json"))]

    def submission(self, sub_id: str) -> "DecodeSubmission":
        return DecodeSubmission(self, sub_id, json.loads((self.submissions_dir / f"{sub_id}.json").read_text()))


class DecodeSubmission:
    """One submission of decode tasks: task ``i`` decodes ``tasks[i]``; the job id once the scheduler has it."""

    def __init__(self, decoder: DecoderDir, sub_id: str, data: dict[str, Any]) -> None:
        self.decoder = decoder
        self.id = sub_id
        self.data = data

    @property
    def path(self) -> Path:
        return self.decoder.submissions_dir / f"{self.id}.json"

    @property
    def tasks(self) -> list["DecodeItem"]:
        return [DecodeItem.from_dict(d) for d in self.data["tasks"]]

    def job_name(self) -> str:
        """``orch.<sweep>.decode.<name>.<submission>``: found again in the queue, never taken for a training job."""
        return f"orch.{self.decoder.sweep.name}.{DECODE_DIR}.{self.decoder.name}.{self.id}"

    def save(self) -> None:
        _atomic_write(self.path, json.dumps(self.data, indent=1))

    def record_job(self, job_id: str) -> None:
        self.data["job_id"] = job_id
        self.save()


# ---- what to decode -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeItem:
    """One trial to decode: its run, checkpoint, and the datasets (``NAME=FORMAT:PATH``) and SNRs it lacks."""

    key: str
    label: str
    run_id: str
    checkpoint: str
    datasets: tuple[str, ...]
    snrs: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "run_id": self.run_id, "checkpoint": self.checkpoint,
                "datasets": list(self.datasets), "snrs": list(self.snrs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DecodeItem":
        return cls(d["key"], d["label"], d["run_id"], d["checkpoint"], tuple(d["datasets"]), tuple(d["snrs"]))


@dataclass
class DecodePlan:
    """What ``evaluate`` submits (``items``) and what it leaves, by trial key."""

    items: list[DecodeItem] = field(default_factory=list)
    decoded: list[str] = field(default_factory=list)  # every metric there already
    live: list[str] = field(default_factory=list)  # a decode task of this decoder still queued or running
    unfinished: list[str] = field(default_factory=list)  # not FINISHED in the ledger, or no checkpoint on disk
    unmatched: int = 0  # not selected by --where

    def summary(self) -> str:
        return (f"{len(self.items)} to decode, {len(self.decoded)} decoded already (skipped), {len(self.live)} "
                f"queued or running (skipped), {len(self.unfinished)} not finished (skipped), {self.unmatched} not "
                "matching --where")


def _dataset_name(spec: str) -> str:
    from asr_core.corpora import parse_dataset_spec

    return parse_dataset_spec(spec)[0]


def plan_decode(sweep: SweepDir, manifest: "Manifest", trials: list[Trial], spec: DecodeSpec,
                where: dict[str, list[Any]], live: Iterable[str] = ()) -> DecodePlan:
    """The trials to decode with ``spec`` (see the module docstring): one ledger search for the trials' runs and one
    for their metrics. ``live``: keys a decode task of this decoder still holds. Raises :class:`DecodeError` when a
    selected trial has no datasets to decode (none in the decode file, none in its eval.datasets)."""
    from asr_core.trial_contract import FINISHED, TrialFolder
    from orchestrate.ledger import Ledger

    plan = DecodePlan()
    live = set(live)
    selected = [t for t in trials if matches(t, where)]
    plan.unmatched = len(trials) - len(selected)
    no_data = [t.label for t in selected if not (spec.datasets or t.config.eval.datasets)]
    if no_data:
        raise DecodeError(f"trials {', '.join(no_data[:5])}{' …' if len(no_data) > 5 else ''} have no "
                          f"eval.datasets and {spec.source} gives no 'datasets': list the datasets to decode there "
                          "(NAME=FORMAT:PATH)")
    ledger = Ledger(manifest.tracking_uri, manifest.name)
    runs = ledger.trial_runs()
    have = decoder_metrics(manifest.tracking_uri, ledger.experiment_id, spec.name)
    for t in selected:
        run = runs.get(t.key)
        checkpoint = TrialFolder(sweep.trial_dir(t.key)).checkpoint
        if run is None or run.status != FINISHED or not checkpoint.is_file():
            plan.unfinished.append(t.key)
            continue
        if t.key in live:
            plan.live.append(t.key)
            continue
        datasets = spec.datasets or t.config.eval.datasets
        lacking = tuple(d for d in datasets
                        if not set(spec.metric_keys(_dataset_name(d))) <= have.get(run.run_id, set()))
        if not lacking:
            plan.decoded.append(t.key)
            continue
        plan.items.append(DecodeItem(t.key, t.label, run.run_id, str(checkpoint), lacking, spec.snrs))
    return plan


def decoder_metrics(uri: str, experiment_id: str, name: str) -> dict[str, set[str]]:
    """{run id: the decoder's metric keys it holds} of every trial run of the experiment (paged searches)."""
    from mlflow.tracking import MlflowClient

    from asr_core.trial_contract import ROLE_TRIAL, TAG_ROLE

    client = MlflowClient(tracking_uri=uri)
    prefix = f"wer_{name}/"
    out: dict[str, set[str]] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'", max_results=1000,
                                  page_token=token)
        for r in page:
            out[r.info.run_id] = {k for k in r.data.metrics if k.startswith(prefix)}
        token = page.token
        if not token:
            return out


def check_trial_data(items: list[DecodeItem], workdir: Path) -> None:
    """:class:`DecodeError` naming every dataset path the tasks would read that does not exist (relative paths: from
    the sweep's working folder, where the tasks run)."""
    from asr_core.corpora import CorpusError, parse_dataset_spec, split_spec

    missing: dict[str, str] = {}
    for i in items:
        for d in i.datasets:
            try:
                fmt, p = split_spec(parse_dataset_spec(d)[1])
            except CorpusError as e:
                raise DecodeError(f"eval.datasets of trial {i.label}: {e}") from None
            full = workdir / p / "prepared.json" if fmt == "prepared" else workdir / p
            if not full.exists():
                missing.setdefault(str(full), i.label)
    if missing:
        raise DecodeError("data not found: " + ", ".join(f"{p} (eval.datasets of {k})" for p, k in
                                                          sorted(missing.items()))
                          + "; give the datasets in the decode file ('datasets'), or move the data back")


def live_keys(decoder: DecoderDir) -> set[str]:
    """Keys whose decode task of this decoder the queue still holds (pending, running, requeued, completing)."""
    from orchestrate.backends import slurm_commands

    subs = {s.job_name(): s for s in decoder.submissions() if s.data.get("backend") in SLURM_BACKENDS}
    out: set[str] = set()
    for row in slurm_commands.squeue(list(subs)):
        sub = subs.get(row.name)
        idx = row.job_id.split("_", 1)[1] if "_" in row.job_id else "0"  # a lone job (one task) is task 0
        if sub is not None and idx.isdigit() and int(idx) < len(sub.data["tasks"]):
            out.add(sub.data["tasks"][int(idx)]["key"])
    return out


# ---- running: the same child on every backend -----------------------------------------------------------------------
def decode_command(sweep_path: Path, name: str, sub_id: str, index: int) -> list[str]:
    """The child that decodes task ``index`` of submission ``sub_id`` (:func:`decode_one`)."""
    return [sys.executable, "-m", "orchestrate.decode_jobs", str(sweep_path), name, sub_id, str(index)]


def run_local(decoder: DecoderDir, sub: DecodeSubmission, workdir: Path) -> int:
    """Decode the submission's tasks one after another in child processes; returns how many failed."""
    from orchestrate.runner import TrialProcess, last_line

    tasks = sub.tasks
    failed = 0
    sub.record_job(f"local:{os.getpid()}:{sub.id}")
    for i, item in enumerate(tasks):
        t0 = time.monotonic()
        print(f"[orchestrate] decode {decoder.name}: {i + 1}/{len(tasks)} {item.label} ({item.key}): "
              f"{', '.join(_dataset_name(d) for d in item.datasets)} ...", file=sys.stderr, flush=True)
        child = TrialProcess(decode_command(decoder.sweep.path, decoder.name, sub.id, i), workdir,
                             decoder.log(item.key))
        rc = child.wait()
        took = time.monotonic() - t0
        if rc == 0:
            print(f"[orchestrate] decode {decoder.name}: {i + 1}/{len(tasks)} {item.label} done in {took:.0f}s",
                  file=sys.stderr, flush=True)
        else:
            failed += 1
            print(f"[orchestrate] decode {decoder.name}: {i + 1}/{len(tasks)} {item.label} FAILED (exit {rc}) after "
                  f"{took:.0f}s: {last_line(child.log_path)} (log {child.log_path})", file=sys.stderr, flush=True)
    return failed


class DecodeTask:
    """What each array task of a decode submission runs (pickled by submitit): its index's child, logged to the
    trial's decode log; a failure raises, so SLURM and submitit see the task failed."""

    def __init__(self, sweep_path: str, name: str, sub_id: str) -> None:
        self.sweep_path = sweep_path
        self.name = name
        self.sub_id = sub_id

    def __call__(self) -> int:
        from orchestrate.runner import TrialProcess, last_line

        index = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))  # a submission of one task is a lone job
        path = Path(self.sweep_path)
        sweep = SweepDir(path.parent, path.name)
        decoder = DecoderDir(sweep, self.name)
        item = decoder.submission(self.sub_id).tasks[index]
        workdir = sweep.read_manifest().workdir or Path.cwd()
        child = TrialProcess(decode_command(sweep.path, self.name, self.sub_id, index), workdir, decoder.log(item.key))
        print(f"[orchestrate] decode task {index}: trial {item.key} ({item.label}), log {child.log_path}", flush=True)
        rc = child.wait()
        if rc != 0:
            raise RuntimeError(f"decoding trial {item.key} exited {rc}: {last_line(child.log_path)}")
        return 0


def decode_minutes(profile: "Profile") -> int:
    """A decode task's time limit: the profile's fixed one; with ``time_limit: estimate`` (training's rule) its
    ``time_max``, else the partition's ``MaxTime``."""
    from orchestrate.backends import slurm_commands
    from orchestrate.backends.resources import parse_minutes

    if not profile.time_rule:
        return profile.time_limit_min()
    if profile.time_max:
        return parse_minutes(profile.time_max)
    cap = slurm_commands.partition_max_minutes(profile.partition)
    if cap is None:
        raise BackendError(f"profile {profile.name!r}: time_limit 'estimate' is training's rule, and neither "
                           "time_max nor the partition's MaxTime gives decode tasks a limit; set time_max")
    return cap


def one_gpu(profile: "Profile") -> str | int:
    """One GPU of the profile's kind (``a100:4`` → ``a100:1``), 0 for none: decoding runs on one device."""
    g = str(profile.gpus_per_node)
    if not profile.gpu_count():
        return 0
    return f"{g.rsplit(':', 1)[0]}:1" if ":" in g else 1


def submit_slurm(decoder: DecoderDir, items: list[DecodeItem], profile: "Profile", code: str,
                 backend: str = "slurm") -> list[str]:
    """Submit ``items`` as job arrays of at most ``MaxArraySize`` tasks each (a record written before each
    ``sbatch``); returns the array ids."""
    from orchestrate.backends import slurm_commands
    from orchestrate.backends.resources import Resources
    from orchestrate.backends.slurm import profile_executor

    size = max(1, slurm_commands.max_array_size())
    minutes = decode_minutes(profile)
    queued: list[str] = []
    for start in range(0, len(items), size):
        chunk = items[start:start + size]
        sub = decoder.new_submission(backend, chunk, code)
        mem = int(float(profile.mem_gb) * 1024) if profile.mem_gb and not isinstance(profile.mem_gb, str) else 0
        ex = profile_executor(decoder.path / "slurm" / sub.id, profile, Resources(minutes, mem_mb=mem),
                              job_name=sub.job_name(), parallelism=min(profile.max_parallel or len(chunk), len(chunk)),
                              comment=f"orchestrate sweep={decoder.sweep.name} decode={decoder.name} submission={sub.id}",
                              gpus=one_gpu(profile))
        task = DecodeTask(str(decoder.sweep.path), decoder.name, sub.id)
        try:
            with ex.batch():
                handles = [ex.submit(task) for _ in chunk]
        except Exception as e:  # submitit raises plain exceptions carrying sbatch's message
            done = f"arrays {', '.join(queued)} are queued; " if queued else "nothing was submitted; "
            raise BackendError(f"sbatch failed for decoder {decoder.name} of sweep {decoder.sweep.name}: {e}; "
                               f"{done}`orchestrate evaluate` again submits the rest") from None
        array_id = handles[0].job_id.split("_")[0]
        sub.record_job(array_id)
        queued.append(array_id)
        print(f"[orchestrate] decode {decoder.name}: job array {array_id} with {len(chunk)} tasks "
              f"(job name {sub.job_name()}); logs in {decoder.path / 'logs'}", file=sys.stderr, flush=True)
    return queued


# ---- the child: one trial decoded -----------------------------------------------------------------------------------
def decode_one(sweep_path: Path, name: str, sub_id: str, index: int) -> int:
    """Decode task ``index`` of submission ``sub_id`` of decoder ``name`` into its trial's run; returns the exit
    code (2: bad input, e.g. a dataset that is missing or changed since the trial was evaluated)."""
    import torch

    from asr_core.config import Config
    from asr_core.corpora import CorpusError
    from asr_core.evaluate import beam_decoding, evaluate
    from asr_core.outbox import fail_fast_http

    sweep = SweepDir(sweep_path.parent, sweep_path.name)
    decoder = DecoderDir(sweep, name)
    spec = decoder.read_spec()
    item = decoder.submission(sub_id).tasks[index]
    manifest = sweep.read_manifest()
    fail_fast_http()  # one MLflow call fails fast; the outbox retries
    checkpoint = Path(item.checkpoint)
    print(f"[decode] {name}: trial {item.key} ({item.label}), run {item.run_id}, datasets "
          f"{', '.join(item.datasets)}, SNRs {list(item.snrs) or 'none (clean only)'}", file=sys.stderr, flush=True)
    try:
        ck = torch.load(str(checkpoint), map_location="cpu", weights_only=True, mmap=True)
        ev = Config.from_stored(ck["config"], source=str(checkpoint)).eval
        del ck
        beam = beam_decoding("beam", lm_path=Path(spec.lm) if spec.lm else None,
                             alpha=spec.alpha if spec.lm else None, beta=spec.beta,
                             beam_width=spec.beam_width, lm_context=spec.lm_context,
                             prompt=Path(spec.prompt) if spec.prompt else None, name=spec.name,
                             tokenizer_of=checkpoint)
        evaluate(checkpoint, list(item.datasets), list(item.snrs), stride=spec.stride or ev.stride,
                 batch_windows=ev.batch_windows, noise=ev.noise, tracking_uri=manifest.tracking_uri,
                 run_id=item.run_id, out_dir=decoder.out_dir(item.key), precision=ev.precision, beam=beam)
    except (CorpusError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"[decode] {name}: trial {item.key}: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrate.decode_jobs SWEEP_PATH NAME SUBMISSION INDEX`` (what :func:`decode_command` runs)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or not args[3].isdigit():
        print("usage: python -m orchestrate.decode_jobs SWEEP_PATH NAME SUBMISSION INDEX (started by `orchestrate "
              "evaluate`)", file=sys.stderr)
        return 2
    return decode_one(Path(args[0]), args[1], args[2], int(args[3]))


if __name__ == "__main__":
    sys.exit(main())
