"""The decisions about a run, as the dashboard and the API call them (neither re-implements a
rule): the agent's reports that put a run in the queue, recording an action that needs approval,
approving and rejecting, resuming, closing and compensating, retrying or skipping a step, bulk
decisions, and the periodic duties that decide (expiring approvals, failing lost agents).

The layers below: ``recovery.items``, ``recovery.approvals`` and ``recovery.commands`` (each
object's own transitions), then ``recovery.unwinds`` (the engine) and ``recovery.sweeper``.
Nothing below imports this package.

Each function checks state in the database (compare-and-set or a row lock), writes its audit
event in the same transaction, and defers side effects (jobs, notifications) to on_commit.

The modules, one verb family each (callers import the one they use):

- ``refusals``: every refused decision audited (``audits_refusals``, ``refusal_record``), and the
  refusal over actions whose outcome is unknown.
- ``reports``: the agent's reports that queue a run (``run_fail_and_queue``,
  ``action_fail_and_queue``, ``action_verify_and_queue``).
- ``approving``: ``action_record_gated``, ``plan_record_gated``, ``approval_approve``, ``approval_reject``,
  ``approval_request_again``.
- ``compensating``: ``unwind_start`` (and auto-compensation), ``step_retry``, ``step_skip``,
  ``unwind_stop``.
- ``resolving``: ``item_resume``, ``item_close``, ``run_flag``.
- ``cancelling``: ``run_cancel``.
- ``bulk``: ``items_bulk_close``, ``items_bulk_compensate``.
- ``periodic``: ``approvals_expire_due``, ``runs_fail_lost_agents``.
"""
