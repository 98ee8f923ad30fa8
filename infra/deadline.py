"""One total deadline for every outbound HTTP call: connect, TLS, send and receive together.

httpx's timeouts bound each network operation, not the request: a server that sends one byte every
9 s under a 10 s timeout never times out, and holds the worker that called it for as long as it
likes. Every outbound caller (compensator webhooks, a run's ``resume_url``, notification channels,
Slack's ``response_url``, the audit stream's HEC sinks, SSO discovery) sends through ``request``
with a client from ``client()``: the deadline is set in the calling thread for the whole call and
the client's network streams give each read and write only what is left of it; when nothing is
left the call ends with ``DeadlineExceeded``, an ``httpx.TimeoutException`` (so every caller's
existing "timed out, try again later" path takes it, the audit stream's backoff included).

The stream wrapper is a httpcore network backend (the layer under httpx that opens sockets), so it
holds for pooled keep-alive connections and for env-configured proxies (``HTTPS_PROXY``, mounted
with the same transport) alike. Raw sockets (the syslog sink) use ``Deadline.left`` themselves.
MCP compensators run under ``anyio.fail_after`` (``recovery.compensators``), which cancels the call
at its deadline.
"""

from __future__ import annotations

import contextlib
import contextvars
import ssl
import time
import typing
from collections.abc import Iterator
from dataclasses import dataclass

import httpcore
import httpx
from httpx._utils import get_environment_proxies

# The deadline of the call under way in this thread (or task): a monotonic time, or None.
_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "saga_outbound_deadline", default=None
)


_GRAIN_S = 0.05


class DeadlineExceeded(httpx.TimeoutException):
    """The whole call took longer than its deadline (however the time was spent)."""


@dataclass(frozen=True)
class Deadline:
    """``seconds`` from when it was made; ``left()`` is what remains (never below 0)."""

    seconds: float
    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(seconds=seconds, at=time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def message(self) -> str:
        return f"no complete answer within {self.seconds:g}s (the deadline for the whole call)"


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """Every network operation in this block, in this thread, shares one deadline ``seconds`` away
    (an enclosing, earlier one stays in force: the one yielded is the one in force)."""
    mine = Deadline.after(seconds)
    outer = _DEADLINE.get()
    in_force = mine if outer is None or outer.at > mine.at else outer
    token = _DEADLINE.set(in_force)
    try:
        yield in_force
    finally:
        _DEADLINE.reset(token)


def request(
    client: httpx.Client, method: str, url: httpx.URL | str, *, deadline_s: float, **kwargs: typing.Any
) -> httpx.Response:
    """``client.request(...)`` (the body read in full) within ``deadline_s`` in all. Raises
    ``DeadlineExceeded`` (an ``httpx.TimeoutException``) when it is not done in time."""
    with deadline(deadline_s) as mine:
        try:
            return client.request(method, url, timeout=deadline_s, **kwargs)
        except httpx.TimeoutException as exc:
            # A socket timeout cut to the deadline fires at it (within the clock's grain).
            if mine.left() <= _GRAIN_S and not isinstance(exc, DeadlineExceeded):
                raise DeadlineExceeded(mine.message(), request=exc.request) from exc
            raise


def post(
    client: httpx.Client, url: httpx.URL | str, *, deadline_s: float, **kwargs: typing.Any
) -> httpx.Response:
    return request(client, "POST", url, deadline_s=deadline_s, **kwargs)


def get(
    client: httpx.Client, url: httpx.URL | str, *, deadline_s: float, **kwargs: typing.Any
) -> httpx.Response:
    return request(client, "GET", url, deadline_s=deadline_s, **kwargs)


def client(*, verify: ssl.SSLContext | bool = True, **kwargs: typing.Any) -> httpx.Client:
    """An ``httpx.Client`` whose every connection keeps to the deadline of the call (``request``),
    never following a redirect unless asked. Proxies from the environment are honoured, as a plain
    ``httpx.Client`` honours them, through the same deadline-keeping transport."""
    mounts: dict[str, httpx.BaseTransport | None] = {
        pattern: None if proxy is None else DeadlineTransport(verify=verify, proxy=proxy)
        for pattern, proxy in get_environment_proxies().items()
    }
    kwargs.setdefault("follow_redirects", False)
    return httpx.Client(transport=DeadlineTransport(verify=verify), mounts=mounts, **kwargs)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport, its connections opened through ``_DeadlineBackend``. A request sent
    without a deadline (not through ``request``) is refused: no outbound call goes unbounded."""

    def __init__(self, **kwargs: typing.Any) -> None:
        super().__init__(**kwargs)
        # httpcore's pool takes a network backend; httpx builds the pool without one (its default,
        # sync sockets), so the pool's is wrapped here, for direct and proxied connections alike.
        pool = self._pool
        pool._network_backend = _DeadlineBackend(pool._network_backend)  # noqa: SLF001

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if _DEADLINE.get() is None:
            raise RuntimeError("An outbound request without a deadline: send it with infra.deadline.request.")
        return super().handle_request(request)


def _bounded(timeout: float | None, *, what: str) -> float | None:
    """``timeout`` cut to what is left of the call's deadline; the deadline passed: the op's
    timeout error (httpx maps httpcore's to its own)."""
    current = _DEADLINE.get()
    if current is None:
        return timeout
    left = current.left()
    if left <= 0:
        raise _TIMEOUTS[what](current.message())
    return left if timeout is None else min(timeout, left)


_TIMEOUTS: dict[str, type[httpcore.TimeoutException]] = {
    "connect": httpcore.ConnectTimeout,
    "read": httpcore.ReadTimeout,
    "write": httpcore.WriteTimeout,
}


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout=_bounded(timeout, what="read"))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout=_bounded(timeout, what="write"))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        # The handshake is bounded as a whole by the socket's timeout (CPython's ssl keeps one
        # deadline across its reads), so what is left of the call's deadline bounds it.
        inner = self._inner.start_tls(ssl_context, server_hostname, timeout=_bounded(timeout, what="connect"))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host,
            port,
            timeout=_bounded(timeout, what="connect"),
            local_address=local_address,
            socket_options=socket_options,
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(
            path, timeout=_bounded(timeout, what="connect"), socket_options=socket_options
        )
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
