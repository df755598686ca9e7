"""The lookup-dictionary LM of paper 002 against a tied baseline, in miniature on this CPU (a benchmark script, not a
CI test):

    .venv/bin/python scripts/lookup_lm_experiment.py [--demo-sweep demo-out/demo/runs/demo] [--out lookup-out]

It takes one acoustic model of a finished demo sweep (the longest context at ``--seed``) and then, each step a
command a user would run (the shared steps as in ``scripts/lm_experiment.py``):

1. synthesises long in-domain dev recordings and a test split of about ``--test-recordings`` long recordings (so
   that the test holds enough tail words), the demo's voices and conditions;
2. generates LM text (``lm text``) and takes its tail set (``tailset``: its rarest words, 5% of its words);
3. trains, with one text, seed and step count (``lm train``), a tied baseline without memory and every reading of
   the memory (:data:`LMS`, or those ``--lms`` names): the paper's setting (§3.2: the sum hash of Eq. 2 at N = 2,
   U = the vocabulary size, as the paper's 5k buckets for 5k pieces, M = 64) in each reading the paper leaves open,
   ``combine`` replace | add x ``trainable`` false | true; and the sum hash at N = 4, U = 512, M = 32, a setting of
   ours (the one this script ran first), in the replace/frozen reading. All with tied embeddings and the memory's
   warmup at ``--warmup-share`` of the steps (the paper's 1000 steps, of a run whose length it does not give).
   ``--lms`` may add the ordered hashes (``ordered-n4-u4096``, ``ordered-n8-u4096``: deviations, for comparison);
4. per LM: overall and tail-token perplexity on the test transcripts (``lm ppl --tail``), alpha and beta on dev
   (``lm tune``), beam decoding of the test split with tail-word errors as an evaluation job of the demo sweep
   (``orchestrate evaluate SWEEP --spec decode-<LM>.yaml --where key=<the model>``: decoder ``lm-<LM>``, its
   table read back from the trial's MLflow run), and
   the share of the memory's buckets the test text reaches (:func:`asr_core.lm.memory.occupancy`);
5. compares every memory LM against the baseline (and names the one with the lowest tuned dev WER): T1 test
   tail-WER >= 5% relative lower with recording-level sign-flip p < 0.05; T2 test WER no worse than the baseline's
   + 2% relative; T3 tail-token perplexity >= 5% lower; T4 the bucket occupancy on the test text, the paper's
   setting's in particular (reported, no threshold).

The memory LMs hold more numbers than the baseline (the table gives both); any gain is confounded with that extra
capacity. Prints a table and writes ``OUT/results.json`` and ``OUT/results.md``. Each step is skipped when its
output exists (rerun after an interruption).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_experiment import ROOT, acoustic_models, errors_of, run  # noqa: E402

MINUTES = (1.5, 3.0)  # recording lengths, as lm_experiment's
PAPER = {"hash": "sum", "order": 2, "buckets": "V", "slots": 64}  # §3.2; "V": the tokenizer's vocabulary size
LMS = {  # name: lm.memory (None: the tied baseline); every reading on one text, seed and step count
    "baseline": None,
    "paper-replace-frozen": {**PAPER, "combine": "replace", "trainable": False},
    "paper-replace-trained": {**PAPER, "combine": "replace", "trainable": True},
    "paper-add-frozen": {**PAPER, "combine": "add", "trainable": False},
    "paper-add-trained": {**PAPER, "combine": "add", "trainable": True},
    "sum-n4-u512": {"hash": "sum", "order": 4, "buckets": 512, "slots": 32, "combine": "replace", "trainable": False},
}
EXTRA = {  # deviations run before, on request (--lms)
    "ordered-n4-u4096": {"hash": "ordered", "order": 4, "buckets": 4096, "slots": 32},
    "ordered-n8-u4096": {"hash": "ordered", "order": 8, "buckets": 4096, "slots": 32},
}
PAPER_LM = "paper-replace-frozen"  # T4: the paper's setting (its four readings share the hash and so the occupancy)
GRIDS = {"full": ("0.2,0.4,0.6,0.8", "0,1,2"), "small": ("0.3,0.6", "0,1")}


def hours_for(recordings: int) -> float:
    """Split hours that make about ``recordings`` recordings of the mean length."""
    return recordings * sum(MINUTES) / 2 / 60


def resolved(memory: dict | None, vocab: int) -> dict | None:
    """``memory`` with ``buckets: "V"`` made the vocabulary size ``vocab``."""
    return None if memory is None else {**memory, "buckets": vocab if memory["buckets"] == "V" else memory["buckets"]}


def lm_overrides(memory: dict | None, steps: int, warmup: int) -> list[str]:
    sets = [f"max_steps={steps}", "lm.tie_embeddings=true"]
    if memory is not None:
        sets += [f"lm.memory.{k}={str(v).lower() if isinstance(v, bool) else v}"
                 for k, v in {**memory, "warmup_steps": warmup}.items()]
    return sets


def reading(memory: dict | None) -> str:
    """The reading an LM's memory is run in, in words."""
    if memory is None:
        return ""
    return f"{memory.get('combine', 'replace')}, {'trained' if memory.get('trainable') else 'frozen'}"


