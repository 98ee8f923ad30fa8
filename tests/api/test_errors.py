"""Every error the contract names, in the one error shape, and never a 500 for client input."""

from __future__ import annotations

import json

import pytest

from ledger.audit import Actor
from ledger.services.keys import agent_key_create, agent_key_revoke
from tests.factories import issue_key, new_action, new_run
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db


# --- 401 / 403 / 404 ------------------------------------------------------------------------------


def test_a_missing_key_is_401():
    response = Api(None).get("/runs")
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("token", ["sk_nope_nope", "garbage", "sk_" + "a" * 500, "sk_abc_\x00def"])
def test_an_invalid_key_is_401(token):
    assert Api(token).get("/runs").status_code == 401


def test_a_revoked_key_is_401(api, agent_key):
    assert api.get("/runs").status_code == 200
    agent_key_revoke(key=agent_key[0], actor=Actor.system("tests"))
    response = api.get("/runs")
    assert response.status_code == 401 and error_of(response)["code"] == "unauthorized"


def test_a_key_without_the_endpoints_scope_is_403(tenant):
    issued = agent_key_create(tenant=tenant, name="ops-bot", scopes=["operator"], actor=Actor.system("tests"))
    response = Api(issued.secret).post("/runs", {"agent": "a", "request": "b"})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "forbidden" and error["details"] == {"scope": "agent"}
    error = error_of(Api(issue_key(tenant, "approval-bot", "approver")[1]).get("/runs"))
    assert error["code"] == "forbidden" and error["details"] == {"scope": "agent or operator"}


def test_another_tenants_objects_are_404_everywhere(api, outsider_api, onboarding_policies):
    run = new_run(api)
    action = new_action(api, run["id"])
    for method, path, body in [
        ("get", f"/runs/{run['id']}", None),
        ("get", f"/runs/{run['id']}/trail", None),
        ("get", f"/runs/{run['id']}/commands", None),
        ("get", f"/runs/{run['id']}/checkpoints", None),
        ("get", f"/runs/{run['id']}/checkpoints/latest", None),
        ("post", f"/runs/{run['id']}/heartbeat", {}),
        ("post", f"/runs/{run['id']}/complete", {}),
        ("post", f"/runs/{run['id']}/fail", {"error": "x"}),
        ("post", f"/runs/{run['id']}/checkpoints", {"name": "cp"}),
        ("post", f"/runs/{run['id']}/actions", {"tool": "hr.create_user", "idempotency_key": "theirs"}),
        ("get", f"/actions/{action['id']}", None),
        ("post", f"/actions/{action['id']}/start", None),
        ("post", f"/actions/{action['id']}/succeed", {}),
        ("post", f"/actions/{action['id']}/fail", {"error": "x", "retryable": False, "layer": "tool"}),
        ("post", f"/actions/{action['id']}/verify", {"ok": True}),
        ("post", f"/actions/{action['id']}/reconcile", {"happened": True, "reason": "x"}),
    ]:
        response = (
            getattr(outsider_api, method)(path, body)
            if body is not None
            else getattr(outsider_api, method)(path)
        )
        assert response.status_code == 404, (method, path, response.content)
        assert error_of(response)["code"] == "not_found"
    # And nothing of theirs changed.
    assert api.get(f"/runs/{run['id']}").json()["status"] == "running"


@pytest.mark.parametrize("run_id", ["run_nope", "act_01abc", "run_%00", "run_" + "x" * 300, "..%2F..%2Fetc"])
def test_malformed_ids_are_simply_not_found(api, run_id):
    assert api.get(f"/runs/{run_id}").status_code == 404


def test_more_query_parameters_than_django_parses_is_a_json_422_not_an_html_400(api):
    # Found by the schema fuzzer: Django refuses to parse over DATA_UPLOAD_MAX_NUMBER_FIELDS
    # parameters, which the gate read for NULs before any handler of the API's could answer.
    response = api.get("/runs?" + "&".join(f"f{n}=1" for n in range(1200)))
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_request"
    assert "Too many query parameters" in error_of(response)["message"]


def test_a_host_header_the_server_does_not_serve_is_a_json_400_under_the_api(api):
    # Found by the schema fuzzer: Django's DisallowedHost answered with its HTML 400 page.
    response = api.client.get("/api/v1/runs", HTTP_HOST="X2x~", HTTP_AUTHORIZATION=f"Bearer {api.secret}")
    assert response.status_code == 400
    assert error_of(response)["code"] == "bad_request"


# --- 422 strict validation ------------------------------------------------------------------------


def test_an_unknown_field_is_a_validation_error(api):
    response = api.post("/runs", {"agent": "onboarding", "request": "x", "extrnal_id": "typo"})
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert [e["field"] for e in error["details"]["errors"]] == ["extrnal_id"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("retryable", "true"),  # a string for a bool
        ("retryable", 1),  # a number for a bool
        ("error", 5),  # a number for a string
    ],
)
def test_nothing_is_coerced(api, onboarding_policies, field, value):
    run = new_run(api)
    action = new_action(api, run["id"])
    api.post(f"/actions/{action['id']}/start")
    body = {"error": "x", "retryable": False, "layer": "tool", field: value}
    response = api.post(f"/actions/{action['id']}/fail", body)
    assert response.status_code == 422
    assert [e["field"] for e in error_of(response)["details"]["errors"]] == [field]


