"""Text scoring: the normaliser, WER counts and marked words (:mod:`asr_core.scoring.score`), and paper 002's tail
words (:mod:`asr_core.scoring.tail`). Read by the evaluation, the LM and the probes; imports none of them."""
