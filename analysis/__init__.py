"""Analysis of a sweep read from MLflow: WER, WERR against the baseline context, significance tests with the
recording as the unit, noise-robustness tables and the paper's figures, written as one report folder.

    python -m analysis report SWEEP [--tracking-uri URI] --out DIR [--baseline-context-s 10.24]
    python -m analysis compare SWEEP A B [--tracking-uri URI] [--dataset D] [--snr DB]
    python -m analysis bench [--runs 321 --runs 3000]

Folders, each reading only those after it: ``document`` (the report: its sections and the paper's finding checks),
``features`` (one module per paper feature: cue, tail, recall, fusion, heads, fragmentation, decoders, error
types), ``display`` (tables as text, Markdown and HTML; the figures), ``significance`` (the tests, the comparisons
over every core, WER and WERR tables), ``ledger`` (MLflow -> tidy DataFrames, the tables cache, names). Beside
them: ``memo`` (a report copied when nothing changed), ``bench`` and ``bench_ledger`` (the report timed at the
paper's scale), ``dashboard`` (the report in the MLflow dashboard).
"""
