"""The synthetic corpus (``python -m asr_core synth``): espeak-ng speech of generated text in podcast and meeting
rooms (:mod:`~asr_core.data.synth.generate`, its text :mod:`~asr_core.data.synth.text`, audio
:mod:`~asr_core.data.synth.audio`, parallel rendering :mod:`~asr_core.data.synth.pool`, command line
:mod:`~asr_core.data.synth.args` and :mod:`~asr_core.data.synth.cli`), and the material planted in it: the long-range
cue (:mod:`~asr_core.data.synth.cues`), the masked-recall control (:mod:`~asr_core.data.synth.recall`), the copy
control (:mod:`~asr_core.data.synth.copy_plant`) and their key edits (:mod:`~asr_core.data.synth.rerender`). Written
in the podcast format the readers of :mod:`asr_core.data.corpora` read; it reads only their base."""
