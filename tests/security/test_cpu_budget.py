"""A valid key does not buy the server's CPU.

- Per-key limits count body bytes as well as requests (``SAGA_THROTTLE_BYTES``), from the headers:
  a key over its bytes gets 429 ``rate_limited`` with ``Retry-After`` before its body is sent,
  let alone parsed, and nothing is recorded; another key is not affected.
- Requests carrying a URL the server checks and will call (a run's ``resume_url``) are limited per
  key (``SAGA_URL_RATE``): over it, the outbound guard resolves nothing.
- A near-limit record is parsed once and never walked value by value, encoded by the standard
  library nowhere (the structural side of the speed-up; the figures are in docs/BENCHMARKS.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from django.core.cache import caches

from infra import hashing, outbound, throttle
from infra.hashing import canonical_json
from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.services.keys import agent_key_create
from recovery.models import Approval
from recovery.notifications.outbox import ARGS_SHOWN_MAX, approval_lines
from saga_admin.api import limits
from tests.security.test_api_edge import _headers_only, _read_response
from tests.support.api import Api, error_of

DAY_S = 86400
# A public address as a literal, so the guard passes it without resolving a name.
PUBLIC_RESUME_URL = "https://93.184.216.34/saga/commands"


def _clear_key_counts() -> None:
    client = caches["default"]._cache.get_client(write=True)  # type: ignore[attr-defined]
    for name in client.scan_iter(match="*saga:throttle:*"):
        client.delete(name)


@pytest.fixture(autouse=True)
def key_counts():
    """The per-key counters live in Redis across tests (and key ids repeat between databases):
    start and end empty."""
    _clear_key_counts()
    yield
    _clear_key_counts()


@pytest.fixture
def second_agent_key(tenant) -> tuple[Any, str]:
    """Another agent of the same tenant, with its own key."""
    issued = agent_key_create(
        tenant=tenant, name="billing-agent", scopes=["agent"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


def _record_body(n: int, *, args_bytes: int) -> bytes:
    return json.dumps(
        {
            "tool": "crm.update_contact",
            "target_type": "contact",
            "target_id": f"c-{n}",
            "args": {"note": "x" * args_bytes},
            "idempotency_key": f"budget-{n}",
        }
    ).encode()


def _spy(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, sizes: list[int], size: Callable[..., int]
) -> None:
    """Wrap ``owner.name`` (the real one still runs): each call appends ``size(args, result)`` to
    ``sizes`` — before the call, with result None, so a call that raises is counted too."""
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        sizes.append(size(args, None))
        result = real(*args, **kwargs)
        if sizes[-1] < 0:
            sizes[-1] = size(args, result)
        return result

    monkeypatch.setattr(owner, name, spy)


# --- Bytes ------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_key_over_its_byte_budget_is_429_from_the_headers_and_records_nothing(
    live_server, settings, agent_key, second_agent_key, monkeypatch
):
    """Pass: with a budget of 64 KiB a day, a 40 KiB record is accepted; the headers of a second
    one declaring 40 KiB get 429 ``rate_limited`` with ``Retry-After`` (the seconds left in the
    day's window) while not one byte of its body has been sent — nothing parsed, nothing recorded;
    the key's bodiless GETs still pass, and another key's 40 KiB record is accepted."""
    settings.SAGA = {**settings.SAGA, "THROTTLE_BYTES": "64KiB/d"}
    parsed: list[int] = []
    _spy(monkeypatch, limits, "parse_json_body", parsed, lambda args, _: len(args[0]))
    base = f"{live_server.url}/api/v1"
    first = {"Authorization": f"Bearer {agent_key[1]}", "Content-Type": "application/json"}
    run_id = httpx.post(f"{base}/runs", json={"agent": "crm", "request": "r"}, headers=first).json()["id"]
    accepted = httpx.post(
        f"{base}/runs/{run_id}/actions", content=_record_body(1, args_bytes=40_000), headers=first
    )
    assert accepted.status_code == 201, accepted.content
    parsed_before = len(parsed)

    body = _record_body(2, args_bytes=40_000)
    before = time.time()
    sock = _headers_only(
        live_server.url,
        f"/api/v1/runs/{run_id}/actions",
        {"Authorization": first["Authorization"]},
        len(body),
    )
    try:
        answer = _read_response(sock, timeout=10)
    finally:
        sock.close()
    after = time.time()
    assert answer is not None, "no answer to the headers alone: the server waited for the body"
    status, headers, content = answer
    assert status == 429, answer
    error = json.loads(content)["error"]
    assert error["code"] == "rate_limited" and error["details"] == {"limit_bytes": 64 * 1024}
    window_end = (before // DAY_S + 1) * DAY_S
    assert math.ceil(window_end - after) <= int(headers["retry-after"]) <= math.ceil(window_end - before)
    assert len(parsed) == parsed_before, "the refused body was parsed"
    assert Action.objects.filter(run_id=run_id).count() == 1

    # A request without a body counts no bytes; another key has a budget of its own.
    assert httpx.get(f"{base}/runs/{run_id}", headers=first).status_code == 200
    second = {"Authorization": f"Bearer {second_agent_key[1]}", "Content-Type": "application/json"}
    other_run = httpx.post(f"{base}/runs", json={"agent": "billing", "request": "r"}, headers=second).json()[
        "id"
    ]
    other = httpx.post(
        f"{base}/runs/{other_run}/actions", content=_record_body(3, args_bytes=40_000), headers=second
    )
    assert other.status_code == 201, other.content


@pytest.mark.django_db
def test_the_byte_budget_refuses_a_whole_body_sent_at_once_and_the_default_is_10_mib_a_minute(
    settings, agent_key
):
    """The same refusal for a client that sends everything (through the whole URL stack), and the
    default budget the contract promises: at least 10 MiB a minute per key."""
    assert throttle.parse_rate(settings.SAGA["THROTTLE_BYTES"]) == (10 * 1024 * 1024, 60)
    settings.SAGA = {**settings.SAGA, "THROTTLE_BYTES": "1000/d"}
    api = Api(agent_key[1])
    response = api.post("/runs", {"agent": "crm", "request": "r" * 2000})
    assert response.status_code == 429
    assert error_of(response)["code"] == "rate_limited" and int(response["Retry-After"]) >= 1
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "rate, expected",
    [("10MiB/m", (10 * 1024 * 1024, 60)), ("64KiB/d", (65536, 86400)), ("5 MB/10s", (5_000_000, 10))],
)
def test_byte_rates_parse(rate, expected):
    assert throttle.parse_rate(rate) == expected


# --- URL-bearing requests -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_url_bearing_requests_are_limited_per_key_and_over_the_limit_nothing_is_resolved(
    settings, agent_key, second_agent_key, monkeypatch
):
    """Pass: with ``SAGA_URL_RATE`` 2 a day, a key's two runs carrying a resume_url are judged (one
    public address accepted; an internal name resolved and refused); the third gets 429
    ``rate_limited`` with ``Retry-After``, creates nothing and resolves nothing. The same key may
    still create runs without a URL, and another key's URL-bearing run is accepted."""
    settings.SAGA = {**settings.SAGA, "URL_RATE": "2/d"}
    resolved: list[int] = []
    _spy(monkeypatch, outbound, "resolve", resolved, lambda args, _: 1)
    api = Api(agent_key[1])
    assert (
        api.post("/runs", {"agent": "crm", "request": "r", "resume_url": PUBLIC_RESUME_URL}).status_code
        == 201
    )
    probe = api.post("/runs", {"agent": "crm", "request": "r", "resume_url": "http://localhost:8080/x"})
    assert probe.status_code == 422 and error_of(probe)["code"] == "url_not_allowed"
    assert len(resolved) == 1
    runs = Run.objects.count()

    refused = api.post("/runs", {"agent": "crm", "request": "r", "resume_url": "http://localhost:9090/y"})
    assert refused.status_code == 429, refused.content
    error = error_of(refused)
    assert error["code"] == "rate_limited" and error["details"] == {"limit": 2}
    assert int(refused["Retry-After"]) >= 1
    assert len(resolved) == 1, "the outbound guard resolved a name for a key over its URL rate"
    assert Run.objects.count() == runs

    assert api.post("/runs", {"agent": "crm", "request": "no url"}).status_code == 201
    other = Api(second_agent_key[1]).post(
        "/runs", {"agent": "billing", "request": "r", "resume_url": PUBLIC_RESUME_URL}
    )
    assert other.status_code == 201, other.content


