"""``orchestrate show SWEEP KEY``: one trial whole, from its folder, the sweep's files and (when it answers) MLflow.

KEY is a trial's key, a unique prefix of one, or its label. Printed: where it stands (:mod:`orchestrate.status.status`'s
state, reason, progress, rate and GPU-hours), its folder and log, its sub-grids and seed, its config, every segment
(start time, host, job, code) and recorded outcome (``attempts.jsonl``), its evaluation jobs, and its run in the
ledger with the run's WERs when MLflow answers (one lookup; the folders are the truth, so an unreachable MLflow
only leaves the runs out, with a line saying why). ``--json``: the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from asr_core.contract.folder.segments import read_segments
from asr_core.contract.tracking import bound_mlflow_http, mlflow_http
from asr_core.contract.trial import read_attempts
from orchestrate.cli.checks import UsageError
from orchestrate.ledger.probe import ledger_probe
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial import Trial
from orchestrate.sweep.trial_state import read_folder_states
from orchestrate.status.trial_status import scheduler_view, trial_statuses

__all__ = ["add_arguments", "find_trial", "show_trial", "trial_record"]

# MLflow's own HTTP retries while show reads a run (unless set by the user): an answer within seconds, or none
MLFLOW_BOUNDS = mlflow_http(max_retries=1, backoff_factor=1, timeout_s=10)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``show``'s own arguments (after SWEEP and the common ones)."""
    p.add_argument("key", metavar="KEY", help="the trial: its key, a unique prefix of it, or its label")
    p.add_argument("--json", action="store_true", help="everything as one JSON object")


def find_trial(trials: list[Trial], text: str, sweep: str) -> Trial:
    """The trial ``text`` names: its key, its label, or a prefix of exactly one key. Raises
    :class:`~orchestrate.cli.checks.UsageError` naming the candidates when it names none or several."""
    for t in trials:
        if text in (t.key, t.label):
            return t
    hits = [t for t in trials if t.key.startswith(text)] if text else []
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise UsageError(f"KEY {text!r} is the start of {len(hits)} trial keys of sweep {sweep!r} ("
                         + ", ".join(f"{t.key} {t.label}" for t in hits[:5]) + (", ..." if len(hits) > 5 else "")
                         + "); give more of it")
    example = f" (e.g. {trials[0].label} or {trials[0].key})" if trials else ""
    raise UsageError(f"KEY {text!r}: no trial of sweep {sweep!r} has that key, key prefix or label{example}; "
                     "`orchestrate status SWEEP --json` lists them")


def _ledger_runs(manifest: Manifest, run_ids: list[str]) -> tuple[dict[str, dict[str, Any]], str]:
    """{run id: {"status", "name", "wer": {metric: value}}} of the runs MLflow has, and a note ("" or why none)."""
    if not run_ids:
        return {}, "no run yet (the trial was never submitted)"
    probe = ledger_probe(manifest.tracking_uri, manifest.name)
    if probe.answered is False:
        return {}, f"MLflow unreachable: {probe.error}"
    bound_mlflow_http(MLFLOW_BOUNDS)
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(manifest.tracking_uri)
        out = {}
        for run_id in run_ids:
            run = client.get_run(run_id)
            out[run_id] = {"status": run.info.status, "name": run.info.run_name or "",
                           "wer": {k: v for k, v in sorted(run.data.metrics.items()) if "wer" in k.lower()}}
        return out, ""
    except Exception as e:  # noqa: BLE001 - MLflow is a mirror: its failure leaves the runs out, said in a line
        last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        return {}, f"MLflow did not answer: {type(e).__name__}: {last}"


def trial_record(sweep: SweepDir, manifest: Manifest, trials: list[Trial], trial: Trial,
                 ledger: bool = True) -> dict[str, Any]:
    """Everything ``show`` prints of ``trial``, as one JSON-ready dict."""
    states = read_folder_states(sweep, [trial.key])
    row = trial_statuses(sweep, manifest, [trial], states, scheduler_view(sweep, manifest))[0]
    folder = sweep.trial_dir(trial.key)
    evaluations = [t for t in trials if t.evaluation is not None and t.evaluation.get("model") == trial.key]
    run_ids = list(dict.fromkeys(r for r in [row.run_id] if r))
    runs, note = _ledger_runs(manifest, run_ids) if ledger else ({}, "not asked")
    return {"sweep": sweep.name, **trial.to_dict(), "status": asdict(row),
            "segments": [s.to_dict() for s in read_segments(folder)],
            "attempts": [a.to_dict() for a in read_attempts(folder)],
            "evaluation_jobs": [{"key": t.key, "label": t.label, "name": t.evaluation["name"]} for t in evaluations],
            "runs": runs, "ledger": manifest.tracking_uri, "ledger_note": note}


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def show_trial(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest) -> int:
    """Print one trial whole (see the module docstring)."""
    trials = sweep.read_trials()
    trial = find_trial(trials, args.key, sweep.name)
    rec = trial_record(sweep, manifest, trials, trial)
    if args.json:
        print(json.dumps(rec, indent=1))
        return 0
    import yaml

    st = rec["status"]
    print(f"trial {trial.label}  {trial.key}  (sweep {sweep.name})")
    print(f"  status    {st['status']}" + (f": {st['reason']}" if st["reason"] else ""))
    if st["phase"]:
        pace = f", {st['rate']:.3g}/s" if st["rate"] else ""
        pace += f", {st['eta_s'] / 3600:.1f} h left" if st["eta_s"] is not None else ""
        print(f"  progress  {st['phase']}{pace}")
    print(f"  folder    {st['folder']}\n  log       {st['log']}")
    print(f"  sub-grids {', '.join(trial.subgrids) or '-'}; seed {trial.seed}; {st['gpu_hours']:.2f} GPU-hours spent")
    if trial.evaluation is not None:
        print(f"  evaluates {trial.evaluation.get('model')} as {trial.evaluation.get('name')}")
    print("config:")
    sys.stdout.write("".join(f"  {line}\n" for line in
                             yaml.safe_dump(rec["config"], sort_keys=False).splitlines()))
    print(f"segments ({len(rec['segments'])}):")
    for s in rec["segments"]:
        print(f"  {s['segment']}  {_when(s['time'])}  host {s['host'] or '?'}  job {s['job_id'] or '-'}  "
              f"code {s['code'] or '?'}")
    print(f"attempts ({len(rec['attempts'])}):")
    for a in rec["attempts"]:
        print(f"  segment {a['segment'] if a['segment'] is not None else '-'}  {_when(a['time'])}  {a['outcome']}"
              f"  by {a['by'] or '?'}  job {a['job_id'] or '-'}" + (f"  {a['reason']}" if a["reason"] else ""))
    if rec["evaluation_jobs"]:
        print(f"evaluation jobs ({len(rec['evaluation_jobs'])}):")
        for e in rec["evaluation_jobs"]:
            print(f"  {e['name']}  {e['key']}  {e['label']}")
    print(f"runs (ledger {manifest.tracking_uri}):")
    if rec["ledger_note"]:
        print(f"  {st['run_id'] or '-'}: {rec['ledger_note']}")
    for run_id, r in rec["runs"].items():
        print(f"  {run_id}  {r['status']}  {r['name']}")
        for k, v in r["wer"].items():
            print(f"    {k} = {v:.2f}")
        if not r["wer"]:
            print("    no WER logged yet")
    return 0
