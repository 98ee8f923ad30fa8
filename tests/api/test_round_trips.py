"""Each of the agent's hot writes is one round trip to PostgreSQL, counted on
the wire (libpq's protocol trace of the request's connection: every ``ReadyForQuery`` the server
sends ends one round trip, BEGIN and COMMIT included), not by what Django logs. The guarantees
those writes keep are the ledger's own tests (idempotency under concurrency, the audit chain,
closed runs, the pivot), which run against the same code."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from ledger.audit import audit_heads_verify, audit_verify
from ledger.models import Action, Run
from tests.factories import new_action, new_run
from tests.support.api import Api
from tests.support.processes import wait_for

# Not wrapped in a test transaction: the requests run as in production, in autocommit.
pytestmark = pytest.mark.django_db(transaction=True)

# The success the clients send, with their Idempotency-Key (docs/API.md, "What a write costs").
SUCCEED_WITH_REPLAY_KEY = 5


class Trips:
    count = 0
    messages: list[str]


@contextmanager
def round_trips() -> Iterator[Trips]:
    """Round trips of this thread's connection while the block runs, from libpq's trace."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    trips = Trips()
    with tempfile.TemporaryFile(mode="w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            yield trips
        finally:
            pgconn.untrace()
            trace.seek(0)
            lines = trace.read().splitlines()
    trips.messages = [line for line in lines if "\tF\t" in line]
    trips.count = sum(1 for line in lines if "\tB\t" in line and "ReadyForQuery" in line)


@pytest.fixture
def warm(api: Api, onboarding_policies) -> dict:
    """A run, and one request of each kind first: the key and the policies are then in this
    process's caches, as they are for an agent that is already at work."""
    run = new_run(api)
    first = new_action(api, run["id"], "warm", start=True)
    assert api.post(f"/actions/{first['id']}/succeed", {"result": {"ok": True}}).status_code == 200
    assert api.post(f"/runs/{run['id']}/heartbeat", {}).status_code == 200
    return run


def test_recording_an_action_is_one_round_trip(api, warm):
    with round_trips() as trips:
        recorded = new_action(api, warm["id"], "k-1")
    assert trips.count == 1, trips.messages
    assert recorded["seq"] == 2
    assert Action.objects.filter(pk=recorded["id"], status="planned").exists()


def test_a_tool_call_is_two_round_trips_record_with_start_then_succeed(api, warm):
    with round_trips() as trips:
        recorded = new_action(api, warm["id"], "k-2", start=True)
    assert trips.count == 1, trips.messages
    assert (recorded["status"], recorded["attempts"]) == ("running", 1)
    with round_trips() as trips:
        succeeded = api.post(f"/actions/{recorded['id']}/succeed", {"result": {"id": 7}})
    assert succeeded.status_code == 200, succeeded.content
    assert trips.count == 1, trips.messages
    body = succeeded.json()
    assert (body["status"], body["completion_seq"], body["result"]) == ("succeeded", 2, {"id": 7})
    # The chain the database extended is the one Python verifies.
    assert audit_verify(chain=f"run:{warm['id']}")[1] is None
    assert audit_heads_verify(chain=f"run:{warm['id']}") == []


def test_start_and_fail_are_one_round_trip_each(api, warm):
    recorded = new_action(api, warm["id"], "k-3")
    with round_trips() as trips:
        started = api.post(f"/actions/{recorded['id']}/start", {})
    assert started.status_code == 200, started.content
    assert trips.count == 1, trips.messages
    assert (started.json()["status"], started.json()["attempts"]) == ("running", 1)
    with round_trips() as trips:
        failed = api.post(
            f"/actions/{recorded['id']}/fail", {"error": "HR API 503", "retryable": True, "layer": "tool"}
        )
    assert failed.status_code == 200, failed.content
    assert trips.count == 1, trips.messages
    assert failed.json()["status"] == "failed"
    assert audit_verify(chain=f"run:{warm['id']}")[1] is None


def test_a_heartbeat_is_one_write_and_the_read_of_pending_commands(api, warm):
    with round_trips() as trips:
        response = api.post(f"/runs/{warm['id']}/heartbeat", {})
    assert response.status_code == 200, response.content
    assert trips.count == 2, trips.messages
    assert response.json()["status"] == "running"
    assert Run.objects.get(pk=warm["id"]).last_heartbeat_at is not None


def test_a_plan_of_five_is_one_round_trip_per_action_and_three_for_the_plan(api, warm):
    """A plan takes the request's cost once; in the database each of its actions is the
    single record's one round trip, and the plan adds its transaction (BEGIN, COMMIT) and the one
    statement that takes all of its keys' locks."""
    actions = [
        {
            "tool": "hr.create_user",
            "target_type": "user",
            "target_id": f"user-{n}@company.com",
            "args": {"email": f"user-{n}@company.com"},
            "idempotency_key": f"plan-{n}",
            "compensation": {"tool": "hr.delete_user", "args": {"email": f"user-{n}@company.com"}},
        }
        for n in range(5)
    ]
    with round_trips() as trips:
        response = api.post(f"/runs/{warm['id']}/plan", {"actions": actions})
    assert response.status_code == 201, response.content
    assert trips.count == 5 + 3, trips.messages
    assert [a["seq"] for a in response.json()["actions"]] == [2, 3, 4, 5, 6]
    assert audit_verify(chain=f"run:{warm['id']}")[1] is None


@pytest.fixture
def saga_client(agent_key) -> Iterator[Any]:
    """The Python client the gateway is built on (its sync twin builds the same requests),
    answered by this process's WSGI application in this thread, with the request signals a
    production request has (Django's test client leaves them out, and with them the health check
    of the reused connection at each request's start): its requests run on the connection
    ``round_trips`` traces."""
    import httpx
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections
    from saga_client import Saga

    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)
    # No retries: a request that fails is seen failing, not answered by its retry.
    client = Saga(
        "http://testserver",
        agent_key[1],
        retries=0,
        transport=httpx.WSGITransport(app=get_wsgi_application()),
    )
    try:
        yield client
    finally:
        client.close()


