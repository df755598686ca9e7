"""One module per paper feature the report reads when the sweep has it: cue, tail, recall, window fusion, head
similarity, context or fragmentation, beam decoders and error types. Each builds its tables, tests and display tables
from a sweep; :mod:`analysis.document.sections` registers their sections."""
