"""Reading a run's evaluation tables from their CSV text (:mod:`analysis.collect` fetches them): the per-recording
tables ``eval/<DATASET>[.<DECODER>].csv`` (:data:`~asr_core.contract.metrics.TABLE_COLUMNS`, with the optional cue and
tail counts) and the per-slot tables of the recall controls (:data:`~asr_core.contract.metrics.SLOT_COLUMNS`). Each
reader returns ``(table, "")`` or ``(empty, why it is unusable)``, which collect lists as a problem of the run;
conditions are made canonical (``snr10.0`` -> ``snr10``) so that a table matches its run's metric keys."""

from __future__ import annotations

import io
import math

import pandas as pd

from asr_core.contract.metrics import (AVERAGE, CLEAN, CUE_COLUMNS, SLOT_COLUMNS, TABLE_COLUMNS, TAIL_COLUMNS,
                                     condition_name, snr_of)

COUNT_COLUMNS = ("ref_words", "substitutions", "deletions", "insertions", "hyp_words")


def read_table(text: str, dataset: str) -> tuple[pd.DataFrame, str]:
    """Parse one eval CSV; returns (table, "") or (empty, why it is unusable)."""
    try:
        df = pd.read_csv(io.StringIO(text), dtype={"recording": str, "condition": str, "dataset": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        return pd.DataFrame(), f"cannot be parsed ({type(e).__name__}: {e})"
    missing = [c for c in TABLE_COLUMNS if c not in df.columns]
    if missing:
        return pd.DataFrame(), f"lacks columns {missing} (has {list(df.columns)})"
    cue = {c: pd.to_numeric(df[c], errors="coerce") if c in df.columns else math.nan
           for c in CUE_COLUMNS + TAIL_COLUMNS}
    df = df[list(TABLE_COLUMNS)].assign(**cue)
    for c in COUNT_COLUMNS + ("wer",):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    bad = df[df[list(COUNT_COLUMNS)].isna().any(axis=1)]
    if len(bad):
        return pd.DataFrame(), f"has non-numeric counts for recordings {bad['recording'].tolist()[:5]}"
    other = sorted(set(df["dataset"]) - {dataset})
    if other:
        return pd.DataFrame(), f"holds rows of other datasets {other}"
    # canonical condition names, so that 'snr10.0' in a table matches the metric key 'snr10'
    snr = pd.to_numeric(df["snr_db"], errors="coerce")
    keys = df["condition"].astype(str) + "|" + snr.astype(str)  # NaN is no dict key: compare as text
    canon = {}
    for key, c, s in zip(keys, df["condition"].astype(str), snr):
        if key not in canon:
            canon[key] = CLEAN if c == CLEAN else condition_name(s if not math.isnan(s) else snr_of(c))
    df["condition"] = keys.map(canon)
    df["errors"] = df["substitutions"] + df["deletions"] + df["insertions"]
    return df.drop(columns=["snr_db"]), ""


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
    """Per condition of one eval table: recordings ``n``, corpus ``wer`` (percent) and duplicated recordings."""
    out = {}
    for cond, part in table.groupby("condition", sort=False):
        words = float(part["ref_words"].sum())
        rec = part["recording"]
        out[str(cond)] = {"n": len(part), "wer": 100.0 * float(part["errors"].sum()) / words if words > 0 else math.nan,
                          "dup": rec[rec.duplicated()].tolist()}
    return out
