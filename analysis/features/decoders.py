"""Beam decoders against greedy decoding (paper 004 Table 6), and LM perplexity against LM context (Table 5).

A beam decoder ``D`` decodes a finished trial's posteriors again (``python -m orchestrate evaluate SWEEP --decode
FILE``); its results sit in the trial's run beside the greedy ones (:mod:`analysis.ledger.collect`). Each configuration
that has them is compared with its own greedy decoding on each dataset and condition:

* WER of each decoder as the mean over seeds of the corpus WER, over the seeds that both decoders have (the greedy
  WER of seeds without the decoder would compare other models);
* WERR against greedy, ``100 * (WER_greedy - WER_D) / WER_greedy`` (positive: the beam decoder is better);
* the project's paired test with the recording as the unit (:func:`analysis.significance.stats.compare`: per recording the error
  counts averaged over those seeds, a sign-flip permutation test of ΔWER; bootstrap intervals that draw each seed
  for both decoders at once, as both decode one trained model), its p-values Holm-corrected together across the
  whole table (every configuration, dataset, condition and decoder).

A decoder is labelled by what its tag ``eval.decoder.<D>`` says: ``LM <N> tok`` for an LM with ``lm_context`` N,
``beam, no LM`` without one, its name when the tag is missing; names are appended where labels would coincide.

Perplexity: ``lm_ppl/<dataset>/ctx<N>`` of LM runs (:attr:`analysis.ledger.collect.Sweep.lm_ppl`), one row per LM and
dataset, one column per LM context, with the decoders that use each LM.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.significance import stats
from analysis.ledger.collect import Sweep, greedy_rows
from analysis.display.render import fmt_num, fmt_p
from analysis.significance.werr import format_seconds, recording_index, stable_seed, verdict
from asr_core.contract.metrics import CLEAN

NO_LM = "none"  # the tag's lm when the beam search ran without an LM (asr_core.evaluation.decoders.beam_decoding)

COMPARISON_COLUMNS = [
    "series", "series_id", "config", "config_id", "context_s", "dataset", "condition", "snr_db", "decoder", "label",
    "lm_context", "seeds", "n_seeds", "wer_greedy", "wer", "werr", "delta_wer", "delta_lo", "delta_hi", "werr_lo",
    "werr_hi", "n_recordings", "p_permutation", "permutation", "p_holm", "significant", "verdict", "note"]
SETTINGS_COLUMNS = ["decoder", "label", "lm", "lm_run", "lm_name", "lm_context", "alpha", "beta", "beam_width",
                    "prompt", "runs", "differs"]


# ---- what each decoder is ------------------------------------------------------------------------------------

def decoder_settings(sweep: Sweep) -> pd.DataFrame:
    """One row per beam decoder of the sweep (:data:`SETTINGS_COLUMNS`), without an LM first, then by LM context:
    its settings as the first run's tag says (``lm_context`` NaN without an LM), its label, the runs decoded, and
    ``differs``: the settings in which its runs' tags disagree (one name should be one setting; ``orchestrate
    evaluate`` refuses otherwise, a standalone ``evaluate`` does not)."""
    names = sweep.beam_decoders
    if not names:
        return pd.DataFrame(columns=SETTINGS_COLUMNS)
    dec = sweep.decoders
    lm_names = dict(zip(sweep.lm_ppl["lm_run"], sweep.lm_ppl["lm_name"]))
    rows = []
    for name in names:
        mine = dec[dec["decoder"] == name]
        first = mine.iloc[0].to_dict() if len(mine) else {}
        parsed = [json.loads(t) if t else {} for t in mine["settings"]]
        keys = sorted({k for p in parsed for k in p})
        differs = [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in parsed}) > 1]
        lm = str(first.get("lm", ""))
        has_lm = bool(lm) and lm != NO_LM
        lm_run = str(first.get("lm_run", "")) if has_lm else ""
        rows.append({"decoder": name, "label": "", "lm": lm, "lm_run": lm_run, "lm_name": lm_names.get(lm_run, ""),
                     "lm_context": _int(first.get("lm_context")) if has_lm else math.nan,
                     "alpha": first.get("alpha", ""), "beta": first.get("beta", ""),
                     "beam_width": first.get("beam_width", ""), "prompt": first.get("prompt", ""),
                     "runs": int(mine["run_id"].nunique()), "differs": ", ".join(differs)})
    out = pd.DataFrame(rows, columns=SETTINGS_COLUMNS)
    out["label"] = _labels(out)
    order = [(r["lm"] not in ("", NO_LM), r["lm"] != NO_LM, r["lm_context"] if math.isfinite(r["lm_context"])
              else -1.0, r["decoder"]) for _, r in out.iterrows()]
    return out.iloc[sorted(range(len(out)), key=order.__getitem__)].reset_index(drop=True)


def _int(value: Any) -> float:
    try:
        return float(int(str(value)))
    except (TypeError, ValueError):
        return math.nan


def _labels(settings: pd.DataFrame) -> list[str]:
    """``LM 1024 tok`` / ``beam, no LM`` / the decoder's name; the LM's run name (or checkpoint) where the decoders
    use several LMs, and ``[name]`` appended to labels several decoders share."""
    lms = {r["lm"] for _, r in settings.iterrows() if r["lm"] and r["lm"] != NO_LM}
    base = []
    for _, r in settings.iterrows():
        if r["lm"] == NO_LM:
            base.append("beam, no LM")
        elif r["lm"] and math.isfinite(r["lm_context"]):
            base.append(f"LM {int(r['lm_context'])} tok" + (f" ({r['lm_name'] or r['lm']})" if len(lms) > 1 else ""))
        else:
            base.append(r["decoder"])
    return [b if base.count(b) == 1 or b == d else f"{b} [{d}]" for b, d in zip(base, settings["decoder"])]


# ---- the comparison with greedy ------------------------------------------------------------------------------

def decoder_table(sweep: Sweep, *, alpha: float = 0.05, level: float = 0.95,
                  bootstrap_resamples: int = stats.BOOTSTRAP_RESAMPLES) -> pd.DataFrame:
    """Every configuration, dataset, condition and beam decoder against greedy decoding (:data:`COMPARISON_COLUMNS`;
    see the module docstring). Empty when the sweep has no beam decoder."""
    settings = decoder_settings(sweep)
    if settings.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    greedy = greedy_rows(sweep.wer)
    g_wer = {(c, d, k, int(s)): w for c, d, k, s, w in
             zip(greedy["config_id"], greedy["dataset"], greedy["condition"], greedy["seed"], greedy["wer"])}
    g_index = recording_index(sweep)
    rows: list[dict[str, Any]] = []
    for _, dec in settings.iterrows():
        d_rows = greedy_rows(sweep.wer, dec["decoder"])
        d_index = recording_index(sweep, dec["decoder"])
        for (cid, ds, cond), grp in d_rows.groupby(["config_id", "dataset", "condition"], sort=True):
            first = grp.iloc[0]
            seeds = sorted(int(s) for s in grp["seed"] if (cid, ds, cond, int(s)) in g_wer)
            row = {"series": first["series"], "series_id": first["series_id"], "config": first["config"],
                   "config_id": cid, "context_s": first["context_s"], "dataset": ds, "condition": cond,
                   "snr_db": first["snr_db"], "decoder": dec["decoder"], "label": dec["label"],
                   "lm_context": dec["lm_context"], "seeds": ",".join(map(str, seeds)), "n_seeds": len(seeds),
                   "p_permutation": math.nan, "note": ""}
            if not seeds:  # e.g. a dataset the decode file added: the trial never decoded it greedily
                rows.append({**row, "wer": float(grp["wer"].mean()), "n_seeds": int(grp["seed"].nunique()),
                             "seeds": ",".join(str(int(x)) for x in sorted(grp["seed"])),
                             "note": "no greedy result on this dataset and condition: the decoder's WER alone"})
                continue
            notes = []
            lone = sorted(set(int(s) for s in grp["seed"]) - set(seeds))
            if lone:
                notes.append(f"seeds {lone} have no greedy result here and are left out")
            mine = grp[grp["seed"].isin(seeds)]
            row["wer"] = float(mine["wer"].mean())
            row["wer_greedy"] = float(np.mean([g_wer[(cid, ds, cond, s)] for s in seeds]))
            row["werr"] = stats.werr(row["wer_greedy"], row["wer"])
            row["delta_wer"] = row["wer"] - row["wer_greedy"]
            a = g_index.get((cid, ds, cond), {})
            b = d_index.get((cid, ds, cond), {})
            both = sorted(set(seeds) & set(a) & set(b))
            if len(both) < len(seeds):
                missing = sorted(set(seeds) - set(both))
                notes.append(f"not tested: per-recording tables missing for seeds {missing} (see the problems "
                             f"table)" if not both else
                             f"the test leaves out seeds {missing}, whose per-recording tables are missing")
            if both:
                a, b = {s: a[s] for s in both}, {s: b[s] for s in both}
                try:
                    pc = stats.pair_counts(a, b, name_a=f"{first['config']} greedy on {ds}/{cond}",
                                           name_b=f"{first['config']} {dec['decoder']} on {ds}/{cond}")
                    res = stats.compare(pc, level=level, bootstrap_resamples=bootstrap_resamples,
                                        seed=stable_seed(cid, dec["decoder"], ds, cond), shared_seeds=True)
                except stats.PairingError as e:
                    notes.append(f"not tested: {e}")
                else:
                    row.update({"n_recordings": res.n_recordings, "delta_lo": res.delta_ci[0],
                                "delta_hi": res.delta_ci[1], "werr_lo": res.werr_ci[0], "werr_hi": res.werr_ci[1],
                                "p_permutation": res.permutation.pvalue,
                                "permutation": "exact" if res.permutation.exact else
                                f"{res.permutation.resamples} random sign flips"})
            row["note"] = "; ".join(notes)
            rows.append(row)
    out = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    out["p_holm"] = stats.holm(out["p_permutation"].to_numpy(dtype=float))
    out["significant"] = [bool(p < alpha) if np.isfinite(p) else None for p in out["p_holm"]]
    out["verdict"] = [verdict(r, alpha) for r in out.to_dict("records")]
    return out.sort_values(["dataset", "snr_db", "series", "context_s", "lm_context", "decoder"],
                           na_position="first").reset_index(drop=True)


# ---- what the report shows -----------------------------------------------------------------------------------

def _mark(significant: Any) -> str:
    return {True: "sig.", False: "n.s."}.get(significant, "untested")


def table6_pivots(table: pd.DataFrame, settings: pd.DataFrame, greedy_wer: pd.DataFrame
                  ) -> list[tuple[str, pd.DataFrame]]:
    """Per dataset and condition, Table 6's layout: rows = acoustic context (and series where the decoded
    configurations span several), columns = greedy, then each decoder by its label; a decoder's cell is
    ``WER (WERR vs greedy %, sig./n.s./untested)``, or ``WER (no greedy)``. ``greedy_wer``:
    :func:`analysis.significance.werr.wer_table` (the greedy column is the configuration's WER over all its seeds, as in the WER
    table)."""
    if table.empty:
        return []
    labels = list(settings["label"])
    several = table["series_id"].nunique() > 1
    out = []
    for (ds, cond), grp in table.groupby(["dataset", "condition"], sort=False):
        index = ["series", "context_s"] if several else ["context_s"]
        keys = grp.drop_duplicates("config_id").sort_values(index)
        g = greedy_wer[(greedy_wer["dataset"] == ds) & (greedy_wer["condition"] == cond)]
        g = dict(zip(g["config_id"], g["wer_mean"]))
        rows = []
        for _, k in keys.iterrows():
            row = {"series": k["series"]} if several else {}
            row.update({"context": format_seconds(k["context_s"]), "config": k["config"],
                        "greedy": f"{g[k['config_id']]:.2f}" if k["config_id"] in g else "–"})
            mine = grp[grp["config_id"] == k["config_id"]].set_index("label")
            for lab in labels:
                if lab not in mine.index or not math.isfinite(mine.loc[lab, "wer"]):
                    row[lab] = "–"
                    continue
                r = mine.loc[lab]
                if not math.isfinite(r["wer_greedy"]):
                    row[lab] = f"{r['wer']:.2f} (no greedy)"
                    continue
                werr = f"{r['werr']:+.1f}%" if math.isfinite(r["werr"]) else "WERR –"  # greedy at 0% has none
                row[lab] = f"{r['wer']:.2f} ({werr}, {_mark(r['significant'])})"
            rows.append(row)
        title = ds if cond == CLEAN else f"{ds}, music at {grp['snr_db'].iloc[0]:g} dB"
        out.append((title, pd.DataFrame(rows)))
    return out


def context_gains(table: pd.DataFrame) -> list[str]:
    """Table 6's point in words: per LM decoder, dataset (clean) and series with two or more acoustic contexts, the
    relative reduction against greedy at the shortest and at the longest acoustic context. A difference of two
    gains: reported, not tested."""
    out = []
    lm = table[table["lm_context"].notna() & (table["condition"] == CLEAN) & table["werr"].notna()]
    lm = lm.sort_values(["lm_context", "label", "dataset", "series"])
    for (label, ds, series), grp in lm.groupby(["label", "dataset", "series"], sort=False):
        if grp["context_s"].nunique() < 2:
            continue
        grp = grp.sort_values("context_s")
        short, long = grp.iloc[0], grp.iloc[-1]
        more = "more" if long["werr"] > short["werr"] else "less" if long["werr"] < short["werr"] else "as much"
        out.append(f"{label} on {ds}" + (f" ({series})" if lm["series_id"].nunique() > 1 else "")
                   + f": WERR against greedy {short['werr']:+.1f}% with {format_seconds(short['context_s'])} of "
                   f"acoustic context ({short['wer_greedy']:.2f}% → {short['wer']:.2f}%), {long['werr']:+.1f}% with "
                   f"{format_seconds(long['context_s'])} ({long['wer_greedy']:.2f}% → {long['wer']:.2f}%): the "
                   f"longer-context model gains {more} from the LM (a difference of gains, not tested)")
    return out


# ---- perplexity ----------------------------------------------------------------------------------------------

def ppl_table(sweep: Sweep, settings: pd.DataFrame | None = None) -> pd.DataFrame:
    """LM × dataset rows, one column per LM context (``ctx<N>``, per-token perplexity), and ``decoders``: the labels
    of the sweep's decoders that use the LM (``settings``: :func:`decoder_settings`)."""
    ppl = sweep.lm_ppl
    if ppl.empty:
        return pd.DataFrame()
    settings = decoder_settings(sweep) if settings is None else settings
    users: dict[str, list[str]] = {}
    for run, label in zip(settings["lm_run"], settings["label"]):
        if run:
            users.setdefault(run, []).append(label)
    pv = ppl.pivot_table(index=["lm_name", "lm_run", "dataset"], columns="lm_context", values="ppl", aggfunc="first")
    pv = pv[sorted(pv.columns)].round(3)
    pv.columns = [f"ctx{c}" for c in pv.columns]
    pv = pv.reset_index()
    pv.insert(3, "decoders", [", ".join(users.get(r, [])) or "–" for r in pv["lm_run"]])
    pv["lm_run"] = pv["lm_run"].str[:8]
    return pv.rename(columns={"lm_name": "LM", "lm_run": "run"})


