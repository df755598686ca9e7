"""The trial folder's files, each with its one writer and its one reader, which the trainer and orchestrate both
import: the segments, the per-trial lease and the clock it is judged by, the outbox's files,
the checkpoint file's torch-free check and the ``TRAINED`` record."""
