"""analysis.memo: a report whose inputs have not changed is copied from the last one, byte for byte, without
building the sweep's tables, comparisons or figures; anything that changed (a run's metrics, an option, a damaged
memo) computes the report again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import analysis.ledger.collect
import analysis.document.report
from analysis.__main__ import main
from analysis.ledger.fetch import RunRecord
from analysis.memo import ReportMemo, Written, inputs_digest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    synth.write_to_mlflow(synth.make_records(), uri, tmp_path / "artifacts")
    return uri


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _report(uri: str, out: Path, cache: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    capsys.readouterr()
    assert main(["report", synth.EXPERIMENT, "--tracking-uri", uri, "--out", str(out), "--no-log",
                 "--bootstrap", "200", "--cache", str(cache), *extra]) == 0
    return capsys.readouterr().out.replace(str(out), "OUT")


class Computed:
    """Counts the reports computed (build_sweep calls) while it is installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = analysis.ledger.collect.build_sweep

        def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(analysis.ledger.collect, "build_sweep", counting)


@pytest.mark.slow  # whole reports on 2 busy cores
def test_an_unchanged_report_is_copied_and_a_change_computes_it_again(ledger: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    computed = Computed(monkeypatch)
    said = _report(ledger, tmp_path / "cold", cache, capsys)
    assert computed.calls == 1
    memos = list((cache / "reports").iterdir())
    assert len(memos) == 1 and (memos[0] / "memo.json").is_file()

    def refused(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the report was computed again")

    with monkeypatch.context() as m:
        m.setattr(analysis.document.report, "build_report", refused)
        again = _report(ledger, tmp_path / "warm", cache, capsys)
    assert computed.calls == 1, "the sweep's tables were built again"
    assert again == said
    cold = _files(tmp_path / "cold")
    assert "report.md" in cold and "significance.csv" in cold
    assert _files(tmp_path / "warm") == cold

    # another option: computed, and the memo replaced (one per sweep)
    _report(ledger, tmp_path / "other", cache, capsys, "--level", "0.9")
    assert computed.calls == 2 and len(list((cache / "reports").iterdir())) == 1
    # a run gains a metric (an evaluation logged it): computed
    client = MlflowClient(ledger)
    run = next(r for r in client.search_runs([client.get_experiment_by_name(synth.EXPERIMENT).experiment_id])
               if r.info.status == "FINISHED" and "trial.label" in r.data.tags)
    client.log_metric(run.info.run_id, "wer/extra", 12.5)
    _report(ledger, tmp_path / "metric", cache, capsys, "--level", "0.9")
    assert computed.calls == 3
    _report(ledger, tmp_path / "metric2", cache, capsys, "--level", "0.9")
    assert computed.calls == 3
    # a file of the memo damaged: computed, and the same files as before
    memo = next((cache / "reports").iterdir())
    (memo / "wer.csv").write_text("damaged")
    _report(ledger, tmp_path / "repaired", cache, capsys, "--level", "0.9")
    assert computed.calls == 4
    assert _files(tmp_path / "repaired") == _files(tmp_path / "metric2")


def _record(run_id: str = "r1", metric: float = 12.5, table: str = "a,b\n1,2\n") -> RunRecord:
    return RunRecord(run_id, "FINISHED", {"trial.label": "x"}, {"data.context_s": "10.24"}, {"wer/dev": metric},
                     {"dev": table})


def test_the_digest_covers_every_input_and_not_their_order() -> None:
    opts = {"alpha": 0.05, "experiment": "s"}
    base = inputs_digest([_record(), _record("r2")], opts, code="c")
    assert base == inputs_digest([_record("r2"), _record()], dict(reversed(opts.items())), code="c")
    assert base != inputs_digest([_record(), _record("r2", metric=12.6)], opts, code="c")
    assert base != inputs_digest([_record(), _record("r2", table="a,b\n1,3\n")], opts, code="c")
    assert base != inputs_digest([_record()], opts, code="c")
    assert base != inputs_digest([_record(), _record("r2")], {**opts, "alpha": 0.01}, code="c")
    assert base != inputs_digest([_record(), _record("r2")], opts, code="another analysis")


def test_a_memo_keeps_and_restores_the_files_and_a_cache_that_cannot_be_written_is_no_failure(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("<html>")
    (out / "report.md").write_text("# report")
    written = Written(out, out / "index.html", out / "report.md", {}, [], [], 3, 1, ["dev"])
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert not ReportMemo(blocked, "s", "sqlite:///x").store("d", written)
    memo = ReportMemo(tmp_path / "cache", "s", "sqlite:///x")
    assert memo.store("d", written)
    assert memo.restore("another digest", tmp_path / "none") is None and not (tmp_path / "none").exists()
    back = memo.restore("d", tmp_path / "back")
    assert back is not None and back.facts() == written.facts() and back.out_dir == tmp_path / "back"
    assert _files(tmp_path / "back") == _files(out)
    assert ReportMemo(tmp_path / "cache", "s", "http://127.0.0.1:5000").restore("d", tmp_path / "x") is None
