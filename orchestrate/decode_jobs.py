"""Alias kept for decode jobs that earlier versions queued: submitit pickled them as
``orchestrate.decode_jobs.DecodeTask``. Decoding now runs as evaluation jobs of the sweep; such a job ends with a
message that says how to plan it again, and touches neither the model nor its run."""

from __future__ import annotations


class DecodeTask:
    """A decode array task queued before decoding became an evaluation job of the sweep."""

    def __init__(self, sweep_path: str, name: str, sub_id: str) -> None:
        self.sweep_path = sweep_path
        self.name = name
        self.sub_id = sub_id

    def __call__(self) -> int:
        raise RuntimeError(
            f"decode job {self.name!r} of sweep {self.sweep_path} was queued by an earlier version; nothing was "
            f"decoded or changed. Plan it again as evaluation jobs: orchestrate evaluate {self.sweep_path} "
            f"--spec DECODE_FILE (it names the setting {self.name!r})")
