"""asr_core.contract.metrics: every name a builder writes is read back by its parser, and the names are the ones
runs already logged hold."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from asr_core.contract import metrics as m

DATASETS = ["dev", "test-shifted", "rev16", "tedlium.v3", "a/b"]
SNRS = [None, -7.5, -5.0, 0.0, 10.0, 2.5, 1e-3, 150.0]
DECODERS = [m.GREEDY, "beam", "beam-lm1024", "beam_lm.v2", "window-5.12s"]


def _same_snr(got: float, snr: float | None) -> bool:
    return math.isnan(got) if snr is None else got == pytest.approx(snr)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_wer_and_cue_keys_round_trip(dataset: str, decoder: str) -> None:
    for snr in SNRS:
        cond = m.condition_name(snr)
        key = m.metric_key(dataset, snr, decoder)
        assert m.metric_name(dataset, cond, decoder) == key
        dec, ds, c, s = m.parse_decoder_metric_key(key)
        assert (dec, ds, c) == (decoder, dataset, cond) and _same_snr(s, snr)
        assert m.parse_cue_metric_key(key) is None
        if decoder == m.GREEDY:
            ds, c, s = m.parse_metric_key(key)
            assert (ds, c) == (dataset, cond) and _same_snr(s, snr)
        else:
            assert m.parse_metric_key(key) is None
        cue = m.cue_metric_key(dataset, snr, decoder)
        dec, ds, c, s = m.parse_cue_metric_key(cue)
        assert (dec, ds, c) == (decoder, dataset, cond) and _same_snr(s, snr)
        assert m.parse_decoder_metric_key(cue) is None
        tail = m.tail_metric_key(dataset, snr, decoder)
        dec, ds, c, s = m.parse_tail_metric_key(tail)
        assert (dec, ds, c) == (decoder, dataset, cond) and _same_snr(s, snr)
        assert m.parse_decoder_metric_key(tail) is None and m.parse_cue_metric_key(tail) is None
        assert m.parse_metric_key(tail) is None
        assert m.parse_tail_metric_key(key) is None and m.parse_tail_metric_key(cue) is None


def test_the_names_runs_hold() -> None:
    assert m.metric_key("dev") == "wer/dev"
    assert m.metric_key("test", -7.5) == "wer/test/snr-7.5"
    assert m.metric_key("rev16", 10.0) == "wer/rev16/snr10" == m.metric_key("rev16", 10)
    assert m.metric_key("test", 5.0, "beam-lm64") == "wer_beam-lm64/test/snr5"
    assert m.cue_metric_key("cued") == "cue/cued" and m.cue_metric_key("cued", 10.0, "beam") == "cue_beam/cued/snr10"
    assert m.tail_metric_key("dev") == "tail/dev" and m.tail_metric_key("test", -5.0) == "tail/test/snr-5"
    assert m.tail_metric_key("dev", 10.0, "beam-lm64") == "tail_beam-lm64/dev/snr10"
    assert m.TAIL_COLUMNS == ("tail_words", "tail_errors") and m.TAIL_TAG == "eval.tail"
    assert m.decoder_tag("beam-lm64") == "eval.decoder.beam-lm64"
    assert m.table_file("test") == "test.csv" and m.table_file("test", "beam") == "test.beam.csv"
    assert m.heads_key("test", "A", "sum") == "heads/test/A/sum"
    assert m.heads_key("test", "Y", "layer", 3) == "heads/test/Y/layer3"
    assert m.heads_windows_key("test") == "heads/test/windows"
    assert m.lm_ppl_key("text", 1024) == "lm_ppl/text/ctx1024"
    assert m.lm_ppl_tail_key("text", 1024) == "lm_ppl_tail/text/ctx1024"
    assert m.LM_TAG == "lm.data_fingerprint"
    assert m.TABLE_COLUMNS + m.CUE_COLUMNS == ("dataset", "condition", "snr_db", "recording", "ref_words",
                                               "substitutions", "deletions", "insertions", "hyp_words", "wer",
                                               "cue_words", "cue_errors")


def test_conditions_round_trip() -> None:
    assert m.condition_name(None) == m.condition_name(math.nan) == m.CLEAN
    assert math.isnan(m.snr_of(m.CLEAN))
    for snr in SNRS[1:]:
        assert m.snr_of(m.condition_name(snr)) == pytest.approx(snr)
    assert m.condition_name(m.snr_of("snr10.0")) == "snr10"  # a table's spelling, made canonical


def test_other_keys_are_not_read_as_wer() -> None:
    for key in ("train/loss", "wer_greedy/dev", "cue_beam/dev", "wer_/dev", "lm_ppl/text/ctx64", "heads/t/A/sum"):
        assert m.parse_decoder_metric_key(key) is None and m.parse_metric_key(key) is None, key
    assert m.parse_cue_metric_key("cue_greedy/dev") is None and m.parse_cue_metric_key("wer/dev") is None
    for key in ("tail_greedy/dev", "tail_/dev", "tail/", "tails/dev", "wer/dev", "cue_beam/dev", "recall/dev/far"):
        assert m.parse_tail_metric_key(key) is None, key
    assert m.parse_decoder_tag("eval.decoder.beam") == "beam" and m.parse_decoder_tag("eval.evaluation.own") is None


@pytest.mark.parametrize("dataset", DATASETS)
def test_head_and_perplexity_keys_round_trip(dataset: str) -> None:
    for r in "AQKVY":
        assert m.parse_heads_key(m.heads_key(dataset, r, "sum")) == (dataset, r, "sum", None)
        assert m.parse_heads_key(m.heads_key(dataset, r, "similarity")) == (dataset, r, "similarity", None)
        for layer in (0, 7, 12):
            assert m.parse_heads_key(m.heads_key(dataset, r, "layer", layer)) == (dataset, r, "layer", layer)
    assert m.parse_heads_key(m.heads_windows_key(dataset)) is None  # a count, not a head statistic
    for context in (0, 64, 1024):
        key = m.lm_ppl_key(dataset, context)
        assert m.parse_lm_ppl_key(key) == (dataset, context) and m.is_lm_ppl_key(key)
    assert m.parse_lm_ppl_key("lm_ppl/text") is None and not m.is_lm_ppl_key("lm/dev_ppl")
    for context in (0, 64, 1024):
        key = m.lm_ppl_tail_key(dataset, context)
        assert m.parse_lm_ppl_tail_key(key) == (dataset, context)
        assert m.parse_lm_ppl_key(key) is None and not m.is_lm_ppl_key(key)  # never read as the overall perplexity
        assert m.parse_lm_ppl_tail_key(m.lm_ppl_key(dataset, context)) is None
    for bad in ("lm_ppl_tail/text", "lm_ppl_tail/ctx64", "lm_ppl_tails/text/ctx64", "tail/text/ctx64"):
        assert m.parse_lm_ppl_tail_key(bad) is None, bad
    for bad in (("mean", None), ("layer", None), ("sum", 1)):
        with pytest.raises(ValueError):
            m.heads_key(dataset, "A", *bad)


def test_decoder_tables_are_told_apart_by_their_stem() -> None:
    assert m.table_name("test") == "test" and m.table_name("test", m.GREEDY) == "test"
    assert m.table_name("test", "beam-lm64") == "test.beam-lm64"


def test_the_contract_imports_neither_torch_nor_pandas() -> None:
    code = ("import sys, asr_core.contract.metrics; "
            "print(sorted(n for n in ('torch', 'pandas', 'numpy') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("seconds", [5.12, 10.24, 20.48, 81.92, 1, 3600])
def test_window_decoders_round_trip(seconds: float) -> None:
    from asr_core.contract.metrics import window_decoder, window_seconds

    name = window_decoder(seconds)
    assert name.startswith("window-") and name.endswith("s")
    assert window_seconds(name) == float(seconds)
    assert m.fusion_method(name) is None  # a window decoder is no fusion method


@pytest.mark.parametrize("bad", [0, -5.12, float("nan"), float("inf"), True, "5.12"])
def test_a_window_that_is_not_positive_is_refused(bad: object) -> None:
    from asr_core.contract.metrics import window_decoder

    with pytest.raises(ValueError, match="positive number of seconds"):
        window_decoder(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["greedy", "beam", "fusion-chiu", "window-5.120s", "window-s", "window-0s",
                                  "window-5.12", "window--1s"])
def test_other_decoders_are_no_window(name: str) -> None:
    from asr_core.contract.metrics import window_seconds

    assert window_seconds(name) is None
