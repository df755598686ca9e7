"""Training: the loop, the objective and checkpoints (one reader for every checkpoint)."""
