"""The one write layer of recovery: the service functions the dashboard, the API, Slack and the
bulk job call (none re-implements a rule): the agent's reports that put a run in the queue,
recording an action that needs approval, approving and rejecting, resuming, closing and
compensating, retrying or skipping a step, agent commands, notification channels, bulk decisions,
and the periodic duties that decide (expiring approvals, failing lost agents).

The layers below: ``recovery.transitions`` (the single-object transitions the engine makes too),
then ``recovery.unwinds`` (the engine) and ``recovery.sweeper``. Nothing below imports this
package (tests/test_architecture.py, ``RECOVERY_GROUPS``); inside it, no module imports another in
a cycle.

Each function checks state in the database (compare-and-set or a row lock), writes its audit
event in the same transaction, and defers side effects (jobs, notifications) to on_commit.

The modules, one verb family each (callers import the one they use):

- ``refusals``: every refused decision audited (``audits_refusals``, ``refusal_record``), and the
  refusal over actions whose outcome is unknown.
- ``reports``: the agent's reports that queue a run (``run_fail_and_queue``,
  ``action_fail_and_queue``, ``action_verify_and_queue``).
- ``commands``: agent commands, resume and cancel orders for a run's agent, redelivered and
  flagged overdue.
- ``channels``: a tenant's notification channels, Slack app and Slack users.
- ``approvals``: ``action_record_gated``, ``plan_record_gated``, ``approval_approve``, ``approval_reject``,
  ``approval_request_again``.
- ``compensations``: ``unwind_start`` (and auto-compensation), ``step_retry``, ``step_skip``,
  ``unwind_stop``.
- ``resolutions``: ``item_resume``, ``item_close``, ``run_flag``.
- ``cancellations``: ``run_cancel``.
- ``bulk``: ``items_bulk_close``, ``items_bulk_compensate``.
- ``periodic``: ``approvals_expire``, ``agents_detect_lost``.
"""