def bucket_occupancy(lm: Path, spec: str) -> float:
    """Share of the LM memory's buckets that the positions of the transcripts ``spec`` reach."""
    import torch

    from asr_core.lm.checkpoint import load_lm
    from asr_core.lm.data import read_documents
    from asr_core.lm.memory import bucket_ids, occupancy

    ck = load_lm(lm)
    cfg = ck.config.lm.memory
    ids = [bucket_ids(torch.tensor([x], dtype=torch.long), ck.model.bos_id, cfg)[0]
           for x in (ck.tokenizer.encode(d.text) for d in read_documents(spec)) if x]
    return occupancy(torch.cat(ids), cfg.buckets)


def decoded_table(sweep: Path, am: Path, name: str, spec: dict, out: Path) -> Path:
    """The test split decoded with LM ``name`` as a user decodes a sweep's model: an evaluation spec (``spec``: lm,
    alpha, beta, beam_width, datasets, tail) named ``lm-<name>``, run by ``orchestrate evaluate`` on the one trial
    ``am`` of ``sweep`` (an evaluation job of the sweep, its result in the trial's MLflow run); returns the
    per-recording table read back from that run (``eval/test.lm-<name>.csv``), kept under ``out``."""
    import yaml
    from mlflow.tracking import MlflowClient

    from asr_core.contract.metrics import table_file
    from asr_core.contract.trial import TAG_KEY

    decoder, key = f"lm-{name}", am.parent.name
    local = out / f"eval-{name}" / table_file("test", decoder)
    if local.exists():
        return local
    spec_file = out / f"decode-{name}.yaml"
    spec_file.write_text(yaml.safe_dump({"name": decoder, **spec}, sort_keys=False))
    run(["orchestrate", "evaluate", sweep.name, "--spec", str(spec_file), "--where", f"key={key}",
         "--sweep-root", str(sweep.parent)], f"test decoding ({name}) through orchestrate evaluate")
    uri = json.loads((sweep / "sweep.json").read_text())["tracking_uri"]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(sweep.name)
    runs = client.search_runs([exp.experiment_id], f"tags.`{TAG_KEY}` = '{key}'")
    if len(runs) != 1:
        sys.exit(f"{sweep}: {len(runs)} MLflow runs of trial {key}; expected one")
    local.parent.mkdir(parents=True, exist_ok=True)
    got = Path(client.download_artifacts(runs[0].info.run_id, f"eval/{table_file('test', decoder)}",
                                         str(local.parent)))
    if got != local:
        got.replace(local)
    return local


def tail_wer(t: pd.DataFrame) -> float:
    return 100 * t.tail_errors.sum() / t.tail_words.sum() if t.tail_words.sum() else float("nan")


