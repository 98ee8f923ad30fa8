"""Compensators: how one unwind step is carried out in the world.

A compensating tool is served by one of:

- a ``ledger.models.Compensator`` row loaded from the policy file (tenant's own beats global):
  ``webhook`` (the signed HTTP protocol of API.md), ``python`` (a dotted path) or ``mcp`` (a tool
  on an MCP server, called over Streamable HTTP with the step's args as its arguments);
- a Python callable registered in code with ``@compensator("tool")``.

Every compensator gets the same fields (those of the webhook body plus ``idempotency_key``) and
ends in one ``Outcome``: ``done``, ``drifted``, ``failed`` (permanent) or ``retry`` (transient:
the engine backs off and tries again, then gives up as ``failed``). Python compensators return
``None``/a dict (done; a ``"state"`` key is kept as the post-compensation snapshot) or an
``Outcome``, or raise ``CompensationDrifted`` / ``CompensationFailed``; any other exception is
treated like a 5xx (retried, then failed) and its text is recorded on the step.

Snapshot restores check drift before touching anything: when a reader is registered for the
tool (``Compensator.reader_path`` or ``@state_reader("tool")``), the target's current state must
still equal the action's after snapshot, or the step is ``drifted`` and a human decides.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import anyio
import httpx
import httpx2
import structlog
from django.db.models import Q
from django.utils.module_loading import import_string
from mcp import Client as McpClient
from mcp import MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND, CallToolResult, RequestParamsMeta, TextContent

from infra import deadline
from infra.conf import saga
from infra.signing import signed_headers
from ledger import upstreams
from ledger.models import CompensationStrategy, Compensator
from ledger.policies.resolve import StampCache

log = structlog.get_logger(__name__)

DONE = "done"
DRIFTED = "drifted"
FAILED = "failed"
RETRY = "retry"

# Outcome.code of a step whose compensating tool nothing serves any more (removed from the policy
# file, or its Python code gone): a permanent failure the engine words for the operator.
COMPENSATOR_MISSING = "compensator_missing"
# Outcome.code of a step not run because its compensator does not reach the upstream that
# performed the action and no person approved it (``ledger.upstreams``).
UPSTREAM_MISMATCH = "upstream_mismatch"


@dataclass(frozen=True)
class Outcome:
    kind: str  # done | drifted | failed | retry
    state: Any = None  # the post-compensation snapshot, when the compensator returned one
    error: str = ""
    status_code: int | None = None
    code: str = ""  # a machine-readable cause, when the engine words the error itself
    # The reader's checks around the call (recovery.readers.checks): whether the value read back
    # is the before-image (None: no reader, or not read back), and this attempt's read_checks.
    verified: bool | None = None
    checks: dict[str, Any] | None = None

    @classmethod
    def done(cls, state: Any = None, *, status_code: int | None = None) -> Outcome:
        return cls(DONE, state=state, status_code=status_code)

    @classmethod
    def drifted(cls, error: str, *, state: Any = None, status_code: int | None = None) -> Outcome:
        return cls(DRIFTED, state=state, error=error, status_code=status_code)

    @classmethod
    def failed(cls, error: str, *, status_code: int | None = None, code: str = "") -> Outcome:
        return cls(FAILED, error=error, status_code=status_code, code=code)

    @classmethod
    def retry(cls, error: str, *, status_code: int | None = None) -> Outcome:
        return cls(RETRY, error=error, status_code=status_code)


class CompensationDrifted(Exception):
    """Raised by a Python compensator: the target no longer matches the after snapshot."""


class CompensationFailed(Exception):
    """Raised by a Python compensator: a permanent failure, retrying will not help."""


@dataclass(frozen=True)
class CompensationRequest:
    """What every compensator receives: the webhook body fields and the step's idempotency key."""

    step_id: str
    action_id: str
    run_id: str
    tenant: str
    tool: str
    args: Any
    target_type: str
    target_id: str
    before_snapshot: Any
    after_snapshot: Any
    attempt: int
    idempotency_key: str
    strategy: str = CompensationStrategy.CUSTOM
    # Set when an operator chose "retry anyway" on a drifted step: skip the reader's drift check.
    override_drift: bool = False
    timeout_s: float = 10.0
    extra: dict[str, Any] = field(default_factory=dict)
    # The upstream that performed the forward action ("" when it names none), and whether a person
    # approved this step: without that approval, a compensator that does not reach the upstream
    # is not called.
    upstream: str = ""
    person_approved: bool = False
    # The action's frozen policy ``before`` (the read that takes its images) and the action's own
    # args, which the read's args are filled from (recovery.readers.checks); None: no reader checks.
    before: dict[str, Any] | None = None
    action_args: Any = None

    def body(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "action_id": self.action_id,
            "run_id": self.run_id,
            "tenant": self.tenant,
            "tool": self.tool,
            "args": self.args,
            "target_type": self.target_type,
            "target_id": self.target_id,
            "before_snapshot": self.before_snapshot,
            "after_snapshot": self.after_snapshot,
            "attempt": self.attempt,
        }


