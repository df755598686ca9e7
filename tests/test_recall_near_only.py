"""The recall control of a corpus whose recordings are too short for far slots (under 45 s: near slots only, as in
the quick demo's test set): no far-band test, and a verdict line that says whether near-band recall is above chance.

The sweep is small and hand-made: one family, contexts 5.12 and 10.24 s, two seeds, one dataset of six recordings.
Five have a key sentence, three masked near slots and one unmasked; one has no key sentence and two masked slots.
``recalled`` says which masked near slots each context recalls.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.features import recall as rc
from analysis.ledger.collect import build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report
from asr_core.contract.metrics import SLOT_COLUMNS

CONTEXTS = (5.12, 10.24)
SEEDS = (1, 2)
KEYED, NO_KEY = 5, 1
HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer"


def slot_table(recalled: int) -> str:
    """Every scoring's rows: of each keyed recording's three masked near slots the first ``recalled`` are right; the
    unmasked slot is right; the no-key slots are wrong."""
    lines = [",".join(SLOT_COLUMNS)]
    for scoring in ("average", "window"):
        for rec in range(KEYED + NO_KEY):
            slots = [("masked", 2.0)] * 3 + [("unmasked", 3.0)] if rec < KEYED else [("no-key", None)] * 2
            for k, (kind, d) in enumerate(slots):
                ok = int(kind == "unmasked" or (kind == "masked" and k < recalled))
                lines.append(f"rec{rec},clean,,rec{rec}/{k},zebra,near,{kind},{'' if d is None else d},"
                             f"{'zebra' if ok else 'walrus'},{ok},{scoring}")
    return "\n".join(lines) + "\n"


def records(recalled: dict[float, int]) -> list[RunRecord]:
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    for ctx in CONTEXTS:
        for seed in SEEDS:
            tags = {"sweep.role": "trial", "trial.label": f"ctx{ctx:g}s-s{seed}", "trial.seed": str(seed),
                    "trial.subgrids": "context", "mlflow.parentRunId": "parent"}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2"}
            rows = [f"test,clean,,rec{i},100,8,1,1,100,10" for i in range(KEYED + NO_KEY)]
            tables = {"test": "\n".join([HEAD, *rows]) + "\n", "test.slots": slot_table(recalled[ctx])}
            out.append(RunRecord(f"r{ctx:g}-{seed}", "FINISHED", tags, params, {"wer/test": 10.0}, tables))
    return out


def verdict_lines(recalled: dict[float, int]) -> list[str]:
    sweep = build_sweep("near", records(recalled))
    rates = rc.rate_table(sweep)
    assert "far" not in set(rates["group"])
    tests = rc.far_tests(sweep, rates)
    assert tests.empty  # no far slots: nothing to test
    return rc.verdicts(rates, tests, 0.05)


def test_no_recall_is_said_to_be_not_learned() -> None:
    lines = verdict_lines({5.12: 0, 10.24: 0})
    assert len(lines) == 2  # the moving-window scoring and the one-window-per-slot scoring
    clean = next(x for x in lines if ", test, " in x)
    window = next(x for x in lines if ", test (clean, one window per slot)" in x)
    for line in (clean, window):
        assert "5.12 s → 10.24 s: no far-band slots" in line
        assert "near band (2 s) 0.0% → 0.0% (chance 12.5%): **the control is not learned" in line
        assert "ceiling (unmasked) 100.0% → 100.0%; guess rate (no key) 0.0% → 0.0%." in line


@pytest.mark.parametrize("recalled, verdict, accs", [
    ({5.12: 3, 10.24: 3}, "**near-band recall is above chance at every context**", "100.0% → 100.0%"),
    ({5.12: 0, 10.24: 1}, "**near-band recall is above chance at some contexts only**", "0.0% → 33.3%"),
])
def test_recall_above_chance_is_said_to_be(recalled: dict[float, int], verdict: str, accs: str) -> None:
    lines = verdict_lines(recalled)
    assert len(lines) == 2 and all(verdict in x and f"near band (2 s) {accs} (chance" in x for x in lines), lines
    assert not any("not learned" in x for x in lines)


def test_the_report_carries_the_near_only_verdict(tmp_path: Path) -> None:
    rep = build_report(build_sweep("near", records({5.12: 0, 10.24: 0})), tmp_path, bootstrap_resamples=200)
    md = rep.markdown.read_text()
    part = md.split("## Recall control (positive control)")[1].split("\n## ")[0]
    assert part.count("**the control is not learned: near-band recall is at or below chance at every context**") == 2
    assert "| near band (2 s) " in part and "| far band (" not in part
    assert "0.0 ± 0.0 (n=15, 2 seeds)" in part
    assert "far-band accuracy against the series' shortest context" not in part  # no empty test table
    assert not (tmp_path / "recall_tests.csv").read_text().strip().count("\n")  # its header only
