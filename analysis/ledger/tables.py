"""Reading a run's evaluation tables from their CSV text (:mod:`analysis.ledger.collect` fetches them): the per-recording
tables ``eval/<DATASET>[.<DECODER>].csv`` (:data:`~asr_core.contract.metrics.TABLE_COLUMNS`, with the optional cue and
tail counts) and the per-slot tables of the recall controls (:data:`~asr_core.contract.metrics.SLOT_COLUMNS`). Each
reader returns ``(table, "")`` or ``(empty, why it is unusable)``, which collect lists as a problem of the run;
conditions are made canonical (``snr10.0`` -> ``snr10``) so that a table matches its run's metric keys."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from asr_core.contract.metrics import (AVERAGE, CLEAN, CUE_COLUMNS, SLOT_COLUMNS, TABLE_COLUMNS, TAIL_COLUMNS,
                                     condition_name, snr_of)

COUNT_COLUMNS = ("ref_words", "substitutions", "deletions", "insertions", "hyp_words")


def read_table(text: str, dataset: str) -> tuple[pd.DataFrame, str]:
    """Parse one eval CSV; returns (table, "") or (empty, why it is unusable). The table is built in one go from
    the parsed columns (a report reads one per run, dataset and decoder: thousands at the paper's scale)."""
    try:
        df = pd.read_csv(io.StringIO(text), dtype={"recording": str, "condition": str, "dataset": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        return pd.DataFrame(), f"cannot be parsed ({type(e).__name__}: {e})"
    missing = [c for c in TABLE_COLUMNS if c not in df.columns]
    if missing:
        return pd.DataFrame(), f"lacks columns {missing} (has {list(df.columns)})"
    counts = {c: pd.to_numeric(df[c], errors="coerce") for c in COUNT_COLUMNS + ("wer",)}
    bad = np.zeros(len(df), dtype=bool)
    for c in COUNT_COLUMNS:
        bad |= counts[c].isna().to_numpy()
    if bad.any():
        return pd.DataFrame(), f"has non-numeric counts for recordings {df['recording'][bad].tolist()[:5]}"
    other = sorted(set(df["dataset"]) - {dataset})
    if other:
        return pd.DataFrame(), f"holds rows of other datasets {other}"
    cols: dict[str, object] = {"dataset": df["dataset"], "condition": _canonical_conditions(df),
                               "recording": df["recording"], **counts}
    for c in CUE_COLUMNS + TAIL_COLUMNS:
        cols[c] = pd.to_numeric(df[c], errors="coerce") if c in df.columns else \
            pd.Series(np.full(len(df), math.nan), index=df.index)
    cols["errors"] = counts["substitutions"] + counts["deletions"] + counts["insertions"]
    return pd.DataFrame(cols, index=df.index), ""


def _canonical_conditions(df: pd.DataFrame) -> pd.Series:
    """Canonical condition names, so that 'snr10.0' in a table matches the metric key 'snr10'; worked out once
    per distinct (condition, SNR) pair."""
    conditions = df["condition"].astype(str).tolist()
    snrs = pd.to_numeric(df["snr_db"], errors="coerce").tolist()
    canon: dict[tuple[str, float | None], str] = {}
    out = []
    for c, s in zip(conditions, snrs):
        key = (c, None if math.isnan(s) else s)  # NaN is no dict key
        name = canon.get(key)
        if name is None:
            name = canon[key] = CLEAN if c == CLEAN else condition_name(s if not math.isnan(s) else snr_of(c))
        out.append(name)
    return pd.Series(out, index=df.index, dtype="str")


def read_slot_table(text: str) -> tuple[pd.DataFrame, str]:
    """Parse one per-slot table (:data:`SLOT_COLUMNS`); returns (table, "") or (empty, why it is unusable).
    Conditions are made canonical as in the per-recording tables."""
    try:
        df = pd.read_csv(io.StringIO(text), dtype={"recording": str, "condition": str, "slot": str, "word": str,
                                                   "band": str, "kind": str, "hyp": str, "scoring": str},
                         keep_default_na=False, na_values={"snr_db": [""], "distance_s": [""]})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        return pd.DataFrame(), f"cannot be parsed ({type(e).__name__}: {e})"
    if "scoring" not in df.columns:  # written before the column: the moving-window scoring only
        df["scoring"] = AVERAGE
    df["scoring"] = df["scoring"].replace("", AVERAGE)
    for c in SLOT_COLUMNS[SLOT_COLUMNS.index("choice"):]:  # written before the forced choice: not scored
        if c not in df.columns:
            df[c] = ""
    missing = [c for c in SLOT_COLUMNS if c not in df.columns]
    if missing:
        return pd.DataFrame(), f"lacks columns {missing} (has {list(df.columns)})"
    df = df[list(SLOT_COLUMNS)].copy()
    for c in ("snr_db", "distance_s", "correct"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    if df["correct"].isna().any() or not df["correct"].isin([0, 1]).all():
        return pd.DataFrame(), "has a 'correct' cell that is not 0 or 1"
    df["condition"] = [CLEAN if c == CLEAN else condition_name(s if not math.isnan(s) else snr_of(c))
                       for c, s in zip(df["condition"], df["snr_db"])]
    df["correct"] = df["correct"].astype(int)
    return df, ""


def condition_summary(table: pd.DataFrame) -> dict[str, dict]:
    """Per condition of one eval table, in the order they first appear: recordings ``n``, corpus ``wer`` (percent)
    and duplicated recordings (those listed again under that condition), in one pass over the table."""
    codes, names = pd.factorize(table["condition"], sort=False)
    k = len(names)
    n = np.bincount(codes[codes >= 0], minlength=k)
    words = np.bincount(codes[codes >= 0], weights=table["ref_words"].to_numpy(dtype=float)[codes >= 0], minlength=k)
    errors = np.bincount(codes[codes >= 0], weights=table["errors"].to_numpy(dtype=float)[codes >= 0], minlength=k)
    dup = table.duplicated(["condition", "recording"]).to_numpy() & (codes >= 0)
    dups: dict[int, list] = {}
    for code, rec in zip(codes[dup], table["recording"].to_numpy()[dup]):
        dups.setdefault(int(code), []).append(rec)
    return {str(name): {"n": int(n[i]), "wer": 100.0 * float(errors[i]) / float(words[i]) if words[i] > 0
                        else math.nan, "dup": dups.get(i, [])} for i, name in enumerate(names)}


# ---- per-recording counts of one configuration, seed, dataset and condition ----------------------------------------

class RecordingCounts(Mapping[str, tuple[float, float]]):
    """``recording -> (errors, ref_words)`` of one seed, held as arrays: ``names`` (R,) and ``errors``, ``words``
    (R,) floats, the names and their positions shared by every seed that has the same recordings in the same order
    (at 3,000 runs a dict of tuples per seed took three times the memory). Reads as the dict it replaces."""

    __slots__ = ("names", "errors", "words", "_pos")
    # names -> (the one tuple of them every seed holds, name -> position)
    _shared: dict[tuple[str, ...], tuple[tuple[str, ...], dict[str, int]]] = {}

    def __init__(self, names: tuple[str, ...], errors: np.ndarray, words: np.ndarray) -> None:
        shared = RecordingCounts._shared.get(names)
        if shared is None:
            if len(RecordingCounts._shared) > 4096:  # a bound on what a long-lived process keeps
                RecordingCounts._shared.clear()
            shared = RecordingCounts._shared.setdefault(names, (names, {n: i for i, n in enumerate(names)}))
        self.names, self._pos = shared
        self.errors, self.words = errors, words

    def __getitem__(self, name: str) -> tuple[float, float]:
        i = self._pos[name]
        return float(self.errors[i]), float(self.words[i])

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def counts_by_seed(frame: pd.DataFrame, keys: Sequence[str], seed: str = "seed", name: str = "recording",
                   errors: str = "errors", words: str = "ref_words") -> dict[tuple, dict[int, Mapping[str, tuple[float,
                                                                                                          float]]]]:
    """``key -> seed -> recording -> (errors, ref_words)`` of ``frame``'s rows (``keys``: the columns of the key,
    such as configuration, dataset and condition), in the order the rows first show each key and seed. A recording
    listed twice under one key and seed keeps its last row's counts at its first place. Grouped on the columns as
    they are (categories stay codes), so a frame of millions of rows is not copied."""
    out: dict[tuple, dict[int, Mapping[str, tuple[float, float]]]] = {}
    if frame.empty:
        return out
    groups = frame.groupby([*keys, seed], sort=False, dropna=False, observed=True).indices
    names = frame[name].to_numpy()
    err = frame[errors].to_numpy(dtype=float)
    wrd = frame[words].to_numpy(dtype=float)
    for group, rows in sorted(groups.items(), key=lambda kv: kv[1][0]):
        *key, s = group
        recs = tuple(str(n) for n in names[rows])
        if len(set(recs)) == len(recs):
            counts: Mapping[str, tuple[float, float]] = RecordingCounts(recs, err[rows], wrd[rows])
        else:
            counts = {}
            for n, e, w in zip(recs, err[rows], wrd[rows]):
                counts[n] = (float(e), float(w))  # type: ignore[index]
        out.setdefault(tuple(key), {})[int(s)] = counts
    return out