CompensatorFn = Callable[..., Any]
ReaderFn = Callable[..., Any]

_REGISTRY: dict[str, CompensatorFn] = {}
_READERS: dict[str, ReaderFn] = {}


def compensator(tool: str) -> Callable[[CompensatorFn], CompensatorFn]:
    """Register a Python compensating tool in code: ``@compensator("hr.delete_user")``."""

    def decorate(fn: CompensatorFn) -> CompensatorFn:
        _REGISTRY[tool] = fn
        return fn

    return decorate


def state_reader(tool: str) -> Callable[[ReaderFn], ReaderFn]:
    """Register the reader a snapshot restore uses to check drift: it gets the request fields and
    returns the target's current state."""

    def decorate(fn: ReaderFn) -> ReaderFn:
        _READERS[tool] = fn
        return fn

    return decorate


def compensator_row(*, tenant_id: int, tool: str) -> Compensator | None:
    """The policy-file row that serves ``tool`` for the tenant (``ledger.upstreams``, which also
    needs it below the recovery layer)."""
    return upstreams.compensator_row(tenant_id=tenant_id, tool=tool)


# The tools registered as compensators for a tenant (its rows and the global ones), per process,
# under the policy stamp (a write to ``ledger_compensator`` moves it, ``ledger/0014``).
_ROWS: StampCache[frozenset[str]] = StampCache()


def compensator_registered(*, tenant_id: int, tool: str, stamp: int | None = None) -> bool:
    """Whether ``tool`` is a registered compensator for the tenant (a policy-file row, the tenant's
    or the global one, or a Python compensator registered in code): the only tools an agent may
    name as an action's compensation on its own. ``stamp``: the policy stamp the caller relies on
    (a ledger write hands it to the database, which refuses the write when it is no longer
    current); the rows may then come from this process's copy read under it."""
    if tool in _REGISTRY:
        return True
    rows = Compensator.objects.filter(Q(tenant_id=tenant_id) | Q(tenant__isnull=True))
    if stamp is None:
        return rows.filter(tool=tool).exists()
    return tool in _ROWS.get(tenant_id, stamp, lambda: frozenset(rows.values_list("tool", flat=True)))


def compensator_describe(*, tenant_id: int, tool: str) -> str:
    """Where a tool's compensation would go, for the plan preview ("" when nothing serves it)."""
    row = compensator_row(tenant_id=tenant_id, tool=tool)
    if row is not None:
        return row.kind
    return "python" if tool in _REGISTRY else ""


# --- Execution -------------------------------------------------------------------------------