def ppl_sentences(sweep: Sweep) -> list[str]:
    """Per LM and dataset: perplexity at the shortest and the longest LM context measured."""
    out = []
    for (name, run, ds), grp in sweep.lm_ppl.groupby(["lm_name", "lm_run", "dataset"], sort=True):
        if grp["lm_context"].nunique() < 2:
            continue
        grp = grp.sort_values("lm_context")
        a, b = grp.iloc[0], grp.iloc[-1]
        change = stats.werr(a["ppl"], b["ppl"])  # the same relative change as WERR
        way = "falls" if b["ppl"] < a["ppl"] else "does not fall"
        out.append(f"{name} on {ds}: perplexity {way} from {a['ppl']:.2f} at {int(a['lm_context'])} tokens of "
                   f"context to {b['ppl']:.2f} at {int(b['lm_context'])} ({-change:+.1f}%)")
    return out


# ---- as the report shows them ---------------------------------------------------------------------------------

def decoder_display(table: pd.DataFrame) -> pd.DataFrame:
    """Every decoder comparison with its p-values and intervals."""
    return pd.DataFrame({
        "dataset": table["dataset"], "condition": table["condition"], "config": table["config"],
        "decoder": table["label"], "seeds": table["seeds"], "WER greedy": table["wer_greedy"].map(fmt_num),
        "WER": table["wer"].map(fmt_num), "WERR %": [fmt_num(x, 1, True) for x in table["werr"]],
        "WERR CI": [f"[{fmt_num(a, 1, True)}, {fmt_num(b, 1, True)}]" for a, b in zip(table["werr_lo"],
                                                                                       table["werr_hi"])],
        "ΔWER": [fmt_num(x, 2, True) for x in table["delta_wer"]],
        "p perm": table["p_permutation"].map(fmt_p), "p Holm": table["p_holm"].map(fmt_p),
        "verdict": table["verdict"], "note": table["note"]})


def settings_display(settings: pd.DataFrame) -> pd.DataFrame:
    """Each beam decoder's settings as the report shows them."""
    return pd.DataFrame({
        "decoder": settings["decoder"], "column": settings["label"],
        "LM": [n or (Path(lm).parent.name + "/" + Path(lm).name if lm and lm != NO_LM else lm or "?")
               for n, lm in zip(settings["lm_name"], settings["lm"])],
        "LM context": [f"{int(c)}" if math.isfinite(c) else "–" for c in settings["lm_context"]],
        "alpha": settings["alpha"], "beta": settings["beta"], "beam width": settings["beam_width"],
        "prompt": [Path(p).name if p else "–" for p in settings["prompt"]], "runs": settings["runs"]})
