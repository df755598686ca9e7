"""WER, WERR and every comparison with a baseline: the tests and intervals (:mod:`.stats`, pure functions), the
comparisons over every core (:mod:`.pool`) and the tables of WER, WERR and significance (:mod:`.werr`)."""