def rel(new: float, old: float) -> float:
    """Relative change of ``new`` against ``old`` in percent (negative: lower)."""
    return 100 * (new - old) / old + 0.0 if old else float("nan")  # + 0.0: no -0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo-sweep", type=Path, default=ROOT / "demo-out" / "demo" / "runs" / "demo")
    ap.add_argument("--out", type=Path, default=ROOT / "lookup-out")
    ap.add_argument("--seed", type=int, default=1, help="the acoustic model's training seed")
    ap.add_argument("--lm-seed", type=int, default=1, help="every LM's training seed")
    ap.add_argument("--test-recordings", type=int, default=30, help="about this many test recordings")
    ap.add_argument("--dev-recordings", type=int, default=8, help="about this many dev recordings")
    ap.add_argument("--lm-docs", type=int, default=800)
    ap.add_argument("--lm-steps", type=int, default=1500)
    ap.add_argument("--warmup-share", type=float, default=0.1,
                    help="the memory's warmup (no update) as a share of --lm-steps")
    ap.add_argument("--lm-context", type=int, default=256, help="LM context of the perplexities, in tokens")
    ap.add_argument("--tune-grid", choices=sorted(GRIDS), default="full", help="alpha x beta grid of lm tune")
    ap.add_argument("--beam-width", type=int, default=16)
    ap.add_argument("--tune-recordings", type=int, default=6)
    ap.add_argument("--lms", default=",".join(LMS), help=f"the LMs to run, comma-separated (baseline among them): "
                    f"of {', '.join([*LMS, *EXTRA])}")
    a = ap.parse_args(argv)
    known = {**LMS, **EXTRA}
    names = [x.strip() for x in a.lms.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or "baseline" not in names or len(names) < 2:
        ap.error(f"--lms {a.lms!r}: " + (f"unknown reading {bad[0]!r}; " if bad else "needs baseline and a memory LM; ")
                 + f"valid: {', '.join(known)}")
    out = a.out.resolve()
    models = acoustic_models(a.demo_sweep, a.seed)
    if not models:
        sys.exit(f"{a.demo_sweep}: no finished demo sweep at seed {a.seed} (run ./scripts/demo.sh)")
    am = models[max(models)]
    vocab = int(json.loads((am.parent / "config.json").read_text())["model"]["vocab_size"])
    print(f"acoustic model: {max(models):g} s context, {am}; vocabulary {vocab} pieces")
    corpus, test_corpus = out / "corpus", out / "corpus-test"
    synth = ["asr_core", "synth", "--hours", "0.01", "--seed", "7", "--voices", "3", "--shift", "near",
             "--min-minutes", f"{MINUTES[0]:g}", "--eval-max-minutes", f"{MINUTES[1]:g}", "--jobs", "2"]
    if not (corpus / "synth.json").exists():
        run([*synth, str(corpus), "--splits", "dev", "--eval-hours", f"{hours_for(a.dev_recordings):.4f}"],
            "long dev recordings")
    if not (test_corpus / "synth.json").exists():
        run([*synth, str(test_corpus), "--splits", "test", "--eval-hours", f"{hours_for(a.test_recordings):.4f}"],
            "long test recordings")
    dev, test = f"dev=podcast:{corpus}/dev", f"test=podcast:{test_corpus}/test"
    lm_dir = out / "lm"
    if not (lm_dir / "train.jsonl").exists():
        overlap = run(["asr_core", "lm", "text", str(lm_dir / "train.jsonl"), "--docs", str(a.lm_docs), "--seed",
                       "101", "--min-words", "300", "--max-words", "1200", "--against", test.split("=", 1)[1]],
                      "LM text")
        (lm_dir / "overlap.txt").write_text(overlap)
        run(["asr_core", "lm", "text", str(lm_dir / "dev.jsonl"), "--docs", "40", "--seed", "102"], "LM dev text")
    tail = lm_dir / "tail.json"
    if not tail.exists():
        from asr_core.lm.data import read_documents

        docs = read_documents(f"text:{lm_dir / 'train.jsonl'}")
        (lm_dir / "train.txt").write_text("".join(d.text + "\n" for d in docs))
        run(["asr_core", "tailset", str(lm_dir / "train.txt"), "--out", str(tail)], "tail set of the LM text")
    ts = json.loads(tail.read_text())
    print(f"tail set: {len(ts['words'])} word types, {ts['tail_share']:.2%} of the LM text's {ts['total_words']} words")

    from analysis.significance.stats import sign_flip_test
    from asr_core.lm.checkpoint import load_checkpoint
    from asr_core.lm.config import LMTrainConfig
    from asr_core.lm.model import lm_size

    warmup = max(1, round(a.warmup_share * a.lm_steps))
    alpha, beta = GRIDS[a.tune_grid]
    rows, tables = [], {}
    for name in names:
        memory = resolved(known[name], vocab)
        d = lm_dir / name
        lm = d / "checkpoint.pt"
        if not (d / "DONE").exists():
            sets = [x for s in lm_overrides(memory, a.lm_steps, warmup) for x in ("--set", s)]
            run(["asr_core", "lm", "train", "--text", f"text:{lm_dir / 'train.jsonl'}", "--dev-text",
                 f"text:{lm_dir / 'dev.jsonl'}", "--tokenizer", str(am), "--out", str(d), "--preset", "tiny",
                 "--set", f"seed={a.lm_seed}", *sets], f"LM training ({name})")
            (d / "DONE").write_text("trained\n")
        ppl_csv = d / "ppl" / "ppl.csv"
        if not ppl_csv.exists():
            run(["asr_core", "lm", "ppl", str(lm), "--data", test, "--lm-contexts", str(a.lm_context), "--tail",
                 str(tail)], f"perplexity and tail perplexity ({name})")
        ppl = pd.read_csv(ppl_csv).iloc[0]
        tune = out / f"tune-{name}.json"
        if not tune.exists():
            run(["asr_core", "lm", "tune", str(am), "--lm", str(lm), "--data", dev, "--lm-weights", alpha,
                 "--token-bonuses", beta, "--beam-width", str(a.beam_width), "--max-recordings",
                 str(a.tune_recordings), "--out", str(tune)], f"alpha and beta ({name})")
        best = json.loads(tune.read_text())["best"]
        t = errors_of(decoded_table(a.demo_sweep, am, name, {
            "lm": str(lm), "alpha": best["alpha"], "beta": best["beta"], "beam_width": a.beam_width,
            "datasets": [test], "tail": str(tail)}, out))
        tables[name] = t.loc[sorted(t.index)]
        cfg = LMTrainConfig.from_dict(load_checkpoint(lm)["config"], source=str(lm)).lm
        size = lm_size(cfg)
        rows.append({"lm": name, "hash": memory and memory["hash"], "order": memory and memory["order"],
                     "buckets": memory and memory["buckets"], "slots": memory and memory["slots"],
                     "reading": reading(memory),
                     "warmup_steps": memory and warmup, "parameters": size.parameters, "memory": size.memory,
                     "ppl": float(ppl.ppl), "tail_ppl": float(ppl.tail_ppl), "tail_tokens": int(ppl.tail_tokens),
                     "alpha": best["alpha"], "beta": best["beta"], "dev_wer": best["wer"],
                     "wer": 100 * t.errors.sum() / t.ref_words.sum(), "tail_wer": tail_wer(t),
                     "tail_words": int(t.tail_words.sum()), "recordings": len(t),
                     "test_occupancy": bucket_occupancy(lm, test.split("=", 1)[1]) if memory else None})
    by = {r["lm"]: r for r in rows}
    base = by["baseline"]
    b = tables["baseline"]
    chosen = min((r for r in rows if r["lm"] != "baseline"), key=lambda r: r["dev_wer"])
    paper = by.get(PAPER_LM) or next((r for r in rows if r["lm"].startswith("paper-")), None)
    per: dict[str, dict] = {}
    for r in rows:
        if r["lm"] == "baseline":
            continue
        m = tables[r["lm"]].loc[b.index]
        p = sign_flip_test((m.tail_errors - b.tail_errors).to_numpy(dtype=float)).pvalue
        t1 = 0.0 - rel(r["tail_wer"], base["tail_wer"])
        t2 = rel(r["wer"], base["wer"])
        t3 = 0.0 - rel(r["tail_ppl"], base["tail_ppl"])
        per[r["lm"]] = {
            "T1": {"met": bool(t1 >= 5 and p < 0.05), "tail_wer_reduction_pct": t1, "p_value": p,
                   "text": f"test tail-WER {base['tail_wer']:.2f}% -> {r['tail_wer']:.2f}% ({t1:.1f}% relative "
                           f"reduction, need >= 5%), sign-flip p = {p:.4f} over {len(b)} recordings (need < 0.05)"},
            "T2": {"met": bool(t2 <= 2), "wer_change_pct": t2,
                   "text": f"test WER {base['wer']:.2f}% -> {r['wer']:.2f}% ({t2:+.1f}% relative, need <= +2%)"},
            "T3": {"met": bool(t3 >= 5), "tail_ppl_reduction_pct": t3,
                   "text": f"tail-token perplexity {base['tail_ppl']:.3f} -> {r['tail_ppl']:.3f} ({t3:.1f}% "
                           "relative reduction, need >= 5%)"},
            "T4": {"occupancy": r["test_occupancy"],
                   "text": f"{r['hash']} hash, N = {r['order']}, U = {r['buckets']}: {r['test_occupancy']:.1%} of its "
                           "buckets reached on the test text (reported, no threshold)"},
        }
    criteria = per[chosen["lm"]]
    lines = [f"Tail set: {len(ts['words'])} word types, {ts['tail_share']:.2%} of the LM text's {ts['total_words']} "
             f"words, unseen words {ts.get('unseen', 'head')}. Acoustic vocabulary {vocab} pieces. LMs: tiny preset, "
             f"tied embeddings, {a.lm_steps} steps, seed {a.lm_seed}; memory warmup {warmup} steps "
             f"({a.warmup_share:g} of the steps). Perplexity at {a.lm_context} tokens of context; memory: numbers in "
             "the dictionary, on top of the parameters (confounds any gain).", "",
             "| LM | reading | hash, N, U, M | parameters | memory | ppl | tail ppl | alpha | beta | dev WER | WER | "
             "tail-WER | occupancy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        occ = "" if r["test_occupancy"] is None else f"{r['test_occupancy']:.1%}"
        setting = "" if r["hash"] is None else f"{r['hash']}, {r['order']}, {r['buckets']}, {r['slots']}"
        lines.append(f"| {r['lm']} | {r['reading']} | {setting} | {r['parameters']:,} | {r['memory']:,} | "
                     f"{r['ppl']:.3f} | {r['tail_ppl']:.3f} | {r['alpha']:g} | {r['beta']:g} | {r['dev_wer']:.2f}% | "
                     f"{r['wer']:.2f}% | {r['tail_wer']:.2f}% | {occ} |")
    lines += ["", f"Each memory LM against the baseline ({len(b)} test recordings, {base['tail_words']} tail words; "
              f"lowest tuned dev WER: {chosen['lm']}):", "",
              "| LM | T1 tail-WER | T2 WER | T3 tail ppl | T4 occupancy |", "| --- | --- | --- | --- | --- |"]
    for name, c in per.items():
        lines.append(f"| {name} | {'met' if c['T1']['met'] else 'not met'}: {c['T1']['tail_wer_reduction_pct']:+.1f}%"
                     f", p = {c['T1']['p_value']:.4f} | {'met' if c['T2']['met'] else 'not met'}: "
                     f"{c['T2']['wer_change_pct']:+.1f}% | {'met' if c['T3']['met'] else 'not met'}: "
                     f"{c['T3']['tail_ppl_reduction_pct']:+.1f}% | {c['T4']['occupancy']:.1%} |")
    lines += ["", "(T1, T3: reduction, positive is better; T2: change, negative is better.)", ""]
    for name, c in per.items():
        lines.append(f"{name}:")
        for k, x in c.items():
            lines.append(f"- {k}: " + ("" if "met" not in x else ("met" if x["met"] else "not met") + ": ") + x["text"])
    if paper is not None:
        lines.append(f"\nT4, the paper's setting: {per[paper['lm']]['T4']['text']}")
    md = "\n".join(lines)
    print(md)
    (out / "results.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps({"lms": rows, "chosen": chosen["lm"], "criteria": criteria,
                                                  "per_lm": per, "vocabulary": vocab, "lm_steps": a.lm_steps,
                                                  "warmup_steps": warmup, "test_recordings": len(b),
                                                  "tail_set": {k: ts[k] for k in ts if k != "words"} |
                                                  {"word_types": len(ts["words"])},
                                                  "overlap": (lm_dir / "overlap.txt").read_text().strip()},
                                                 indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
