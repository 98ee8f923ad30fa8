"""An OpenID Provider that answers what a test tells it to: well-formed by default (discovery, a
signed ID token carrying the nonce the sign-in started with, its key set, userinfo), or any one
answer replaced by a malformed one, as a broken or hostile provider might send. The certified
provider of tests/support/oidc.py never misbehaves; this one stands in for one that does."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.processes import http_serving

CLIENT_ID = "saga-admin-tests"
CLIENT_SECRET = "tests-only-hostile-secret"
KID = "hostile-1"
# An answer the test leaves alone: the well-formed default.
DEFAULT: Any = object()


@dataclass
class HostileProvider:
    port: int = 0
    subject: str = "mallory"
    # The nonce of the sign-in under way (the test copies it from the session it started).
    nonce: str = ""
    # Claims added to (or replacing) the ID token's standard ones.
    id_claims: dict[str, Any] = field(default_factory=dict)
    # The JSON each endpoint answers; DEFAULT for the well-formed answer.
    token: Any = DEFAULT
    jwks: Any = DEFAULT
    userinfo: Any = DEFAULT
    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def discovery(self) -> dict[str, str]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
        }

    def id_token(self) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "sub": self.subject,
            "nonce": self.nonce,
            "iat": now,
            "exp": now + 300,
            **self.id_claims,
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": KID})

    def answer(self, path: str) -> tuple[int, Any]:
        """The status and the JSON to answer ``path`` with."""
        known = {"/.well-known/openid-configuration", "/jwks", "/token", "/userinfo"}
        return (200, self._json(path)) if path in known else (404, {"error": "not_found"})

    def _json(self, path: str) -> Any:
        if path == "/.well-known/openid-configuration":
            return self.discovery()
        if path == "/jwks":
            if self.jwks is not DEFAULT:
                return self.jwks
            public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
            return {"keys": [{**public, "kid": KID, "alg": "RS256", "use": "sig"}]}
        if path == "/token":
            if self.token is not DEFAULT:
                return self.token
            return {
                "access_token": "hostile-access-token",
                "token_type": "Bearer",
                "id_token": self.id_token(),
            }
        return {"sub": self.subject} if self.userinfo is DEFAULT else self.userinfo


@contextmanager
def hostile_provider() -> Iterator[HostileProvider]:
    provider = HostileProvider()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            status, value = provider.answer(self.path.partition("?")[0])
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer  # noqa: N815 - http.server's naming
        do_POST = _answer  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    with http_serving(Handler) as port:
        provider.port = port
        yield provider
