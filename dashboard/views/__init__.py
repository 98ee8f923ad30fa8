"""The ops dashboard's views, one module per feature: auth, typed parsing and one service call per
decision.

Every decision is a plain form POST that redirects with a message (works without JavaScript); htmx
only enhances (partials, polling). Reads are scoped to the user's tenants (another tenant's object
is a 404) and every decision checks the user's role in the object's tenant (403).

- ``common``: what every view shares (the htmx request type, the acting person, the answer after a
  decision or a refusal, an object looked up in the user's tenants, a confirmation page).
- ``queue``: the recovery queue (filters, pages, groups, the new-items poll) and bulk decisions.
- ``bulk``: bulk decisions by filter (the preview, the typed confirmation, the bulk's live page,
  abort).
- ``runs``: the run page and its live poll; flagging and cancelling a run.
- ``runs_list``: the Runs page (every run, filtered, keyset-paged; an exact id opens the run).
- ``items``: a recovery item's decisions: compensate (the plan, partial or to a checkpoint),
  resume, close, assign.
- ``unwinds``: a compensation in progress: its progress, stopping it, a step's ask-again, retry
  and skip.
- ``actions``: reconciling an action whose outcome is unknown.
- ``inbox``: the approval inbox and approving or rejecting.
- ``insights``, ``policies``: the read-only pages.
- ``pauses``: the kill switches (pause an agent or tool, lift a pause).
- ``notifications``: the outbox and a tenant's notification settings (channels, the Slack app).
- ``slack_account``: linking one's own Slack account.
- ``slack``: Slack's signed requests (Approve / Reject presses, the ``/saga link`` command).
- ``workers``: django-rq's pages behind the superuser gate.
"""