def execute(
    request: CompensationRequest,
    *,
    tenant_id: int,
    rows: dict[tuple[int, str], Compensator | None] | None = None,
) -> Outcome:
    """Carry out one attempt of one step. Never raises for anything the tool's side can cause.

    ``rows`` memoises the registry lookup across the steps one job runs back to back (a batch
    lasts seconds; a policy reload is seen by the next batch)."""
    row = _row_for(request, tenant_id=tenant_id, rows=rows)
    if request.upstream and not request.person_approved:
        # The plan made such a step wait for a person; this holds even when the policy file
        # changed the compensator after the plan was frozen.
        reach = upstreams.compensator_reach(
            via={"upstream": request.upstream}, row=row, in_code=request.tool in _REGISTRY
        )
        if reach is not None and not reach.reaches:
            return Outcome.failed(f"Not run: {reach.mismatch(tool=request.tool)}.", code=UPSTREAM_MISMATCH)
    if request.strategy == CompensationStrategy.SNAPSHOT and not request.override_drift:
        drift = _check_drift(request, row)
        if drift is not None:
            return drift
    return _call(request, row)


def _row_for(
    request: CompensationRequest, *, tenant_id: int, rows: dict[tuple[int, str], Compensator | None] | None
) -> Compensator | None:
    """The registry row that serves the step's tool (``execute``), memoised in ``rows`` when given."""
    if rows is None:
        row = compensator_row(tenant_id=tenant_id, tool=request.tool)
    elif (tenant_id, request.tool) in rows:
        row = rows[(tenant_id, request.tool)]
    else:
        row = rows[(tenant_id, request.tool)] = compensator_row(tenant_id=tenant_id, tool=request.tool)
    return row


def _call(request: CompensationRequest, row: Compensator | None) -> Outcome:
    """Call what serves the step's tool (``execute``, its checks passed): the policy file's row
    (webhook, MCP or Python), else a compensator registered in code."""
    if row is not None and row.kind == Compensator.Kind.WEBHOOK:
        secret = _secret_for(row)
        if not secret:
            return Outcome.failed(
                f"Compensator for {request.tool} has no secret (set {row.secret_env or 'secret'} in the "
                "policy file or the environment); refusing to send an unsigned request."
            )
        return webhook_call(url=row.url, secret=secret, request=request)
    if row is not None and row.kind == Compensator.Kind.MCP:
        return mcp_call(url=row.url, tool=row.mcp_tool, headers_env=row.headers_env or {}, request=request)
    if row is not None:
        try:
            fn = import_string(row.python_path)
        except ImportError as exc:
            return Outcome.failed(
                f"The compensator for {request.tool} cannot be imported: {row.python_path} ({exc}).",
                code=COMPENSATOR_MISSING,
            )
        return python_call(fn, request)
    if request.tool in _REGISTRY:
        return python_call(_REGISTRY[request.tool], request)
    return Outcome.failed(
        f"No compensator is registered for {request.tool}: neither the policy file nor the code registers it.",
        code=COMPENSATOR_MISSING,
    )


def _secret_for(row: Compensator) -> str:
    if row.secret_env:
        return os.environ.get(row.secret_env, "")
    return row.secret


def _check_drift(request: CompensationRequest, row: Compensator | None) -> Outcome | None:
    reader: ReaderFn | None = None
    if row is not None and row.reader_path:
        try:
            reader = import_string(row.reader_path)
        except ImportError as exc:
            return Outcome.failed(f"Cannot import state reader {row.reader_path}: {exc}")
    else:
        reader = _READERS.get(request.tool)
    if reader is None:
        # No reader: the compensator itself must check (a webhook answers 412 on drift).
        return None
    try:
        current = reader(**request.body(), idempotency_key=request.idempotency_key)
    except Exception as exc:  # noqa: BLE001 - a reader outage is transient; the text goes on the step
        return Outcome.retry(f"State reader for {request.tool} failed: {type(exc).__name__}: {exc}")
    if _normalised(current) != _normalised(request.after_snapshot):
        return Outcome.drifted(
            f"{request.target_type or 'target'} {request.target_id} changed since the action: its current "
            "state no longer equals the after snapshot, so restoring would overwrite someone else's change.",
            state={"current": current, "after_snapshot": request.after_snapshot},
        )
    return None


