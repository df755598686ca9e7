#!/usr/bin/env python
"""Is the planted cue learnable when it is concentrated? The demo's models trained on a strong plant, one table.

For each band (``short``: the learnability control, whose deciding word a 10 s window always holds, at the 2.8
cue words a minute a 2-6 s band reaches; ``mid``: 2-30 s, which a 5 s window almost never holds and an 80 s one
almost always does, at the 8.7 a minute it reaches: three times the short band's examples; ``long``: the range the
demo tests), this script

1. makes a corpus like the demo's (1 h of training audio in three voices, ``--shift near --seed 0``; an in-domain
   test set of 0.3 h of recordings of up to 2.5 minutes) with a concentrated cue (``synth --cue RATE,NEAR-FAR,gK``:
   only the first K homophone groups, every recording's topic owning one of their spellings), printing its
   window-containment report;
2. trains and evaluates the demo model (grids/demo.yaml's base config: the grid it writes ``extends`` that file)
   with one seed at two context lengths through ``python -m orchestrate submit --backend local``, clean audio only;
3. prints, per model: WER, WER on the other (not planted) words, the cue-word error rate (the ``cue/test`` metric:
   the pooled rate of the per-recording ``cue_words`` / ``cue_errors`` of ``eval/test.csv``), how each planted word
   was written (the right spelling, the group's other spelling, something else: from the aligned transcript of
   ``eval/test.hyp.jsonl``) and, among the planted words written as either spelling, the share spelt right; and the
   recording-level paired sign-flip test between the two contexts (:func:`analysis.significance.stats.sign_flip_test`) on the
   per-recording cue-word error rate (recordings with planted words) and on the other words' error counts.

The share spelt right has a context-free baseline: a model that ignores context and writes each sound's more
frequent training spelling. Under ``gK`` the topics are dealt evenly but do not own the same number of spellings
(with g2, cooking owns flour and steak, gardening flower, finance stake), so that baseline is not 50%; the table
prints it (``prior``) from the training split's planted words.

Everything lands under ``--out`` (default /tmp/cue-strong): ``<band>/corpus``, ``<band>/grid.yaml``,
``<band>/runs`` (sweep root and MLflow sqlite), ``<band>/table.csv``, and ``<band>/report`` with ``--report``
(``python -m analysis report``, whose "Planted cue" section Holm-corrects the same tests). Re-running reuses the
corpus and finished trials (synth resumes, submit skips finished trials) and prints the table again.

    python scripts/cue_strength_experiment.py --bands short            # the control first
    python scripts/cue_strength_experiment.py --bands mid --report     # more examples, the range 5 s windows miss
    python scripts/cue_strength_experiment.py --bands long --report
    python scripts/cue_strength_experiment.py --bands short,long --table-only
    python scripts/cue_strength_experiment.py --bands mid --steps 2100 --report   # three times the training
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import jiwer
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.significance.stats import sign_flip_test  # noqa: E402
from asr_core.data.corpora import load_corpus  # noqa: E402
from asr_core.data.synth.cues import CueConfig, planted, planted_groups  # noqa: E402
from asr_core.scoring.score import normalise_marked  # noqa: E402

DEMO_GRID = ROOT / "grids" / "demo.yaml"


@dataclass(frozen=True)
class Band:
    """One arm of the experiment: the cue spec of its corpus and the two context lengths (seconds) compared."""

    name: str
    cue: str
    contexts: tuple[float, float]


BANDS = {
    "short": Band("short", "10,2-6,g2", (10.24, 81.92)),
    "long": Band("long", "7,20-60,g2", (5.12, 81.92)),
    "mid": Band("mid", "10,2-30,g2", (5.12, 81.92)),  # a rate a 2-6 s band cannot reach (one cue word a zone)
}


def run(cmd: list[str], log: Path | None = None) -> None:
    """Run ``cmd`` from the repository root with one thread per process (as the demo does); stop on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    print("+ " + " ".join(cmd), flush=True)
    if log is None:
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        return
    with log.open("a") as fh:
        r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if r.returncode:
        raise SystemExit(f"{cmd[:4]} failed with exit code {r.returncode}; see {log}")


