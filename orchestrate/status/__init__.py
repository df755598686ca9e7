"""What ``orchestrate status`` says of a sweep, from its trial folders and the scheduler, in well under a second:
each trial's state (:mod:`~orchestrate.status.trial_status`), the table or the one-screen view
(:mod:`~orchestrate.status.status`, :mod:`~orchestrate.status.screen`, :mod:`~orchestrate.status.monitor`,
:mod:`~orchestrate.status.trial_metrics`) and the ledger's line (:mod:`~orchestrate.status.ledger_line`). It reads
the budget, the backends' scheduler commands, the ledger and the sweep folder; nothing below it reads status."""
