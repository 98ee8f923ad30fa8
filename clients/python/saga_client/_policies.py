"""The tenant's policies as a client keeps them: ``GET /policies`` and its ETag, revalidated with
``If-None-Match`` (a 304 when nothing changed) at most every ``policy_refresh_s`` seconds (an
option of ``Saga``/``AsyncSaga``, 5 s by default), and the policy that governs a tool, picked as the
server picks it (``ledger/policies/resolve.py``): an exact name beats a glob, a tenant's policy
beats a global one, and among globs the one with the longer literal part wins. The client reads
them for the steps whose policy has ``before`` (``saga_client._before``)."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Generator, Mapping
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
# A flow (``saga_client._core.Flow``), named here without importing it: ``_core`` imports this.
Flow = Generator[Any, Any, T]


class Api(Protocol):
    """What the cache needs of ``saga_client._core.Api``."""

    def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None) -> Flow[Any]: ...


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _rank(policy: Mapping[str, Any]) -> tuple[int, int, int]:
    pattern = str(policy.get("tool", ""))
    literal = sum(1 for ch in pattern if ch not in "*?[]")
    return (0 if _is_glob(pattern) else 1, 1 if policy.get("scope") == "tenant" else 0, literal)


def policy_for(policies: list[Mapping[str, Any]], tool: str) -> Mapping[str, Any] | None:
    """The policy that governs ``tool``, by the server's precedence (``ledger/policies/resolve.py``)."""
    candidates = [
        p
        for p in policies
        if p.get("tool") == tool
        or (_is_glob(str(p.get("tool", ""))) and fnmatch.fnmatchcase(tool, p["tool"]))
    ]
    return max(candidates, key=_rank) if candidates else None


class PolicyCache:
    """The tenant's policies as ``GET /policies`` answered last, kept current with its ETag."""

    def __init__(self, refresh_s: float) -> None:
        self.refresh_s = refresh_s
        self.policies: list[Mapping[str, Any]] | None = None
        self.etag = ""
        self._checked_at = 0.0
        # How often the server was asked, and how often it answered 304 (nothing changed).
        self.fetches = 0
        self.not_modified = 0

    def current(self, api: Api) -> Flow[list[Mapping[str, Any]]]:
        if self.policies is not None and time.monotonic() - self._checked_at < self.refresh_s:
            return self.policies
        headers = {"If-None-Match": self.etag} if self.etag and self.policies is not None else None
        reply = yield from api.request("GET", "/policies", headers=headers)
        self.fetches += 1
        if reply.status == 304 and self.policies is not None:
            self.not_modified += 1
        else:
            self.policies = list(reply.data["policies"])
            self.etag = reply.etag
        self._checked_at = time.monotonic()
        return self.policies

    def before_of(self, api: Api, tool: str) -> Flow[Mapping[str, Any] | None]:
        """The ``before`` of the policy governing ``tool`` (None: the policy takes no images)."""
        policies = yield from self.current(api)
        policy = policy_for(policies, tool)
        before = policy.get("before") if policy else None
        return before if isinstance(before, Mapping) else None
