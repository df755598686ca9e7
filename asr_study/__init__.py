"""``asr-study``: the project's one console command, with the three groups (``core``, ``orchestrate``,
``analysis``) as subcommands and the packaged MLflow server script (``mlflow-server``); see :mod:`asr_study.cli`."""
