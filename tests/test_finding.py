"""analysis.document.finding: the paper's three claims checked on sweeps with a planted result, its reverse, and too little."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.ledger.collect import build_sweep
from analysis.ledger.fetch import RunRecord
from analysis.document.finding import finding_checks, summary_sentence
from asr_core.config import preset

N_RECORDINGS = 12
WORDS = [400 + 37 * i for i in range(N_RECORDINGS)]
RATE = [0.30 + 0.02 * (i % 5) for i in range(N_RECORDINGS)]  # per-recording error rates around 34%


def _params(ctx: float, seed: int) -> dict[str, str]:
    cfg = preset("tiny").with_overrides([
        f"data.context_s={ctx}", f"train.seed={seed}",
        'eval.datasets=["test=manifest:data/test", "test-shifted=manifest:data/shifted"]', "eval.snrs=[5]"])
    return {k: str(v) for k, v in cfg.flat().items()}


def _records(factor: dict[tuple[float, str, str], float], contexts: tuple[float, ...]) -> list[RunRecord]:
    """Trials whose per-recording errors are words * rate * factor[(context, dataset, condition)]."""
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {}, {})]
    for ctx in contexts:
        for seed in (1, 2):
            metrics, tables = {}, {}
            for ds in ("test", "test-shifted"):
                rows = []
                for cond, snr in (("clean", ""), ("snr5", 5.0)):
                    total_e = 0
                    for i, (n, r) in enumerate(zip(WORDS, RATE)):
                        e = round(n * r * factor[(ctx, ds, cond)] * (1 + 0.01 * seed))
                        total_e += e
                        rows.append({"dataset": ds, "condition": cond, "snr_db": snr, "recording": f"{ds}-{i:02d}",
                                     "ref_words": n, "substitutions": e, "deletions": 0, "insertions": 0,
                                     "hyp_words": n, "wer": 100.0 * e / n})
                    metrics[f"wer/{ds}" + ("" if cond == "clean" else "/snr5")] = 100.0 * total_e / sum(WORDS)
                tables[ds] = pd.DataFrame(rows).to_csv(index=False)
            tags = {"mlflow.parentRunId": "parent", "sweep.role": "trial", "trial.subgrids": "context",
                    "trial.label": f"ctx{ctx:g}-s{seed}", "trial.seed": str(seed)}
            out.append(RunRecord(f"r{ctx:g}-{seed}", "FINISHED", tags, _params(ctx, seed), metrics, tables))
    return out


CONTEXTS = (5.12, 10.24, 81.92)


def _planted(gain: dict[tuple[str, str], float]) -> dict[tuple[float, str, str], float]:
    """Error factors: 1 at the shortest context, 1 - gain at the longest, halfway in between."""
    f = {}
    for (ds, cond), g in gain.items():
        f[(5.12, ds, cond)], f[(10.24, ds, cond)], f[(81.92, ds, cond)] = 1.0, 1.0 - g / 2, 1.0 - g
    return f


def test_a_planted_finding_holds_claim_by_claim_and_is_significant() -> None:
    gain = {("test", "clean"): 0.10, ("test-shifted", "clean"): 0.25, ("test", "snr5"): 0.20,
            ("test-shifted", "snr5"): 0.35}
    sweep = build_sweep("s", _records(_planted(gain), CONTEXTS))
    checks, gains = finding_checks(sweep)
    assert [c.verdict for c in checks] == ["holds"] * 3, checks
    assert summary_sentence(checks).startswith("The paper's qualitative finding holds here")
    by = {(g.dataset, g.condition): g for g in gains}
    assert by[("test-shifted", "clean")].werr == pytest.approx(25.0, abs=0.2)
    assert by[("test", "snr5")].werr == pytest.approx(20.0, abs=0.2)
    # every one of 12 recordings improves: exact permutation p = 2 / 2**12, still < 0.05 after Holm over 4
    assert all(g.p == pytest.approx(2 / 2**12) and g.p_holm < 0.05 for g in gains)
    assert "significant" in checks[0].detail and "5.12 s 3" in checks[0].detail


def test_a_reversed_result_is_reported_as_not_holding() -> None:
    gain = {("test", "clean"): -0.10, ("test-shifted", "clean"): -0.05, ("test", "snr5"): -0.02,
            ("test-shifted", "snr5"): -0.01}
    checks, _ = finding_checks(build_sweep("s", _records(_planted(gain), CONTEXTS)))
    # a smaller loss on the shifted set or in noise is not a larger gain
    assert [c.verdict for c in checks] == ["does not hold"] * 3, checks
    assert "not reproduced" in summary_sentence(checks)


def test_gain_in_domain_only_holds_for_the_trend_but_not_for_shift_or_noise() -> None:
    gain = {("test", "clean"): 0.20, ("test-shifted", "clean"): 0.05, ("test", "snr5"): 0.10,
            ("test-shifted", "snr5"): 0.02}
    checks, _ = finding_checks(build_sweep("s", _records(_planted(gain), CONTEXTS)))
    assert [c.verdict for c in checks] == ["holds", "does not hold", "does not hold"]
    assert "partly reproduced here: 1 of 3 claims hold" in summary_sentence(checks)


def test_one_context_length_cannot_be_checked() -> None:
    gain = {("test", "clean"): 0.0, ("test-shifted", "clean"): 0.0, ("test", "snr5"): 0.0,
            ("test-shifted", "snr5"): 0.0}
    checks, gains = finding_checks(build_sweep("s", _records(_planted(gain), (10.24,))))
    assert [c.verdict for c in checks] == ["cannot be checked"] and not gains
    assert "two or more context lengths" in summary_sentence(checks)


def test_models_that_have_not_learned_cannot_be_judged() -> None:
    """Every WER near 100% (e.g. the 50-step quick demo): no claim is judged either way."""
    worst = {(ctx, ds, cond): 3.0 for ctx in CONTEXTS for ds in ("test", "test-shifted") for cond in ("clean", "snr5")}
    checks, _ = finding_checks(build_sweep("s", _records(worst, CONTEXTS)))  # 3 x ~34% error rate: WER > 99%
    assert [c.verdict for c in checks] == ["cannot be checked"]
    assert "none has learned enough" in checks[0].detail and "cannot be checked" in summary_sentence(checks)


def test_a_claims_bullet_joins_the_claim_and_its_detail_into_one_sentence() -> None:
    """The detail opens in lower case ("every model ..."): it follows the claim after a dash, not after a full stop,
    and the bullet ends with one full stop whether or not the detail has one."""
    from analysis.document.finding import Check

    line = Check("WER falls as context grows", None, "every model is at 95% WER or more on clean audio").line()
    assert line == ("**Cannot be checked**: WER falls as context grows — every model is at 95% WER or more on "
                    "clean audio.")
    assert "grows. every" not in line
    assert Check("a claim", True, "test: WERR +5.0%.").line() == "**Holds**: a claim — test: WERR +5.0%."
    assert summary_sentence([Check("c", None, "no clean results.")]).endswith("sweep: no clean results.")
