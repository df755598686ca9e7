"""Analysis command line: a publishable report of a sweep (`report`), one pairwise comparison (`compare`), or the
report's benchmark at the paper's scale (`bench`, :mod:`analysis.bench`).

    python -m analysis report SWEEP --out DIR [--tracking-uri URI] [--baseline-context-s 10.24] [--no-log]
                              [--lm-experiment NAME ...] [--heads-repr A|Q|K|V|Y]
    python -m analysis compare SWEEP A B [--tracking-uri URI] [--dataset D] [--snr DB] [--family F]
    python -m analysis bench [--runs 321 --runs 3000] [--dir DIR]

The ledger is found as by every command (:mod:`asr_core.contract.tracking`): ``--tracking-uri``, else the URI the
sweep's folder (``--sweep-root``, default ``./runs``) recorded, else ``MLFLOW_TRACKING_URI``, else
``sqlite:///runs/mlflow.db``; a ledger file that does not exist is said, never created.

``report`` also logs the report's files to ``report/`` of the sweep's parent run and saves a view of the runs
table with the clean WER columns, linked from the experiment's description (:mod:`analysis.dashboard`);
``--no-log`` writes the folder only.

A and B name configurations (B is compared against A), in any of these forms:

* a configuration name: the trial label without its seed, e.g. ``ctx82s-rope1.5M-6L768d6h``;
* a trial label (its configuration is meant, all seeds), e.g. ``ctx82s-rope1.5M-6L768d6h-s2``;
* a context length, ``20.48``, ``20s``, ``5.5min`` or ``1h`` (within 1%, or equal rounded to whole seconds as in
  the labels), when one configuration has it — in ``--family`` if given, and in the other side's series if the
  other side is named unambiguously;
* the ``config_id`` column of ``trials.csv`` or its first 4+ characters.

Exit codes: 0 done; 2 bad arguments, a ledger file that does not exist, or a selection that matches nothing or
several; 3 the sweep cannot be read
(an unreachable tracker included, found within seconds), A and B cannot be paired, or the written report cannot be
logged to MLflow.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.bench import add_parser as add_bench_parser
from analysis.bench import run_bench
from analysis.ledger.cache import CACHE_ENV, bad_cache_dir, default_cache_dir
from analysis.ledger.defaults import BOOTSTRAP_RESAMPLES, DEFAULT_BASELINE_CONTEXT_S
from analysis.ledger.fetch import CollectError
from asr_core.contract.metrics import CLEAN, condition_name
from asr_core.contract.options import positional, renamed
from asr_core.contract.tracking import (DASHBOARD_HOST, DASHBOARD_PORT, DEFAULT_SWEEP_ROOT, ENV, SWEEP_ROOT_ENV,
                                        bad_uri, bound_mlflow_http, dashboard_command, default_sweep_root,
                                        missing_ledger, mlflow_http, tracking_uri)
from asr_core.contract.command import ShowVersion

if TYPE_CHECKING:  # the tables (pandas, scipy) are imported where a command runs: --help and a Tab need none
    from analysis.ledger.cache import TableCache
    from analysis.memo import Written

EXIT_USAGE = 2
EXIT_DATA = 3
# MLflow's own HTTP retries, unless set: a server that stops answering mid-read is given up in seconds, not minutes
# (its defaults retry 7 times with up to 2 min between tries; a server that is down from the start is found by
# analysis.ledger.fetch.check_tracker before any of them)
MLFLOW_BOUNDS = mlflow_http(max_retries=2, backoff_factor=1, timeout_s=10)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=ShowVersion)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="write DIR/index.html, report.md, figures and CSV tables for a sweep",
                       description="Write DIR/index.html, report.md, figures and CSV tables for a sweep.")
    renamed(r, "--experiment", r.add_argument("sweep", nargs="?", default=None, metavar="SWEEP",
                                              help="the sweep (its MLflow experiment)"))
    ledger_options(r)
    r.add_argument("--out", required=True, help="output folder (created)")
    renamed(r, "--baseline-context", r.add_argument(
        "--baseline-context-s", type=float, default=DEFAULT_BASELINE_CONTEXT_S,
        help="context length in seconds that WERR is measured from (nearest within 1%%; default 10.24)"))
    renamed(r, "--alpha", r.add_argument("--significance", type=float, default=0.05,
                                         help="significance level after Holm correction (default 0.05)"))
    r.add_argument("--level", type=float, default=0.95, help="confidence level of the bootstrap intervals")
    r.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES, help="bootstrap resamples")
    r.add_argument("--main-family", default=None,
                   help="family drawn in figures 1 and 2 (default: 'context' if present)")
    r.add_argument("--ignore-param", action="append", default=[], metavar="KEY",
                   help="a param that may differ between seeds of one configuration (repeatable)")
    r.add_argument("--lm-experiment", action="append", default=[], metavar="NAME",
                   help="an MLflow experiment whose LM runs' perplexities (lm_ppl/...) the report shows, besides "
                        "LM runs in the sweep's experiment and those its decoders name (repeatable; e.g. asr_core_lm)")
    r.add_argument("--heads-repr", default="A", choices=("A", "Q", "K", "V", "Y"),
                   help="the representation whose summed head similarity is drawn against context and correlated "
                        "with WER (default A, the attention probabilities)")
    r.add_argument("--cache", default=None, metavar="DIR",
                   help="where finished runs' tables are kept between reports, so a second report downloads only "
                        f"what changed (default: ${CACHE_ENV}, else ~/.cache/long-context-asr-study/report)")
    r.add_argument("--no-cache", action="store_true",
                   help=f"read every table from MLflow and keep none (as {CACHE_ENV}=off)")
    r.add_argument("--no-log", action="store_true",
                   help="write the folder only: do not log it to the sweep's parent run in MLflow, nor save the "
                        "view of the runs table with the WER columns")
    add_bench_parser(sub)
    c = sub.add_parser("compare", help="print one pairwise comparison (B against A) with p-values and intervals",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("sweep", metavar="SWEEP", help="the sweep (its MLflow experiment)")
    c.add_argument("a", help="the reference configuration (see the forms above)")
    c.add_argument("b", help="the configuration compared with A")
    ledger_options(c)
    c.add_argument("--dataset", default=None, help="one dataset (default: every dataset both have)")
    c.add_argument("--snr", type=float, default=None, help="the music SNR condition in dB (default: clean)")
    c.add_argument("--family", default=None, help="resolve context-length names within this family")
    renamed(c, "--alpha", c.add_argument("--significance", type=float, default=0.05,
                                         help="significance level of the verdict line (default 0.05)"))
    c.add_argument("--level", type=float, default=0.95, help="confidence level of the bootstrap intervals")
    c.add_argument("--bootstrap", type=int, default=BOOTSTRAP_RESAMPLES)
    c.add_argument("--ignore-param", action="append", default=[], metavar="KEY")
    return p


def ledger_options(p: argparse.ArgumentParser) -> None:
    """``--tracking-uri`` and ``--sweep-root``: where the sweep's ledger is, by the one rule."""
    p.add_argument("--tracking-uri", default=None, help=f"MLflow tracking URI (default: the URI the sweep's folder "
                   f"recorded, else ${ENV}, else sqlite:///SWEEP_ROOT/mlflow.db)")
    p.add_argument("--sweep-root", default=default_sweep_root(), help="the folder sweeps live in, for the sweep's "
                   f"recorded URI and the default ledger (default: ${SWEEP_ROOT_ENV}, else ./{DEFAULT_SWEEP_ROOT})")