def test_a_string_for_a_number_is_refused(api, onboarding_policies):
    run = new_run(api)
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "hr.create_user", "idempotency_key": "k", "intent": {"confidence": "5"}},
    )
    assert response.status_code == 422
    assert [e["field"] for e in error_of(response)["details"]["errors"]] == ["intent.confidence"]


def test_limit_must_be_in_range(api):
    assert api.get("/runs", {"limit": 0}).status_code == 422
    assert api.get("/runs", {"limit": "five"}).status_code == 422
    assert api.get("/runs", {"limit": "5"}).status_code == 200


def test_strings_have_length_limits(api):
    response = api.post("/runs", {"agent": "a" * 201, "request": "x"})
    assert response.status_code == 422
    assert error_of(response)["details"]["errors"][0]["field"] == "agent"


def test_a_missing_body_is_a_validation_error(api):
    response = api.post("/runs")
    assert response.status_code == 422 and error_of(response)["code"] == "invalid_request"


def test_a_json_array_body_is_a_validation_error(api):
    response = api.post("/runs", [1, 2, 3])
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_request"


# --- Bodies: 400 / 413 / 415 / depth ---------------------------------------------------------


def test_a_body_over_the_limit_is_413(api, settings):
    settings.SAGA = {**settings.SAGA, "MAX_BODY_BYTES": 2048}
    response = api.post("/runs", {"agent": "a", "request": "x" * 4096})
    assert response.status_code == 413
    error = error_of(response)
    assert error["code"] == "payload_too_large" and error["details"] == {"max_bytes": 2048}


def test_djangos_own_upload_limit_also_becomes_413_not_400(api, settings):
    # Django raises RequestDataTooBig only when request.body is read; it must not leak as a 400/500.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = api.post("/runs", {"agent": "a", "request": "x" * 4096})
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"


def test_the_default_limit_is_one_mebibyte(api):
    response = api.post("/runs", {"agent": "a", "request": "x" * (1024 * 1024)})
    assert response.status_code == 413


def test_a_body_that_is_not_json_is_415(api):
    response = api.post("/runs", raw="agent=a&request=b", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"agent": "a", "request": ',
        b"\xff\xfe{}",
        b'{"agent": NaN}',
        b'{"n": 1e999}',
        b'{"n": ' + b"9" * 5000 + b"}",
    ],
)
def test_malformed_json_is_400(api, raw):
    response = api.post("/runs", raw=raw)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def test_json_nested_too_deep_is_422(api, settings):
    settings.SAGA = {**settings.SAGA, "MAX_JSON_DEPTH": 5}
    deep: dict = {}
    cursor = deep
    for _ in range(10):
        cursor["x"] = {}
        cursor = cursor["x"]
    response = api.post("/runs", {"agent": "a", "request": "r", "metadata": deep})
    assert response.status_code == 422
    assert error_of(response)["details"]["max_depth"] == 5


@pytest.mark.parametrize("levels", [2000, 100000])
def test_a_body_too_deep_for_the_parser_is_refused_naming_the_nesting_limit(api, settings, levels):
    # Past what both parsers recurse through: the answer is the nesting limit, not "not valid JSON".
    limit = settings.SAGA["MAX_JSON_DEPTH"]
    for raw in (
        "[" * levels + "]" * levels,
        '{"agent": "a", "metadata": ' + '{"x": ' * levels + "1" + "}" * levels + "}",
    ):
        response = api.post("/runs", raw=raw)
        assert response.status_code == 422, response.content
        error = error_of(response)
        assert error["code"] == "invalid_request"
        assert error["message"] == f"The JSON body is nested deeper than {limit} levels."
        assert error["details"] == {"max_depth": limit}


def test_a_validation_error_locates_the_field_in_the_body_not_in_the_framework(api):
    response = api.post("/runs", {"request": "r", "metadata": {"a": 1}, "extra": 1})
    assert response.status_code == 422
    errors = {e["field"]: e for e in error_of(response)["details"]["errors"]}
    assert errors["agent"]["loc"] == ["body", "agent"] and errors["agent"]["type"] == "missing"
    assert errors["extra"]["loc"] == ["body", "extra"]
    # Query parameters keep their source too.
    listed = api.get("/runs", {"limit": "many"})
    assert listed.status_code == 422
    (limit,) = error_of(listed)["details"]["errors"]
    assert (limit["loc"], limit["field"]) == (["query", "limit"], "limit")


@pytest.mark.parametrize("value", ["nul \u0000 byte", "\ud800"])
def test_strings_postgres_cannot_store_are_422(api, value):
    raw = json.dumps({"agent": "a", "request": "r", "metadata": {"note": value}})
    response = api.post("/runs", raw=raw)
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_request"


def test_a_nul_in_a_query_filter_is_refused(api):
    assert api.get("/runs", {"agent": "a\x00b"}).status_code == 422


# --- 500 ----------------------------------------------------------------------------------------


def test_an_unexpected_error_is_a_500_with_a_request_id_and_no_traceback(api, monkeypatch):
    from ledger.services import runs

    def explode(**kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(runs, "run_create", explode)
    response = api.post("/runs", {"agent": "a", "request": "r"}, headers={"X-Request-Id": "req-42"})
    assert response.status_code == 500
    error = error_of(response)
    assert error["code"] == "internal_error" and error["details"] == {"request_id": "req-42"}
    assert b"secret internals" not in response.content and b"Traceback" not in response.content
