"""An action of a run, from its record to its last state, one module per job:

- ``recording``: ``action_record``, recording a planned action idempotently per tenant and key; the
  fast path (one round trip when this process's policies need no check) and the checked path
  (every check in Python under the key's and the run's locks), and an idempotent replay.
- ``plans``: ``plan_record``, several planned actions of one run recorded in one transaction, all
  or nothing, each through ``action_record`` as if alone; idempotent through its actions' keys.
- ``payload``: what a recording writes: the payload hash that makes two recordings the same
  action, the new row and its audit events, the JSON ``saga_action_record`` takes.
- ``compensation``: the compensation rule: what undoes a newly recorded action, as its policy
  allows it (the compensating tool, its strategy, its args or their template).
- ``moves``: the action's state moves after it is recorded (approval, start, the agent's reports,
  reconciling, verifying, compensating), each a compare-and-set with its audit event.
"""
