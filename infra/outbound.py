"""Outbound requests to URLs that a tenant or an agent chose (a run's ``resume_url`` today, a
tenant's notification channels tomorrow): where they may go, how they are sent, how they are
signed. URLs the operator of the installation configures (compensator webhooks in the policy file,
``SAGA_NOTIFY_WEBHOOKS``) are trusted and do not come through here.

- ``check_url`` is the one guard. The URL must be http(s) with a host, and the host — a literal
  address, or every address the system resolver gives for the name (IPv4 and IPv6; decimal, octal
  and hex IPv4 forms read as the resolver reads them; IPv4 inside IPv6) — must be a public
  address: not loopback, private (RFC 1918, CGNAT, ULA), link-local (169.254.169.254 included),
  multicast, reserved or unspecified. ``SAGA_OUTBOUND_ALLOWED_HOSTS`` names the internal hosts an
  operator allows (``host`` or ``host:port``, matched against the URL as written, not resolved).
  A name that does not resolve (or not within ``SAGA_OUTBOUND_RESOLVE_TIMEOUT_S``, 1 s by default)
  is refused (reason ``unresolvable``): what cannot be checked does not pass. A refusal because of
  where the host is, or whether it resolves, tells the caller only that the URL is not allowed (the
  same message and details for "private" and "does not resolve": anything more would map the
  internal network for whoever sends names); the reason and the operator's message ride on the
  exception (``reason``, ``operator_message``, ``resolved_address``) for the audit log.
- ``post`` sends to the addresses that ``check_url`` checked, not to a fresh DNS answer, so a name
  that resolved to a public address when it was checked cannot be re-pointed at an internal one
  between the check and the connection (DNS rebinding). It never follows redirects, and its
  ``timeout`` is one deadline for the whole call, every address tried included
  (``infra.deadline``): an endpoint that dribbles its answer holds the caller no longer.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import httpx
from django.core.exceptions import ImproperlyConfigured

from infra import deadline, errors
from infra.conf import saga

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Why a URL was refused: ``UrlNotAllowed.reason`` (and ``details["reason"]`` for the first three,
# which say nothing about the network). Only ``unresolvable`` may change by itself (a DNS outage);
# every other reason is final for the URL as it stands.
INVALID = "invalid"
SCHEME = "scheme"
NO_HOST = "no_host"
UNRESOLVABLE = "unresolvable"
PLAINTEXT = "plaintext"
UNSPECIFIED = "unspecified"
LOOPBACK = "loopback"
LINK_LOCAL = "link_local"
MULTICAST = "multicast"
PRIVATE = "private"
RESERVED = "reserved"

# Reasons that depend on where the host is (or on whether it resolves): the caller is told none
# of them apart.
_NETWORK_REASONS = frozenset({UNRESOLVABLE, UNSPECIFIED, LOOPBACK, LINK_LOCAL, MULTICAST, PRIVATE, RESERVED})

_DESCRIPTIONS = {
    UNSPECIFIED: "an unspecified address",
    LOOPBACK: "a loopback address",
    LINK_LOCAL: "a link-local address (cloud metadata services live there)",
    MULTICAST: "a multicast address",
    PRIVATE: "a private address",
    RESERVED: "a reserved or non-public address",
}

# Private ranges named as such in the message; everything else that is not globally routable is
# "reserved" (documentation, benchmarking, 240/4, broadcast, deprecated IPv4-compatible IPv6, …).
_PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
# NAT64's well-known prefix carries an IPv4 address in its last 32 bits; judge that address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Name resolution runs on threads of its own so that a name whose DNS server never answers costs
# its caller at most the configured timeout. A lookup cannot be interrupted: a stuck one holds its
# thread until the C library gives up (seconds to minutes). One pool shared by every tenant let one
# tenant's names under a zone that never answers fill it, and every other tenant's checks then
# timed out waiting behind them. So the threads are shared out per owner (the tenant whose URL it
# is): one owner holds at most ``_OWNER_THREADS`` lookups at once (its further lookups wait, within
# their own timeout, for one of its own to end), and all owners together ``_MAX_THREADS``.
_OWNER_THREADS = 4
_MAX_THREADS = 64
_resolver: tuple[int, _FairResolver] | None = None
_resolver_lock = threading.Lock()


@dataclass(frozen=True)
class CheckedUrl:
    """A URL that passed ``check_url``. ``addresses``: the public addresses its host resolved to,
    which ``post`` connects to (empty when the host is allowed by ``SAGA_OUTBOUND_ALLOWED_HOSTS``
    and is reached by name)."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]
    allowed_by_setting: bool


