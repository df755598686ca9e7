"""What a job needs to survive a scheduler: stop signals, and the outbox that holds everything meant for MLflow
until it is shipped. The files it shares with orchestrate (the lease, the outbox's files) and the code version it
records are contracts: :mod:`asr_core.contract.folder`, :mod:`asr_core.contract.provenance`."""
