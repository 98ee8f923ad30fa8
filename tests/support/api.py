"""The agent and operator API through the real URL stack (middleware, auth, routing)."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client


class Api:
    """django.test.Client with a bearer key and JSON bodies: ``api.post(path, body)``."""

    def __init__(self, secret: str | None) -> None:
        self.client = Client()
        self.secret = secret

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        base = {"Authorization": f"Bearer {self.secret}"} if self.secret else {}
        return {**base, **(headers or {})}

    def get(self, path: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        return self.client.get(f"/api/v1{path}", params or {}, headers=self._headers(headers))

    def post(
        self,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
    ):
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return self.client.post(
            f"/api/v1{path}", data=data, content_type=content_type, headers=self._headers(headers)
        )


def error_of(response) -> dict[str, Any]:
    """The contract's one error shape, asserted on the way."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    return body["error"]