# The schemes ``check_url`` takes by default, with their default ports.
HTTP_SCHEMES: Mapping[str, int] = {"http": 80, "https": 443}


TLS_SCHEMES = frozenset({"https", "tcp+tls"})


def url_scheme(url: str) -> str:
    """The scheme of ``url`` as ``check_url`` reads it (httpx's parse: lower case), "" when it does
    not parse. Whatever decides how a URL is sent (TLS or not) asks here, so a check and a sender
    never read one URL two ways (``TCP+TLS://`` passed the TLS rule and went out in clear text)."""
    try:
        return httpx.URL(url).scheme
    except (httpx.InvalidURL, TypeError, ValueError):
        return ""


def check_url(
    url: str,
    *,
    field: str = "url",
    schemes: Mapping[str, int] = HTTP_SCHEMES,
    tls: bool = False,
    owner: str = "",
) -> CheckedUrl:
    """The guard for every outbound URL a tenant or agent chose (``schemes``: the ones allowed, with
    their default ports; 0: the URL must give one; ``tls``: what is sent must not cross the network
    in clear text, so a scheme without TLS is refused, reason ``plaintext``, except to a host the
    operator allows in ``SAGA_OUTBOUND_ALLOWED_HOSTS``). Raises ``errors.UrlNotAllowed``
    (422 ``url_not_allowed``). A URL that is not http(s) with a host is told so (``details``: field,
    url, reason); one refused for where its host is or whether it resolves is told only that it is
    not allowed (``details``: field, url), with the reason on the exception for the audit log.
    ``owner``: whose URL it is (a tenant's slug): its name is resolved within that owner's share of
    the resolver threads (``resolve``)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        # Not parsed, so credentials cannot be cut out: everything up to an "@" is left out.
        shown = url.rpartition("@")[2] if isinstance(url, str) else ""
        raise _refusal(f"{field} is not a valid URL: {exc}", field=field, url=shown, reason=INVALID) from exc
    shown = _without_userinfo(parsed)
    if parsed.scheme not in schemes:
        wanted = "an http(s)" if schemes is HTTP_SCHEMES else "a " + " or ".join(f"{s}://" for s in schemes)
        raise _refusal(
            f"{field} must be {wanted} URL, not {parsed.scheme or 'a relative URL'}.",
            field=field,
            url=shown,
            reason=SCHEME,
        )
    host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    if not host:
        raise _refusal(f"{field} has no host.", field=field, url=shown, reason=NO_HOST)
    port = parsed.port or schemes[parsed.scheme]
    if not port:
        raise _refusal(f"{field} has no port.", field=field, url=shown, reason=INVALID)
    if _allowed_by_setting(host, port):
        return CheckedUrl(
            url=url, scheme=parsed.scheme, host=host, port=port, addresses=(), allowed_by_setting=True
        )
    literal = _ip(host)
    addresses = (
        (str(literal),) if literal is not None else resolve(host, port, field=field, url=shown, owner=owner)
    )
    for address in addresses:
        reason = address_refusal(address)
        if reason is not None:
            how = "is" if literal is not None else "resolves to"
            raise _refusal(
                f"{field} host {host} {how} {_DESCRIPTIONS[reason]}; outbound requests go only to "
                "public addresses or to hosts the operator allows in SAGA_OUTBOUND_ALLOWED_HOSTS.",
                field=field,
                url=shown,
                reason=reason,
                address=address,
            )
    # Last: a URL refused for where it points is told that first, whatever its scheme.
    if tls and parsed.scheme not in TLS_SCHEMES:
        secure = " or ".join(f"{s}://" for s in schemes if s in TLS_SCHEMES)
        raise _refusal(
            f"{field} must use {secure}: what is sent there must not cross the network in clear "
            "text (plain connections go only to hosts the operator allows).",
            field=field,
            url=shown,
            reason=PLAINTEXT,
        )
    return CheckedUrl(
        url=url, scheme=parsed.scheme, host=host, port=port, addresses=addresses, allowed_by_setting=False
    )


def address_refusal(address: str) -> str | None:
    """Why an address may not be reached (a reason constant), or None for a public address."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv4-mapped and NAT64 addresses are connections to the IPv4 address they carry; a 6to4
        # address is refused when the IPv4 address it routes to would be.
        if ip.ipv4_mapped is not None:
            return address_refusal(str(ip.ipv4_mapped))
        if ip in _NAT64:
            return address_refusal(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
        if ip.sixtofour is not None and address_refusal(str(ip.sixtofour)) is not None:
            return address_refusal(str(ip.sixtofour))
    return _range_refusal(ip)


def _range_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address, as itself, may not be reached: the range it is in (None: a public one)."""
    if ip.is_unspecified:
        return UNSPECIFIED
    if ip.is_loopback:
        return LOOPBACK
    if ip.is_link_local:
        return LINK_LOCAL
    if ip.is_multicast:
        return MULTICAST
    if any(ip in network for network in _PRIVATE_NETWORKS):
        return PRIVATE
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return RESERVED
    return None


def resolve(host: str, port: int, *, field: str = "url", url: str = "", owner: str = "") -> tuple[str, ...]:
    """Every address the system resolver gives for ``host`` (IPv4 and IPv6, resolver order, no
    duplicates), within ``SAGA_OUTBOUND_RESOLVE_TIMEOUT_S`` (waiting for a free resolver thread of
    ``owner``'s share included). A name that does not resolve (or not in time) raises
    ``UrlNotAllowed`` with reason ``unresolvable``."""
    timeout = saga().outbound_resolve_timeout_s
    try:
        infos = _resolver_of_this_process().lookup(host, port, owner=owner, timeout=timeout)
    except FutureTimeout:
        # The lookup itself cannot be interrupted: it goes on in its thread, counted in its owner's
        # share until it ends; its caller does not wait for it.
        problem = f"did not resolve within {timeout:g} s"
    except (OSError, UnicodeError) as exc:
        problem = f"does not resolve ({exc})"
    else:
        addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
        if addresses:
            return addresses
        problem = "does not resolve (no addresses)"
    raise _refusal(
        f"{field} host {host} {problem}; it must name a host with a public address, or one the "
        "operator allows in SAGA_OUTBOUND_ALLOWED_HOSTS.",
        field=field,
        url=url,
        reason=UNRESOLVABLE,
    )


def post(
    checked: CheckedUrl, *, content: bytes, headers: Mapping[str, str], timeout: float
) -> httpx.Response:
    """POST to a checked URL: to the addresses ``check_url`` approved (the URL's own Host header,
    and its name for TLS SNI and certificate checks), trying the next one only when a connection
    is refused; never following a redirect (a 3xx is the answer). Within ``timeout`` seconds in all
    (``deadline.DeadlineExceeded``, an ``httpx.TimeoutException``, past it)."""
    url = httpx.URL(checked.url)
    request_headers = dict(headers)
    extensions: dict[str, str] = {}
    targets = [url]
    if checked.addresses and _ip(checked.host) is None:
        request_headers["Host"] = url.netloc.decode("ascii")
        if checked.scheme == "https":
            extensions["sni_hostname"] = checked.host
        targets = [url.copy_with(host=address) for address in checked.addresses]
    with deadline.deadline(timeout), deadline.client() as client:
        for target in targets[:-1]:
            try:
                return deadline.post(
                    client,
                    target,
                    deadline_s=timeout,
                    content=content,
                    headers=request_headers,
                    extensions=extensions,
                    follow_redirects=False,
                )
            except httpx.ConnectError:
                continue
        return deadline.post(
            client,
            targets[-1],
            deadline_s=timeout,
            content=content,
            headers=request_headers,
            extensions=extensions,
            follow_redirects=False,
        )


# --- Helpers ---------------------------------------------------------------------------------


def _refusal(message: str, *, field: str, url: str, reason: str, address: str = "") -> errors.UrlNotAllowed:
    """The refusal as the caller sees it, with why on the side for the operator. Where a host is,
    or whether its name resolves, is not the caller's to learn: those refusals all read alike."""
    if reason in _NETWORK_REASONS:
        told = (
            f"{field} is not allowed: outbound requests go only to public hosts or to hosts the "
            "operator allows."
        )
        refusal = errors.UrlNotAllowed(told, details={"field": field, "url": url})
    else:
        refusal = errors.UrlNotAllowed(message, details={"field": field, "url": url, "reason": reason})
    refusal.reason = reason
    refusal.operator_message = message
    refusal.resolved_address = address
    return refusal


def _without_userinfo(url: httpx.URL) -> str:
    # Credentials in a URL stay out of error messages, logs and the audit log.
    return str(url.copy_with(userinfo=b"")) if url.userinfo else str(url)


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _allowed_by_setting(host: str, port: int) -> bool:
    return any(
        host == allowed_host and allowed_port in (None, port)
        for allowed_host, allowed_port in allowed_hosts()
    )


def owner_of(tenant_id: int) -> str:
    """The resolver share of a tenant's URLs (``check_url``'s ``owner``)."""
    return f"tenant:{tenant_id}"


def allowed_hosts() -> list[tuple[str, int | None]]:
    """``SAGA_OUTBOUND_ALLOWED_HOSTS`` as (host, port or None) pairs. Entries are a host name or an
    IP address, optionally with ``:port`` (``[IPv6]:port``); a malformed one is a configuration
    error, reported when a URL is first checked."""
    return [_allowed_entry(entry) for entry in saga().outbound_allowed_hosts]


def _allowed_entry(entry: str) -> tuple[str, int | None]:
    text = entry.strip().lower()
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ImproperlyConfigured(f"SAGA_OUTBOUND_ALLOWED_HOSTS: {entry!r} is not host[:port].")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ImproperlyConfigured(f"SAGA_OUTBOUND_ALLOWED_HOSTS: {entry!r} has no valid port.")
    try:
        # The same normalisation as a URL's host: lower case, IDNA for names, brackets for IPv6.
        parsed = httpx.URL(f"http://[{host}]/" if ":" in host else f"http://{host}/")
    except httpx.InvalidURL as exc:
        raise ImproperlyConfigured(f"SAGA_OUTBOUND_ALLOWED_HOSTS: {entry!r} is not a host: {exc}") from exc
    normalised = parsed.raw_host.decode("ascii").rstrip(".")
    if not normalised or parsed.userinfo or parsed.path != "/" or parsed.port is not None:
        raise ImproperlyConfigured(f"SAGA_OUTBOUND_ALLOWED_HOSTS: {entry!r} is not host[:port].")
    return normalised, int(port) if port else None


# What getaddrinfo answers: (family, type, proto, canonname, sockaddr) tuples.
AddrInfo = list[tuple[Any, ...]]


class _FairResolver:
    """``socket.getaddrinfo`` on a thread of its own per lookup, at most ``per_owner`` at once for
    one owner and ``most`` for all: a lookup waits (within its timeout) only for its own owner's
    stuck lookups, never for another tenant's."""

    def __init__(self, *, per_owner: int, most: int) -> None:
        self.per_owner, self.most = per_owner, most
        self._changed = threading.Condition()
        self._busy: Counter[str] = Counter()

    def lookup(self, host: str, port: int, *, owner: str, timeout: float) -> AddrInfo:
        """The answer, or ``FutureTimeout`` when there is none within ``timeout`` seconds."""
        until = time.monotonic() + timeout
        with self._changed:
            while self._busy[owner] >= self.per_owner or self._busy.total() >= self.most:
                left = until - time.monotonic()
                if left <= 0:
                    raise FutureTimeout
                self._changed.wait(left)
            self._busy[owner] += 1
        answer: Future[AddrInfo] = Future()
        threading.Thread(
            target=self._run, args=(answer, host, port, owner), name="saga-resolve", daemon=True
        ).start()
        return answer.result(timeout=max(0.0, until - time.monotonic()))

    def _run(self, answer: Future[AddrInfo], host: str, port: int, owner: str) -> None:
        try:
            answer.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who reads it
            answer.set_exception(exc)
        finally:
            with self._changed:
                self._busy[owner] -= 1
                if not self._busy[owner]:
                    del self._busy[owner]
                self._changed.notify_all()


def _resolver_of_this_process() -> _FairResolver:
    # One per process: one inherited across fork (gunicorn, RQ's work horses) counts lookups whose
    # threads did not come along.
    global _resolver
    with _resolver_lock:
        if _resolver is None or _resolver[0] != os.getpid():
            _resolver = (os.getpid(), _FairResolver(per_owner=_OWNER_THREADS, most=_MAX_THREADS))
        return _resolver[1]
