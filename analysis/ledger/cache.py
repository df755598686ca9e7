"""A local cache of the per-recording tables of finished runs, so that a second ``python -m analysis report`` of a
sweep downloads only what changed.

A finished trial run's ``eval/*.csv`` do not change, except when an evaluation adds or rewrites some
(``python -m asr_core evaluate`` on a finished run: new datasets, conditions or decoders). An entry is therefore
keyed by the run id, the listing of its ``eval/`` folder (each file's path and size, as the artifact store lists
them: one request, no download) and a digest of the run's metrics (an evaluation logs its WERs): any of them
changing is a miss, and the tables are downloaded again and the entry replaced. Only finished runs are cached.

Where: ``--cache DIR`` of ``python -m analysis report``, else ``$ASR_STUDY_REPORT_CACHE``, else
``$XDG_CACHE_HOME`` (default ``~/.cache``) ``/long-context-asr-study/report``; ``--no-cache`` or
``ASR_STUDY_REPORT_CACHE=off`` reads everything from MLflow and writes no cache. One file per run,
``<dir>/<run id[:2]>/<run id>.json.gz``: gzip'd JSON of the tables' text (never pickle), replaced atomically
(:func:`asr_core.contract.atomic.write_atomic`). An entry that cannot be read (cut short, not gzip, not the
expected JSON, another key) is a miss and is rewritten; a cache that cannot be written is said once in the log and
the report goes on. The cache never stands in for the server: a run's listing is read from MLflow first, so an
unreachable server is the same error with or without it. Delete the folder to empty it. The same folder keeps
each sweep's last report (``reports/``, :mod:`analysis.memo`): a report with nothing changed is copied from it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from asr_core.contract.atomic import write_atomic
from asr_core.contract.command import PROJECT

log = logging.getLogger(__name__)

CACHE_ENV = "ASR_STUDY_REPORT_CACHE"
OFF = "off"  # the value of CACHE_ENV that turns the cache off
FORMAT = 1  # bumped when an entry's layout changes: older entries are then misses
SUFFIX = ".json.gz"


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The cache folder when no option names one: ``$ASR_STUDY_REPORT_CACHE`` (None when it is ``off``), else
    ``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/long-context-asr-study/report``."""
    env = os.environ if env is None else env
    named = env.get(CACHE_ENV, "").strip()
    if named.lower() == OFF:
        return None
    if named:
        return Path(named).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / PROJECT / "report"


def bad_cache_dir(path: Path) -> str | None:
    """Why ``path`` cannot be a cache folder (it is a file, or lies under one), or None when it can."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else f"{p} is a file"
    return None


def entry_key(run_id: str, listing: Iterable[tuple[str, int | None]], metrics: Mapping[str, float]) -> str:
    """The key of a run's tables: its id, its ``eval/`` listing (path, size) and its metrics, hashed."""
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, run_id, sorted((p, -1 if s is None else int(s)) for p, s in listing),
                         sorted((k, repr(float(v))) for k, v in metrics.items())]).encode())
    return h.hexdigest()


@dataclass
class TableCache:
    """The cache in folder ``root`` (made when first written). Safe to use from several threads: each entry is one
    file, replaced whole. ``hits``/``misses``/``writes`` count this process's use."""

    root: Path
    hits: int = 0
    misses: int = 0
    writes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _warned: bool = field(default=False, repr=False)

    def path(self, run_id: str) -> Path:
        """The file of ``run_id``'s entry (its id made safe for a file name)."""
        safe = "".join(c for c in run_id if c.isalnum() or c in "-_") or "_"
        return self.root / safe[:2] / (safe + SUFFIX)

    def get(self, run_id: str, key: str) -> dict[str, str] | None:
        """The tables cached for ``run_id`` under ``key``; None when there are none, they are for another key, or
        the entry cannot be read (it is then rewritten by the next :meth:`put`)."""
        tables = self._read(self.path(run_id), run_id, key)
        with self._lock:
            if tables is None:
                self.misses += 1
            else:
                self.hits += 1
        return tables

    def _read(self, path: Path, run_id: str, key: str) -> dict[str, str] | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("report cache: %s cannot be read (%s); the run's tables are downloaded", path, e)
            return None
        try:
            entry = json.loads(gzip.decompress(raw).decode("utf-8"))
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError):
            log.warning("report cache: %s is damaged; the run's tables are downloaded again", path)
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("run_id") != run_id \
                or entry.get("key") != key:
            return None
        tables = entry.get("tables")
        if not isinstance(tables, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in tables.items()):
            log.warning("report cache: %s is damaged; the run's tables are downloaded again", path)
            return None
        return tables

    def put(self, run_id: str, key: str, tables: Mapping[str, str]) -> None:
        """Store ``run_id``'s ``tables`` under ``key`` (atomically); a failure is logged once and otherwise
        ignored: the report does not need the cache."""
        path = self.path(run_id)
        data = gzip.compress(json.dumps({"format": FORMAT, "run_id": run_id, "key": key, "tables": dict(tables)},
                                        ensure_ascii=False).encode("utf-8"), compresslevel=1, mtime=0)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
        except OSError as e:
            with self._lock:
                warned, self._warned = self._warned, True
            if not warned:
                log.warning("report cache: cannot write under %s (%s); the report goes on without caching",
                            self.root, e)
            return
        with self._lock:
            self.writes += 1

    def summary(self) -> str:
        """One line: how many runs were read from the cache and how many downloaded."""
        return (f"report cache {self.root}: {self.hits} runs' tables from the cache, {self.misses} downloaded"
                + (f", {self.writes} cached" if self.writes else ""))
