"""``python -m asr_core COMMAND ...``: one entry point for every trainer-side command.

Each command lives in the module named after what it does and exposes ``cli(argv) -> int``; this file only
dispatches, so importing it stays cheap and a command's heavy imports happen only when it runs.

The commands a scheduler stops with SIGUSR2/SIGTERM (:data:`SIGNALLED`: ``trial``, ``train``) get the recording
handlers of :mod:`asr_core.runtime.signals` before anything else is imported, so a signal that arrives while the job is
still importing torch or loading its corpus is honoured (checkpoint if there is anything to checkpoint, exit 75)
instead of killing it. The other commands keep Python's default handling.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and (sys.argv[1:2] in (["trial"], ["train"]) or sys.argv[1:3] == ["lm", "train"]):
    # the first thing the process does
    from asr_core.runtime import signals as _signals

    _signals.install()

import importlib  # noqa: E402 - after the handlers, on purpose

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("asr_core.training.train_args", "train a model from a config: train CONFIG.yaml [--set k=v ...] [--out DIR]"),
    "params": ("asr_core.model.params_args", "parameter counts per module and in total: params CONFIG.yaml [--set k=v ...]"),
    "evaluate": ("asr_core.evaluation.evaluate", "moving-window WER of a checkpoint: evaluate CKPT --data NAME=FORMAT:PATH ..."),
    "heads": ("asr_core.probes.heads_args", "how alike the attention heads are (paper 003): heads CKPT --data NAME=FORMAT:PATH ..."),
    "reach": ("asr_core.probes.reach", "how far back a model's decoded output reaches: reach CKPT --data NAME=FORMAT:PATH ..."),
    "recall": ("asr_core.probes.recall_args", "the recall plant's slots scored from one window each: recall CKPT --data NAME=podcast:PATH ..."),
    "repeats": ("asr_core.probes.repeats", "key terms' errors, first mentions against repeats by distance: repeats HYPS ... --data NAME=podcast:PATH"),
    "score": ("asr_core.evaluation.external", "WER of another system's transcripts: score --ref NAME=FORMAT:PATH --hyp DIR --system S"),
    "tailset": ("asr_core.scoring.tail", "the tail words of a text (paper 002), for evaluate/score --tail: tailset TEXT --out FILE.json"),
    "prepare": ("asr_core.data.prepare", "store a corpus once, memory-mapped, for every trial: prepare [NAME=]FORMAT:PATH --out OUT"),
    "synth": ("asr_core.data.synth.cli", "generate the synthetic long-form corpus: synth --out OUT --hours H --seed S"),
    "trial": ("asr_core.trial", "one grid trial (train, then evaluate) inside an MLflow run; used by orchestrate"),
    "bench": ("asr_core.bench", "benchmarks: bench train | bench decode | bench data | bench calibrate"),
    "outbox": ("asr_core.runtime.shipper", "ship a trial's pending MLflow records by hand: outbox TRIAL_DIR --tracking-uri URI --run-id RUN"),
    "ship": ("asr_core.runtime.resend", "send a trial's pending and kept (refused) MLflow records again: ship TRIAL_DIR [--run-id RUN]"),
    "lm": ("asr_core.lm.cli", "the language model: lm text | lm train | lm ppl | lm tune"),
}
SIGNALLED = ("trial", "train")  # commands that checkpoint on SIGUSR2/SIGTERM (and `lm train`)


def main(argv: list[str] | None = None) -> int:
    from asr_core.contract.command import guarded  # a bug: one line naming its log, exit 1

    return guarded("asr_core", _main, argv)


def _main(argv: list[str]) -> int:
    if argv and (argv[0] in SIGNALLED or argv[:2] == ["lm", "train"]):  # (done at import under ``python -m``)
        from asr_core.runtime import signals

        signals.install()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m asr_core COMMAND [ARGS]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:9s} {text}")
        print("\n  --version print the version and the code's commit, then exit")
        return 0 if argv else 2
    if argv[0] == "--version":
        from asr_core.contract.command import version_line

        print(version_line("python -m asr_core"))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"asr_core: unknown command {name!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.cli(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
