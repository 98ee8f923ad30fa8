"""Helpers for exercising the agent API through the real URL stack (middleware, auth, routing)."""

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


def new_run(api: Api, **fields: Any) -> dict[str, Any]:
    response = api.post("/runs", {"agent": "onboarding", "request": "Onboard Ashu Kumar", **fields})
    assert response.status_code == 201, response.content
    return response.json()


def new_action(api: Api, run_id: str, key: str = "k-1", **fields: Any) -> dict[str, Any]:
    body = {
        "tool": "hr.create_user",
        "target_type": "user",
        "target_id": "ashu@company.com",
        "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
        "idempotency_key": key,
        "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        **fields,
    }
    response = api.post(f"/runs/{run_id}/actions", body)
    assert response.status_code == 201, response.content
    return response.json()


# The onboarding scenario's tool policies: the first two steps run without approval; the welcome
# e-mail is irreversible (a correction can follow it) but auto-approved; charging needs a human.
ONBOARDING_POLICIES = [
    ("hr.create_user", "medium", "auto", "external_reversible", "custom"),
    ("workspace.provision_license", "medium", "auto", "external_reversible", "custom"),
    ("email.send_welcome", "high", "auto", "external_irreversible", "correction"),
    ("payments.charge", "critical", "manual", "external_irreversible", "correction"),
    ("crm.update_*", "low", "auto", "internal_update", "snapshot"),
]


def create_onboarding_policies() -> list[Any]:
    from ledger.models import ToolPolicy

    return [
        ToolPolicy.objects.create(
            tool=tool, risk=risk, approval=approval, action_class=cls, compensation=comp, source="tests"
        )
        for tool, risk, approval, cls, comp in ONBOARDING_POLICIES
    ]
