"""The "Context or fragmentation" section (analysis.features.fragmentation): the verdict's rules on their own, the controls
found by their fields, the summary and test tables, and the section in a report.

The sweep is small and hand-made: dense models at 5.12 and 81.92 s, two banded 81.92 s models (0.96 s and 2.56 s a
layer: total receptive fields 5.3 s and 11.7 s with 2 layers), a pause-cut 5.12 s model, and the dense 81.92 s model
decoded at 5.12, 10.24 and 20.48 s windows; 3 seeds, 12 recordings of 100 words. Errors per recording are set per
world (seed s adds s − 1 errors on rec0 everywhere), split as 3 substitutions, 1 insertion, the rest deletions.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.features import fragmentation as fr
from analysis.ledger.collect import Sweep, build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.features.fragmentation import Evidence, decide
from analysis.document.report import build_report
from asr_core.config import resolve
from asr_core.contract.trial import TAG_RECEPTIVE_FIELD
from asr_core.model.receptive import receptive_field

SEEDS = (1, 2, 3)
N_REC, WORDS = 12, 100
RESAMPLES = 200
HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer"
MODELS = {  # name -> params beyond seed and layers
    "dense5": {"data.context_s": "5.12"}, "dense82": {"data.context_s": "81.92"},
    "band1": {"data.context_s": "81.92", "model.attention_span_s": "0.96"},
    "band2": {"data.context_s": "81.92", "model.attention_span_s": "2.56"},
    "pauses": {"data.context_s": "5.12", "data.cut": "pauses"}}
WINDOWS = (5.12, 10.24, 20.48)
ALT = np.array([1.0, -1.0] * (N_REC // 2))  # moves recordings both ways: no change in total, p = 1
# world -> model (or "window-<W>s") -> errors per recording of seed 1
WORLDS = {
    "fragmentation": {"dense5": 12, "dense82": 8, "band1": 8 + (np.arange(N_REC) % 4 == 0), "band2": 8,
                      "pauses": 9, "window-5.12s": 11, "window-10.24s": 10, "window-20.48s": 9},
    "context": {"dense5": 12, "dense82": 8, "band1": 11, "band2": 10, "pauses": 12 + ALT,
                "window-5.12s": 9, "window-10.24s": 8 + (np.arange(N_REC) % 3 == 0), "window-20.48s": 8},
    "nogain": {"dense5": 12, "dense82": 12 + ALT, "band1": 12, "pauses": 11},
}


def field_tag(params: dict[str, str]) -> dict[str, str]:
    """The tag training gives a run of ``params`` (``model.receptive_field_s``: seconds each side, or "window")."""
    overrides = [f"{k}={v}" for k, v in params.items() if k.startswith("model.")]
    field = receptive_field(resolve({}, overrides))
    return {TAG_RECEPTIVE_FIELD: f"{field.seconds:.3f}" if field.banded else "window"}


def errors(world: str, name: str, seed: int) -> np.ndarray:
    e = np.full(N_REC, 0.0) + np.asarray(WORLDS[world][name], dtype=float)
    e[0] += seed - 1
    return e


def table(ds: str, e: np.ndarray) -> str:
    rows = [f"{ds},clean,,rec{i},{WORDS},3,{x - 4:g},1,{WORDS},{x:g}" for i, x in enumerate(e)]
    return HEAD + "\n" + "\n".join(rows) + "\n"


def records(world: str, controls: bool = True) -> list[RunRecord]:
    """The trial runs of ``world``; without ``controls`` the dense models only, greedy only."""
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    for name, params in MODELS.items():
        if name not in WORLDS[world] or (not controls and not name.startswith("dense")):
            continue
        for seed in SEEDS:
            tags = {"sweep.role": "trial", "trial.label": f"{name}-s{seed}", "trial.seed": str(seed),
                    "trial.subgrids": "dense" if name.startswith("dense") else "control",
                    **field_tag({"model.layers": "2", **params})}
            e = errors(world, name, seed)
            metrics, tables = {"wer/talks": 100.0 * e.sum() / (N_REC * WORDS)}, {"talks": table("talks", e)}
            for w in WINDOWS if name == "dense82" and controls else ():
                dec = f"window-{w:g}s"
                if dec in WORLDS[world]:
                    e = errors(world, dec, seed)
                    metrics[f"wer_{dec}/talks"] = 100.0 * e.sum() / (N_REC * WORDS)
                    tables[f"talks.{dec}"] = table("talks", e)
                    tags[f"eval.decoder.{dec}"] = json.dumps({"window_s": w})
            out.append(RunRecord(f"{name}-{seed}", "FINISHED", tags,
                                 {"train.seed": str(seed), "model.layers": "2", **params}, metrics, tables))
    return out


@pytest.fixture(scope="module")
def frag() -> Sweep:
    return build_sweep("frag", records("fragmentation"))


# ---- the rules on their own --------------------------------------------------------------------------------------

def ev(**kw: object) -> Evidence:
    """Evidence with G = 4 points (12% → 8%) that holds, a banded model at 5.3 s, the pause test not holding."""
    base = dict(wer_short=12.0, wer_long=8.0, gain_holds=True, wer_banded=10.0, banded_field_s=5.3, wer_pauses=11.0,
                pauses_holds=False, wer_edges=10.0, short_s=5.12, long_s=81.92)
    return Evidence(**{**base, **kw})


def test_no_gain_when_not_positive_or_not_significant() -> None:
    assert decide(ev(wer_long=12.0)).kind == fr.NO_GAIN
    assert decide(ev(wer_long=13.0)).kind == fr.NO_GAIN
    v = decide(ev(gain_holds=False))
    assert v.kind == fr.NO_GAIN and "not significant" in v.sentence


# G = 3 points (12% → 9%) where a share sits on a bound: 1/3, 1/2 and 2/3 of 3 are exact in floating point
@pytest.mark.parametrize("long, banded, pauses, holds, kind", [
    (8.0, 11.0, 12.0, False, fr.CONTEXT_USED),  # share_banded 0.75, share_pauses 0
    (9.0, 11.0, 11.0, False, fr.CONTEXT_USED),  # share_banded 2/3, share_pauses 1/3: on both bounds
    (9.0, 11.0, 13.0, False, fr.CONTEXT_USED),  # share_pauses -1/3: the bound holds either way
    (9.0, 11.0, 10.5, False, fr.MIXED),  # share_pauses 1/2 > 1/3
    (8.0, 11.0, 12.0, True, fr.MIXED),  # pause cuts significantly different: not "context used"
    (8.0, 8.5, 9.0, False, fr.FRAGMENTATION),  # share_banded 0.125, share_pauses 0.75
    (9.0, 10.0, 10.5, True, fr.FRAGMENTATION),  # share_banded 1/3, share_pauses 1/2: on both bounds
    (9.0, 10.0, 10.6, False, fr.MIXED),  # share_pauses just under 1/2
    (9.0, 10.1, 9.0, False, fr.MIXED),  # share_banded just over 1/3
    (8.0, 10.0, 11.0, False, fr.MIXED),
])
def test_rule_branches_and_boundaries(long: float, banded: float, pauses: float, holds: bool, kind: str) -> None:
    v = decide(ev(wer_long=long, wer_banded=banded, wer_pauses=pauses, pauses_holds=holds))
    assert v.kind == kind, v.sentence
    assert v.sentence.startswith(f"Verdict: {kind}.")
    assert v.gain == pytest.approx(12.0 - long) and v.share_banded == pytest.approx((banded - long) / (12.0 - long))


def test_mixed_states_every_share_in_percent() -> None:
    v = decide(ev())
    assert v.kind == fr.MIXED
    assert v.sentence == ("Verdict: mixed. Of the 5.12 → 81.92 s gain of 4.00 points (WER 12.00% → 8.00%), banding "
                          "attention to a 5.3 s field (the window kept) loses 50%, cutting at pauses recovers 25%, "
                          "decoding at 5.12 s windows loses 50%.")


def test_a_missing_control_says_which_and_what_can_be_said() -> None:
    v = decide(ev(wer_banded=None, banded_field_s=None))  # neither rule can be decided without the banded model
    assert v.kind == fr.UNDECIDED and "a banded model" in v.sentence and "cutting at pauses recovers 25%" in v.sentence
    v = decide(ev(wer_banded=9.0, wer_pauses=None, pauses_holds=None))  # banding's share 0.25 rules out "context"
    assert v.kind == fr.UNDECIDED and "pause-cut model at 5.12 s" in v.sentence
    v = decide(ev(wer_pauses=None, pauses_holds=None))  # banding's share 0.5 rules out both: mixed whatever pauses
    assert v.kind == fr.MIXED and "Not measured: a pause-cut model at 5.12 s." in v.sentence
    v = decide(ev(wer_edges=None, wer_banded=8.5, wer_pauses=9.0))
    assert v.kind == fr.FRAGMENTATION and "Not measured: decoding at 5.12 s windows." in v.sentence
    v = decide(ev(wer_banded=11.0, wer_pauses=12.0, pauses_holds=None))  # the pause test is needed and missing
    assert v.kind == fr.UNDECIDED and "the pause-cut test" in v.sentence
    v = decide(ev(wer_long=None))
    assert v.kind == fr.UNDECIDED and "no dense model at 81.92 s" in v.sentence
    assert decide(ev(gain_holds=None)).kind == fr.UNDECIDED


# ---- the models and tables -----------------------------------------------------------------------------------

def test_controls_are_found_by_their_fields(frag: Sweep) -> None:
    roles = {m.config: m.role for m in fr.models(frag)}
    assert roles == {"dense5": "dense", "dense82": "dense", "band1": "banded", "band2": "banded", "pauses": "pauses"}
    fields = {m.config: m.field_s for m in fr.models(frag)}
    # the runs' tags, rounded to milliseconds as training writes them
    assert fields["band1"] == pytest.approx(2.6425, abs=1e-3) and fields["band2"] == pytest.approx(5.8425, abs=1e-3)
    assert np.isnan(fields["dense82"])
    assert fr.window_decoders(frag) == ["window-5.12s", "window-10.24s", "window-20.48s"]
    (g,) = fr.groups(frag)
    assert (g.short_s, g.longs, g.short.config, g.at(81.92).config) == (5.12, [81.92], "dense5", "dense82")
    assert fr.has_controls(frag) and not fr.has_controls(build_sweep("plain", records("fragmentation", False)))


def test_summary_rows_and_error_types(frag: Sweep) -> None:
    s = fr.summary_table(frag)
    assert list(s.columns) == fr.SUMMARY_COLUMNS
    assert list(s["model"]) == ["dense 5.12 s", "dense 81.92 s", "banded 81.92 s (field ±2.64 s)",
                                "banded 81.92 s (field ±5.84 s)", "pause cuts 5.12 s",
                                "dense 81.92 s at 5.12 s windows", "dense 81.92 s at 10.24 s windows",
                                "dense 81.92 s at 20.48 s windows"]
    row = s[s["model"] == "pause cuts 5.12 s"].iloc[0]
    # seeds add 0, 1, 2 errors on rec0: mean 9 + 1/12 errors per recording of 100 words
    assert row["wer_mean"] == pytest.approx(9 + 1 / 12) and row["n_seeds"] == 3
    assert row["sub_mean"] == pytest.approx(3.0) and row["ins_mean"] == pytest.approx(1.0)
    assert row["sub_mean"] + row["del_mean"] + row["ins_mean"] == pytest.approx(row["wer_mean"])
    assert s.loc[s["decoder"] == "window-5.12s", "window_s"].iloc[0] == 5.12


def test_tests_pair_recordings_and_holm_within_two_families(frag: Sweep) -> None:
    t = fr.test_table(frag, bootstrap_resamples=RESAMPLES)
    assert list(t.columns) == fr.TEST_COLUMNS
    assert len(t) == 1 + 2 * 2 + 2 + 3 * 2
    assert (t["p_holm"] >= t["p_permutation"] - 1e-12).all()
    gain = t[t["test"] == "gain"].iloc[0]
    assert gain["p_permutation"] == pytest.approx(2 / 2 ** N_REC) and gain["holds"]
    # the verdict's family: the gain and pause cuts against dense short; the other 11 tests are descriptive
    verdict_family = t[t["family"] == fr.VERDICT_FAMILY]
    assert sorted(zip(verdict_family["test"], verdict_family["reference"])) == [("gain", "dense 5.12 s"),
                                                                                ("pauses", "dense 5.12 s")]
    assert gain["p_holm"] == pytest.approx(2 * 2 / 2 ** N_REC)
    other = t[t["family"] == fr.OTHER_FAMILY]
    assert len(other) == 11 and other["p_holm"].max() <= 1.0
    shared = t[t["shared_seeds"]]
    assert set(shared["decoder"]) == {"window-5.12s", "window-10.24s", "window-20.48s"}
    assert set(shared["reference"]) == {"dense 81.92 s"} and (shared["seeds"] == "1,2,3").all()
    own = t[(t["test"] == "window") & ~t["shared_seeds"].astype(bool)]
    assert set(own["reference"]) == {"dense 5.12 s"}


@pytest.mark.parametrize("world, kind", [("fragmentation", fr.FRAGMENTATION), ("context", fr.CONTEXT_USED),
                                         ("nogain", fr.NO_GAIN)])
def test_verdict_of_each_world(world: str, kind: str) -> None:
    sweep = build_sweep(world, records(world))
    found = fr.groups(sweep)
    summary = fr.summary_table(sweep, found)
    tests = fr.test_table(sweep, found, bootstrap_resamples=RESAMPLES)
    ((head, v),) = fr.verdicts(found, summary, tests)
    assert head == "talks" and v.kind == kind, v.sentence
    if world == "fragmentation":  # band1 (5.3 s total, nearest 5.12 s) is read, not band2
        assert v.share_banded == pytest.approx(0.25 / 4) and v.share_pauses == pytest.approx(0.75)
        assert v.share_edges == pytest.approx(0.75)
    if world == "nogain":
        assert "Not" not in v.sentence and "gain" in v.sentence


def test_report_section_and_csvs(tmp_path) -> None:
    rep = build_report(build_sweep("frag", records("fragmentation")), tmp_path, bootstrap_resamples=RESAMPLES)
    md = rep.markdown.read_text()
    assert "## Context or fragmentation" in md and "## Error types" in md
    part = md.split("## Context or fragmentation")[1].split("\n## ")[0]
    assert "talks: Verdict: fragmentation. Of the 5.12 → 81.92 s gain" in part
    assert "cutting at pauses recovers 75%" in part and "decoding at 5.12 s windows loses 75%" in part
    assert rep.csvs["fragmentation"] == tmp_path / "fragmentation.csv"
    assert (tmp_path / "fragmentation_tests.csv").exists() and (tmp_path / "errors.csv").exists()


def test_no_controls_no_section(tmp_path) -> None:
    rep = build_report(build_sweep("plain", records("fragmentation", False)), tmp_path,
                       bootstrap_resamples=RESAMPLES)
    assert "Context or fragmentation" not in rep.markdown.read_text()
    assert not {"fragmentation", "fragmentation_tests"} & set(rep.csvs)
    assert not (tmp_path / "fragmentation.csv").exists()


def test_paper_layout_short_context_from_the_pause_cuts() -> None:
    """At the paper's scale the controls read against 10.24 s (pause cuts there, no dense 5.12 s model) and two long
    contexts (banded at 81.92 and 3600 s): one verdict for each long context."""
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    layout = {"d10": ({"data.context_s": "10.24"}, 12), "d82": ({"data.context_s": "81.92"}, 8),
              "d3600": ({"data.context_s": "3600"}, 7), "p10": ({"data.context_s": "10.24", "data.cut": "pauses"}, 9),
              "b82": ({"data.context_s": "81.92", "model.attention_span_s": "0.48"}, 11),
              "b3600": ({"data.context_s": "3600", "model.attention_span_s": "0.48"}, 11)}
    for name, (params, e) in layout.items():
        for seed in SEEDS:
            x = np.full(N_REC, float(e))
            x[0] += seed - 1
            out.append(RunRecord(f"{name}-{seed}", "FINISHED", {"sweep.role": "trial", "trial.label": f"{name}-s{seed}",
                                                                "trial.seed": str(seed), "trial.subgrids": "paper",
                                                                **field_tag({"model.layers": "6", **params})},
                                 {"train.seed": str(seed), "model.layers": "6", **params},
                                 {"wer/talks": 100.0 * x.sum() / (N_REC * WORDS)}, {"talks": table("talks", x)}))
    sweep = build_sweep("paper", out)
    (g,) = fr.groups(sweep)
    assert (g.short_s, g.longs) == (10.24, [81.92, 3600.0])
    summary = fr.summary_table(sweep, [g])
    tests = fr.test_table(sweep, [g], bootstrap_resamples=RESAMPLES)
    assert len(tests) == 2 + 2 * 2 + 3  # gains, banded against both dense models, pause cuts against all three
    heads = dict(fr.verdicts([g], summary, tests))
    assert set(heads) == {"talks, 10.24 → 81.92 s", "talks, 10.24 → 3600 s"}
    assert heads["talks, 10.24 → 81.92 s"].kind == fr.MIXED  # banding loses 3/4, pause cuts recover 3/4
    assert "Of the 10.24 → 3600 s gain of 5.00 points" in heads["talks, 10.24 → 3600 s"].sentence


def test_power_lines_say_when_no_test_can_reach_alpha() -> None:
    """With R recordings an exact sign-flip p is at least 2^(1-R): 9 recordings and 13 tests cannot reach 0.05
    (13 x 2/512 = 0.051), 9 recordings and 2 tests can; the section says which."""
    def tests(n_tests: int, n_rec: int) -> pd.DataFrame:
        return pd.DataFrame({"group": "g", "dataset": "test", "family": fr.VERDICT_FAMILY,
                             "p_permutation": [0.5] * n_tests, "n_recordings": [n_rec] * n_tests})

    line = fr.power_lines(tests(13, 9), 0.05)
    assert len(line) == 1 and "with 9 recordings no test can reach p < 0.05" in line[0] and "0.0508" in line[0]
    assert fr.power_lines(tests(2, 9), 0.05) == []
    assert fr.power_lines(tests(1, 6), 0.05) == [] and len(fr.power_lines(tests(1, 5), 0.05)) == 1


def test_a_banded_model_better_than_dense_long_reads_as_a_further_gain() -> None:
    v = decide(ev(wer_banded=6.0, wer_pauses=9.0))  # 2 points better than dense long; pauses recover 3 of 4
    assert v.kind == fr.FRAGMENTATION and v.share_banded == pytest.approx(-0.5)
    assert "loses none of it and gains 50% of it more" in v.sentence and "-50%" not in v.sentence


def test_a_dense_model_shared_with_another_grid_counts_every_seed() -> None:
    """The full demo's dense seeds (sub-grids ``context,dense``) beside the seed the fragmentation grid added
    (``dense``): one configuration, every seed in its row, whichever family lists it first."""
    runs = records("fragmentation")
    for r in runs:
        if r.tags.get("trial.subgrids") == "dense" and r.tags["trial.seed"] != "3":
            r.tags["trial.subgrids"] = "context,dense"
    s = fr.summary_table(build_sweep("demo", runs))
    dense = s[s["model"].isin(["dense 5.12 s", "dense 81.92 s"])]
    assert len(dense) == 2 and set(dense["n_seeds"]) == {3}, dense[["model", "n_seeds", "seeds"]]
