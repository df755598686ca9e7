"""The acoustic model (paper 000 §2.1, §3.2): subsampling, positional encodings, attention, batch
renormalisation, Conformer layers, the CTC head, the assembled model, head diversity (paper 003) and its size."""
