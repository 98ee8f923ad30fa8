"""Sending a batch of audit stream messages to one sink; ``SendFailed`` when it did not arrive
(the cursor then stays where it was and the batch is sent again later).

- syslog: one TCP (or TLS) connection per batch, the messages framed by octet counting. TCP says
  nothing about what the receiver read, so the batch counts as delivered only once the receiver,
  having read to the end (our half-close), closes its side: a receiver gone mid-batch is an error,
  not a silent loss.
- HEC: one POST of the batch, ``Authorization: Splunk <token>``; any 2xx is delivered.

A tenant's sink is hostile: its URL is checked again (``infra.outbound``) and the connection goes
to the addresses checked, never to a fresh DNS answer; the installation's are the operator's.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from infra import deadline, errors, outbound
from recovery.audit_stream import config, records
from recovery.audit_stream.models import AuditSink


class SendFailed(Exception):
    pass


# What a syslog receiver may send back before the send counts as failed (RFC 6587 receivers send none).
MAX_ANSWER_BYTES = 64 * 1024


def send(sink: config.Sink, messages: Sequence[dict[str, Any]], *, timeout: float) -> None:
    if not messages:
        return
    try:
        if sink.kind == AuditSink.Kind.SYSLOG:
            _send_syslog(sink, messages, timeout=timeout)
        else:
            _send_hec(sink, messages, timeout=timeout)
    except errors.UrlNotAllowed as exc:
        raise SendFailed(f"the sink's URL is not allowed: {exc.message}") from exc
    except (OSError, httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        # ValueError: a URL urlsplit cannot take apart (a port out of range); the sink waits out
        # its backoff with the error shown, and the other sinks and tenants go on.
        raise SendFailed(f"{type(exc).__name__}: {exc}") from exc


def _tls_context(sink: config.Sink) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=sink.ca_file or None)
    if not sink.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _targets(sink: config.Sink) -> tuple[str, list[tuple[str, int]], bool]:
    """The host (for TLS), the addresses to connect to, and whether to speak TLS."""
    if sink.hostile:
        checked = config.check_tenant_sink(
            kind=sink.kind, url=sink.url, token=sink.token, tenant_id=sink.tenant_id
        )
        addresses = checked.addresses or (checked.host,)
        # TLS as the check read the scheme: what passed the rule is what is sent.
        tls = checked.scheme in outbound.TLS_SCHEMES
        return checked.host, [(address, checked.port) for address in addresses], tls
    parts = urlsplit(sink.url)
    if not parts.hostname or not parts.port:
        raise SendFailed(f"the syslog URL needs a host and a port: {sink.url}")
    return parts.hostname, [(parts.hostname, parts.port)], sink.tls


def _connect(targets: list[tuple[str, int]], limit: deadline.Deadline) -> socket.socket:
    last: OSError | None = None
    for address in targets:
        if limit.left() <= 0:
            break
        try:
            return socket.create_connection(address, timeout=limit.left())
        except OSError as exc:
            last = exc
    raise last or SendFailed(f"no connection within {limit.seconds:g}s")


def _send_syslog(sink: config.Sink, messages: Sequence[dict[str, Any]], *, timeout: float) -> None:
    """One deadline, ``timeout`` from the start, for the whole send: connecting (every address
    tried), the TLS handshake, the batch and the receiver's close. Each step gets what is left of
    it, so a receiver that reads (or answers) a byte at a time holds a pass no longer than one
    that never answers."""
    limit = deadline.Deadline.after(timeout)
    host, targets, tls = _targets(sink)
    payload = b"".join(records.syslog_frame(message) for message in messages)
    raw = _connect(targets, limit)
    conn: socket.socket = raw
    try:
        if tls:
            # CPython's handshake keeps the socket's timeout as one deadline across its reads.
            raw.settimeout(_left(limit, "the TLS handshake"))
            conn = _tls_context(sink).wrap_socket(raw, server_hostname=host)
        # sendall keeps its timeout as one deadline for all it sends (Python 3.5 and later).
        conn.settimeout(_left(limit, "the batch"))
        conn.sendall(payload)
        # Half-close, then wait for the receiver to close its side: it has read everything. Within
        # the deadline (not per read: a receiver trickling a byte at a time holds nothing longer)
        # and for at most a little it may say back.
        conn.shutdown(socket.SHUT_WR)
        answered = 0
        while True:
            left = limit.left()
            if left <= 0:
                raise SendFailed(
                    f"the receiver did not close the connection within {timeout:g}s of the batch's start"
                )
            conn.settimeout(left)
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                continue  # the deadline passed during the read: the check above says so
            if not chunk:
                break
            answered += len(chunk)
            if answered > MAX_ANSWER_BYTES:
                raise SendFailed(
                    f"the receiver sent back more than {MAX_ANSWER_BYTES} bytes; syslog receivers send nothing"
                )
    except TimeoutError as exc:
        raise SendFailed(
            f"the send did not finish within {timeout:g}s (the deadline for the whole send)"
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            conn.close()


def _left(limit: deadline.Deadline, what: str) -> float:
    left = limit.left()
    if left <= 0:
        raise SendFailed(
            f"no time left for {what} within {limit.seconds:g}s (the deadline for the whole send)"
        )
    return left


def _send_hec(sink: config.Sink, messages: Sequence[dict[str, Any]], *, timeout: float) -> None:
    content = records.hec_body(messages)
    headers = {"Authorization": f"Splunk {sink.token}", "Content-Type": "application/json"}
    if sink.hostile:
        checked = config.check_tenant_sink(
            kind=sink.kind, url=sink.url, token=sink.token, tenant_id=sink.tenant_id
        )
        response = outbound.post(checked, content=content, headers=headers, timeout=timeout)
    else:
        verify: ssl.SSLContext | bool = _tls_context(sink) if sink.tls else True
        with deadline.client(verify=verify) as client:
            response = deadline.post(client, sink.url, deadline_s=timeout, content=content, headers=headers)
    if not response.is_success:
        raise SendFailed(f"HTTP {response.status_code}: {response.text[:300]}")
