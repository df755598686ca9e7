"""The command line of the synthetic corpus, ``python -m asr_core synth`` (:mod:`asr_core.data.synth.generate`
makes the corpus; :mod:`asr_core.data.synth.args` defines the options): validates the options, refuses what
does not go together (one line naming the option, exit 2), makes the corpus and prints a summary per split."""

from __future__ import annotations

import sys
from pathlib import Path

from asr_core.contract.options import take_positional
from asr_core.data.synth import generate as synth
from asr_core.data.synth.cues import WINDOWS_S, CueConfig, containment, corpus_sites, format_containment
from asr_core.data.synth.generate import DOMAINS, SHIFTS, SPLITS, domain_voices, synthesise
from asr_core.data.synth.args import parser
from asr_core.data.synth.pool import Interrupted
from asr_core.contract.command import EXIT_INTERRUPTED


def cli(argv: list[str]) -> int:
    ap = parser(str(synth.__doc__).split("\n\n")[0], SPLITS, SHIFTS)
    a = ap.parse_args(argv)
    take_positional(ap, a, "out", "--out")
    a.out = Path(a.out)
    splits = tuple(s for s in a.splits.split(",") if s)
    bad = [s for s in splits if s not in SPLITS]
    if bad:
        ap.error(f"--splits: unknown split {bad[0]!r}; valid: {', '.join(SPLITS)}")
    if not a.hours > 0 or (a.eval_hours is not None and not a.eval_hours > 0):
        ap.error("--hours and --eval-hours must be positive")
    if not 0 < a.min_minutes <= a.max_minutes:
        ap.error("--min-minutes must be positive and at most --max-minutes")
    if a.eval_max_minutes is not None and not a.eval_max_minutes > 0:
        ap.error(f"--eval-max-minutes must be positive, got {a.eval_max_minutes}")
    top = a.max_minutes if a.eval_max_minutes is None else a.eval_max_minutes
    if a.eval_min_minutes is not None and not 0 < a.eval_min_minutes <= top:
        ap.error(f"--eval-min-minutes must be positive and at most --eval-max-minutes ({top:g}"
                 f"{', from --max-minutes' if a.eval_max_minutes is None else ''}), got {a.eval_min_minutes:g}")
    if not 0 <= a.meeting_fraction <= 1:
        ap.error("--meeting-fraction must be in [0, 1]")
    n_voices = len(domain_voices(DOMAINS["in"]))
    if not 0 <= a.voices <= n_voices:
        ap.error(f"--voices must be 0 (all) or 1..{n_voices}, got {a.voices}")
    try:
        cue = CueConfig.parse(a.cue)
    except ValueError as e:
        ap.error(f"--cue: {e}")
    from asr_core.data.synth.recall import RecallConfig

    try:
        recall = RecallConfig.parse(a.recall)
    except ValueError as e:
        ap.error(f"--recall: {e}")
    from asr_core.data.synth.copy_plant import CopyConfig

    copy = None
    if a.copy is not None:
        try:
            copy = CopyConfig.parse(a.copy)
        except ValueError as e:
            ap.error(f"--copy: {e}")
        if recall.active or cue.active:
            ap.error(f"--copy: not with {'--recall' if recall.active else '--cue'} (the copy plant fills the "
                     "recording's cells itself); give --copy alone, or --recall/--cue without --copy")
    slotted = recall.active or copy is not None
    try:
        summary = synthesise(a.out, a.hours, a.seed, eval_hours=a.eval_hours, min_minutes=a.min_minutes,
                             max_minutes=a.max_minutes, meeting_fraction=a.meeting_fraction, jobs=a.jobs,
                             splits=splits, voices=a.voices, shift=a.shift, eval_max_minutes=a.eval_max_minutes,
                             cue=cue, recall=recall, eval_min_minutes=a.eval_min_minutes, copy=copy)
    except Interrupted as e:  # Ctrl-C while rendering: one line on what is left, 130
        print(e.line(), file=sys.stderr)
        return EXIT_INTERRUPTED
    cued = cue.active
    print(f"{'split':14s} {'recordings':>10s} {'hours':>7s} {'words':>7s}{' cue words  a minute' if cued else ''}"
          f"{'     slots  a minute' if slotted else ''}  spec")
    for s, d in summary.items():
        planted = f"{d['cue_words']:10d} {d['cue_words'] / max(d['hours'] * 60, 1e-9):9.2f}" if cued else ""
        if slotted:
            planted += f"{d['recall_slots']:10d} {d['recall_slots'] / max(d['hours'] * 60, 1e-9):9.2f}"
        print(f"{s:14s} {d['recordings']:10d} {d['hours']:7.3f} {d['words']:7d}{planted}  {d['spec']}")
    if a.cue_report:
        print()
        print(cue_report(a.out, splits))
    return 0


def cue_report(out: Path, splits: tuple[str, ...] = SPLITS, windows_s: tuple[float, ...] = WINDOWS_S) -> str:
    """For each split of the corpus in ``out``: how often a window of each length holds a disambiguating word with
    the cue word (:func:`asr_core.data.synth.cues.containment`); ``before``: the window ends at the cue word,
    ``placed``: the mean over the window's placements around the cue word, as moving-window decoding averages them."""
    parts = ["planted cue: share of cue words whose disambiguating word a window holds (before: a window ending at "
             "the cue word; placed: the mean over the window's placements around it)"]
    for s in splits:
        rows = containment(corpus_sites(out / s), windows_s)
        if not rows or rows[0]["cue_words"] == 0:
            parts.append(f"{s}: no planted words")
            continue
        parts.append(format_containment(rows, title=f"{s}:"))
    return "\n\n".join(parts)
