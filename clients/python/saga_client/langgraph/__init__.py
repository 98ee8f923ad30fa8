"""LangGraph adapter (extra ``langgraph``): each call of a wrapped tool is a step of the Saga run
active in the context; a call waiting for approval pauses the graph with ``interrupt()``.

Saga Admin's approver decides, not the resume value: on ``Command(resume=…)`` the tool asks Saga
again, so an approved call runs (once, with the approver's args if edited), a rejected one is an
error ``ToolMessage`` for the model (``ToolRejected`` with ``raise_on_reject=True``), and one still
undecided pauses the graph again. The run stays open while a call waits; another process resumes
the graph inside ``with saga.attach(run_id):``. See clients/python/README.md, "LangGraph".

Importing it imports LangGraph (an ``ImportError`` without the extra); ``saga_client`` itself never
does. The private modules: ``_tools`` (the wrapped tools), ``_resume`` (resuming a paused graph).
"""

from __future__ import annotations

from saga_client.langgraph._resume import resume_when_decided
from saga_client.langgraph._tools import ToolRejected, saga_tool, saga_tools

__all__ = ["ToolRejected", "resume_when_decided", "saga_tool", "saga_tools"]
