"""What a job needs to survive a scheduler: stop signals, the per-trial lease, provenance, and the outbox that
holds everything meant for MLflow until it is shipped."""
