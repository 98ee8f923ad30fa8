"""The API's edge: a request without a valid key is refused from its headers alone — before a byte
of its body is read or parsed — and throttled per client address; every path under /api/ answers
in the one JSON error shape (unknown paths 404, wrong methods 405).

The headline proofs go over real HTTP: a raw socket that sends only the headers of a 1 MiB POST
gets its 401 back while the body is still unsent (with a valid key, the same headers get no
answer until the body arrives), and the throttle is exercised through the live server.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from django.core.cache import caches
from django.test import Client

from infra import throttle
from ledger.audit import Actor
from ledger.models import Run
from ledger.services.keys import agent_key_create, agent_key_revoke
from saga_admin.api import limits
from tests.support.api import Api, error_of

MIB = 1024 * 1024
RUN = {"agent": "onboarding", "request": "Onboard Ashu Kumar"}
# Well-formed (so it is looked up) but unknown; and one the token check refuses outright.
UNKNOWN_KEY = "sk_0123456789ab_" + "x" * 43
MALFORMED_KEY = "not a key; DROP TABLE"


def _clear_address_counts() -> None:
    client = caches["default"]._cache.get_client(write=True)  # type: ignore[attr-defined]
    for name in client.scan_iter(match="*throttle:unauthenticated:*"):
        client.delete(name)


@pytest.fixture(autouse=True)
def address_counts() -> Iterator[None]:
    """The per-address refusal counters live in Redis across tests: start and end empty."""
    _clear_address_counts()
    yield
    _clear_address_counts()


@pytest.fixture
def no_parsing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records every body the gate parses: a refused request must leave it empty."""
    parsed: list[int] = []
    real = limits.parse_json_body

    def spy(raw: bytes, *, max_depth: int) -> object:
        parsed.append(len(raw))
        return real(raw, max_depth=max_depth)

    monkeypatch.setattr(limits, "parse_json_body", spy)
    return parsed


@pytest.fixture
def revoked_key(tenant) -> str:
    issued = agent_key_create(tenant=tenant, name="old-agent", scopes=["agent"], actor=Actor.system("tests"))
    agent_key_revoke(key=issued.key, actor=Actor.system("tests"))
    return issued.secret


def _authorization(kind: str, revoked: str) -> dict[str, str]:
    return {
        "no key": {},
        "unknown key": {"Authorization": f"Bearer {UNKNOWN_KEY}"},
        "malformed key": {"Authorization": f"Bearer {MALFORMED_KEY}"},
        "revoked key": {"Authorization": f"Bearer {revoked}"},
        "basic auth": {"Authorization": "Basic YWRtaW46YWRtaW4="},
    }[kind]


UNAUTHENTICATED = ["no key", "unknown key", "malformed key", "revoked key", "basic auth"]


# --- Raw HTTP helpers -------------------------------------------------------------------------------


def _headers_only(base_url: str, path: str, headers: dict[str, str], length: int) -> socket.socket:
    """Open a connection and send the headers of a POST declaring ``length`` body bytes — and
    none of the body."""
    parts = urlsplit(base_url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.hostname}:{parts.port}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _read_response(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], bytes] | None:
    """(status, headers, body) of the response, or None when none arrived within ``timeout``."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not head:
            return None
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except TimeoutError:
        return None
    return int(status_line.split()[1]), headers, body


def _padded_run_body(size: int) -> bytes:
    """A JSON run body of exactly ``size`` bytes (its request far over the field's length limit)."""
    shell = json.dumps({"agent": "onboarding", "request": ""}).encode()
    return shell[:-2] + b"x" * (size - len(shell)) + shell[-2:]


# --- Refused before the body is read ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", UNAUTHENTICATED)
def test_a_1_mib_post_without_a_valid_key_is_answered_401_before_its_body_is_sent(
    live_server, agent_key, revoked_key, kind
):
    """Pass: the server answers 401 (the error shape, WWW-Authenticate: Bearer) to the headers of
    a 1 MiB POST while not one byte of its body has been sent — so it cannot have read or parsed
    it — and creates nothing."""
    sock = _headers_only(live_server.url, "/api/v1/runs", _authorization(kind, revoked_key), MIB)
    try:
        answer = _read_response(sock, timeout=10)
    finally:
        sock.close()
    assert answer is not None, "no answer to the headers alone: the server waited for the body"
    status, headers, body = answer
    assert status == 401, answer
    assert headers["www-authenticate"].startswith("Bearer")
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "unauthorized"
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_with_a_valid_key_the_same_headers_wait_for_the_body(live_server, agent_key):
    """The control that lets the test above fail: with a valid key the gate reads the body, so the
    headers alone get no answer; once the megabyte arrives it is parsed and judged (422: the
    request field is far over its length limit)."""
    headers = {"Authorization": f"Bearer {agent_key[1]}"}
    sock = _headers_only(live_server.url, "/api/v1/runs", headers, MIB)
    try:
        assert _read_response(sock, timeout=1.0) is None
        sock.sendall(_padded_run_body(MIB))
        answer = _read_response(sock, timeout=30)
    finally:
        sock.close()
    assert answer is not None
    status, _, body = answer
    assert status == 422 and json.loads(body)["error"]["code"] == "invalid_request"
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["no key", "unknown key", "revoked key"])
def test_a_whole_1_mib_body_without_a_valid_key_is_401_over_http(live_server, revoked_key, kind):
    """A client that sends the whole megabyte (httpx) still gets the 401, not a reset connection,
    whatever the body holds: valid JSON or not."""
    url = f"{live_server.url}/api/v1/runs"
    headers = {"Content-Type": "application/json", **_authorization(kind, revoked_key)}
    for body in (_padded_run_body(MIB), b"{" * MIB):
        response = httpx.post(url, content=body, headers=headers, timeout=30)
        assert response.status_code == 401, response.content
        assert response.json()["error"]["code"] == "unauthorized"
    assert not Run.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw, content_type",
    [
        (b'{"agent": "a", "request": ', "application/json"),  # malformed: 400 with a key
        (b"\xff\xfe{}", "application/json"),  # not UTF-8: 400 with a key
        (b"agent=a&request=b", "application/x-www-form-urlencoded"),  # not JSON: 415 with a key
        (b'{"agent": "a", "request": "\\u0000"}', "application/json"),  # NUL: 422 with a key
    ],
)
@pytest.mark.parametrize("kind", UNAUTHENTICATED)
def test_a_bad_body_without_a_valid_key_is_401_not_the_body_error(
    no_parsing, revoked_key, raw, content_type, kind
):
    """Pass: 401 `unauthorized` whatever is wrong with the body, and the body was never parsed."""
    response = Client().post(
        "/api/v1/runs", data=raw, content_type=content_type, headers=_authorization(kind, revoked_key)
    )
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthorized"
    assert no_parsing == []