def _normalised(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def python_call(fn: CompensatorFn, request: CompensationRequest) -> Outcome:
    try:
        result = fn(**request.body(), idempotency_key=request.idempotency_key)
    except CompensationDrifted as exc:
        return Outcome.drifted(str(exc) or "the target drifted")
    except CompensationFailed as exc:
        return Outcome.failed(str(exc) or "the compensator reported a permanent failure")
    except Exception as exc:  # noqa: BLE001 - like a 5xx: retried with backoff, recorded on the step
        return Outcome.retry(f"{type(exc).__name__}: {exc}")
    if isinstance(result, Outcome):
        return result
    if isinstance(result, dict):
        return Outcome.done(result.get("state", result))
    return Outcome.done(result)


# One HTTP client per process for compensator webhooks. ``httpx.post`` built a client per call, and
# with it an SSL context that loads the CA bundle (plus, in a fresh work horse, httpcore's first
# import): about 80 ms of CPU per step, even for a plain-http URL. The SSL context is built once and
# may be inherited by forked work horses (it holds configuration, no connection); the client holds
# pooled connections, so each process makes its own and never uses one inherited across a fork.
_ssl_context_built: ssl.SSLContext | None = None
_webhook_client: tuple[int, httpx.Client] | None = None
_webhook_client_lock = threading.Lock()


def _ssl_context() -> ssl.SSLContext:
    global _ssl_context_built
    if _ssl_context_built is None:
        # What httpx.post used: certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR when set.
        _ssl_context_built = httpx.create_ssl_context()
    return _ssl_context_built


def webhook_client() -> httpx.Client:
    """This process's client for compensator webhooks (thread-safe). Never follows a redirect: a
    3xx is the endpoint's answer (retried, then failed, like a 5xx), not a place to send the signed
    step. Send with ``infra.deadline.request``: one deadline per call (the client refuses a
    request without one)."""
    global _webhook_client
    with _webhook_client_lock:
        if _webhook_client is None or _webhook_client[0] != os.getpid():
            # A client inherited across a fork is dropped, not closed: closing it would shut down
            # connections (TLS sessions included) that belong to the parent.
            _webhook_client = (
                os.getpid(),
                deadline.client(verify=_ssl_context(), timeout=saga().webhook_timeout_s),
            )
        return _webhook_client[1]


def webhook_client_warm() -> None:
    """Called by the worker before it forks work horses: build the SSL context and import httpcore
    (httpx imports it on a client's first use) once, so no work horse pays for them. No client is
    kept: connections are never shared across a fork."""
    httpx.HTTPTransport(verify=_ssl_context()).close()


def webhook_call(*, url: str, secret: str, request: CompensationRequest) -> Outcome:
    """POST the step to the tool's endpoint exactly as API.md describes and map the answer."""
    body = json.dumps(request.body(), sort_keys=True, separators=(",", ":"), default=str).encode()
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": request.idempotency_key,
        "User-Agent": "saga-admin-compensator/1",
        **signed_headers(secret, body),
    }
    # A step's error is shown to everyone who may read the run, viewers included, and goes out in
    # notifications: it names the compensator by its tool, never by the URL it points at (that is
    # the installation's configuration, shown to operators and admins on the policies page).
    where = compensator_label("webhook", request.tool)
    scrub = functools.partial(_without_url, url=url, label=where)
    try:
        # One deadline for the whole call: an endpoint that answers a byte at a time holds the
        # worker no longer than a silent one.
        response = deadline.post(
            webhook_client(), url, deadline_s=request.timeout_s, content=body, headers=headers
        )
    except httpx.TimeoutException as exc:
        return Outcome.retry(f"Timed out after {request.timeout_s:g}s calling {where}: {type(exc).__name__}")
    except httpx.TransportError as exc:
        return Outcome.retry(scrub(f"Could not reach {where}: {type(exc).__name__}: {exc}"))
    status = response.status_code
    if 200 <= status < 300:
        return Outcome.done(_state_from(response), status_code=status)
    if status == 409:
        # The tool says it was already compensated (an earlier attempt did it): that is success.
        return Outcome.done(_state_from(response), status_code=status)
    if status == 412:
        return Outcome.drifted(
            scrub(
                f"{where} answered 412: the target drifted from the after snapshot. {_excerpt(response)}"
            ).strip(),
            status_code=status,
        )
    if 400 <= status < 500:
        return Outcome.failed(
            scrub(f"{where} answered {status}. {_excerpt(response)}").strip(), status_code=status
        )
    return Outcome.retry(
        scrub(f"{where} answered {status}. {_excerpt(response)}").strip(), status_code=status
    )