def report_cache(args: argparse.Namespace) -> TableCache | None:
    """The cache ``report``'s options name: ``--no-cache`` none, ``--cache DIR``, else the default
    (:func:`analysis.ledger.cache.default_cache_dir`)."""
    from analysis.ledger.cache import TableCache

    if args.no_cache:
        return None
    root = Path(args.cache).expanduser() if args.cache else default_cache_dir()
    return None if root is None else TableCache(root)


def _report(args: argparse.Namespace) -> int:
    from analysis.ledger.collect import build_sweep, greedy_rows
    from analysis.ledger.fetch import fetch_records
    from analysis.memo import ReportMemo, Written, inputs_digest
    from analysis.document.report import build_report

    cache = report_cache(args)
    records = fetch_records(args.sweep, args.tracking_uri, lm_experiments=args.lm_experiment, cache=cache)
    say = logging.getLogger("analysis").info
    if cache is not None:
        say(cache.summary())
    options = {"experiment": args.sweep, "uri": tracking_uri(args.tracking_uri) or "",
               "ignore_params": sorted(args.ignore_param), "lm_experiments": sorted(args.lm_experiment),
               "baseline_context_s": args.baseline_context_s, "alpha": args.significance, "level": args.level,
               "bootstrap": args.bootstrap, "main_family": args.main_family, "heads_repr": args.heads_repr}
    memo = ReportMemo(cache.root, args.sweep, options["uri"]) if cache is not None else None
    digest = inputs_digest(records, options) if memo is not None else ""
    written = memo.restore(digest, Path(args.out)) if memo is not None else None
    if written is not None:
        say(f"report memo: nothing changed since the last report of {args.sweep!r}; its files copied from "
            f"{memo.dir}")
    else:
        sweep = build_sweep(args.sweep, records, ignore_params=args.ignore_param)
        rep = build_report(sweep, args.out, baseline_context=args.baseline_context_s, alpha=args.significance,
                           level=args.level, bootstrap_resamples=args.bootstrap, main_family=args.main_family,
                           progress=True, heads_representation=args.heads_repr)
        wer = greedy_rows(sweep.wer)
        written = Written.of(rep, wer.loc[wer["condition"] == CLEAN, "dataset"] if len(wer) else [])
        if memo is not None:
            memo.store(digest, written)
    print(f"report: {written.html}")
    print(f"        {written.markdown}, {len(written.figures)} figures, {len(written.csvs)} CSV tables")
    print(f"        {written.comparisons} comparisons with the baseline, {written.significant} significant after "
          "Holm correction")
    for s in written.skipped:
        print(f"        skipped {s.key}: {s.reason}")
    return 0 if args.no_log else _log_report(args, written)