@pytest.mark.django_db
def test_a_declared_oversize_body_without_a_key_is_401_and_with_a_key_413(agent_key, no_parsing):
    """The key is checked first; the 413 (on the declared length, still unread) is for callers we
    know."""
    body = _padded_run_body(2 * MIB)
    assert Api(None).post("/runs", raw=body).status_code == 401
    response = Api(agent_key[1]).post("/runs", raw=body)
    assert response.status_code == 413 and error_of(response)["code"] == "payload_too_large"
    assert no_parsing == []


@pytest.mark.django_db
def test_with_a_valid_key_the_body_checks_still_apply(agent_key, no_parsing):
    api = Api(agent_key[1])
    response = api.post("/runs", raw=b'{"agent": ')
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    response = api.post("/runs", raw="agent=a", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert len(no_parsing) == 1  # the malformed JSON was parsed (and refused); the form was not
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_public_docs_need_no_key_and_read_no_body(no_parsing):
    """The OpenAPI document and the docs page are served without a key, to GET and HEAD only: a
    POST to them is a 405 in the error shape, its body unread."""
    client = Client()
    assert client.get("/api/v1/openapi.json").status_code == 200
    assert client.get("/api/v1/docs").status_code == 200
    response = client.post("/api/v1/openapi.json", data=b"{" * 1000, content_type="application/json")
    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"
    assert no_parsing == []


# --- Throttled per client address -------------------------------------------------------------------


@pytest.mark.django_db
def test_refusals_are_throttled_per_address_and_a_valid_key_is_not(settings, agent_key, no_parsing):
    """Pass: after N refusals in the window, the same address gets 429 `rate_limited` with
    Retry-After (seconds to the window's end) — still without parsing the body; another address
    still gets its 401s; a valid key from the throttled address is served."""
    settings.SAGA = {**settings.SAGA, "UNAUTHENTICATED_RATE": "3/h"}
    attacker, neighbour = Client(REMOTE_ADDR="203.0.113.7"), Client(REMOTE_ADDR="198.51.100.20")
    statuses = [
        attacker.post("/api/v1/runs", data=RUN, content_type="application/json").status_code for _ in range(4)
    ]
    assert statuses == [401, 401, 401, 429]
    response = attacker.post("/api/v1/runs", data=RUN, content_type="application/json")
    assert response.status_code == 429
    assert error_of(response)["code"] == "rate_limited"
    assert 1 <= int(response["Retry-After"]) <= 3600
    assert neighbour.get("/api/v1/runs").status_code == 401
    keyed = attacker.get("/api/v1/runs", headers={"Authorization": f"Bearer {agent_key[1]}"})
    assert keyed.status_code == 200
    assert no_parsing == [] and not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_throttle_over_http_ignores_forwarded_for_unless_a_proxy_is_trusted(
    live_server, agent_key, settings
):
    """Over a real socket: the fourth refusal from 127.0.0.1 is a 429; a forged X-Forwarded-For
    does not escape it (no proxy is trusted by default); a valid key is served. With one trusted
    proxy (SAGA_TRUSTED_PROXY_HOPS=1), the address that proxy appended is the one counted."""
    settings.SAGA = {**settings.SAGA, "UNAUTHENTICATED_RATE": "3/h"}
    url = f"{live_server.url}/api/v1/runs"
    with httpx.Client(timeout=10) as client:
        assert [client.post(url, json=RUN).status_code for _ in range(3)] == [401, 401, 401]
        throttled = client.post(url, json=RUN)
        assert throttled.status_code == 429
        assert throttled.json()["error"]["code"] == "rate_limited"
        assert int(throttled.headers["Retry-After"]) >= 1
        forged = client.post(url, json=RUN, headers={"X-Forwarded-For": "192.0.2.55"})
        assert forged.status_code == 429
        served = client.get(url, headers={"Authorization": f"Bearer {agent_key[1]}"})
        assert served.status_code == 200

        settings.SAGA = {**settings.SAGA, "TRUSTED_PROXY_HOPS": 1}
        behind_proxy = client.post(url, json=RUN, headers={"X-Forwarded-For": "10.9.9.9, 192.0.2.55"})
        assert behind_proxy.status_code == 401
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "remote, forwarded, hops, expected",
    [
        ("203.0.113.7", "", 0, "203.0.113.7"),
        ("203.0.113.7", "192.0.2.1", 0, "203.0.113.7"),  # not trusted: ignored
        ("10.0.0.2", "1.1.1.1, 192.0.2.1", 1, "192.0.2.1"),  # the one our proxy appended
        ("10.0.0.2", "1.1.1.1, 192.0.2.1, 10.0.0.9", 2, "192.0.2.1"),  # CDN then load balancer
        ("10.0.0.2", "192.0.2.1", 3, "192.0.2.1"),  # fewer entries than hops: the leftmost
        ("10.0.0.2", "not-an-address", 1, "unknown"),
        ("2001:db8:1:2::5", "", 0, "2001:db8:1:2::/64"),  # IPv6: one bucket per /64
        ("2001:db8:1:2:ffff::9", "", 0, "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "", 0, "203.0.113.7"),
    ],
)
def test_the_counted_address(settings, rf, remote, forwarded, hops, expected):
    settings.SAGA = {**settings.SAGA, "TRUSTED_PROXY_HOPS": hops}
    request = rf.get("/api/v1/runs", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert throttle.client_address(request) == expected


# --- Every path under /api/ answers in the error shape ----------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "post", "delete"])
@pytest.mark.parametrize(
    "path", ["/api/nope", "/api/v1/nope", "/api/v2/x", "/api/v1/runs/", "/api/v1", "/api/"]
)
def test_an_unknown_api_path_is_a_json_404(agent_key, method, path):
    client = Client(headers={"Authorization": f"Bearer {agent_key[1]}"})
    # A JSON body, so the POST passes the body checks (which come before routing) and is routed.
    body = {"data": {}, "content_type": "application/json"} if method == "post" else {}
    response = getattr(client, method)(path, **body)
    assert response.status_code == 404, response.content
    assert response["Content-Type"].startswith("application/json")
    assert error_of(response)["code"] == "not_found"


@pytest.mark.django_db
def test_an_unknown_api_path_without_a_key_is_401_like_any_other(no_parsing):
    response = Client().post("/api/v2/x", data=b"{" * 1000, content_type="application/json")
    assert response.status_code == 401 and error_of(response)["code"] == "unauthorized"
    assert no_parsing == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("delete", "/api/v1/runs", "GET, POST"),
        ("put", "/api/v1/runs/run_01abc", "GET"),
        ("get", "/api/v1/runs/run_01abc/heartbeat", "POST"),
        ("patch", "/api/v1/recovery", "GET"),
    ],
)
def test_a_wrong_method_on_a_known_path_is_a_json_405_with_allow(agent_key, method, path, allowed):
    client = Client(headers={"Authorization": f"Bearer {agent_key[1]}"})
    response = getattr(client, method)(path)
    assert response.status_code == 405, response.content
    error = error_of(response)
    assert error["code"] == "method_not_allowed"
    assert response["Allow"] == allowed and error["details"] == {"allowed": allowed.split(", ")}


@pytest.mark.django_db(transaction=True)
def test_unknown_paths_and_wrong_methods_are_json_over_http(live_server, agent_key):
    headers = {"Authorization": f"Bearer {agent_key[1]}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=10) as client:
        for path in ("/api/v2/x", "/api/v1/nope"):
            response = client.get(path)
            assert response.status_code == 404
            assert response.headers["content-type"].startswith("application/json")
            assert response.json()["error"]["code"] == "not_found"
        response = client.delete("/api/v1/runs")
        assert response.status_code == 405 and response.headers["allow"] == "GET, POST"
        assert response.json()["error"]["code"] == "method_not_allowed"