# --- A near-limit record: parsed once, never walked ---------------------------------------------------


def _tricky_bodies(max_depth: int) -> list[tuple[bytes, int]]:
    """Run bodies the byte-level checks must judge exactly as a walk would: (body, status)."""

    def run(metadata: str) -> bytes:
        return b'{"agent": "a", "request": "r", "metadata": ' + metadata.encode() + b"}"

    nested = "[" * (max_depth - 1) + "1" + "]" * (max_depth - 1)  # at the limit with the body's own
    return [
        (run(r'{"note": "a \\u0000 is text here"}'), 201),  # an escaped backslash, then "u0000"
        (run(r'{"note": "\\\\u0000 too"}'), 201),
        (run(r'{"note": "\u0000"}'), 422),  # a NUL
        (run(r'{"note": "\\\u0000"}'), 422),  # an escaped backslash, then a NUL
        (run(r'{"n\u0000te": 1}'), 422),  # a NUL in a key
        (run('{"deep": ' + nested[1:-1] + "}"), 201),
        (run('{"deep": ' + nested + "}"), 422),
        (run('{"s": "' + "[{" * (max_depth + 5) + '\\"]}"}'), 201),  # brackets inside strings
        (run('{"s": "\\\\", "t": [' + "[" * (max_depth - 2) + "]" * (max_depth - 2) + "]}"), 422),
        (run('{"emoji": "\\ud83d\\ude00", "alone": "ok"}'), 201),
        (run('{"alone": "\\ud83d"}'), 422),  # a lone surrogate
        (run('{"n": ' + "9" * 30 + "}"), 201),
    ]


