"""The last report of each sweep, kept in the report cache: a report whose inputs have not changed is copied, not
computed again.

A report is a pure function of the runs it reads (each run's status, tags, params, metrics and tables), the report's
options, the code that turns them into tables and figures, and the versions of the libraries that draw and compute.
:func:`inputs_digest` hashes all of them; after a report is written its files are kept under that digest
(:meth:`ReportMemo.store`), and the next report of the same sweep at the same ledger whose digest is the same copies
them (:meth:`ReportMemo.restore`) instead of building the sweep's tables, running its comparisons and drawing its
figures again: the same files, byte for byte. Anything that changed (a run finished or evaluated anew, another
option, another version of the analysis) is another digest, and the report is computed and the memo replaced.

Where: ``<cache>/reports/<sweep digest>/`` (the report cache's folder, :mod:`analysis.ledger.cache`), one memo per sweep
and ledger, so the folder holds one report per sweep read. Its ``memo.json`` is written last and names the digest
and every file with its SHA-256; a memo that is cut short, damaged or for another digest is a miss. Never pickle.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

log = logging.getLogger(__name__)

FORMAT = 1  # bumped when the memo's layout changes: older memos are then misses
MEMO = "memo.json"
# the libraries whose versions can change a table's digits or a figure's bytes
LIBRARIES = ("numpy", "pandas", "scipy", "matplotlib")
_CODE = ("analysis", "asr_core/contract", "asr_core/scoring")  # folders whose source the report runs


def code_digest(root: Path | None = None) -> str:
    """SHA-256 of the source of the packages the report runs (:data:`_CODE`) and of :data:`LIBRARIES`' versions."""
    root = Path(__file__).resolve().parents[1] if root is None else root
    h = hashlib.sha256()
    for folder in _CODE:
        for path in sorted((root / folder).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for lib in LIBRARIES:
        try:
            version = metadata.version(lib)
        except metadata.PackageNotFoundError:
            version = "-"
        h.update(f"{lib}={version}\0".encode())
    return h.hexdigest()


def inputs_digest(records: Iterable[Any], options: Mapping[str, Any], code: str | None = None) -> str:
    """The digest of a report's inputs: every record (:class:`analysis.ledger.fetch.RunRecord`: id, status, tags, params,
    metrics, tables' text) in id order, the report's ``options`` (JSON-able) and ``code`` (default
    :func:`code_digest`)."""
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, code if code is not None else code_digest(), sorted(options.items())],
                        default=str).encode())
    for rec in sorted(records, key=lambda r: r.run_id):
        head = [rec.run_id, rec.status, sorted(rec.tags.items()), sorted(rec.params.items()),
                sorted((k, repr(float(v))) for k, v in rec.metrics.items()), sorted(rec.tables)]
        h.update(json.dumps(head).encode())
        for name in sorted(rec.tables):
            h.update(hashlib.sha256(rec.tables[name].encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class Kept:
    """What a kept report says besides its files: the summary lines and what the MLflow view needs."""

    files: dict[str, str]  # file name in the report folder -> its SHA-256
    facts: dict[str, Any]  # JSON-able: figures, skipped figures, tables, clean datasets, comparisons


class ReportMemo:
    """The memo folder of one sweep (``experiment`` at ``uri``) under the report cache ``root``."""

    def __init__(self, root: Path, experiment: str, uri: str) -> None:
        sweep = hashlib.sha256(json.dumps([experiment, uri]).encode()).hexdigest()[:24]
        self.dir = Path(root) / "reports" / sweep

    def restore(self, digest: str, out: Path) -> "Written | None":
        """Copy the kept report of ``digest`` into ``out`` and say what it holds; None (nothing copied) when there
        is none, it is for another digest, or a file of it is missing or damaged."""
        kept = self._read(digest)
        if kept is None:
            return None
        try:
            written = Written.from_facts(out, kept.facts)
        except (KeyError, TypeError, ValueError):
            log.warning("report memo %s is damaged; the report is computed", self.dir)
            return None
        out.mkdir(parents=True, exist_ok=True)
        for name in kept.files:
            shutil.copyfile(self.dir / name, out / name)
        return written

    def _read(self, digest: str) -> Kept | None:
        try:
            memo = json.loads((self.dir / MEMO).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("report memo %s cannot be read (%s); the report is computed", self.dir, e)
            return None
        if not isinstance(memo, dict) or memo.get("format") != FORMAT or memo.get("digest") != digest:
            return None
        files, facts = memo.get("files"), memo.get("facts")
        if not isinstance(files, dict) or not isinstance(facts, dict):
            return None
        for name, sha in files.items():
            try:
                if Path(name).name != name or _sha256(self.dir / name) != sha:
                    raise OSError("changed")
            except OSError:
                log.warning("report memo %s: %s is missing or changed; the report is computed", self.dir, name)
                return None
        return Kept(dict(files), facts)

    def store(self, digest: str, written: "Written") -> bool:
        """Keep the report ``written`` under ``digest``, replacing the sweep's earlier memo; False (logged, the
        report goes on) when the cache cannot be written."""
        out, names, facts = written.out_dir, written.names, written.facts()
        parent = self.dir.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.dir.name}-", dir=parent))
        except OSError as e:
            log.warning("report memo: cannot keep the report under %s (%s); the report goes on", parent, e)
            return False
        try:
            files = {}
            for name in sorted(set(names)):
                shutil.copyfile(out / name, tmp / name)
                files[name] = _sha256(tmp / name)
            (tmp / MEMO).write_text(json.dumps({"format": FORMAT, "digest": digest, "files": files,
                                                "facts": dict(facts)}, default=str), encoding="utf-8")
            old = parent / f".{self.dir.name}-old-{os.getpid()}"
            if self.dir.exists():
                os.replace(self.dir, old)
            os.replace(tmp, self.dir)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as e:
            log.warning("report memo: cannot keep the report under %s (%s); the report goes on", parent, e)
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        return True


@dataclass(frozen=True)
class Written:
    """A report folder as the command line speaks of it, computed (:meth:`of`) or restored from a memo
    (:meth:`from_facts`): its files, figures, skipped figures, comparison counts and the datasets with clean greedy
    WERs (for the MLflow view)."""

    out_dir: Path
    html: Path
    markdown: Path
    csvs: dict[str, Path]
    figures: list[Any]  # analysis.display.plots.Figure
    skipped: list[Any]  # analysis.display.plots.Skipped
    comparisons: int
    significant: int
    clean: list[str]

    @classmethod
    def of(cls, rep: Any, clean: Iterable[str]) -> "Written":
        """The written report ``rep`` (:class:`analysis.document.report.Report`)."""
        sig = rep.significance
        n_sig = int((sig["significant"] == True).sum()) if len(sig) else 0  # noqa: E712
        return cls(rep.out_dir, rep.html, rep.markdown, dict(rep.csvs), list(rep.figures), list(rep.skipped),
                   len(sig), n_sig, list(dict.fromkeys(str(d) for d in clean)))

    @property
    def names(self) -> list[str]:
        """The report's file names in its folder."""
        return [self.html.name, self.markdown.name, *(f.path.name for f in self.figures),
                *(p.name for p in self.csvs.values())]

    def facts(self) -> dict[str, Any]:
        """What a memo keeps besides the files (JSON-able)."""
        return {"html": self.html.name, "markdown": self.markdown.name,
                "csvs": {k: p.name for k, p in self.csvs.items()},
                "figures": [[f.key, f.title, f.caption, f.path.name] for f in self.figures],
                "skipped": [[s.key, s.title, s.reason] for s in self.skipped],
                "comparisons": self.comparisons, "significant": self.significant, "clean": self.clean}

    @classmethod
    def from_facts(cls, out: Path, facts: Mapping[str, Any]) -> "Written":
        """The report copied into ``out`` from a memo whose facts are ``facts``."""
        from analysis.display.plots import Figure, Skipped

        return cls(out, out / facts["html"], out / facts["markdown"], {k: out / v for k, v in facts["csvs"].items()},
                   [Figure(k, t, c, out / n) for k, t, c, n in facts["figures"]],
                   [Skipped(k, t, r) for k, t, r in facts["skipped"]],
                   int(facts["comparisons"]), int(facts["significant"]), list(facts["clean"]))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
