"""A receiver of signed requests is not crashed by the timestamp header.

``X-Saga-Timestamp`` arrives before anything is authenticated. One of more than 4,300 digits made ``int()``
raise ``ValueError`` (Python's limit on converting long digit strings), and one of a few hundred
digits made the subtraction from now raise ``OverflowError``: a 500 in every receiver built on
``verify_signature``, the server's (``infra.signing``) and the client library's
(``saga_client.signing``) alike. Both now answer False, and the vectors say so for every client
(``clients/spec/vectors/signatures.json``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType

import httpx
import pytest
import saga_client.signing as client_signing

import infra.signing as server_signing

SECRET = "whsec-test-0123456789"
BODY = b'{"command":"resume"}'
HUGE = ["1" * 5000, "1" * 4300, "1" * 400, "9" * 21]
IMPLEMENTATIONS = [pytest.param(server_signing, id="server"), pytest.param(client_signing, id="client")]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("timestamp", HUGE, ids=["5000-digits", "4300-digits", "400-digits", "21-digits"])
def test_a_huge_timestamp_is_refused_not_raised(impl: ModuleType, timestamp: str) -> None:
    """Fail (before): ``ValueError: Exceeds the limit (4300 digits)`` / ``OverflowError``. Pass: False,
    whatever signature comes with it (even one computed over that very timestamp)."""
    for signature in ("sha256=" + "0" * 64, impl.compute_signature(SECRET, timestamp, BODY)):
        headers = {"X-Saga-Timestamp": timestamp, "X-Saga-Signature": signature}
        assert impl.verify_signature(SECRET, headers, BODY) is False


@pytest.fixture(params=IMPLEMENTATIONS)
def receiver(request: pytest.FixtureRequest) -> Iterator[str]:
    """A receiver as the docs tell integrators to write one: verify, then 401 or 204; anything
    it raises is a 500, as a web framework answers."""
    impl: ModuleType = request.param

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                status = 204 if impl.verify_signature(SECRET, dict(self.headers.items()), raw) else 401
            except Exception:  # noqa: BLE001 - the framework's 500, which is what is tested against
                status = 500
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/saga/commands"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_an_unauthenticated_request_with_a_huge_timestamp_is_a_401_not_a_500(receiver: str) -> None:
    good = server_signing.signed_headers(SECRET, BODY)
    assert httpx.post(receiver, content=BODY, headers=good).status_code == 204  # the receiver works
    for timestamp in HUGE:
        headers = {"X-Saga-Timestamp": timestamp, "X-Saga-Signature": "sha256=" + "0" * 64}
        assert httpx.post(receiver, content=BODY, headers=headers).status_code == 401, timestamp
