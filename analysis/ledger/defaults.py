"""The analysis's defaults that its command line shows, in a module that imports nothing (the command line of
``python -m analysis`` is built, for ``--help`` and for shell completion, without numpy, scipy or pandas)."""

BOOTSTRAP_RESAMPLES = 2_000  # bootstrap resamples of a confidence interval (analysis.significance.stats)
DEFAULT_BASELINE_CONTEXT_S = 10.24  # the context WERR is measured against (analysis.significance.werr)
