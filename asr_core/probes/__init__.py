"""Measurements of a trained model beyond WER: how alike its attention heads are (paper 003) and how far
back its output reaches."""
