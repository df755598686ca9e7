"""The backend-neutral decisions about a sweep: what ``submit``, ``resume`` and ``retry`` skip, re-attach, leave or
send out again under the failure budget (:mod:`~orchestrate.dispatch.dispatch`), and ``cancel``
(:mod:`~orchestrate.dispatch.cancel`). They act through the backends, the ledger and the sweep folder; what a
command prints of a sweep is the status's."""
