"""The tenant's policies as the gateway knows them: the last ``GET /policies`` answer and its ETag,
revalidated with ``If-None-Match`` (the server answers 304 when nothing changed) at most once per
``refresh_s`` seconds, and at once when a recorded action shows a policy the copy does not have.

``before_of(tool)`` is the ``before`` read of the policy that governs ``tool`` (the namespaced name,
as the gateway records it), picked as the server picks (``ledger/policies/resolve.py``): an exact
name beats a glob, a tenant's policy beats the global one, the longer literal part wins
(``saga_client._policies.policy_for``, the client's one copy of that rule).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio
import httpx

from saga_client._core import Flow, Send
from saga_client._policies import policy_for
from saga_client.aio import AsyncSaga
from saga_client.errors import SagaError, SagaUnavailable, error_from_response
from saga_client.mcp.options import DEFAULT_POLICY_REFRESH_S

log = logging.getLogger(__name__)

__all__ = ["PolicyCache", "policy_for"]


def _revalidate(etag: str) -> Flow[tuple[int, Any, str]]:
    """One ``GET /policies`` with ``If-None-Match``: (status, body or None, ETag)."""
    headers = {"If-None-Match": etag} if etag else {}
    try:
        response: httpx.Response = yield Send("GET", "/policies", None, None, headers)
    except httpx.TransportError as exc:
        raise SagaUnavailable(
            f"Saga Admin did not answer GET /policies ({type(exc).__name__}: {exc})", attempts=1
        ) from exc
    if response.status_code == 304:
        return 304, None, response.headers.get("ETag", etag)
    if response.status_code >= 400:
        raise error_from_response(response)
    return response.status_code, response.json(), response.headers.get("ETag", "")


class PolicyCache:
    def __init__(self, saga: AsyncSaga, *, refresh_s: float = DEFAULT_POLICY_REFRESH_S) -> None:
        self.saga = saga
        self.refresh_s = refresh_s
        self.policies: list[Mapping[str, Any]] = []
        self.etag = ""
        self.loaded = False
        self.checked_at = float("-inf")
        # What the revalidations were answered (tests and the logs read these).
        self.fetched = 0
        self.not_modified = 0
        self._lock = anyio.Lock()

    async def refresh(self, *, force: bool = False) -> None:
        """Revalidate the copy when it is older than ``refresh_s`` (or ``force``). A Saga Admin
        that cannot be reached keeps the last copy (logged); with no copy at all, ``SagaError``."""
        async with self._lock:
            if not force and time.monotonic() - self.checked_at < self.refresh_s:
                return
            try:
                status, body, etag = await self.saga._drive(_revalidate(self.etag if self.loaded else ""))
            except SagaError as exc:
                if not self.loaded:
                    raise
                log.warning("saga-mcp: could not revalidate the policies (%s); keeping the last copy", exc)
                return
            self.checked_at = time.monotonic()
            if status == 304:
                self.not_modified += 1
                log.debug("saga-mcp: policies unchanged (event=policies_not_modified etag=%s)", etag)
                return
            self.fetched += 1
            self.policies = list((body or {}).get("policies") or [])
            self.etag, self.loaded = etag, True
            log.info(
                "saga-mcp: policies loaded (event=policies_loaded etag=%s policies=%d)",
                etag,
                len(self.policies),
            )

    def before_of(self, tool: str) -> dict[str, Any] | None:
        """The ``before`` read of the policy that governs ``tool``, or None."""
        policy = policy_for(self.policies, tool)
        before = policy.get("before") if policy is not None else None
        return dict(before) if isinstance(before, Mapping) and before.get("tool") else None