def _log_report(args: argparse.Namespace, rep: Written) -> int:
    """The written report to the sweep in MLflow (:func:`analysis.dashboard.publish`), said on stdout; a sweep
    without a parent run is said on stderr and is no failure."""
    from mlflow.exceptions import MlflowException

    from analysis.dashboard import ARTIFACT_DIR, DashboardError, publish

    uri = args.tracking_uri
    files = [rep.html, rep.markdown, *(f.path for f in rep.figures), *rep.csvs.values()]
    try:
        pub = publish(args.sweep, files, rep.clean, uri)
    except (DashboardError, MlflowException, OSError) as e:  # e.g. a server gone away, no permission to write
        print(f"error: the report is in {rep.out_dir} but could not be logged to MLflow: {e}", file=sys.stderr)
        return EXIT_DATA
    served = uri.startswith(("http://", "https://"))
    base = f"http://{DASHBOARD_HOST}:{DASHBOARD_PORT}"  # where `asr-study dashboard` serves a local ledger

    def url(link: str) -> str:
        return pub.url(link, uri) if served else f"{base}/{link}"

    if pub.parent_run_id is None:
        saved = "; only the view of the runs table with the WER columns is saved" if pub.view_link else ""
        print(f"note: experiment {args.sweep!r} has no parent run (tag sweep.role=parent), so the report is "
              f"not logged to MLflow{saved}", file=sys.stderr)
    else:
        removed = f"; removed {', '.join(pub.removed)} (not in this report)" if pub.removed else ""
        print(f"mlflow: {len(pub.files)} files logged to {ARTIFACT_DIR}/ of the sweep's parent run "
              f"{pub.parent_run_id}{removed}")
        print(f"        the report: {url(pub.report_link)}")
    if pub.view_link:
        print(f"        every run with {', '.join(pub.metrics)}: {url(pub.view_link)}")
    if not served and (pub.view_link or pub.parent_run_id is not None):
        print(f"        (served by: {dashboard_command(args.sweep, args.sweep_root)}; --port P for another port)")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from analysis.significance import stats
    from analysis.ledger.collect import collect, greedy_rows
    from analysis.significance.werr import SelectionError, compare_configs, format_seconds, resolve_config

    sweep = collect(args.sweep, args.tracking_uri, ignore_params=args.ignore_param, progress=False)
    series = sweep.trials.drop_duplicates("config_id").set_index("config_id")["series_id"]
    try:
        # a context length given for one side means "the same series as the other side" where that is unique
        try:
            a = resolve_config(sweep, args.a, family=args.family)
            b = resolve_config(sweep, args.b, family=args.family, series_id=series[a])
        except SelectionError:
            b = resolve_config(sweep, args.b, family=args.family)
            a = resolve_config(sweep, args.a, family=args.family, series_id=series[b])
    except SelectionError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    cond = CLEAN if args.snr is None else condition_name(args.snr)
    rec = greedy_rows(sweep.recordings)
    have = {cid: set(rec.loc[(rec["config_id"] == cid) & (rec["condition"] == cond), "dataset"]) for cid in (a, b)}
    datasets = [args.dataset] if args.dataset else sorted(have[a] & have[b])
    if not datasets:
        print(f"error: {args.a} and {args.b} share no dataset with per-recording results under condition {cond}; "
              f"A has {sorted(have[a]) or 'none'}, B has {sorted(have[b]) or 'none'}", file=sys.stderr)
        return EXIT_DATA
    names = sweep.trials.drop_duplicates("config_id").set_index("config_id")
    print(f"A = {names.loc[a, 'config']} ({format_seconds(names.loc[a, 'context_s'])}), "
          f"B = {names.loc[b, 'config']} ({format_seconds(names.loc[b, 'context_s'])}); condition {cond}")
    failed = False
    for ds in datasets:
        try:
            res = compare_configs(sweep, a, b, ds, cond, bootstrap_resamples=args.bootstrap, level=args.level)
        except stats.PairingError as e:
            print(f"\n[{ds}] cannot compare: {e}", file=sys.stderr)
            failed = True
            continue
        print(f"\n[{ds}] seeds A {list(res.seeds_a)}, B {list(res.seeds_b)}")
        print(res.summary())
        verdict = "significant" if res.permutation.pvalue < args.significance else "not significant"
        print(f"-> B against A: {verdict} at significance level {args.significance:g} by the permutation test (a "
              "single comparison: no multiplicity correction; the report corrects across context lengths)")
    return EXIT_DATA if failed else 0


