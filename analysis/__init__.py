"""Analysis of a sweep read from MLflow: WER, WERR against the baseline context, significance tests with the
recording as the unit, noise-robustness tables and the paper's figures, written as one report folder.

    python -m analysis report SWEEP [--tracking-uri URI] --out DIR [--baseline-context-s 10.24]
    python -m analysis compare SWEEP A B [--tracking-uri URI] [--dataset D] [--snr DB]

Modules: ``collect`` (MLflow -> tidy DataFrames), ``werr`` (tables and comparisons), ``stats`` (pure tests),
``plots`` (figures 1-5), ``decoders`` (greedy against beam+LM decoding, perplexity against LM context), ``heads``
(head similarity against context beside WER), ``report`` (HTML, Markdown, CSV, PNG), ``dashboard`` (the report in
the MLflow dashboard).
"""