@pytest.mark.django_db
def test_bodies_are_judged_from_their_bytes_and_the_walk_runs_only_for_a_refused_one(
    settings, agent_key, monkeypatch
):
    """Pass: NUL escapes behind runs of backslashes, nesting at and past the limit, brackets and
    escaped quotes inside strings, surrogate pairs and a lone surrogate, a 30-digit integer: each
    gets the status the exact walk gives (422 naming where), the walk runs only for the refused
    bodies, and the big integer is stored exactly."""
    settings.SAGA = {**settings.SAGA, "MAX_JSON_DEPTH": 6}
    walked: list[int] = []
    _spy(monkeypatch, limits, "check_json_value", walked, lambda args, _: 1)
    api = Api(agent_key[1])
    for body, expected in _tricky_bodies(6):
        before = len(walked)
        response = api.post("/runs", raw=body)
        assert response.status_code == expected, (body, response.content)
        if expected == 422:
            assert error_of(response)["details"]["at"].startswith("$.metadata"), response.content
            assert len(walked) == before + 1
        else:
            assert len(walked) == before, f"walked an accepted body: {body!r}"
    assert Run.objects.get(metadata__has_key="n").metadata["n"] == int("9" * 30)


@pytest.mark.django_db
def test_a_near_limit_record_is_parsed_once_and_never_walked_or_spelled_by_the_standard_library(
    agent_key, onboarding_policies, monkeypatch
):
    """Pass: a record whose args are just under 1 MiB of small objects (the costliest megabyte) is
    recorded with its body parsed once, no walk over its values, and no standard-library JSON
    encode or decode of anything larger than 64 KiB (the payload hash, the database write and
    the response all go through orjson; so does reading the row back when it is started); the
    stored payload hash is the one the standard library's canonical JSON gives, so hashes stored
    before still match. (``crm.update_*`` needs no approval: this pins the record itself, not the
    approval a gated one also opens.)"""
    api = Api(agent_key[1])
    run_id = api.post("/runs", {"agent": "crm", "request": "r"}).json()["id"]
    args = {"items": [{"k": i % 10, "f": 0.5} for i in range(50_000)], "note": "réunion ☃"}
    body = {"tool": "crm.update_contact", "target_id": "c-1", "args": args, "idempotency_key": "near-limit"}
    raw = json.dumps(body).encode()
    assert 900_000 < len(raw) < 1024 * 1024
    parsed: list[int] = []
    walked: list[int] = []
    encoded: list[int] = []
    decoded: list[int] = []
    _spy(monkeypatch, limits, "parse_json_body", parsed, lambda a, _: len(a[0]))
    _spy(monkeypatch, limits, "check_json_value", walked, lambda a, _: 1)
    _spy(monkeypatch, json, "dumps", encoded, lambda a, result: -1 if result is None else len(result))
    _spy(monkeypatch, json, "loads", decoded, lambda a, _: len(a[0]))

    response = api.post(f"/runs/{run_id}/actions", raw=raw)
    # Its start reads the whole row back from the write function (the response shows the args).
    started = api.post(f"/actions/{orjson.loads(response.content)['id']}/start")
    large = [size for size in encoded + decoded if size > 64 * 1024]
    monkeypatch.undo()

    assert response.status_code == 201, response.content[:300]
    assert started.status_code == 200 and started.json()["status"] == "running", started.content[:300]
    assert parsed == [len(raw)]
    assert walked == []
    assert large == []
    assert response.json()["args"] == args
    action = Action.objects.get(run_id=run_id)
    assert action.args == args
    # The standard library's spelling, written out: the hash stored before this change.
    assert (
        action.payload_hash
        == hashlib.sha256(
            canonical_json(
                {
                    "tool": "crm.update_contact",
                    "target_type": "",
                    "target_id": "c-1",
                    "args": args,
                    "compensation": None,
                }
            ).encode()
        ).hexdigest()
    )


