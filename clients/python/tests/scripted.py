"""A scripted httpx transport for the client's own tests (no server, no Django): it answers in
order and keeps the requests."""

from __future__ import annotations

from typing import Any

import httpx

Answer = Any  # (status, body[, headers]) or an exception to raise


class Script:
    """Answers requests in order and keeps them; sync and async transports share one script."""

    def __init__(self, *answers: Answer, policies: list[dict] | None = None) -> None:
        self.answers = list(answers)
        self.seen: list[httpx.Request] = []
        # ``GET /policies`` (what a client reads to know which steps take before-images) is
        # answered aside, with these policies, and kept apart from ``seen``.
        self.policies = policies or []
        self.policy_requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/api/v1/policies"):
            self.policy_requests.append(request)
            return httpx.Response(200, json={"policies": self.policies}, headers={"ETag": '"p-1"'})
        self.seen.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        status, body, *headers = answer
        return httpx.Response(
            status, json=body, headers={"X-Request-Id": "req-1", **(headers[0] if headers else {})}
        )

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.path.removeprefix('/api/v1')}" for r in self.seen]


def error(code: str, message: str = "", status_details: dict | None = None) -> dict:
    return {
        "error": {
            "code": code,
            "message": message or code.replace("_", " "),
            "details": status_details or {"x": 1},
        }
    }
