"""Error types (analysis.features.errors): substitution, deletion and insertion rates per decoder, corpus level per seed then
mean and sd over seeds, S + D + I = WER; the "Error types" section, and the report of a greedy-only sweep.

The hand-made sweep: contexts 5.12 and 81.92 s, seeds 1 and 2, 4 recordings of 100 words on ``talks``; seed 2 has
no row for rec3 (so pooling the seeds' recordings would weigh it differently from the mean of the seeds' rates),
and the 81.92 s model is also decoded by a beam decoder and at a 5.12 s window.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.features import errors as er
from analysis.ledger.collect import Sweep, build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.document.report import build_report
from asr_core.contract.metrics import CLEAN, GREEDY

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402

HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer"
WORDS = 100
# (context, decoder) -> per recording (S, D, I) of seed 1; seed 2 has one more deletion on every recording
COUNTS = {(5.12, GREEDY): [(3, 6, 1), (2, 8, 0), (4, 5, 2), (3, 7, 1)],
          (81.92, GREEDY): [(3, 3, 1), (2, 4, 0), (4, 2, 1), (3, 3, 1)],
          (81.92, "beam"): [(2, 3, 1), (1, 4, 0), (3, 2, 1), (2, 3, 1)],
          (81.92, "window-5.12s"): [(3, 5, 1), (2, 7, 0), (4, 4, 2), (3, 6, 1)]}


def counts(ctx: float, decoder: str, seed: int) -> np.ndarray:
    c = np.array(COUNTS[(ctx, decoder)], dtype=float)
    c[:, 1] += seed - 1
    return c[:3] if seed == 2 else c  # seed 2 lacks rec3


def records() -> list[RunRecord]:
    out = []
    for ctx in (5.12, 81.92):
        for seed in (1, 2):
            tags = {"sweep.role": "trial", "trial.label": f"ctx{ctx:g}-s{seed}", "trial.seed": str(seed),
                    "trial.subgrids": "context"}
            metrics, tables = {}, {}
            for (c, dec) in COUNTS:
                if c != ctx:
                    continue
                x = counts(ctx, dec, seed)
                rows = [f"talks,clean,,rec{i},{WORDS},{s:g},{d:g},{n:g},{WORDS},{s + d + n:g}" for i, (s, d, n)
                        in enumerate(x)]
                tables["talks" if dec == GREEDY else f"talks.{dec}"] = HEAD + "\n" + "\n".join(rows) + "\n"
                metrics["wer/talks" if dec == GREEDY else f"wer_{dec}/talks"] = 100.0 * x.sum() / (len(x) * WORDS)
                if dec != GREEDY:
                    tags[f"eval.decoder.{dec}"] = json.dumps({"name": dec})
            out.append(RunRecord(f"r{ctx:g}-{seed}", "FINISHED", tags,
                                 {"data.context_s": str(ctx), "train.seed": str(seed)}, metrics, tables))
    return out


@pytest.fixture(scope="module")
def sweep() -> Sweep:
    return build_sweep("errors", records())


def _row(table: pd.DataFrame, ctx: float, decoder: str) -> pd.Series:
    hit = table[np.isclose(table["context_s"], ctx) & (table["decoder"] == decoder)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_rates_per_seed_sum_to_the_wer(sweep: Sweep) -> None:
    per_seed = er.seed_rates(sweep)
    assert list(per_seed.columns) == er.SEED_COLUMNS
    assert np.allclose(per_seed["sub"] + per_seed["del"] + per_seed["ins"], per_seed["wer"])
    s2 = per_seed[np.isclose(per_seed["context_s"], 5.12) & (per_seed["seed"] == 2)].iloc[0]
    assert s2["n_recordings"] == 3 and s2["ref_words"] == 300
    assert s2["del"] == pytest.approx(100.0 * (7 + 9 + 6) / 300)
    # each seed's rate is its own corpus-level rate; the tables' WER agrees with the metric
    wer = sweep.wer[sweep.wer["decoder"] == GREEDY].set_index(["run_id"])["wer_table"]
    assert s2["wer"] == pytest.approx(wer["r5.12-2"])


def test_mean_over_seeds_not_pooled(sweep: Sweep) -> None:
    table = er.error_table(sweep)
    assert list(table.columns) == er.RATE_COLUMNS and er.check_sums(table)
    r = _row(table, 5.12, GREEDY)
    d1, d2 = 100.0 * 26 / 400, 100.0 * 22 / 300  # seed 1: 4 recordings; seed 2: 3, one more deletion each
    assert r["del_mean"] == pytest.approx((d1 + d2) / 2)
    assert r["del_mean"] != pytest.approx(100.0 * (26 + 22) / 700)  # not the seeds' recordings pooled
    assert r["del_sd"] == pytest.approx(np.std([d1, d2], ddof=1))
    assert r["wer_mean"] == pytest.approx(r["sub_mean"] + r["del_mean"] + r["ins_mean"])
    assert (r["n_seeds"], r["seeds"], r["n_recordings"]) == (2, "1,2", 3)
    assert r["cut"] == "fixed" and np.isnan(r["attention_span_s"])


def test_every_decoder_has_rows(sweep: Sweep) -> None:
    table = er.error_table(sweep)
    assert set(table["decoder"]) == {GREEDY, "beam", "window-5.12s"}
    assert list(table["decoder"])[:2] == [GREEDY, GREEDY]  # greedy first
    beam = _row(table, 81.92, "beam")
    assert beam["sub_mean"] == pytest.approx(np.mean([100.0 * 8 / 400, 100.0 * 6 / 300]))


def test_section_shows_greedy_clean_and_the_change(sweep: Sweep) -> None:
    section, table = er.section(sweep)
    assert section.title == er.TITLE and len(table) == 4
    (title, shown), = section.tables
    assert list(shown["context"]) == ["5.12 s", "81.92 s"] and set(shown.columns) >= {"WER", "S", "D", "I"}
    (_, lines), = section.bullets
    assert len(lines) == 1 and "deletions change most" in lines[0]


def test_sweep_without_tables_gets_a_sentence() -> None:
    bare = [RunRecord(r.run_id, r.status, r.tags, r.params, r.metrics, {}) for r in records()]
    section, table = er.section(build_sweep("bare", bare))
    assert table.empty and list(table.columns) == er.RATE_COLUMNS
    assert "cannot be split" in section.paragraphs[0] and not section.tables


def test_greedy_only_report_has_the_greedy_table(tmp_path: Path) -> None:
    rep = build_report(build_sweep(synth.EXPERIMENT, synth.make_records()), tmp_path, bootstrap_resamples=200)
    titles = [ln[3:] for ln in rep.markdown.read_text().splitlines() if ln.startswith("## ")]
    assert titles[titles.index("WER and WERR") + 1] == er.TITLE and "Context or fragmentation" not in titles
    errors = pd.read_csv(rep.csvs["errors"])
    assert rep.csvs["errors"] == tmp_path / "errors.csv" and set(errors["decoder"]) == {GREEDY}
    assert np.allclose(errors["sub_mean"] + errors["del_mean"] + errors["ins_mean"], errors["wer_mean"])
    assert set(errors["condition"]) > {CLEAN}  # every condition in the CSV


def test_kinds_moving_apart_are_said_so_not_given_a_share_over_100() -> None:
    """A small net change whose kinds move in opposite directions (the demo's shifted set: S +9, D -10) names the
    kind that moved most without a share of -822%."""
    rows = [{"decoder": GREEDY, "condition": "clean", "config_id": f"c{i}", "dataset": "shifted", "series": "all",
             "context_s": ctx, "wer_mean": w, "sub_mean": s, "del_mean": d, "ins_mean": ins}
            for i, (ctx, w, s, d, ins) in enumerate([(5.12, 81.13, 40.0, 35.0, 6.13),
                                                      (81.92, 82.35, 49.09, 25.03, 8.23)])]
    (line,) = er.change_lines(pd.DataFrame(rows))
    assert "deletions change most, and the kinds move in opposite directions" in line and "%" in line
    assert "of the change" not in line
