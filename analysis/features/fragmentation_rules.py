"""The verdict of the "Context or fragmentation" section (:mod:`analysis.features.fragmentation`): rules fixed before any
control was trained, as pure functions of the WERs and of whether the tests the rules read hold."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from analysis.display.render import fmt_num

# ---- the verdict's rules ----------------------------------------------------------------------------------------
# Fixed before any control was trained, and not to be tuned to what the controls show. G = WER(dense short) −
# WER(dense long), clean audio, per dataset: the gain to explain. Shares of G:
#   share_banded = (WER(banded) − WER(dense long)) / G   1: banding loses the whole gain; 0: it loses none
#   share_pauses = (WER(dense short) − WER(pause cuts)) / G   the share that removing cut losses recovers
#   share_edges  = (WER(dense long at short windows) − WER(dense long)) / G   what decoding edges cost (stated only)
# The banded model read is the one whose total receptive field (2 × each side) is nearest the short context.
# The tests the rules read (the gain; pause cuts against dense short) are one Holm family, the section's other tests
# (descriptive) another: with R recordings a sign-flip test's p is at least 2^(1 − R), so one family of every test
# (13 in the demo) could never reach alpha with the demo's 9 recordings, and the verdict would be "no gain" whatever
# the models did (:func:`power_lines` says when even the verdict's family cannot).
# A test "holds" when its Holm-adjusted p < alpha and its bootstrap interval of ΔWER, which resamples seeds as well
# as recordings, excludes 0.
CONTEXT_BANDED_MIN = 2 / 3  # "context used": share_banded ≥ this, and
CONTEXT_PAUSES_MAX = 1 / 3  # |share_pauses| ≤ this, and the test of pause cuts against dense short not holding
FRAGMENTATION_BANDED_MAX = 1 / 3  # "fragmentation": share_banded ≤ this, and
FRAGMENTATION_PAUSES_MIN = 1 / 2  # share_pauses ≥ this
VERDICT_FAMILY, OTHER_FAMILY = "verdict", "descriptive"
NO_GAIN, CONTEXT_USED, FRAGMENTATION, MIXED, UNDECIDED = (
    "no gain of context to explain", "context used", "fragmentation", "mixed", "undecided")


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads for one dataset (clean audio): WERs in percent, None where the model is missing;
    ``*_holds``: whether the test holds (None: not tested)."""

    wer_short: float | None = None  # dense, short context
    wer_long: float | None = None  # dense, long context
    gain_holds: bool | None = None  # dense long against dense short
    wer_banded: float | None = None
    banded_field_s: float | None = None  # total receptive field, 2 × each side
    wer_pauses: float | None = None
    pauses_holds: bool | None = None  # pause cuts against dense short
    wer_edges: float | None = None  # dense long decoded at short windows
    short_s: float = math.nan
    long_s: float = math.nan


@dataclass(frozen=True)
class Verdict:
    kind: str
    sentence: str
    gain: float | None = None
    share_banded: float | None = None
    share_pauses: float | None = None
    share_edges: float | None = None


def _all(*conditions: bool | None) -> bool | None:
    """Three-valued AND: False if any is False, None (unknown) if any is None, else True."""
    if any(c is False for c in conditions):
        return False
    return None if any(c is None for c in conditions) else True


def _rule(x: float | None, holds: Callable[[float], bool]) -> bool | None:
    return None if x is None else holds(x)


def decide(e: Evidence) -> Verdict:
    """The verdict for one dataset by the module's rules (pure; see the constants). Where a control is missing the
    verdict is reached if the rules decide without it, else it is :data:`UNDECIDED`, naming what is missing."""
    span = f"{e.short_s:g} → {e.long_s:g} s"
    missing_dense = [f"{c:g} s" if math.isfinite(c) else "a longer context"
                     for c, w in ((e.short_s, e.wer_short), (e.long_s, e.wer_long)) if w is None]
    if missing_dense:
        return Verdict(UNDECIDED, f"Verdict: undecided: no dense model at {' and '.join(missing_dense)}, so there "
                                  f"is no {span} gain to explain.")
    gain = e.wer_short - e.wer_long
    head = f"the {span} gain of {fmt_num(gain)} points (WER {fmt_num(e.wer_short)}% → {fmt_num(e.wer_long)}%)"
    if gain <= 0 or e.gain_holds is False:
        why = "is not positive" if gain <= 0 else "is not significant after Holm's correction (or not robust to seeds)"
        return Verdict(NO_GAIN, f"Verdict: {NO_GAIN}: {head} {why}.", gain)
    if e.gain_holds is None:
        return Verdict(UNDECIDED, f"Verdict: undecided: {head} could not be tested recording by recording.", gain)
    sb, sp, se = ((None if w is None else sign * (w - ref) / gain) for w, ref, sign in (
        (e.wer_banded, e.wer_long, 1), (e.wer_pauses, e.wer_short, -1), (e.wer_edges, e.wer_long, 1)))
    context_used = _all(_rule(sb, lambda x: x >= CONTEXT_BANDED_MIN), _rule(sp, lambda x: abs(x) <= CONTEXT_PAUSES_MAX),
                        None if e.pauses_holds is None else not e.pauses_holds)
    fragmentation = _all(_rule(sb, lambda x: x <= FRAGMENTATION_BANDED_MAX),
                         _rule(sp, lambda x: x >= FRAGMENTATION_PAUSES_MIN))
    kind = (CONTEXT_USED if context_used else FRAGMENTATION if fragmentation
            else MIXED if context_used is False and fragmentation is False else UNDECIDED)
    parts = []
    if sb is not None:
        field = f"a {e.banded_field_s:.2g} s field" if e.banded_field_s else "a short field"
        parts.append(f"banding attention to {field} (the window kept) " + (
            f"loses {100 * sb:.0f}%" if sb >= 0 else f"loses none of it and gains {-100 * sb:.0f}% of it more"))
    if sp is not None:
        parts.append(f"cutting at pauses recovers {100 * sp:.0f}%")
    if se is not None:
        parts.append(f"decoding at {e.short_s:g} s windows loses {100 * se:.0f}%")
    absent = [what for what, w in (("a banded model", e.wer_banded),
                                   (f"a pause-cut model at {e.short_s:g} s", e.wer_pauses),
                                   (f"decoding at {e.short_s:g} s windows", e.wer_edges)) if w is None]
    if kind == UNDECIDED:
        needed = [a for a in absent if not a.startswith("decoding")] or ["the pause-cut test"]
        text = f"Verdict: undecided: the rules need {' and '.join(needed)}, which this sweep lacks."
    else:
        text = f"Verdict: {kind}."
    text += f" Of {head}, " + (", ".join(parts) if parts else "no control measures a share") + "."
    if absent and kind != UNDECIDED:
        text += " Not measured: " + "; ".join(absent) + "."
    return Verdict(kind, text, gain, sb, sp, se)
