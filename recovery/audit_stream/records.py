"""What the audit stream sends, and how a SIEM checks it.

Every message is one JSON object (docs/OPERATIONS.md, "Audit stream", has an example of each):

- ``{"type": "audit_event", ...}``: one audit event — its id, tenant, ``seq`` (its position in
  this sink's stream of the tenant: 1, 2, 3, … without gaps), kind, actor, run and action ids,
  time, and its hash-chain link (``hash``, ``prev_hash``, ``chain``) as ``ledger.audit`` wrote it;
- ``{"type": "chain_head", ...}``: a signed head. ``head`` is the stream's own running digest,
  ``sha256(previous head + "." + event hash)`` from ``"0" * 64``, over the events of ``seq`` 1 to
  ``position``; ``signature`` is HMAC-SHA256 under ``SAGA_AUDIT_KEY`` of
  ``"saga-audit-head:v1\\n" + tenant + "\\n" + position + "\\n" + head + "\\n" + time``.
  Whoever can write the database cannot make one (the key is not there), so a SIEM that recomputes
  the digest over what it received and finds the signed head proves it has every event up to
  ``position``, unaltered and in order, and that none was removed from the stream.

Syslog carries the JSON as an RFC 5424 message's MSG, framed by octet counting (RFC 6587); HEC
as each event's ``event``, batched (concatenated objects).
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ledger.audit_signing import sign_head, signature_matches
from ledger.models import Event

GENESIS = "0" * 64
HEAD_CONTEXT = "saga-audit-head:v1"
APP_NAME = "saga-admin"
SOURCETYPE = "saga:audit"
# RFC 5424: facility 13 (log audit), severity 6 (informational); structured data under the
# documentation enterprise number (RFC 5612).
PRI = 13 * 8 + 6
SD_ID = "saga@32473"


def next_head(head: str, event_hash: str) -> str:
    return hashlib.sha256(f"{head}.{event_hash}".encode()).hexdigest()


def event_message(event: Event, *, tenant: str, seq: int) -> dict[str, Any]:
    data = event.data if isinstance(event.data, dict) else {}
    action_id = event.subject_id if event.subject_type == "action" else str(data.get("action_id") or "")
    return {
        "type": "audit_event",
        "id": event.id,
        "tenant": tenant,
        "seq": seq,
        "kind": event.kind,
        "subject": {"type": event.subject_type, "id": event.subject_id},
        "from_state": event.from_state,
        "to_state": event.to_state,
        "actor": {"type": event.actor_type, "id": event.actor_id, "label": event.actor_label},
        "run_id": event.run_id or "",
        "action_id": action_id,
        "reason": event.reason,
        "data": data,
        "time": event.created_at.isoformat(),
        "chain": event.chain,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


def head_signature(key: bytes, *, tenant: str, position: int, head: str, time: str) -> str:
    """The stream's heads are signed by the one rule for signed heads (``ledger.audit_signing``),
    under their own context."""
    return sign_head(key, context=HEAD_CONTEXT, scope=tenant, position=position, head=head, time=time)


def head_message(key: bytes, *, tenant: str, position: int, head: str, now: datetime) -> dict[str, Any]:
    time = now.astimezone(UTC).isoformat()
    return {
        "type": "chain_head",
        "tenant": tenant,
        "position": position,
        "head": head,
        "time": time,
        "signature": head_signature(key, tenant=tenant, position=position, head=head, time=time),
    }


def _sd_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def syslog_frame(message: dict[str, Any], *, hostname: str | None = None) -> bytes:
    """One RFC 5424 message carrying ``message`` as its MSG (UTF-8, with the BOM the RFC asks
    for), framed by octet counting (RFC 6587): ``<length> <message>``."""
    is_head = message["type"] == "chain_head"
    time = message["time"]
    params = {"tenant": message["tenant"]}
    if is_head:
        params["position"] = str(message["position"])
    else:
        params.update(seq=str(message["seq"]), id=str(message["id"]), kind=message["kind"])
    sd = "[" + SD_ID + "".join(f' {k}="{_sd_value(v)}"' for k, v in params.items()) + "]"
    host = (hostname or socket.gethostname() or "-")[:255].replace(" ", "-")
    msgid = "chain-head" if is_head else "audit"
    header = f"<{PRI}>1 {time} {host} {APP_NAME} - {msgid} {sd} "
    body = header.encode() + b"\xef\xbb\xbf" + json.dumps(message, separators=(",", ":")).encode()
    return str(len(body)).encode() + b" " + body


def hec_body(messages: Iterable[dict[str, Any]], *, hostname: str | None = None) -> bytes:
    """Splunk HEC's batch: one ``{"time", "host", "source", "sourcetype", "event"}`` per message,
    concatenated. ``time`` is epoch seconds."""
    host = hostname or socket.gethostname()
    parts = []
    for message in messages:
        epoch = datetime.fromisoformat(message["time"]).timestamp()
        envelope = {"time": round(epoch, 6), "host": host, "source": APP_NAME, "sourcetype": SOURCETYPE}
        parts.append(json.dumps({**envelope, "event": message}, separators=(",", ":")))
    return "\n".join(parts).encode()


# --- What a SIEM does with it (``manage.py verify_audit_stream``) -------------------------------


@dataclass
class StreamReport:
    """What ``verify_stream`` found: per tenant, events received (after removing duplicates) and
    heads verified; ``problems``: each in one line (empty: the stream is whole)."""

    events: dict[str, int] = field(default_factory=dict)
    heads_verified: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_message(line: str) -> dict[str, Any] | None:
    """A message out of one received line: the JSON object itself, a HEC envelope (its
    ``event``) or an RFC 5424 line (the JSON after the BOM, or from its first ``{``)."""
    text = line.strip()
    if not text:
        return None
    if not text.startswith("{"):
        start = text.find("\ufeff{")
        start = start + 1 if start >= 0 else text.find("{")
        if start < 0:
            return None
        text = text[start:]
    value = json.loads(text)
    if isinstance(value, dict) and isinstance(value.get("event"), dict) and "type" not in value:
        value = value["event"]
    return value if isinstance(value, dict) else None


def verify_stream(messages: Iterable[dict[str, Any]], key: bytes) -> StreamReport:
    """Check a received stream: events deduplicated by id, each tenant's ``seq`` without gaps
    from 1, and every chain head's signature and digest over the events up to its position. A
    message of either type without its fields (a line damaged on the way, or forged) is a problem
    of its own, never a crash of the check."""
    report = StreamReport()
    events: dict[str, dict[int, dict[str, Any]]] = {}
    heads: list[dict[str, Any]] = []
    for number, message in enumerate(messages, start=1):
        kind = message.get("type")
        if kind not in _REQUIRED:
            continue
        missing = _malformed(message, _REQUIRED[kind])
        if missing:
            report.problems.append(f"message {number} ({kind}) has no usable {missing}")
            continue
        if kind == "audit_event":
            tenant_events = events.setdefault(message["tenant"], {})
            seen = tenant_events.get(message["seq"])
            if seen is not None and seen["id"] != message["id"]:
                report.problems.append(
                    f"{message['tenant']}: seq {message['seq']} is event {seen['id']} and also {message['id']}"
                )
            tenant_events[message["seq"]] = message
        else:
            heads.append(message)
    digests: dict[str, list[str]] = {}
    for tenant, by_seq in sorted(events.items()):
        report.events[tenant] = len(by_seq)
        head, chain = GENESIS, [GENESIS]
        for seq in range(1, max(by_seq) + 1):
            if seq not in by_seq:
                report.problems.append(f"{tenant}: event seq {seq} is missing")
                break
            head = next_head(head, by_seq[seq]["hash"])
            chain.append(head)
        digests[tenant] = chain
    for message in heads:
        _check_head(message, key, digests, report)
    return report


# The fields each message type must carry, and their JSON types (a seq or position is a whole
# number: a bool is not one, though Python counts it as an int; an event's id is its number).
_REQUIRED: dict[str, dict[str, type]] = {
    "audit_event": {"tenant": str, "seq": int, "id": int, "hash": str},
    "chain_head": {"tenant": str, "position": int, "head": str, "time": str, "signature": str},
}


def _malformed(message: dict[str, Any], fields: dict[str, type]) -> str:
    """The first of ``fields`` that ``message`` lacks or has of another type; "" when none."""
    for name, kind in fields.items():
        value = message.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return name
        if isinstance(value, int) and value < (1 if name == "seq" else 0):
            return name
    return ""


def _check_head(
    message: dict[str, Any], key: bytes, digests: dict[str, list[str]], report: StreamReport
) -> None:
    tenant, position = message["tenant"], message["position"]
    expected = head_signature(
        key, tenant=tenant, position=position, head=message["head"], time=message["time"]
    )
    if not signature_matches(expected, message["signature"]):
        report.problems.append(f"{tenant}: the chain head at position {position} has a bad signature")
        return
    chain = digests.get(tenant, [GENESIS])
    if position >= len(chain):
        report.problems.append(f"{tenant}: the chain head at position {position} is past the events received")
    elif chain[position] != message["head"]:
        report.problems.append(
            f"{tenant}: the events received up to position {position} do not match the signed chain head"
        )
    else:
        report.heads_verified[tenant] = report.heads_verified.get(tenant, 0) + 1
