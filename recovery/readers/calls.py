"""One read of a target's current value through the ``StateReader`` row serving a read tool.

Every read ends in a ``Read``: the image (the value at ``before.path`` in the read's result, by
``ledger.policies.before_images``), or that the result has no value there (``absent``), or an
error that is ``transient`` (an outage: the step is retried like a compensator's 5xx) or not (a
misconfigured reader, a result that is no JSON object: retrying the same read cannot help). The
read's audit entry (``entry``: phase, tool, kind, ok, error, at, ms) goes on the step.

Errors name the reader by its tool ("the webhook reader of crm.get_contact"), never by its URL:
a step's error and its ``read_checks`` are shown to everyone who may read the run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import httpx
from django.db.models import Q
from django.utils.module_loading import import_string
from mcp_types import TextContent

from infra import deadline
from infra.signing import signed_headers
from ledger.models import StateReader
from ledger.policies.before_images import NoImage, image_at, read_result
from recovery import compensators
from recovery.compensators import CompensationRequest

USER_AGENT = "saga-admin-reader/1"


@dataclass(frozen=True)
class Read:
    ok: bool
    value: Any = None  # the image (None when absent or on error)
    absent: bool = False  # the read answered, but its result has no value at the path
    error: str = ""  # what went wrong (or, when absent, what is missing)
    transient: bool = False
    entry: dict[str, Any] = field(default_factory=dict)


def reader_row(*, tenant_id: int, tool: str) -> StateReader | None:
    """The policy-file row serving the read ``tool`` for the tenant: its own beats the global one."""
    rows = StateReader.objects.filter(Q(tenant_id=tenant_id) | Q(tenant__isnull=True), tool=tool)
    return min(rows, key=lambda row: row.tenant_id is None, default=None)


def reader_label(row: StateReader) -> str:
    kind = {"mcp": "MCP", "webhook": "webhook", "python": "Python"}.get(row.kind, row.kind)
    return f"the {kind} reader of {row.tool}"


@dataclass(frozen=True)
class _Answer:
    """What a reader answered before the image is taken: the result, or an error."""

    result: Any = None
    error: str = ""
    transient: bool = False


def read_value(
    row: StateReader, *, request: CompensationRequest, args: Any, path: str | None, phase: str
) -> Read:
    """Read the target's value now through ``row`` with the read's ``args`` (filled from the
    action), for ``phase`` ("drift" or "verify")."""
    started = time.monotonic()
    at = datetime.now(UTC).isoformat()
    answer = _ask(row, request=request, args=args)
    read: Read
    if answer.error:
        read = Read(ok=False, error=answer.error, transient=answer.transient)
    else:
        try:
            read = Read(ok=True, value=image_at(answer.result, path))
        except NoImage as exc:
            read = Read(ok=True, absent=True, error=f"{reader_label(row)}: {exc}")
    entry = {
        "phase": phase,
        "tool": row.tool,
        "kind": row.kind,
        "ok": read.ok,
        "error": read.error,
        "at": at,
        "ms": round((time.monotonic() - started) * 1000, 1),
    }
    return Read(read.ok, read.value, read.absent, read.error, read.transient, entry)


def _ask(row: StateReader, *, request: CompensationRequest, args: Any) -> _Answer:
    where = reader_label(row)
    try:
        if row.kind == StateReader.Kind.MCP:
            return _mcp(row, request=request, args=args, where=where)
        if row.kind == StateReader.Kind.WEBHOOK:
            return _webhook(row, request=request, args=args, where=where)
        return _python(row, request=request, args=args, where=where)
    except NoImage as exc:
        return _Answer(error=f"{where} answered, but not with a JSON object: {exc}")


def _mcp(row: StateReader, *, request: CompensationRequest, args: Any, where: str) -> _Answer:
    """Call the read tool as an MCP compensator is called (``compensators.mcp_call``): headers from
    the environment, one deadline for the whole exchange, the URL never in a message."""
    headers_env = dict(row.headers_env or {})
    missing = sorted({env for env in headers_env.values() if not os.environ.get(env)})
    if missing:
        return _Answer(
            error=f"{where} sends headers from the environment, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set in the worker's environment; nothing was read."
        )
    if not isinstance(args, dict):
        return _Answer(error=f"{where} takes its arguments as an object, not {type(args).__name__}.")
    headers = {name: os.environ[env] for name, env in headers_env.items()}
    headers["User-Agent"] = USER_AGENT
    meta = {
        "saga/step_id": request.step_id,
        "saga/action_id": request.action_id,
        "saga/run_id": request.run_id,
        "saga/tenant": request.tenant,
        "saga/read": "true",
    }
    scrub = _scrubber(row.url, where)
    try:
        result = compensators._run_async(
            compensators._mcp_call_tool(
                url=row.url,
                tool=row.mcp_tool,
                args=args,
                headers=headers,
                meta=meta,
                timeout_s=request.timeout_s,
            )
        )
    except TimeoutError:
        return _Answer(
            error=f"Timed out after {request.timeout_s:g}s reading through {where}.", transient=True
        )
    except Exception as exc:  # noqa: BLE001 - anything the server's side causes is the step's to record
        outcome = compensators._mcp_error_outcome(
            exc, tool=row.mcp_tool, where=where, timeout_s=request.timeout_s
        )
        return _Answer(error=scrub(outcome.error), transient=outcome.kind == compensators.RETRY)
    if result.is_error:
        text = compensators._result_text(result) or "(no message)"
        return _Answer(error=scrub(f"{where} answered with an error: {text}"))
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    return _Answer(result=read_result(structured=result.structured_content, texts=texts))


def _webhook(row: StateReader, *, request: CompensationRequest, args: Any, where: str) -> _Answer:
    """POST the read, signed as compensator calls are, through the compensators' client (one
    deadline per call, no redirects followed); the answer is ``{"state": …}``."""
    secret = os.environ.get(row.secret_env, "") if row.secret_env else row.secret
    if not secret:
        return _Answer(
            error=f"{where} has no secret (set {row.secret_env or 'secret'} in the policy file or the "
            "environment); refusing to send an unsigned request."
        )
    body = json.dumps(
        {
            "tool": row.tool,
            "args": args,
            "tenant": request.tenant,
            "run_id": request.run_id,
            "action_id": request.action_id,
        },
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    ).encode()
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **signed_headers(secret, body)}
    scrub = _scrubber(row.url, where)
    try:
        response = deadline.post(
            compensators.webhook_client(),
            row.url,
            deadline_s=request.timeout_s,
            content=body,
            headers=headers,
        )
    except httpx.TimeoutException as exc:
        return _Answer(
            error=f"Timed out after {request.timeout_s:g}s reading through {where}: {type(exc).__name__}",
            transient=True,
        )
    except httpx.TransportError as exc:
        return _Answer(error=scrub(f"Could not reach {where}: {type(exc).__name__}: {exc}"), transient=True)
    status = response.status_code
    if not 200 <= status < 300:
        # A 4xx is the reader refusing this read (a bad signature, an unknown tool): retrying the
        # same request cannot help. Anything else (5xx, a redirect) is its trouble: retried.
        return _Answer(
            error=scrub(f"{where} answered {status}. {response.text[:300]}").strip(),
            transient=not 400 <= status < 500,
        )
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or "state" not in data:
        return _Answer(error=f'{where} answered {status} without a JSON object {{"state": …}}.')
    return _Answer(result=data["state"])


def _python(row: StateReader, *, request: CompensationRequest, args: Any, where: str) -> _Answer:
    try:
        fn = import_string(row.python_path)
    except ImportError as exc:
        return _Answer(error=f"{where} cannot be imported: {row.python_path} ({exc}).")
    try:
        result = fn(
            tool=row.tool,
            args=args,
            tenant=request.tenant,
            run_id=request.run_id,
            action_id=request.action_id,
        )
    except Exception as exc:  # noqa: BLE001 - like a 5xx: retried with backoff, recorded on the step
        return _Answer(error=f"{where} failed: {type(exc).__name__}: {exc}", transient=True)
    return _Answer(result=cast(Any, result))


def _scrubber(url: str, where: str) -> Any:
    def scrub(text: str) -> str:
        return compensators._without_url(text, url=url, label=where)

    return scrub
