"""The recall plant's slots as a word scorer (:mod:`asr_core.evaluation.scorers.base`): after a dataset with slots
(``synth --recall``, ``synth --copy``) is decoded, a per-slot table ``<NAME>[.<decoder>].slots.csv``
(:func:`asr_core.evaluation.scorers.slots.slot_table`; for greedy decoding of clean audio also one row per slot from the
single window that ends 1 s after it, :mod:`asr_core.evaluation.scorers.slot_window`) and the clean condition's
moving-window slot accuracy per group (``recall/<NAME>/near``, ``far``, ``unmasked``, ``no-key``). Datasets without
slots get nothing; the per-recording table gains no column."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from asr_core.contract.metrics import GREEDY, slot_table_file
from asr_core.data.corpora import Recording
from asr_core.evaluation.scorers.slots import (Slot, merge_slot_tables, recall_metrics, recall_slots, slot_table,
                                        write_slot_table)
from asr_core.evaluation.scorers.base import Bound, DatasetDone, WordScorer


class _BoundRecall(Bound):
    def __init__(self, dataset: str, slots: dict[str, tuple[Slot, ...]]) -> None:
        self.dataset, self.slots = dataset, slots

    def tables(self, done: DatasetDone) -> tuple[list[Path], dict[str, float], list[str]]:
        rows = slot_table(done.recordings, done.hyps, self.slots, done.decoder)
        if done.decoder == GREEDY and done.clean:  # and one window per slot, clean audio
            from asr_core.evaluation.scorers.slot_window import WindowModel, window_rows

            s = done.setup
            rows += window_rows(WindowModel(s.model, s.window, s.fps, s.tokenizer, s.device, s.batch.size),
                                done.recordings, self.slots, s.extractor)
        table = write_slot_table(done.out / slot_table_file(self.dataset, done.decoder), rows)
        if done.tables_from:
            merge_slot_tables(table, [Path(d) / table.name for d in done.tables_from])
        found = recall_metrics(self.dataset, rows, done.decoder)
        return [table], found, [f"{key} = {value:.2f}% (slot accuracy, clean)" for key, value in found.items()]


class RecallScorer(WordScorer):
    """The recall plant's slots (see the module docstring)."""

    def bind(self, dataset: str, recordings: Sequence[Recording]) -> Bound | None:
        slots = recall_slots(recordings)
        return None if slots is None else _BoundRecall(dataset, slots)
