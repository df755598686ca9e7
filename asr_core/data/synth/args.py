"""The options of ``python -m asr_core synth`` (:mod:`asr_core.data.synth.generate`, which validates them and
makes the corpus), defined without the audio side so that they parse in a fraction of a second."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from asr_core.contract.options import positional_alias
from asr_core.data.synth.text import CUE_GROUPS


def parser(description: str, splits: Sequence[str], shifts: Sequence[str]) -> argparse.ArgumentParser:
    """The command's parser; ``splits`` and ``shifts``: the corpus's splits and test-shifted domains (synth's)."""
    ap = argparse.ArgumentParser(prog="python -m asr_core synth", description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output folder (required; see the layout below)")
    positional_alias(ap, "out", "--out")
    ap.add_argument("--hours", type=float, required=True, help="hours of training audio (fractions allowed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-hours", type=float, default=None,
                    help="hours in each of dev, test, test-shifted (default max(0.1, hours/10))")
    ap.add_argument("--min-minutes", type=float, default=1.0)
    ap.add_argument("--max-minutes", type=float, default=5.0)
    ap.add_argument("--eval-max-minutes", type=float, default=None,
                    help="cap on the length of dev/test/test-shifted recordings (default --max-minutes): shorter "
                         "evaluation recordings give a paired test more of them")
    ap.add_argument("--eval-min-minutes", type=float, default=None,
                    help="shortest dev/test/test-shifted recording (default min(--min-minutes, --eval-max-minutes)): "
                         "longer ones hold more window edges; positive, at most --eval-max-minutes")
    ap.add_argument("--shift", choices=shifts, default="far",
                    help="test-shifted domain: far = unseen accents and voices (default); near = the training "
                         "voices at unseen rates and pitches, in unseen rooms (for corpora made with --voices)")
    ap.add_argument("--meeting-fraction", type=float, default=0.3, help="share of two-voice meetings")
    ap.add_argument("--voices", type=int, default=0,
                    help="limit train/dev/test to this many espeak-ng voices (0 = all 21); test-shifted is unchanged")
    ap.add_argument("--cue", default="0", metavar="RATE[,NEAR-FAR][,gK]",
                    help="plant a long-range cue: RATE homophones a minute spelt by the recording's topic, the "
                         "nearest word giving the topic away NEAR-FAR seconds before each (default 20-60) and none "
                         f"within NEAR seconds after; gK: only the first K of the {len(CUE_GROUPS)} homophone "
                         "groups, every recording's topic one that owns a spelling in them (e.g. 10,2-6,g2: a "
                         "concentrated plant); 0 (default) = none, the corpus as without this option")
    ap.add_argument("--recall", default="0", metavar="RATE",
                    help="plant a masked-recall control: a code word said clearly (\"the code word is X\"), then "
                         "asked for RATE times a minute (4-6 recommended) with its audio masked by pink noise, half "
                         "1-4 s and half 20-60 s after the latest clear mention, with unmasked and no-key controls "
                         "(see asr_core.data.synth.recall); 0 (default) = none, the corpus as without this option")
    ap.add_argument("--copy", default=None, metavar="BANDS",
                    help="plant the copy control instead (not with --recall or --cue): near = a one-piece identity "
                         "token said clearly, then masked 1-3 s later inside one 5.12 s cell, in every other cell; "
                         "near,far = also, in every other 81.92 s block, a key asked for 20-60 s later in the same "
                         "block, 2-3 slots each (near,far:LO-HI: LO to HI slots, at most 8; see "
                         "asr_core.data.synth.copy_plant); absent (default) = none")
    ap.add_argument("--cue-report", action="store_true",
                    help="print, per split, how often a window of 5/10/20/40/80 s holds a disambiguating word with "
                         "each cue word")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes (output does not depend on it)")
    ap.add_argument("--splits", default=",".join(splits), help=f"comma-separated subset of {','.join(splits)}")
    return ap
