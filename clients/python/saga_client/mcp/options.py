"""What a gateway runs with: its ``Options`` (from the command line, ``saga_client.mcp.cli``),
their defaults, and ``GatewayError``, the startup problem it reports in one sentence."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

DEFAULT_AGENT = "mcp"
DEFAULT_APPROVAL_TIMEOUT_S = 300.0
DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_IDLE_TIMEOUT_S = 1800.0
DEFAULT_HEARTBEAT_S = 30.0
# How often, at most, the gateway revalidates its copy of the tenant's policies (a 304 when they
# did not change): a policy loaded while it runs governs its calls within this many seconds.
DEFAULT_POLICY_REFRESH_S = 5.0
# How long, beyond the call time-out, a repeated request waits for the first one's outcome.
REPLAY_WAIT_MARGIN_S = 30.0


class GatewayError(Exception):
    """A configuration or startup problem: printed as one sentence, exit status 2 (or 1)."""

    def __init__(self, message: str, *, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Options:
    saga_url: str
    api_key: str
    upstream: str
    agent: str = DEFAULT_AGENT
    namespace: str = ""
    listen: tuple[str, int] | None = None
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    upstream_headers: tuple[tuple[str, str], ...] = ()
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    poll_interval_s: float = 1.0
    policy_refresh_s: float = DEFAULT_POLICY_REFRESH_S
    # The bearer token every HTTP request must carry (``SAGA_MCP_TOKEN``); empty: no token asked.
    token: str = field(default="", repr=False)

    def recorded_name(self, tool: str) -> str:
        return f"{self.namespace}.{tool}" if self.namespace else tool


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host``: ``localhost`` or a loopback address. Any
    other name may resolve to an address others reach, so it counts as open."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