def _state_from(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        data = response.json()
    except ValueError:
        return None
    return data.get("state") if isinstance(data, dict) else None


def _excerpt(response: httpx.Response) -> str:
    return response.text[:500]


# --- MCP compensators ------------------------------------------------------------------------

# JSON-RPC errors that say the call itself is wrong (no such tool or method, arguments the server
# refuses): retrying the same call cannot help. Any other error is the server's trouble: retried.
_PERMANENT_MCP_ERRORS = frozenset({METHOD_NOT_FOUND, INVALID_PARAMS})


def mcp_call(*, url: str, tool: str, headers_env: dict[str, str], request: CompensationRequest) -> Outcome:
    """Call ``tool`` on the MCP server at ``url`` (Streamable HTTP) with the step's args.

    The webhook protocol's other fields travel where MCP has room for them: the idempotency key
    as the ``Idempotency-Key`` header and, with the step's ids, in the request's ``_meta``
    (``saga/…`` keys). A result with ``isError`` is a permanent failure whose message is kept; a
    transport error, a time-out or a server-side JSON-RPC error is retried with the usual backoff.
    Header values come from the environment only; they are never logged or recorded."""
    # Named by its tool, not its URL, as a webhook compensator is (webhook_call).
    where = compensator_label("MCP", request.tool)
    missing = sorted({env for env in headers_env.values() if not os.environ.get(env)})
    if missing:
        return Outcome.failed(
            f"The MCP compensator for {request.tool} sends headers from the environment, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set in the worker's environment; "
            f"{tool} at {where} was not called. Set {'it' if len(missing) == 1 else 'them'} and retry this step."
        )
    if not isinstance(request.args, dict):
        return Outcome.failed(
            f"{tool} at {where} takes its arguments as an object, but this step's args are "
            f"{type(request.args).__name__}; nothing was called."
        )
    headers = {name: os.environ[env] for name, env in headers_env.items()}
    headers["Idempotency-Key"] = request.idempotency_key
    headers["User-Agent"] = "saga-admin-compensator/1"
    meta = {
        "saga/idempotency_key": request.idempotency_key,
        "saga/step_id": request.step_id,
        "saga/action_id": request.action_id,
        "saga/run_id": request.run_id,
        "saga/tenant": request.tenant,
        "saga/attempt": request.attempt,
    }
    try:
        result = _run_async(
            _mcp_call_tool(
                url=url, tool=tool, args=request.args, headers=headers, meta=meta, timeout_s=request.timeout_s
            )
        )
    except TimeoutError:
        return Outcome.retry(f"Timed out after {request.timeout_s:g}s calling {tool} at {where}.")
    except Exception as exc:  # noqa: BLE001 - anything the server's side causes is the step's to record
        outcome = _mcp_error_outcome(exc, tool=tool, where=where, timeout_s=request.timeout_s)
        return replace(outcome, error=_without_url(outcome.error, url=url, label=where))
    if result.is_error:
        return Outcome.failed(
            _without_url(
                f"{tool} at {where} answered with an error: {_result_text(result) or '(no message)'}",
                url=url,
                label=where,
            )
        )
    state = result.structured_content if result.structured_content is not None else _result_text(result)
    return Outcome.done(state if state != "" else None)


async def _mcp_call_tool(
    *,
    url: str,
    tool: str,
    args: dict[str, Any],
    headers: dict[str, str],
    meta: dict[str, Any],
    timeout_s: float,
) -> CallToolResult:
    # One deadline for the whole exchange (connect, negotiate, call, close), as a webhook call has.
    with anyio.fail_after(timeout_s):
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout_s)) as http:
            transport = streamable_http_client(url, http_client=http)
            async with McpClient(transport, read_timeout_seconds=timeout_s, cache=None) as client:
                return await client.call_tool(tool, args, meta=cast(RequestParamsMeta, meta))


