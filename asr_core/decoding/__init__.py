"""Decoding long recordings: moving-window posteriors and CTC beam search with an optional language model."""