def test_the_gateways_two_calls_are_what_the_contract_says(saga_client, warm):
    """saga-mcp's governed call, as it sends it (saga_client.mcp.gateway: ``record_action_reply``
    with ``start`` before forwarding, ``succeed_action`` after): the record is the one round trip
    of any record; the success, which the client sends with an ``Idempotency-Key`` so a retry
    replays it, adds the replay store's claim and its stored response, in the same transaction."""
    with round_trips() as trips:
        recorded = saga_client.record_action_reply(
            warm["id"],
            tool="hr.create_user",
            idempotency_key="gateway-1",
            args={"email": "gw@company.com"},
            intent={"reasoning": "MCP tools/call create_user via saga-mcp", "mcp_tool": "create_user"},
            via={"gateway": "saga-mcp/0.2.0", "upstream": "http://127.0.0.1:8765/mcp"},
            start=True,
        )
    assert trips.count == 1, trips.messages
    assert recorded.started_here and recorded.data["status"] == "running"
    with round_trips() as trips:
        succeeded = saga_client.succeed_action(recorded.data, result={"id": 8})
    assert trips.count == SUCCEED_WITH_REPLAY_KEY, "\n".join(trips.messages)
    assert succeeded["status"] == "succeeded"
    assert audit_verify(chain=f"run:{warm['id']}")[1] is None


def test_a_connection_the_server_closed_between_requests_is_replaced_not_used(saga_client, warm):
    """The health check that costs no round trip (infra/postgresql/base.py) still finds a
    connection PostgreSQL closed while it was idle (a restart, a pooler's recycle, an
    administrator's terminate): the next request gets a new connection and succeeds."""
    import select

    import psycopg

    recorded = saga_client.record_action_reply(warm["id"], tool="hr.create_user", idempotency_key="gone-1")
    pid = connection.connection.info.backend_pid
    params = {k: v for k, v in connection.get_connection_params().items() if k != "context"}
    with psycopg.connect(**params, autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
    socket_fd = connection.connection.pgconn.socket
    wait_for(lambda: select.select([socket_fd], [], [], 0)[0], timeout=10, what="the server's close")
    assert saga_client.get_action(recorded.data["id"])["id"] == recorded.data["id"]
    assert connection.connection.info.backend_pid != pid
