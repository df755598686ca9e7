"""What a sweep is asked to do, read and checked before anything runs: grid files → trials
(:mod:`~orchestrate.plan.grid_file`, :mod:`~orchestrate.plan.grid`, :mod:`~orchestrate.plan.grid_reference`),
evaluation jobs and decode files (:mod:`~orchestrate.plan.evaluations`, :mod:`~orchestrate.plan.decode_file`) and
the cluster profile a sweep runs under (:mod:`~orchestrate.plan.profile`). It reads the sweep folder and, for
evaluation jobs, the ledger; the budget and the backends read it."""
