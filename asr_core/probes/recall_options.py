"""The options of ``python -m asr_core recall`` that the command line (:mod:`asr_core.probes.recall_args`) checks
before torch is imported and the scoring (:mod:`asr_core.probes.recall`) uses: the key edits and the window's
seconds. Pure, and light to import.
"""

from __future__ import annotations

import math

from asr_core.contract.metrics import RECALL_KEY_EDITS

RECALL_DIR = "recall"  # the tables' folder beside a checkpoint
AS_IS = "as-is"  # the recording as it is: no key edit
KEYS = (AS_IS, *RECALL_KEY_EDITS)
MIN_WINDOW_S = 2.56  # a window holds its slot's code word and RIGHT_S (1 s) after it


def parse_keys(text: str) -> tuple[str, ...]:
    """``"as-is,swap"`` -> ``("as-is", "swap")``; ValueError naming the valid ones."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in keys if k not in KEYS]
    if bad or not keys:
        raise ValueError(f"--key {text!r}: a comma-separated list of {', '.join(KEYS)}")
    return tuple(dict.fromkeys(keys))


def check_window(window_s: float | None) -> None:
    """ValueError unless ``window_s`` is None (the model's context) or a finite number of seconds of at least
    :data:`MIN_WINDOW_S`."""
    if window_s is not None and not (math.isfinite(window_s) and window_s >= MIN_WINDOW_S):
        raise ValueError(f"--window-s {window_s:g}: a number of seconds of at least {MIN_WINDOW_S:g} (the window "
                         "each slot is decoded from holds the code word and 1 s after it; default the model's "
                         "context)")