@pytest.mark.django_db
def test_a_near_limit_record_that_waits_for_approval_binds_and_announces_its_args_cheaply(
    agent_key, onboarding_policies, monkeypatch
):
    """Pass: a near-limit record of a tool that needs a person (the default policy) opens its
    approval without the standard library spelling or reading the megabyte: not for the approval's
    args hash, not for the approval's and the action's jsonb columns (``infra.json_text``), not
    for the notification (which shows the args cut, with no Approve button in Slack: the inbox
    shows them whole); the hash is the one ``canonical_json`` gives. Before, the hash and an
    indented copy for every notification cost more than the rest of the record together."""
    api = Api(agent_key[1])
    run_id = api.post("/runs", {"agent": "hr", "request": "r"}).json()["id"]
    args = {"items": [{"k": i % 10} for i in range(90_000)]}
    body = {"tool": "unlisted.tool", "target_id": "t-1", "args": args, "idempotency_key": "near-limit-gated"}
    spelled: list[int] = []
    _spy(
        monkeypatch,
        hashing,
        "canonical_json",
        spelled,
        lambda a, result: -1 if result is None else len(result),
    )
    indented: list[int] = []
    real_dumps = json.dumps

    def dumps(value: Any, *args: Any, **kwargs: Any) -> str:
        text = real_dumps(value, *args, **kwargs)
        if kwargs.get("indent") is not None:  # a notification's spelling, not a column's
            indented.append(len(text))
        return text

    monkeypatch.setattr(json, "dumps", dumps)
    # The standard library's own spelling and reading (json.dumps and json.loads end there, and so
    # does Django's JSONField unless it is the ledger's, which spells and reads with orjson).
    stdlib_spelled: list[int] = []
    _spy(
        monkeypatch,
        json.JSONEncoder,
        "encode",
        stdlib_spelled,
        lambda a, result: -1 if result is None else len(result),
    )
    stdlib_read: list[int] = []
    _spy(monkeypatch, json.JSONDecoder, "decode", stdlib_read, lambda a, result: len(a[1]))

    response = api.post(f"/runs/{run_id}/actions", raw=orjson.dumps(body))
    approval = Approval.objects.get(action_id=orjson.loads(response.content)["id"])
    # What every notification of the request says of it (e-mail, Slack, the outbox row).
    shown = approval_lines(approval)
    monkeypatch.undo()

    assert response.status_code == 201, response.content[:300]
    assert response.json()["status"] == "awaiting_approval"
    assert [size for size in spelled + indented if size > 64 * 1024] == []
    assert [size for size in stdlib_spelled + stdlib_read if size > 64 * 1024] == []
    assert approval.args_hash == hashlib.sha256(canonical_json(args).encode()).hexdigest()
    args_line = next(line for line in shown if line.startswith("Args: "))
    assert len(args_line) < ARGS_SHOWN_MAX + 200
    assert "cut here" in args_line and "the inbox shows them whole" in args_line


@pytest.mark.django_db
def test_an_idempotency_key_fingerprints_a_megabyte_body_without_the_standard_library(agent_key, monkeypatch):
    """Pass: a run created with an ``Idempotency-Key`` and ~900 KB of metadata is fingerprinted
    without the standard library's canonical JSON (orjson spells the same bytes), and the same
    request sent again is still recognised as the same one (replayed, nothing new created)."""
    from infra import hashing

    spelled: list[int] = []
    _spy(
        monkeypatch,
        hashing,
        "canonical_json",
        spelled,
        lambda a, result: -1 if result is None else len(result),
    )
    api = Api(agent_key[1])
    body = {"agent": "crm", "request": "r", "metadata": {"items": [{"k": i % 10} for i in range(80_000)]}}
    headers = {"Idempotency-Key": "megabyte-run"}
    first = api.post("/runs", body, headers=headers)
    assert first.status_code == 201, first.content[:300]
    assert [size for size in spelled if size > 64 * 1024] == []
    again = api.post("/runs", body, headers=headers)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and Run.objects.count() == 1
