"""The sweep as the report reads it: runs fetched from MLflow (:mod:`.fetch`, with the tables cache :mod:`.cache`),
gathered into a :class:`~analysis.ledger.collect.Sweep` of tidy frames (:mod:`.collect`, :mod:`.tables`), named
(:mod:`.naming`), with the report's defaults (:mod:`.defaults`)."""