def make_corpus(band: Band, out: Path, seed: int, hours: float, test_hours: float, jobs: int) -> Path:
    corpus = out / "corpus"
    run([sys.executable, "-m", "asr_core", "synth", str(corpus), "--hours", str(hours), "--eval-hours",
         str(test_hours), "--eval-max-minutes", "2.5", "--voices", "3", "--shift", "near", "--splits", "train,test",
         "--seed", str(seed), "--cue", band.cue, "--cue-report", "--jobs", str(jobs)])
    return corpus


def write_grid(band: Band, out: Path, seed: int) -> Path:
    """A grid that takes grids/demo.yaml's base and changes only the seeds and the context axis."""
    grid = out / "grid.yaml"
    grid.write_text(
        f"# the demo model (base of {DEMO_GRID}) on the strong-cue corpus {band.cue}; written by "
        f"scripts/cue_strength_experiment.py\n"
        f"name: cue-{band.name}\n"
        f"extends: {DEMO_GRID}\n"
        f"seeds: [{seed}]\n"
        f"subgrids:\n"
        f"  context:\n"
        f"    section: \"context length, strong cue {band.cue}\"\n"
        f"    axes:\n"
        f"      data.context_s: [{', '.join(f'{c:g}' for c in band.contexts)}]\n")
    return grid


def train(band: Band, out: Path, grid: Path, corpus: Path, steps: int | None = None) -> Path:
    """Submit the band's grid; ``steps``: ``train.max_steps`` instead of the demo's (a trial key setting: other
    trials, in their own folder)."""
    root = out / "runs"
    more = ["--set", f"train.max_steps={steps}"] if steps else []
    run([sys.executable, "-m", "orchestrate", "submit", str(grid), "--backend", "local", "--sweep",
         f"cue-{band.name}", "--sweep-root", str(root), "--set", f"data.train=podcast:{corpus / 'train'}",
         "--set", f"eval.datasets=[test=podcast:{corpus / 'test'}]", "--set", "eval.snrs=[]", *more])
    return root


# ---- reading the trials back -----------------------------------------------------------------------------------

def planted_words(corpus: Path, split: str) -> dict[str, list[tuple[int, str]]]:
    """Per recording: (index into the normalised reference, spelling) of each planted word."""
    out: dict[str, list[tuple[int, str]]] = {}
    recs = load_corpus(f"podcast:{corpus / split}", audio=False)
    marked = planted(recs) or {}
    for rec in recs:
        idx = sorted(marked.get(rec.id, ()))
        _, marks = normalise_marked([w.text for w in rec.words], idx)
        out[rec.id] = [(m, rec.words[i].text) for m, i in zip(marks, idx)]
    return out


def written_forms(ref: list[str], hyp: list[str], marks: list[tuple[int, str]]) -> Counter:
    """(planted spelling, what ``hyp`` has in its place) for each planted word of ``ref`` (normalised words), under
    jiwer's alignment (the one the cue-word error rate counts); ``""`` for a deleted word."""
    aligned: dict[int, str] = {}
    if hyp:
        for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
            if chunk.type in ("equal", "substitute"):
                for k in range(chunk.ref_end_idx - chunk.ref_start_idx):
                    aligned[chunk.ref_start_idx + k] = hyp[chunk.hyp_start_idx + k]
    return Counter((word, aligned.get(i, "")) for i, word in marks)


def spelling_choices(forms: Counter, other: dict[str, str]) -> Counter:
    """:func:`written_forms` counted as ``right``, ``other`` (the group's other spelling) or ``else`` (another word,
    or deleted)."""
    out: Counter = Counter()
    for (word, got), n in forms.items():
        out["right" if got == word else "other" if got == other[word] else "else"] += n
    return out


def format_forms(forms: Counter) -> str:
    """``flour: flourer 3, flower 2, (deleted) 1; ...``: what each planted spelling was written as, most often
    first."""
    parts = []
    for word in sorted({w for w, _ in forms}):
        got = sorted(((n, g) for (w, g), n in forms.items() if w == word), key=lambda x: (-x[0], x[1]))
        parts.append(f"{word}: " + ", ".join(f"{g or '(deleted)'} {n}" for n, g in got))
    return "; ".join(parts)


