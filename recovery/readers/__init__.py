"""Readers: the worker reads a target's current value through the read tool an action's policy
names in ``before`` (API.md "Before-images and verified undo").

- ``calls``: one read through the ``ledger.models.StateReader`` row that serves the tool (the
  tenant's own row beats the global one): an MCP tool over Streamable HTTP, a signed webhook
  (``{"tool", "args", "tenant", "run_id", "action_id"}`` → ``{"state": …}``) or a Python callable;
  each read is audited on the step (``read_checks["reads"]``).
- ``checks``: around an undo step's compensator call, the drift check before it (the value now
  must be the after-image, else the step is ``drifted`` and the compensator is not called) and the
  read-back after it (the value must be the before-image, else the step fails ``not_restored``).
"""
