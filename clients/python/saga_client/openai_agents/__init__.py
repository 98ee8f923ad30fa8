"""OpenAI Agents SDK adapter (extra ``openai-agents``): function tools whose every call is a step of
the Saga run active in the context, and whose approval is Saga Admin's.

Saga's decision counts; the SDK's tool-approval flow carries it. ``needs_approval`` records the call
in Saga (``run.record``, not started) and is True until Saga's approver approved it (or Saga needs
no approval), so the run returns with ``interruptions``; ``saga_decisions`` waits for Saga's
decisions and writes them into the run state (approve, or reject with the approver's reason). When
the SDK runs the call, the step asks Saga again: only a call Saga approved runs, once; an approval
given in the SDK alone is a tool error. See clients/python/README.md, "OpenAI Agents SDK".

Importing it imports the SDK (an ``ImportError`` without the extra); ``saga_client`` itself never
does. The private modules: ``_tools`` (the function tools), ``_decisions`` (Saga's decisions into
the run state).
"""

from __future__ import annotations

from saga_client.openai_agents._decisions import saga_decisions
from saga_client.openai_agents._tools import saga_function_tool

__all__ = ["saga_decisions", "saga_function_tool"]
