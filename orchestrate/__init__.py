"""Grids of training configurations → trials → Ray Tune (local), SLURM job arrays or Ray-on-SLURM, with MLflow as
the sweep's ledger. See docs/ARCHITECTURE.md ("orchestrate") and ``python -m orchestrate --help``."""
