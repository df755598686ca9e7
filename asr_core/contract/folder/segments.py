"""The trial's segments: one record per start of the trial job (the first start and each resume), appended to
``TRIAL_DIR/segments.jsonl`` (:attr:`~asr_core.contract.trial.TrialFolder.segments`), one JSON object a line::

    {"segment": 2, "time": 1718000000.123, "code": "1a2b3c4d5e6f", "commit": "1a2b3c4d5e6f…", "dirty": false,
     "host": "gpu-node-07", "job_id": "9000_3", "kernels": "avx512", "cpu": "AMD EPYC 7763 64-Core Processor"}

``code``, ``commit`` and ``dirty`` are the code version that ran it (:class:`asr_core.contract.provenance.CodeVersion`),
``job_id`` the scheduler's (:data:`~asr_core.contract.trial.ENV_JOB_ID`; null outside a scheduler), ``kernels`` and
``cpu`` the CPU kernel level PyTorch ran with and the CPU's model (:mod:`asr_core.contract.provenance`; a model's
weights depend on the kernel level, so figures say which produced them; "" in records written before they were). The job appends
it (:func:`append_segment`); the job and ``orchestrate`` read it (:func:`read_segments`) as :class:`Segment` records:
how often the job started, which code versions ran the trial, which job ran its newest segment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.trial import TrialFolder, append_json_line


@dataclass(frozen=True)
class Segment:
    """One start of the trial job, as ``segments.jsonl`` records it (:meth:`to_dict` is the line's JSON)."""

    number: int | None  # "segment": 1 for the first start; None in a record that has no (integer) number
    time: float = 0.0  # Unix seconds
    code: str = ""  # the code label (``1a2b3c4d5e6f``, ``…+dirty.0f1e2d3c``, ``unknown``); "" when not recorded
    commit: str | None = None
    dirty: bool = False
    host: str = ""
    job_id: str | None = None  # the scheduler's job id; None (JSON null) when the job ran outside a scheduler
    kernels: str = ""  # PyTorch's CPU kernel level (default, avx2, avx512, ...); "" when not recorded
    cpu: str = ""  # the CPU's model name; "" when not recorded

    @property
    def job(self) -> str:
        """The job id, "" when unknown."""
        return str(self.job_id or "")

    def number_or(self, position: int) -> int:
        """The segment's number, or ``position`` (its 1-based place in the file) for a record without one."""
        return self.number if self.number is not None else position

    def to_dict(self) -> dict[str, Any]:
        return {"segment": self.number, "time": self.time, "code": self.code, "commit": self.commit,
                "dirty": self.dirty, "host": self.host, "job_id": self.job_id, "kernels": self.kernels, "cpu": self.cpu}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        """A record read back; missing or malformed fields read as unknown, never raise."""
        number, job, commit = d.get("segment"), d.get("job_id"), d.get("commit")
        try:
            when = float(d.get("time") or 0.0)
        except (TypeError, ValueError):
            when = 0.0
        return cls(number=number if isinstance(number, int) else None, time=when,
                   code=str(d["code"]) if d.get("code") else "", commit=str(commit) if commit else None,
                   dirty=bool(d.get("dirty")), host=str(d.get("host") or ""),
                   job_id=str(job) if job else None, kernels=str(d.get("kernels") or ""),
                   cpu=str(d.get("cpu") or ""))


def read_segments(trial_dir: Path | str) -> list[Segment]:
    """The segment records of a trial folder, oldest first (none when the job never started)."""
    try:
        lines = TrialFolder(Path(trial_dir)).segments.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash while it was written; the next start still counts itself
        if isinstance(rec, dict):
            out.append(Segment.from_dict(rec))
    return out


def append_segment(trial_dir: Path | str, segment: Segment) -> None:
    """Append one segment's record to the folder's ``segments.jsonl`` (one ``write`` of one whole line)."""
    append_json_line(TrialFolder(Path(trial_dir)).segments, segment.to_dict())


def code_labels(segments: Iterable[Segment]) -> tuple[str, ...]:
    """Every code version that ran a segment, in order of first use (what :data:`~asr_core.contract.trial.TAG_CODE`
    records)."""
    return tuple(dict.fromkeys(s.code for s in segments if s.code))


def kernel_levels(segments: Iterable[Segment]) -> tuple[str, ...]:
    """Every CPU kernel level a segment ran with, in order of first use (what
    :data:`~asr_core.contract.trial.TAG_KERNELS` records; two levels: the trial was resumed on another CPU)."""
    return tuple(dict.fromkeys(s.kernels for s in segments if s.kernels))
