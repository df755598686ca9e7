"""Audio to optimiser steps: reading audio, features, the tokenizer, music noise, corpora, chunking recordings
into windows and steps, batching, and preparing a corpus once."""
