"""Retention: runs closed longer than their tenant's ``audit.retention`` window are archived
(JSON lines and a signed manifest, ``ledger.archive``) and removed from PostgreSQL.

``policy``: each tenant's retention; ``records``: what belongs to a run (every model that
references it) and what keeps it open; ``write``: a run's files written and confirmed; ``remove``:
the transaction that records the archive and deletes the run; ``runner``: ``runs_archive``, the
worker's periodic duty and ``manage.py archive_runs``.
"""
