"""Scenario 8: hostile and malformed input. Schemathesis drives every operation of the OpenAPI
document (agent and operator endpoints, positive and negative modes, bounded); hand-made bodies
cover what a generator rarely produces. Only 4xx, no partial writes, logs not injectable."""

from __future__ import annotations

import io
import json
import logging

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from ledger.models import Action, Checkpoint, Event, IdempotencyRecord, Run
from recovery.models import AgentCommand, RecoveryItem, Unwind
from saga_admin.logs import json_formatter
from saga_admin.wsgi import application
from tests.support.api import Api

# Module level, not a fixture: schemathesis.pytest.from_fixture breaks under pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=8)

COUNTED = (Run, Action, Checkpoint, Event, IdempotencyRecord, RecoveryItem, Unwind, AgentCommand)
server_errors_seen: list[str] = []


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in COUNTED}


@pytest.fixture
def fuzz_key(tenant):
    """A key with the agent and operator scopes, so agent and operator endpoints both run their
    handlers on the world's run (which it owns). The approvals need the approver scope, which
    never comes with the agent's: they answer this key 403."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create

    issued = agent_key_create(
        tenant=tenant, name="fuzz-supervisor", scopes=["agent", "operator"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def world(keep_test_connection, fuzz_key):
    """A failed run with an open item, so operator endpoints reach their handlers too."""
    from ledger.audit import Actor
    from ledger.services import runs
    from recovery.actions.approvals import action_record_gated
    from recovery.actions.reports import run_fail_and_queue

    actor = Actor.for_key(fuzz_key[0])
    run = runs.run_create(tenant=fuzz_key[0].tenant, actor=actor, agent="fuzz", request="fuzz me")
    action = action_record_gated(run=run, actor=actor, tool="fuzz.tool", idempotency_key="fz-1").action
    # The run ends withdrawing its action's approval (a run does not end with one outstanding).
    item = run_fail_and_queue(run=run, actor=actor, error="fuzzed", withdraw_approvals=True).item
    return {"run_id": run.pk, "action_id": action.pk, "item_id": item.pk}


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=8)
@pytest.mark.django_db
def test_scenario_8_fuzz_every_operation_with_an_operator_key(case, fuzz_key, world):
    """Pass: for generated valid and invalid requests to every documented operation, made with a
    key that has both scopes (so operator endpoints run their handlers), no response is a 5xx."""
    for name, value in world.items():
        if name in (case.path_parameters or {}) and hash(repr(case.body)) % 2:
            case.path_parameters[name] = value
    response = case.call(headers={"Authorization": f"Bearer {fuzz_key[1]}"})
    if response.status_code >= 500:
        server_errors_seen.append(f"{case.method} {case.formatted_path}")
    case.validate_response(response, checks=[not_a_server_error])


HOSTILE_BODIES = [
    ("oversized", b'{"agent": "a", "request": "' + b"x" * (1024 * 1024 + 10) + b'"}', {413}),
    (
        "deeply nested",
        b'{"agent": "a", "request": "b", "metadata": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
        {400, 422},
    ),
    ("invalid utf-8", b'{"agent": "\xff\xfe", "request": "b"}', {400}),
    ("lone surrogate", b'{"agent": "\\ud800", "request": "b"}', {422}),
    ("nul in a string", b'{"agent": "a\\u0000b", "request": "b"}', {422}),
    ("NaN", b'{"agent": "a", "request": "b", "metadata": {"x": NaN}}', {400}),
    ("truncated", b'{"agent": "a", "request": ', {400}),
    ("array body", b'[{"agent": "a", "request": "b"}]', {422}),
    ("huge integer", b'{"agent": "a", "request": "b", "metadata": {"x": ' + b"9" * 5000 + b"}}", {400, 422}),
]


@pytest.mark.django_db
def test_scenario_8_hostile_bodies_are_4xx_and_write_nothing(fuzz_key, operator_key, world, results):
    """Pass: oversized, deeply nested, invalid UTF-8, surrogate, NUL, NaN, truncated, array and
    huge-number bodies, and control characters in strings and ids, sent to write endpoints, all
    answer 4xx in the one error shape, and no row of any ledger or recovery table is added."""
    api, operator = Api(fuzz_key[1]), Api(operator_key[1])
    before = _counts()
    statuses = []
    for name, raw, expected in HOSTILE_BODIES:
        for client, path in (
            (api, "/runs"),
            (api, f"/runs/{world['run_id']}/actions"),
            (operator, f"/recovery/{world['item_id']}/close"),
        ):
            response = client.post(path, raw=raw)
            statuses.append(response.status_code)
            assert response.status_code in expected, (
                name,
                path,
                response.status_code,
                response.content[:200],
            )
            assert set(response.json()) == {"error"}, (name, path)
    for path in (f"/recovery/{world['item_id']}\x00x/close", "/recovery/rec_\u202e\n/close", "/unwinds/%00"):
        response = operator.post(path, {"reason": "x"})
        statuses.append(response.status_code)
        assert 400 <= response.status_code < 500, (path, response.status_code)
    assert _counts() == before
    assert all(400 <= s < 500 for s in statuses)
    # Control characters are data, not an attack on the database: stored as sent, or refused.
    control = operator.post(f"/recovery/{world['item_id']}/close", {"reason": "ok\x07\x1b[31m\u202e"})
    statuses.append(control.status_code)
    assert control.status_code in (200, 422), control.content
    results.record(
        "8-bad-input",
        hostile_requests=len(statuses),
        fuzz_server_errors=len(server_errors_seen),
        rows_added=0,
        duplicates_observed=0,
        lost_intents=0,
        server_errors=sum(1 for s in statuses if s >= 500) + len(server_errors_seen),
    )


@pytest.mark.django_db
def test_scenario_8_a_newline_in_client_input_cannot_forge_a_log_line(agent_key):
    """Pass: a path and a body carrying a newline followed by a fake JSON log record produce log
    output in which every line is one JSON object and none is the forged record."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    forged = '\n{"event": "forged", "level": "critical"}\n'
    try:
        api = Api(agent_key[1])
        api.get("/runs/run_x" + forged.replace("\n", "%0A"))
        api.post("/runs", raw=('{"agent": ' + json.dumps(forged) + ', "request": 5}').encode())
        api.get("/runs", {"status": forged})
    finally:
        root.removeHandler(handler)
    lines = [line for line in stream.getvalue().splitlines() if line.strip()]
    assert lines, "the requests logged nothing; the test would prove nothing"
    records = [json.loads(line) for line in lines]
    assert not [r for r in records if r.get("event") == "forged"]
