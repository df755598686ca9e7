"""Evaluation: WER of a checkpoint on test sets and noise conditions, scoring, other systems' transcripts,
the MLflow run a stage logs into, and the evaluation job's stage."""
