"""The unwind engine: steps persisted in PostgreSQL, carried out one at a time by RQ jobs.

Mechanics (docs/RECOVERY.md tells the whole story):

- ``unwind_create`` freezes the plan into steps (position 0 = newest completed action) and, after
  commit, enqueues the ``unwind_advance`` job, whose id it writes on the unwind (``job_id``) in the
  same transaction.
- ``unwind_advance_move`` (under the unwind's row lock) looks at the first unfinished step: a step that
  needs approval opens an Approval and pauses the unwind; otherwise the step becomes ``queued``
  and ``step_run`` is enqueued. Only one step is ever in flight. (The sweeper's move; the
  ``unwind_advance`` job claims the step and runs it itself: ``runner.unwind_advance`` below.)
- ``step_run`` claims the step (``select_for_update(skip_locked=True)``, status ``queued`` →
  ``running``, a new fencing token and a lease), calls the compensator outside any transaction,
  then records the outcome only if it still holds the lease (same token, still ``running``).
- The worker's jobs do both in a loop (``unwind_advance``, ``step_run(batch_s=...)``): the
  ``unwind_advance`` job claims the unwind's first step (``unwind_advance_and_claim``) and runs it,
  and the transaction that records a step's outcome also advances the unwind and claims its next step
  (``pending`` → ``running`` directly: it never waits for a worker), and the job goes on with it
  for up to a batch of a couple of seconds; then the next step is queued with a ``step_run`` job
  at the back of the queue, so concurrent unwinds take turns. A crash mid-batch leaves one
  ``running`` step whose lease expires.
- ``recovery.sweeper.sweep`` (periodic) re-queues steps whose lease expired (worker killed), re-enqueues
  queued steps whose job vanished (Redis restarted), and advances running unwinds with nothing in
  flight whose advance job RQ will not run (it never reached Redis, or its work horse died); one
  still waiting in the queue is left to run.
- When no step is left the unwind finishes: run → ``compensated`` and the item resolved, or run →
  ``failed`` and the item reopened as ``compensation_failed`` / ``state_drift`` listing what is left.

Every state change here is a compare-and-set (or happens under a row lock) with its audit event
in the same transaction; enqueues happen on commit.

The modules, one verb family each (callers import the one they use):

- ``state``: the state sets, the compare-and-set of a step or the unwind, the unwind's row lock,
  the plan as it was frozen.
- ``dispatch``: enqueueing the advance and step jobs after commit; leases, backoff, timeouts, batch.
- ``create``: ``unwind_create``.
- ``claim``: ``step_claim`` and the claim a worker holds (token, lease, compensation request).
- ``advance``: ``unwind_advance_move`` / ``unwind_advance_and_claim``, and an approval's decision on its step.
- ``runner``: the worker's side: ``step_run``, ``unwind_advance``, the lease renewed during a call,
  ``step_record_outcome`` (fenced).
- ``finish``: ``unwind_finish``, and the report of a stopped unwind.
- ``moves``: the operator's moves: ``step_retry``, ``step_skip``, ``unwind_stop``,
  ``step_approval_ask_again``.
"""
