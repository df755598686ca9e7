"""The report itself: :func:`~analysis.document.report.build_report` assembles the WER, WERR and significance
sections, the paper's finding checks (:mod:`.finding`) and every registered optional section (:mod:`.sections`) into
one folder."""