def _run_async(coroutine: Any) -> Any:
    """Run a coroutine to completion from sync code: the RQ worker has no event loop, but a caller
    that already runs one (an async test, a web thread) gets a thread of its own for it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups: anyio's task groups wrap what a transport raises."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _mcp_error_outcome(exc: Exception, *, tool: str, where: str, timeout_s: float) -> Outcome:
    leaves = _leaves(exc)
    if any(isinstance(leaf, TimeoutError | httpx2.TimeoutException) for leaf in leaves):
        return Outcome.retry(f"Timed out after {timeout_s:g}s calling {tool} at {where}.")
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            if leaf.code in _PERMANENT_MCP_ERRORS:
                return Outcome.failed(
                    f"{where} refused the call to {tool}: {leaf.message} (JSON-RPC {leaf.code})."
                )
            return Outcome.retry(
                f"{where} answered the call to {tool} with JSON-RPC error {leaf.code}: {leaf.message}"
            )
    for leaf in leaves:
        if isinstance(leaf, httpx2.TransportError | OSError):
            return Outcome.retry(f"Could not reach {where} to call {tool}: {type(leaf).__name__}: {leaf}")
    first = leaves[0]
    return Outcome.retry(f"Calling {tool} at {where} failed: {type(first).__name__}: {first}")


def _result_text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))[:2000]


def compensator_label(kind: str, tool: str) -> str:
    """How a step's error names a compensator: by kind and tool ("the webhook compensator of
    hr.delete_user"), never by where it points."""
    return f"the {kind} compensator of {tool}"


def _without_url(text: str, *, url: str, label: str) -> str:
    """``text`` with the compensator's URL (and its origin, which transport errors quote) replaced
    by ``label``: a library's message may quote the address it failed to reach."""
    parts = httpx.URL(url)
    port = f":{parts.port}" if parts.port else ""
    origin = f"{parts.scheme}://{parts.host}{port}"
    for quoted in sorted(
        {url, f"{origin}{parts.path}", origin, f"{parts.host}{port}"}, key=len, reverse=True
    ):
        if quoted:
            text = text.replace(quoted, label)
    return text


def call_timeout_s(*, step_timeout_s: float | None = None) -> float:
    """How long one compensator call may take: the webhook timeout, shortened by the policy's
    ``unwind.step_timeout_s`` when that is smaller."""
    timeout = saga().webhook_timeout_s
    if step_timeout_s:
        timeout = min(timeout, float(step_timeout_s))
    return timeout


def mcp_tool_names(*, url: str, headers: dict[str, str]) -> set[str]:
    """The tools the MCP server at ``url`` lists: ``initialize`` and ``tools/list``, every page; no
    tool is called (the dashboard's compensator check, recovery.compensator_checks)."""
    return cast(set[str], _run_async(_mcp_list_tools(url=url, headers=headers, timeout_s=call_timeout_s())))


async def _mcp_list_tools(*, url: str, headers: dict[str, str], timeout_s: float) -> set[str]:
    names: set[str] = set()
    with anyio.fail_after(timeout_s):
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout_s)) as http:
            transport = streamable_http_client(url, http_client=http)
            async with McpClient(transport, read_timeout_seconds=timeout_s, cache=None) as client:
                cursor: str | None = None
                for _page in range(100):
                    listed = await client.list_tools(cursor=cursor)
                    names.update(tool.name for tool in listed.tools)
                    cursor = listed.next_cursor
                    if not cursor:
                        break
    return names
