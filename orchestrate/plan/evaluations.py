"""Evaluations of trained models as jobs of the sweep: what to evaluate, never what to train.

A sweep's trials are of two kinds, kept in one list (``trials.json``) and run by one machinery (the same backends,
lease, outbox, attempts, failure budget, ``max_parallel``, ``cancel`` and ``retry``):

* a **model** (a training trial, keyed by its model key): trained once; at the end of training its own job runs
  the sweep's default evaluation, the grid's ``eval:`` section as it stands then;
* an **evaluation job** (:class:`~orchestrate.sweep.trial.Trial` with ``evaluation`` set, keyed by
  :func:`asr_core.contract.identity.evaluation_key`): one evaluation of a trained model, into the model's run, never
  training it (:mod:`asr_core.contract.evaluation`).

:func:`plan_default` runs at every ``submit``: a model whose own evaluation is done but whose grid now asks for
more (another test set, another SNR) gets one evaluation job for exactly what it lacks; a grid that changes the
fixed setting of a finished evaluation (stride, precision, noise) is refused, naming the field.
:func:`plan_named` does the same for ``orchestrate evaluate SWEEP --spec FILE`` (a beam decoder, paper 004), under
the spec's name; :func:`plan_plain` for a spec of plain test sets, under each model's own name.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from asr_core.contract.evaluation import (DEFAULT_EVALUATION, Conditions, EvaluationSpec, conditions_json,
                                          conditions_lacking, conditions_of, conditions_union, default_evaluation,
                                          read_evaluated, setting_differences)
from asr_core.contract.identity import evaluation_key
from asr_core.contract.atomic import write_atomic
from asr_core.contract.trial import TrialFolder
from orchestrate.sweep.folder import SweepDir
from orchestrate.sweep.trial import Trial

if TYPE_CHECKING:
    from orchestrate.plan.decode_file import DecodeSpec


class EvaluationError(ValueError):
    """An evaluation cannot be planned as asked; the message names the field and what to do (exit 2)."""


def _dataset_names(specs: Iterable[str]) -> dict[str, str]:
    from asr_core.contract.specs import dataset_name

    return {dataset_name(s): s for s in specs}


def own_evaluation(sweep: SweepDir, model: Trial) -> tuple[Conditions, dict[str, Any] | None] | None:
    """What the model's own job evaluated (conditions, fixed setting), once its evaluation is done; None while it
    is not (its job then evaluates the grid's eval section as it stands at the end of training)."""
    folder = TrialFolder(sweep.trial_dir(model.key))
    if not (folder.evaluated.exists() or folder.done.exists()):
        return None
    rec = read_evaluated(folder.evaluated)
    if rec is not None:
        return rec
    from asr_core.config import Config
    from asr_core.config.parse import ConfigError

    try:  # an EVALUATED of an older version, or DONE without one: the config it ran (config.json, left as it ran)
        ev = Config.from_yaml(folder.config, stored=True).eval
    except ConfigError:
        ev = model.config.eval
    if not ev.datasets or not (folder.evaluated.exists() or folder.eval_dir.exists()):
        return {}, None
    return default_evaluation(ev)


def _jobs_by_model(trials: Iterable[Trial]) -> dict[tuple[str, str], list[EvaluationSpec]]:
    out: dict[tuple[str, str], list[EvaluationSpec]] = {}
    for t in trials:
        if t.evaluation is not None:
            spec = EvaluationSpec.from_dict(t.evaluation)
            out.setdefault((spec.model, spec.name), []).append(spec)
    return out


def evaluation_trial(sweep: SweepDir, model: Trial, name: str, setting: Mapping[str, Any], lacking: Conditions,
                     specs: Mapping[str, str], decoder: Mapping[str, Any] | None = None) -> Trial:
    """The evaluation job bringing ``lacking`` (dataset name → conditions) to ``model`` under ``name``."""
    key = evaluation_key(model.key, {"name": name, "setting": dict(setting), "conditions": conditions_json(lacking)})
    spec = EvaluationSpec(key=key, model=model.key, model_dir=str(sweep.trial_dir(model.key)), name=name,
                          setting=dict(setting), datasets=tuple(specs[n] for n in lacking), conditions=lacking,
                          decoder=dict(decoder) if decoder is not None else None, created=time.time())
    return dataclasses.replace(model, key=key, label=f"{model.label}.{name}-{key[-8:-2]}",
                               evaluation=spec.to_dict())


def plan_default(sweep: SweepDir, trials: list[Trial]) -> list[Trial]:
    """``trials`` (the sweep's, after the grid's were merged in) with one evaluation job appended for each model
    whose own evaluation is done and whose eval section (the grid's) asks for conditions no evaluation of it has
    or holds in hand. Raises :class:`EvaluationError` when the eval section changes the fixed setting (stride,
    precision, noise) of a model already evaluated."""
    known = {t.key for t in trials}
    jobs = _jobs_by_model(trials)
    added: list[Trial] = []
    for m in trials:
        if m.is_evaluation:
            continue
        own = own_evaluation(sweep, m)
        if own is None:
            continue
        ran, setting = own
        wanted, now = default_evaluation(m.config.eval)
        if setting is not None and wanted and setting != now:
            what = "; ".join(f"eval.{d}" for d in setting_differences(setting, now))
            raise EvaluationError(
                f"model {m.label} ({m.key}) was evaluated with another eval setting than the grid's now ({what}); "
                f"one name means one setting and its results ({DEFAULT_EVALUATION}: wer/...) would mix. Set it "
                "back in the grid, and evaluate the trained models the new way under a name of its own with "
                "`orchestrate evaluate SWEEP --spec FILE`")
        _add_job(sweep, m, DEFAULT_EVALUATION, now, wanted, ran, jobs, _dataset_names(m.config.eval.datasets), None,
                 known, added)
    return trials + added


def _add_job(sweep: SweepDir, model: Trial, name: str, setting: Mapping[str, Any], wanted: Conditions,
             have: Conditions, jobs: Mapping[tuple[str, str], list[EvaluationSpec]], specs: Mapping[str, str],
             decoder: Mapping[str, Any] | None, known: set[str], added: list[Trial]) -> None:
    """Append to ``added`` the job for what of ``wanted`` neither ``have`` nor a job of ``name`` already holds
    (none when nothing lacks, or its job is in ``known``)."""
    lacking = conditions_lacking(wanted, conditions_union(have, *(s.conditions for s in jobs.get((model.key, name),
                                                                                                   []))))
    if not lacking:
        return
    t = evaluation_trial(sweep, model, name, setting, lacking, specs, decoder)
    if t.key not in known:
        known.add(t.key)
        added.append(t)


def plan_named(sweep: SweepDir, trials: list[Trial], models: Iterable[Trial], name: str,
               setting: Mapping[str, Any], datasets: tuple[str, ...], snrs: tuple[float, ...],
               decoder: Mapping[str, Any], have_metrics: Mapping[str, Conditions] | None = None
               ) -> tuple[list[Trial], list[Trial], list[Trial]]:
    """Evaluation jobs of ``name`` (a spec of ``orchestrate evaluate``) for ``models``: for each trained model, one
    job for the conditions (``datasets`` or the model's eval.datasets, clean and each SNR) that no evaluation of
    that name has or holds in hand. ``have_metrics``: {model key: conditions} found in the ledger (results of an
    earlier version's decode jobs). Returns (every trial, the added jobs, the models left: not trained yet)."""
    known = {t.key for t in trials}
    jobs = _jobs_by_model(trials)
    added: list[Trial] = []
    untrained: list[Trial] = []
    for m in models:
        folder = TrialFolder(sweep.trial_dir(m.key))
        if not (folder.trained.exists() or folder.done.exists()) or not folder.checkpoint.is_file():
            untrained.append(m)
            continue
        specs = _dataset_names(datasets or m.config.eval.datasets)
        if not specs:
            raise EvaluationError(f"model {m.label} has no eval.datasets and the spec gives no 'datasets': list the "
                                  "datasets to evaluate there (NAME=FORMAT:PATH)")
        _add_job(sweep, m, name, setting, conditions_of(specs.values(), snrs), (have_metrics or {}).get(m.key, {}),
                 jobs, specs, decoder, known, added)
    return trials + added, added, untrained


def plan_plain(sweep: SweepDir, trials: list[Trial], models: Iterable[Trial], datasets: tuple[str, ...],
               snrs: tuple[float, ...]) -> tuple[list[Trial], list[Trial], list[Trial]]:
    """Jobs of each model's own evaluation (:data:`DEFAULT_EVALUATION`, metrics ``wer/...``) for plain test sets
    (``orchestrate evaluate`` with a file of only ``datasets`` and ``snrs``): what ``submit`` plans when the grid's
    eval section gains them (:func:`plan_default`), at the setting each model was evaluated with. Returns (every
    trial, the added jobs, the models left: not trained, or their own evaluation not done yet). Raises
    :class:`EvaluationError` when a dataset's name is one of a model's own test sets with another path."""
    known = {t.key for t in trials}
    jobs = _jobs_by_model(trials)
    added: list[Trial] = []
    waiting: list[Trial] = []
    specs = _dataset_names(datasets)
    for m in models:
        own = own_evaluation(sweep, m)
        if own is None:
            waiting.append(m)
            continue
        mine = _dataset_names(m.config.eval.datasets)
        for name, spec in specs.items():
            if name in mine and mine[name] != spec:
                raise EvaluationError(f"dataset name {name!r} is model {m.label}'s test set {mine[name]!r} already, "
                                      f"and the file gives it {spec!r}: one name means one test set (its metrics "
                                      f"wer/{name}/...); give this one another name")
        ran, setting = own
        if setting is None:
            setting = default_evaluation(m.config.eval)[1]
        _add_job(sweep, m, DEFAULT_EVALUATION, setting, conditions_of(specs.values(), snrs), ran, jobs, specs, None,
                 known, added)
    return trials + added, added, waiting


def evaluation_config(job: Trial) -> Any:
    """The config of an evaluation job with an eval section that decodes what the job decodes (its datasets; every
    SNR of its conditions on the datasets that have one): what :mod:`orchestrate.budget.estimate` sizes. It may count a
    clean condition the job leaves out: an estimate for a time limit errs long."""
    spec = EvaluationSpec.from_dict(job.evaluation or {})
    snrs = sorted({c for cs in spec.conditions.values() for c in cs if c is not None})
    noisy = tuple(n for n, cs in spec.conditions.items() if any(c is not None for c in cs))
    ev = dataclasses.replace(job.config.eval, datasets=spec.datasets, snrs=tuple(snrs),
                             noisy=() if len(noisy) == len(spec.conditions) else noisy)
    return dataclasses.replace(job.config, eval=ev)


def decoded_before(uri: str, sweep_name: str, decoders: list[str], models: Iterable[Trial]
                   ) -> dict[str, Conditions]:
    """{model key: the conditions whose ``wer_<decoder>/<dataset>[/snr<DB>]`` its run already holds for every one
    of ``decoders``} (decoded by an earlier version's decode jobs under this name): never decoded again. One search
    of the sweep's trial runs."""
    from orchestrate.ledger.ledger import Ledger

    ledger = Ledger(uri, sweep_name)
    by_run = decoder_metrics(uri, ledger.experiment_id, decoders)
    runs = ledger.trial_runs()
    out: dict[str, Conditions] = {}
    for m in models:
        run = runs.get(m.key)
        held = by_run.get(run.run_id, set()) if run is not None else set()
        every: set[tuple[str, Any]] | None = None
        for decoder in decoders:
            prefix = f"wer_{decoder}/"
            mine: set[tuple[str, Any]] = set()
            for metric in (k for k in held if k.startswith(prefix)):
                dataset, _, snr = metric[len(prefix):].partition("/snr")
                if "/" in dataset:  # no metric of a dataset and condition
                    continue
                try:
                    mine.add((dataset, float(snr) if snr else None))
                except ValueError:
                    continue
            every = mine if every is None else every & mine
        conds: dict[str, set[Any]] = {}
        for dataset, snr in every or ():
            conds.setdefault(dataset, set()).add(snr)
        if conds:
            out[m.key] = conditions_union(conds)
    return out


def evaluation_runs(sweep: SweepDir, trials: Iterable[Trial], runs: Mapping[str, Any]) -> dict[str, Any]:
    """The ledger as :func:`orchestrate.dispatch.dispatch.classify` sees an evaluation job: its model's run, always
    SCHEDULED (an evaluation job's state is its folder's alone: the model's run says how training went), once the
    job has been prepared (a folder); none before (a new job)."""
    from asr_core.contract.trial import SCHEDULED

    out: dict[str, Any] = {}
    for t in trials:
        if t.evaluation is None:
            continue
        r = runs.get(t.model)
        if r is not None and TrialFolder(sweep.trial_dir(t.key)).config.exists():
            out[t.key] = dataclasses.replace(r, key=t.key, label=t.label, status=SCHEDULED, error="", job_id="")
    return out


# ---- one name, one setting ---------------------------------------------------------------------------------------
NAMES_DIR = "decode"  # in the sweep folder: one folder per evaluation name of `orchestrate evaluate` (its setting)


class EvaluationName:
    """``<sweep>/decode/<name>/``: the setting that first took an evaluation ``name`` of ``orchestrate evaluate``
    (``spec.json``, with a copy of its file, ``decode.yaml``). A later spec under the name must repeat it."""

    def __init__(self, sweep: SweepDir, name: str) -> None:
        self.sweep = sweep
        self.name = name
        self.path = sweep.path / NAMES_DIR / name

    @property
    def spec_path(self) -> Path:
        return self.path / "spec.json"

    def check_setting(self, spec: "DecodeSpec", setting: dict[str, Any]) -> bool:
        """True when the name is new here; False when it holds ``setting`` already; :class:`EvaluationError` naming
        both files and what differs when it holds another."""
        if not self.spec_path.exists():
            return True
        recorded = json.loads(self.spec_path.read_text())
        differ = setting_differences(recorded["setting"], setting)
        if not differ:
            return False
        raise EvaluationError(f"evaluation name {self.name!r} of sweep {self.sweep.name!r} is the setting of "
                              f"{recorded['spec']['source']} (copied to {self.path / 'decode.yaml'}), and "
                              f"{spec.source} gives it another ({'; '.join(differ)}); one name means one setting: "
                              "give this one another name")

    def claim(self, spec: "DecodeSpec", setting: dict[str, Any]) -> None:
        """Record the setting under this name (the caller holds the sweep's lock and checked it is new)."""
        text = Path(spec.source).read_text()
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / "decode.yaml", f"# copied from {spec.source} (relative paths are relative to its "
                     f"folder) by `orchestrate evaluate` at {time.strftime('%Y-%m-%d %H:%M:%S')}\n{text}")
        write_atomic(self.spec_path, json.dumps({"spec": spec.to_dict(), "setting": setting}, indent=1))


