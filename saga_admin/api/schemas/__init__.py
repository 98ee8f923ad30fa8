"""The API's request and response schemas, one module per resource; callers import the module
they use.

- ``common``: what the others share: the strict input base, the decision body (a reason), the
  field types (JSON, ids, tool names, URLs).
- ``runs``: runs (start, list, detail, heartbeat, complete, fail, cancel) and their trail.
- ``actions``: the ledger's actions (record, start, succeed, fail, verify, reconcile, pages).
- ``plans``: a plan (several planned actions recorded in one request) and its answer.
- ``checkpoints``: checkpoints and their pages.
- ``commands``: the resume/cancel commands given to an agent.
- ``policies``: the tool policies in force.
- ``queue``: the recovery queue: items, their compensation plan and resume preview.
- ``unwinds``: unwinds and their steps.
- ``approvals``: approvals, their grants and the inbox.
- ``pauses``: pauses (kill switches).
"""
