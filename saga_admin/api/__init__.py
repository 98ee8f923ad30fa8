"""The HTTP API under /api/v1/: one router module per resource; callers import the module they use.

- ``app``: the NinjaAPI (the routers mounted in order, the operation ids, the one error shape).
- ``auth``: API keys and their scopes (agent, operator, approver), the error schema.
- ``common``: what the routers share: the caller's key, tenant and actor, a key's reach over
  runs and actions, the errors of writes, the Idempotency-Key header.
- ``limits``: the gate in front of /api/ (the key before the body, body limits, per-key limits).
- ``idempotency``: the Idempotency-Key header's replay store.
- ``renderers``: the JSON renderer (orjson).
- The agents' routers: ``runs`` (also an operator's cancel), ``actions``, ``commands``,
  ``checkpoints``, ``policies``.
- The operator's routers: ``queue`` (the recovery queue, flagging a run), ``unwinds``,
  ``approvals``, ``pauses``.
- ``schemas``: the request and response schemas, one module per resource.
"""