def main(argv: list[str] | None = None) -> int:
    from asr_core.contract.command import guarded  # a bug: one line naming its log, exit 1

    return guarded("analysis", _main, argv)


def _main(argv: list[str]) -> int:
    bound_mlflow_http(MLFLOW_BOUNDS)  # the user's own settings win
    logging.basicConfig(level=logging.INFO, format="[analysis] %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
    args.sweep = positional(args, "sweep")
    if args.sweep is None:
        print(f"python -m analysis {args.command}: error: the following arguments are required: SWEEP",
              file=sys.stderr)
        return EXIT_USAGE
    if not 0 < args.significance < 1 or not 0 < args.level < 1 or args.bootstrap < 100 \
            or getattr(args, "baseline_context_s", 1) <= 0:  # before the ledger is looked for
        print(f"error: --significance {args.significance:g} and --level {args.level:g} must lie in (0, 1), "
              f"--bootstrap {args.bootstrap} be at least 100"
              + (f" and --baseline-context-s {args.baseline_context_s:g} positive" if args.command == "report" else ""),
              file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out) if args.command == "report" else None
    if out is not None and out.exists() and not out.is_dir():  # before the ledger is looked for, nothing written
        print(f"error: --out {out} is a file; give a folder for the report (made if missing)", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "report" and args.cache and not args.no_cache:
        bad = bad_cache_dir(Path(args.cache).expanduser())
        if bad:
            print(f"error: --cache {args.cache}: {bad}; give a folder for the report cache (made if missing), or "
                  "--no-cache", file=sys.stderr)
            return EXIT_USAGE
    args.tracking_uri = tracking_uri(args.tracking_uri, sweep_root=args.sweep_root, sweep=args.sweep)
    bad = bad_uri(args.tracking_uri)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    missing = missing_ledger(args.tracking_uri)
    if missing:  # a ledger named (or looked for by the rule) that is not there: an input to correct
        print(f"error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _report(args) if args.command == "report" else _compare(args)
    except CollectError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DATA
    except ValueError as e:  # e.g. --main-family naming no family
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