def prior_share(corpus: Path, groups: tuple[dict[str, str], ...]) -> float:
    """Percentage of the test split's planted words that a context-free writer of each sound's more frequent
    training spelling gets right."""
    def counts(split: str) -> Counter:
        c: Counter = Counter()
        for line in (corpus / "recordings.jsonl").read_text().splitlines():
            m = json.loads(line)
            if m["split"] == split:
                c.update(x["word"] for x in m.get("cues", ()))
        return c

    train, test = counts("train"), counts("test")
    majority = {w: max(g, key=lambda s: train[s]) for g in groups for w in g}
    n = sum(test.values())
    return 100.0 * sum(k for w, k in test.items() if majority[w] == w) / n if n else float("nan")


def trial_rows(band: Band, root: Path, corpus: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One summary row per finished trial, and the per-recording clean rows of every trial (with ``context_s``)."""
    groups = planted_groups(CueConfig.parse(band.cue))
    other = {a: b for g in groups for a, b in zip(g, reversed(list(g)))}
    marks = planted_words(corpus, "test")
    prior = prior_share(corpus, groups)
    summary, per_rec = [], []
    for trial in sorted((root / f"cue-{band.name}" / "trials").glob("*")):
        csv = trial / "eval" / "test.csv"
        if not csv.is_file():
            continue
        cfg = json.loads((trial / "config.json").read_text())
        df = pd.read_csv(csv)
        df = df[df.condition == "clean"].assign(context_s=float(cfg["data"]["context_s"]),
                                                seed=int(cfg["train"]["seed"]))
        df["errors"] = df.substitutions + df.deletions + df.insertions
        forms: Counter = Counter()
        for line in (trial / "eval" / "test.hyp.jsonl").read_text().splitlines():
            h = json.loads(line)
            if h["condition"] == "clean":
                forms += written_forms(h["ref"].split(), h["hyp"].split(), marks[h["recording"]])
        choice = spelling_choices(forms, other)
        cw, ce = df.cue_words.sum(), df.cue_errors.sum()
        written = choice["right"] + choice["other"]
        summary.append({
            "band": band.name, "cue": band.cue, "context_s": df.context_s.iloc[0], "seed": df.seed.iloc[0],
            "trial": trial.name, "recordings": len(df), "wer": 100 * df.errors.sum() / df.ref_words.sum(),
            "other_wer": 100 * (df.errors.sum() - ce) / (df.ref_words.sum() - cw),
            "cue_words": int(cw), "cue_rate": 100 * ce / cw if cw else float("nan"),
            "right": choice["right"], "other_spelling": choice["other"], "something_else": choice["else"],
            "right_of_written": 100 * choice["right"] / written if written else float("nan"), "prior": prior,
            "written": format_forms(forms)})
        per_rec.append(df)
    return pd.DataFrame(summary), (pd.concat(per_rec) if per_rec else pd.DataFrame())


def paired_tests(rec: pd.DataFrame, contexts: tuple[float, float]) -> dict[str, float]:
    """Sign-flip p of the longer context against the shorter: on the per-recording cue-word error rate (recordings
    with planted words) and on the per-recording error counts of the other words."""
    a, b = (rec[rec.context_s == c].groupby("recording")[["errors", "cue_errors", "cue_words"]].mean()
            for c in contexts)
    both = a.merge(b, left_index=True, right_index=True, suffixes=("_a", "_b"), how="inner")
    cued = both[both.cue_words_a > 0]
    rate = (cued.cue_errors_b - cued.cue_errors_a) / cued.cue_words_a
    other = (both.errors_b - both.cue_errors_b) - (both.errors_a - both.cue_errors_a)
    return {"recordings": len(both), "cue_recordings": len(cued),
            "p_cue": sign_flip_test(rate.to_numpy()).pvalue, "p_other": sign_flip_test(other.to_numpy()).pvalue}


def table(band: Band, out: Path, corpus: Path) -> str:
    summary, rec = trial_rows(band, out / "runs", corpus)
    if summary.empty:
        return f"{band.name} ({band.cue}): no finished trial under {out / 'runs'}"
    summary.to_csv(out / "table.csv", index=False)
    lines = [f"band {band.name}: --cue {band.cue}, test set {summary.recordings.iloc[0]} recordings, "
             f"{summary.cue_words.iloc[0]} planted words; prior (context-free majority spelling) "
             f"{summary.prior.iloc[0]:.1f}% right",
             f"{'context':>8s} {'seed':>4s} {'WER':>6s} {'other':>6s} {'cue':>6s} {'right':>5s} {'other sp.':>9s} "
             f"{'else':>5s} {'right of written':>16s}"]
    for r in summary.sort_values("context_s").itertuples():
        lines.append(f"{r.context_s:7.2f}s {r.seed:4d} {r.wer:5.1f}% {r.other_wer:5.1f}% {r.cue_rate:5.1f}% "
                     f"{r.right:5d} {r.other_spelling:9d} {r.something_else:5d} "
                     f"{r.right_of_written:15.1f}%")
    lines.append("what each planted spelling was written as:")
    for r in summary.sort_values("context_s").itertuples():
        lines.append(f"{r.context_s:7.2f}s {r.written}")
    if set(band.contexts) <= set(summary.context_s):
        t = paired_tests(rec, band.contexts)
        lines.append(f"{band.contexts[1]:g} s against {band.contexts[0]:g} s, recording-level sign-flip test: "
                     f"cue-word error rate p = {t['p_cue']:.3f} ({t['cue_recordings']} recordings with planted "
                     f"words), other words p = {t['p_other']:.3f} ({t['recordings']} recordings)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Bands: " + "; ".join(f"{b.name}: --cue {b.cue}, contexts "
                                                              f"{b.contexts[0]:g} and {b.contexts[1]:g} s"
                                                              for b in BANDS.values()))
    ap.add_argument("--bands", default="short", help=f"comma-separated, of {', '.join(BANDS)} (default short)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/cue-strong"))
    ap.add_argument("--seed", type=int, default=2, help="training seed (default 2)")
    ap.add_argument("--corpus-seed", type=int, default=0)
    ap.add_argument("--hours", type=float, default=1.0, help="training audio (default 1, as the demo)")
    ap.add_argument("--test-hours", type=float, default=0.3)
    ap.add_argument("--jobs", type=int, default=2, help="synth processes")
    ap.add_argument("--steps", type=int, default=0,
                    help="train.max_steps instead of the demo's 700 (its trials and report in BAND-stepsN/, the band's "
                         "corpus reused)")
    ap.add_argument("--table-only", action="store_true", help="only print the table of what is finished")
    ap.add_argument("--report", action="store_true", help="also write python -m analysis report per band")
    a = ap.parse_args(argv)
    if a.steps < 0:
        ap.error(f"--steps: {a.steps}; give a positive number of steps (0: the demo's)")
    names = [b for b in a.bands.split(",") if b]
    bad = [b for b in names if b not in BANDS]
    if bad or not names:
        ap.error(f"--bands: unknown band {bad[0] if bad else '(none)'}; valid: {', '.join(BANDS)}")
    tables = []
    for name in names:
        band = BANDS[name]
        out = a.out / (f"{name}-steps{a.steps}" if a.steps else name)
        corpus = a.out / name / "corpus"
        out.mkdir(parents=True, exist_ok=True)
        if not a.table_only:
            make_corpus(band, a.out / name, a.corpus_seed, a.hours, a.test_hours, a.jobs)
            train(band, out, write_grid(band, out, a.seed), corpus, a.steps or None)
        if a.report:
            uri = f"sqlite:///{(out / 'runs').resolve()}/mlflow.db"
            run([sys.executable, "-m", "analysis", "report", "--experiment", f"cue-{band.name}", "--tracking-uri",
                 uri, "--out", str(out / "report")])
        tables.append(table(band, out, corpus))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
