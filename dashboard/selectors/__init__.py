"""Reads that only the dashboard needs, one module per page; every read is scoped to the user's
tenants, and no list counts the ledger (keyset pages, capped counts over small indexed sets).

- ``queue``: what the queue lists (``QueueView``: the one ``QueueFilter`` with the age and the
  sort), pages, new-item count, failure groups, and the items a bulk decision names.
- ``runs_list``: the Runs page (every run, by the one ``ledger.run_filter.RunFilter``) and the run a
  queue search names exactly.
- ``runs``: the run page's bundle (ledger, checkpoints, audit events, item, unwind, approvals).
- ``live``: the run page's poll: a fingerprint of each region, how often to poll, the nav badge.
- ``inbox``: the approval inbox's pages and the pending count.
- ``outbox``: the Notifications page's status of each channel (last delivery, last failure, backlog).
- ``insights``: the insights page's aggregates.
- ``policies``: the policies page's sections, one per tenant.
- ``tenants``: the tenants a user sees.

What a page shows of an approval (its card) is shaped in ``dashboard.presenters``.
"""
