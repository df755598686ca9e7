"""The sweep on disk, the floor every other folder of orchestrate stands on: its folder and lock
(:mod:`~orchestrate.sweep.folder`), a trial (:mod:`~orchestrate.sweep.trial`), what each trial folder says
(:mod:`~orchestrate.sweep.trial_state`, :mod:`~orchestrate.sweep.progress`), whether its ``flock`` reaches every
node (:mod:`~orchestrate.sweep.mounts`) and which trials a ``--where`` names (:mod:`~orchestrate.sweep.where`).
Below it: only asr_core's contract and config."""
