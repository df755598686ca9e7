"""analysis.ledger.cache: finished runs' tables kept between reports. A second report with nothing changed downloads no
table and writes the same files byte for byte as a report without the cache; an evaluation that adds a table, or a
damaged entry, is downloaded again; a server that fails mid-read is exit 3 with one line and no report."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
from mlflow.tracking import MlflowClient

from analysis.__main__ import main
from analysis.ledger.cache import CACHE_ENV, OFF, TableCache, default_cache_dir, entry_key
from analysis.ledger.collect import collect

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
import synthetic_sweep as synth  # noqa: E402

FINISHED_TRIALS = sum(1 for r in synth.make_records() if r.status == "FINISHED" and r.tables)


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    synth.write_to_mlflow(synth.make_records(), uri, tmp_path / "artifacts")
    return uri


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every download of a run's artifacts, by artifact root."""
    seen: list[str] = []
    original = LocalArtifactRepository.download_artifacts

    def counting(self, artifact_path, dst_path=None):  # noqa: ANN001, ANN202
        seen.append(self.artifact_dir)
        return original(self, artifact_path, dst_path)

    monkeypatch.setattr(LocalArtifactRepository, "download_artifacts", counting)
    return seen


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _report(uri: str, out: Path, *cache: str) -> None:
    assert main(["report", synth.EXPERIMENT, "--tracking-uri", uri, "--out", str(out), "--no-log",
                 "--bootstrap", "200", *cache]) == 0


@pytest.mark.slow  # whole reports on 2 busy cores
def test_a_second_report_downloads_nothing_and_all_three_are_identical(ledger: str, tmp_path: Path,
                                                                        downloads: list[str]) -> None:
    cache = tmp_path / "cache"
    _report(ledger, tmp_path / "plain", "--no-cache")
    assert len(downloads) == FINISHED_TRIALS
    _report(ledger, tmp_path / "cold", "--cache", str(cache))
    assert len(downloads) == 2 * FINISHED_TRIALS
    assert len(list(cache.rglob("*.json.gz"))) == FINISHED_TRIALS  # finished runs only
    _report(ledger, tmp_path / "warm", "--cache", str(cache))
    assert len(downloads) == 2 * FINISHED_TRIALS, "the warm report downloaded tables"
    plain = _files(tmp_path / "plain")
    assert "wer.csv" in plain and "significance.csv" in plain and "report.md" in plain
    assert _files(tmp_path / "cold") == plain
    assert _files(tmp_path / "warm") == plain


@pytest.mark.slow  # whole reports on 2 busy cores
def test_an_evaluation_that_adds_a_table_and_a_damaged_entry_are_downloaded_again(ledger: str, tmp_path: Path,
                                                                                   downloads: list[str]) -> None:
    cache = TableCache(tmp_path / "cache")
    first = collect(synth.EXPERIMENT, ledger, progress=False, cache=cache)
    assert (cache.hits, cache.misses, cache.writes) == (0, FINISHED_TRIALS, FINISHED_TRIALS)
    client = MlflowClient(ledger)
    runs = {r.data.tags["trial.label"]: r.info.run_id
            for r in client.search_runs([client.get_experiment_by_name(synth.EXPERIMENT).experiment_id])
            if r.info.status == "FINISHED" and "trial.label" in r.data.tags}
    added, damaged = sorted(runs.values())[:2]
    extra = tmp_path / "dev.beam.csv"
    extra.write_text(first.recordings.iloc[:0].to_csv(index=False))
    client.log_artifact(added, str(extra), "eval")
    cache.path(damaged).write_bytes(gzip.compress(b"{not json"))

    before = len(downloads)
    again = TableCache(cache.root)
    collect(synth.EXPERIMENT, ledger, progress=False, cache=again)
    assert len(downloads) - before == 2 and (again.hits, again.misses) == (FINISHED_TRIALS - 2, 2)
    assert again.get(damaged, "another key") is None
    third = TableCache(cache.root)
    sweep = collect(synth.EXPERIMENT, ledger, progress=False, cache=third)
    assert len(downloads) - before == 2 and third.hits == FINISHED_TRIALS  # both entries rewritten whole
    assert sweep.recordings.equals(first.recordings)


@pytest.mark.slow  # whole reports on 2 busy cores
def test_a_server_failing_mid_read_is_exit_3_one_line_and_no_report(ledger: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    _report(ledger, tmp_path / "cold", "--cache", str(cache))  # every entry cached: the outage must still show
    calls: list[int] = []
    original = LocalArtifactRepository.list_artifacts

    def failing(self, path=None):  # noqa: ANN001, ANN202
        calls.append(1)
        if len(calls) >= 3:
            raise ConnectionError("Connection refused")
        return original(self, path)

    monkeypatch.setattr(LocalArtifactRepository, "list_artifacts", failing)
    capsys.readouterr()
    out = tmp_path / "report"
    assert main(["report", synth.EXPERIMENT, "--tracking-uri", ledger, "--out", str(out), "--no-log",
                 "--cache", str(cache)]) == 3
    err = [line for line in capsys.readouterr().err.splitlines()  # less the progress bar, erased on a terminal
           if line.strip() and not line.startswith("reading runs:")]
    assert len(err) == 1 and err[0].startswith("error: reading the sweep at") and "Connection refused" in err[0], err
    assert not out.exists()
    entries = list(cache.rglob("*.json.gz"))
    assert len(entries) == FINISHED_TRIALS
    assert all(TableCache(cache).get(p.name.split(".")[0], "x") is None for p in entries)  # readable, other key


def test_where_the_cache_lives(tmp_path: Path) -> None:
    assert default_cache_dir({CACHE_ENV: OFF}) is None and default_cache_dir({CACHE_ENV: "Off "}) is None
    assert default_cache_dir({CACHE_ENV: str(tmp_path)}) == tmp_path
    assert default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "long-context-asr-study" / "report"


def test_an_entry_is_keyed_by_listing_and_metrics_and_survives_no_damage(tmp_path: Path) -> None:
    key = entry_key("r1", [("eval/dev.csv", 10)], {"wer/dev": 12.5})
    assert key == entry_key("r1", [("eval/dev.csv", 10)], {"wer/dev": 12.5})
    assert key != entry_key("r1", [("eval/dev.csv", 11)], {"wer/dev": 12.5})
    assert key != entry_key("r1", [("eval/dev.csv", 10), ("eval/test.csv", 5)], {"wer/dev": 12.5})
    assert key != entry_key("r1", [("eval/dev.csv", 10)], {"wer/dev": 12.5, "wer/dev/snr0": 20.0})
    assert key != entry_key("r2", [("eval/dev.csv", 10)], {"wer/dev": 12.5})
    cache = TableCache(tmp_path)
    cache.put("r1", key, {"dev": "a,b\n1,2\n", "dev.beam": "ü\n"})
    assert cache.get("r1", key) == {"dev": "a,b\n1,2\n", "dev.beam": "ü\n"}
    raw = cache.path("r1").read_bytes()
    for damaged in (raw[: len(raw) // 2], b"", b"not gzip", gzip.compress(b'{"format": 1, "tables": 3}')):
        cache.path("r1").write_bytes(damaged)
        assert cache.get("r1", key) is None
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
