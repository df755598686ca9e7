"""The lookup-dictionary LM of paper 002 against a tied baseline, in miniature on this CPU (a benchmark script, not a
CI test):

    .venv/bin/python scripts/lookup_lm_experiment.py [--demo-sweep demo-out/demo/runs/demo] [--out lookup-out]

It takes one acoustic model of a finished demo sweep (the longest context at ``--seed``) and then, each step a
command a user would run (the shared steps as in ``scripts/lm_experiment.py``):

1. synthesises long in-domain dev recordings and a test split of about ``--test-recordings`` long recordings (so
   that the test holds enough tail words), the demo's voices and conditions;
2. generates LM text (``lm text``) and takes its tail set (``tailset``: its rarest words, 5% of its words);
3. trains four LMs on that text with one seed and step count (``lm train``): a tied baseline without memory and
   three lookup memories (M = 32): the sum hash of Eq. 2 at N = 4, U = 512 (a setting of ours, not the paper's
   §3.2 N = 2, U about the vocabulary size, M = 64); the ordered hash N = 4, U = 4096; the
   ordered hash N = 8, U = 4096, all with tied embeddings and the memory's warmup at ``--warmup-share`` of the steps
   (the paper's 1000 steps, of a run whose length it does not give);
4. per LM: overall and tail-token perplexity on the test transcripts (``lm ppl --tail``), alpha and beta on dev
   (``lm tune``), beam decoding of the test split with tail-word errors (``evaluate --decoder beam --tail``), and
   the share of the memory's buckets the test text reaches (:func:`asr_core.lm.memory.occupancy`);
5. compares the memory LM with the lowest tuned dev WER against the baseline: T1 test tail-WER >= 5% relative lower
   with recording-level sign-flip p < 0.05; T2 test WER no worse than the baseline's + 2% relative; T3 tail-token
   perplexity >= 5% lower; T4 the sum hash's bucket occupancy on the test text (reported, no threshold).

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
SLOTS = 32
LMS = {  # name: lm.memory (None: the tied baseline)
    "baseline": None,
    "sum-n4-u512": {"hash": "sum", "order": 4, "buckets": 512},
    "ordered-n4-u4096": {"hash": "ordered", "order": 4, "buckets": 4096},
    "ordered-n8-u4096": {"hash": "ordered", "order": 8, "buckets": 4096},
}
SUM_LM = "sum-n4-u512"
GRIDS = {"full": ("0.2,0.4,0.6,0.8", "0,1,2"), "small": ("0.3,0.6", "0,1")}


def hours_for(recordings: int) -> float:
    """Split hours that make about ``recordings`` recordings of the mean length."""
    return recordings * sum(MINUTES) / 2 / 60


def lm_overrides(memory: dict | None, steps: int, warmup: int) -> list[str]:
    sets = [f"max_steps={steps}", "lm.tie_embeddings=true"]
    if memory is not None:
        sets += [f"lm.memory.{k}={v}" for k, v in {**memory, "slots": SLOTS, "warmup_steps": warmup}.items()]
    return sets


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
    a = ap.parse_args(argv)
    out = a.out.resolve()
    models = acoustic_models(a.demo_sweep, a.seed)
    if not models:
        sys.exit(f"{a.demo_sweep}: no finished demo sweep at seed {a.seed} (run ./scripts/demo.sh)")
    am = models[max(models)]
    print(f"acoustic model: {max(models):g} s context, {am}")
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

    from analysis.stats import sign_flip_test
    from asr_core.lm.checkpoint import load_checkpoint
    from asr_core.lm.config import LMTrainConfig
    from asr_core.lm.model import lm_size

    warmup = max(1, round(a.warmup_share * a.lm_steps))
    alpha, beta = GRIDS[a.tune_grid]
    rows, tables = [], {}
    for name, memory in LMS.items():
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
        ev = out / f"eval-{name}"
        if not (ev / "test.lm.csv").exists():
            run(["asr_core", "evaluate", str(am), "--data", test, "--clean-only", "--out", str(ev), "--no-log",
                 "--decoder", "beam", "--lm", str(lm), "--lm-weight", f"{best['alpha']:g}", "--token-bonus",
                 f"{best['beta']:g}", "--beam-width", str(a.beam_width), "--decoder-name", "lm", "--tail", str(tail)],
                f"test decoding ({name})")
        t = errors_of(ev / "test.lm.csv")
        tables[name] = t.loc[sorted(t.index)]
        cfg = LMTrainConfig.from_dict(load_checkpoint(lm)["config"], source=str(lm)).lm
        size = lm_size(cfg)
        rows.append({"lm": name, "hash": memory and memory["hash"], "order": memory and memory["order"],
                     "buckets": memory and memory["buckets"], "slots": memory and SLOTS,
                     "warmup_steps": memory and warmup, "parameters": size.parameters, "memory": size.memory,
                     "ppl": float(ppl.ppl), "tail_ppl": float(ppl.tail_ppl), "tail_tokens": int(ppl.tail_tokens),
                     "alpha": best["alpha"], "beta": best["beta"], "dev_wer": best["wer"],
                     "wer": 100 * t.errors.sum() / t.ref_words.sum(), "tail_wer": tail_wer(t),
                     "tail_words": int(t.tail_words.sum()), "recordings": len(t),
                     "test_occupancy": bucket_occupancy(lm, test.split("=", 1)[1]) if memory else None})
    by = {r["lm"]: r for r in rows}
    base = by["baseline"]
    chosen = min((r for r in rows if r["lm"] != "baseline"), key=lambda r: r["dev_wer"])
    b, m = tables["baseline"], tables[chosen["lm"]].loc[tables["baseline"].index]
    p = sign_flip_test((m.tail_errors - b.tail_errors).to_numpy(dtype=float)).pvalue
    t1 = 0.0 - rel(chosen["tail_wer"], base["tail_wer"])
    t2 = rel(chosen["wer"], base["wer"])
    t3 = 0.0 - rel(chosen["tail_ppl"], base["tail_ppl"])
    criteria = {
        "T1": {"met": bool(t1 >= 5 and p < 0.05), "tail_wer_reduction_pct": t1, "p_value": p,
               "text": f"test tail-WER {base['tail_wer']:.2f}% -> {chosen['tail_wer']:.2f}% ({t1:.1f}% relative "
                       f"reduction, need >= 5%), sign-flip p = {p:.4f} over {len(b)} recordings (need < 0.05)"},
        "T2": {"met": bool(t2 <= 2), "wer_change_pct": t2,
               "text": f"test WER {base['wer']:.2f}% -> {chosen['wer']:.2f}% ({t2:+.1f}% relative, need <= +2%)"},
        "T3": {"met": bool(t3 >= 5), "tail_ppl_reduction_pct": t3,
               "text": f"tail-token perplexity {base['tail_ppl']:.3f} -> {chosen['tail_ppl']:.3f} ({t3:.1f}% "
                       "relative reduction, need >= 5%)"},
        "T4": {"occupancy": by[SUM_LM]["test_occupancy"],
               "text": f"the sum hash (N = 4, U = 512) reaches {by[SUM_LM]['test_occupancy']:.1%} of its buckets on "
                       "the test text (reported, no threshold)"},
    }
    lines = [f"Tail set: {len(ts['words'])} word types, {ts['tail_share']:.2%} of the LM text's {ts['total_words']} "
             f"words. LMs: tiny preset, tied embeddings, {a.lm_steps} steps, seed {a.lm_seed}; memories M = {SLOTS}, "
             f"warmup {warmup} steps ({a.warmup_share:g} of the steps). Perplexity at {a.lm_context} tokens of "
             "context; memory: numbers in the dictionary, on top of the parameters (confounds any gain).", "",
             "| LM | parameters | memory | ppl | tail ppl | alpha | beta | dev WER | WER | tail-WER | occupancy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        occ = "" if r["test_occupancy"] is None else f"{r['test_occupancy']:.1%}"
        lines.append(f"| {r['lm']} | {r['parameters']:,} | {r['memory']:,} | {r['ppl']:.3f} | {r['tail_ppl']:.3f} | "
                     f"{r['alpha']:g} | {r['beta']:g} | {r['dev_wer']:.2f}% | {r['wer']:.2f}% | {r['tail_wer']:.2f}% "
                     f"| {occ} |")
    lines += ["", f"Chosen on dev: {chosen['lm']} (lowest tuned dev WER), against the baseline, {len(b)} test "
              f"recordings, {base['tail_words']} tail words:", ""]
    for k, c in criteria.items():
        lines.append(f"- {k}: " + ("" if "met" not in c else ("met" if c["met"] else "not met") + ": ") + c["text"])
    md = "\n".join(lines)
    print(md)
    (out / "results.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps({"lms": rows, "chosen": chosen["lm"], "criteria": criteria,
                                                  "tail_set": {k: ts[k] for k in ts if k != "words"} |
                                                  {"word_types": len(ts["words"])},
                                                  "overlap": (lm_dir / "overlap.txt").read_text().strip()},
                                                 indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
