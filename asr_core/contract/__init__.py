"""Torch-free owners of every seam between the trainer and the packages around it: the trial job's contract
(command, exit codes, folder files, progress, segments, attempts), the ledger's tags and saved view, evaluation jobs,
metric and table names, the calibration file, the dataset-spec grammar, the code version and what every command
does alike (``command``); the trial folder's files in ``folder/``. Both sides import them from here."""
