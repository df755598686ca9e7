"""The word scorers of an evaluation, each a plug-in (:mod:`asr_core.evaluation.registry`): the protocol with the WER
and cue scorers (:mod:`~asr_core.evaluation.scorers.base`), the tail words of paper 002
(:mod:`~asr_core.evaluation.scorers.tail`), and the recall plant's slots (:mod:`~asr_core.evaluation.scorers.recall`,
scored by :mod:`~asr_core.evaluation.scorers.slots` and, one window per slot, :mod:`~asr_core.evaluation.scorers.
slot_window`). They read down into :mod:`asr_core.scoring` and the contracts, never up into the evaluation."""
