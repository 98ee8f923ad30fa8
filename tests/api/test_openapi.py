from __future__ import annotations

import pytest
from django.test import Client

AGENT_OPERATIONS = {
    ("post", "/api/v1/runs"),
    ("get", "/api/v1/runs"),
    ("get", "/api/v1/runs/{run_id}"),
    ("post", "/api/v1/runs/{run_id}/heartbeat"),
    ("post", "/api/v1/runs/{run_id}/complete"),
    ("post", "/api/v1/runs/{run_id}/fail"),
    ("get", "/api/v1/runs/{run_id}/commands"),
    ("post", "/api/v1/commands/{command_id}/ack"),
    ("get", "/api/v1/runs/{run_id}/trail"),
    ("post", "/api/v1/runs/{run_id}/actions"),
    ("get", "/api/v1/actions/{action_id}"),
    ("post", "/api/v1/actions/{action_id}/start"),
    ("post", "/api/v1/actions/{action_id}/succeed"),
    ("post", "/api/v1/actions/{action_id}/fail"),
    ("post", "/api/v1/actions/{action_id}/verify"),
    ("post", "/api/v1/actions/{action_id}/reconcile"),
    ("post", "/api/v1/runs/{run_id}/checkpoints"),
    ("get", "/api/v1/runs/{run_id}/checkpoints"),
    ("get", "/api/v1/runs/{run_id}/checkpoints/latest"),
    ("get", "/api/v1/policies"),
}


@pytest.fixture(scope="module")
def document():
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def test_it_is_openapi_3_1(document):
    assert document["openapi"].startswith("3.1")


def test_every_agent_operation_is_documented_with_its_errors(document):
    operations = {(method, path) for path, ops in document["paths"].items() for method in ops}
    assert operations >= AGENT_OPERATIONS
    for method, path in AGENT_OPERATIONS:
        responses = document["paths"][path][method]["responses"]
        assert {"401", "403", "404", "422", "429"} <= set(responses), (method, path)
        error_ref = responses["404"]["content"]["application/json"]["schema"]["$ref"]
        assert error_ref.endswith("/ErrorOut")
        # Every state-changing POST can lose to the state machine or to an in-flight twin.
        if method == "post" and path != "/api/v1/runs/{run_id}/heartbeat":
            assert "409" in responses, (method, path)


def test_request_bodies_are_described_and_closed(document):
    run_in = document["components"]["schemas"]["RunIn"]
    assert run_in["additionalProperties"] is False
    assert set(run_in["required"]) == {"agent", "request"}
    assert run_in["properties"]["agent"]["maxLength"] == 200
    body = document["paths"]["/api/v1/runs/{run_id}/actions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/ActionIn")


def test_the_idempotency_key_header_is_documented(document):
    params = document["paths"]["/api/v1/runs"]["post"]["parameters"]
    assert any(p["in"] == "header" and p["name"] == "Idempotency-Key" for p in params)


def test_bearer_auth_is_declared(document):
    schemes = document["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())


@pytest.mark.django_db
def test_the_docs_page_loads_swagger_from_local_static_files():
    response = Client().get("/api/v1/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/ninja/" in html
    assert "cdn." not in html and "unpkg" not in html
