"""The benchmark harness (`make bench`): Saga Admin measured against this machine's own limits.

``run`` parses the options and runs the phases in order; each phase is a module with ``phase(h)``
and its own section of the report (its rows of the one table, its targets, its Markdown), which
``report`` puts together. Under the phases: ``harness`` (the web and worker processes, the load
generator pointed at them), ``sizes``, ``stats``, ``tables``, ``databases``, ``environment``,
``procs`` and ``loadgen``. Imports point that way only, and nothing outside bench imports it
(tests/test_architecture.py). What needs Django's apps (models, services) is imported inside
functions: the orchestrator sets Django up only once it has its options and a fresh database.
"""