def decoder_metrics(uri: str, experiment_id: str, decoders: list[str]) -> dict[str, set[str]]:
    """{run id: the metric keys ``wer_<decoder>/...`` it holds, of any of ``decoders``} of every trial run of the
    experiment (paged searches)."""
    from mlflow.tracking import MlflowClient

    from asr_core.contract.trial import ROLE_TRIAL, TAG_ROLE

    client = MlflowClient(tracking_uri=uri)
    prefixes = tuple(f"wer_{d}/" for d in decoders)
    out: dict[str, set[str]] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'", max_results=1000,
                                  page_token=token)
        for r in page:
            out[r.info.run_id] = {k for k in r.data.metrics if k.startswith(prefixes)}
        token = page.token
        if not token:
            return out


def missing_data(jobs: Iterable[Trial], workdir: Path) -> dict[str, str]:
    """{path: the job's label} of every dataset the evaluation jobs would read that is not there (relative paths:
    from ``workdir``, where the jobs run; a prepared corpus: once its manifest is written)."""
    from asr_core.contract.specs import CorpusError, parse_dataset_spec, split_spec

    out: dict[str, str] = {}
    for j in jobs:
        for d in (j.evaluation or {}).get("datasets", ()):
            try:
                fmt, p = split_spec(parse_dataset_spec(d)[1])
            except CorpusError as e:
                raise EvaluationError(f"evaluation job {j.label}: {e}") from None
            full = workdir / p / "prepared.json" if fmt == "prepared" else workdir / p
            if not full.exists():
                out.setdefault(str(full), j.label)
    return out
