"""MLflow as the sweep's ledger, a mirror of the trial folders: its experiment and runs
(:mod:`~orchestrate.ledger.ledger`), where it lives (:mod:`~orchestrate.ledger.store`), the REST API a server is
spoken to through (:mod:`~orchestrate.ledger.mlflow_rest`), one cheap probe of it (:mod:`~orchestrate.ledger.probe`)
and bringing it in line with the trial folders (:mod:`~orchestrate.ledger.reconcile`). It reads the sweep folder,
nothing above it."""
