"""Outbound requests go only where an operator allowed; a refusal tells the
agent only "not allowed" and the operator why; each agent's pushed commands
are signed with a secret of its own and name their destination.

Over real HTTP: runs are created through a live server, commands are pushed by the real RQ job to
a real local receiver. Made-up names are answered by a stand-in for the system resolver (``dns``),
so DNS rebinding can be staged: public when the run is created, loopback when the command is sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any

import django_rq
import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone
from rq import SimpleWorker
from saga_client.signing import derive_secret, signed_headers, verify_signature

from infra import errors, outbound
from ledger.audit import Actor
from ledger.models import Event, IdempotencyRecord, Run
from ledger.services import runs
from ledger.services.keys import agent_key_create
from recovery.actions import commands
from recovery.models import AgentCommand
from recovery.notifications.command_push import deliver_command
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"  # a public address; nothing here ever connects to it
REAL_GETADDRINFO = socket.getaddrinfo


# --- A resolver we can stage, and an agent's endpoint ------------------------------------------


@dataclass
class Dns:
    """Answers for made-up names (an empty list: the name does not resolve); every other name goes
    to the real resolver. ``lookups`` records each made-up name asked for."""

    answers: dict[str, list[str]] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)
    delay_s: float = 0.0


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Dns:
    staged = Dns()

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in staged.answers:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        staged.lookups.append(name)
        time.sleep(staged.delay_s)
        if not staged.answers[name]:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, int(port or 0), 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port or 0)))
            for a in staged.answers[name]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return staged


@dataclass
class Receiver:
    """An agent's resume endpoint on 127.0.0.1: records every request; ``replies`` maps a path to
    (status, headers), 200 otherwise. A path in ``secrets`` is an agent that checks what it gets
    as the Python client tells it to — ``verify_signature(secret, headers, body, url=<its own
    resume_url>)`` — and answers 401 to what does not verify (``calls[i]["verified"]``)."""

    port: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    replies: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers_in = dict(self.headers.items())
            verified = None
            if self.path in state.secrets:
                own_url = state.url(self.path)
                verified = verify_signature(state.secrets[self.path], headers_in, raw, url=own_url)
            state.calls.append({"path": self.path, "headers": headers_in, "raw": raw, "verified": verified})
            status, headers = (401, {}) if verified is False else state.replies.get(self.path, (200, {}))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def api(agent_key: Any) -> Api:
    return Api(agent_key[1])


def _allow(settings: Any, *hosts: str, **more: Any) -> None:
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": list(hosts), **more}


def _http(live_server: Any, secret: str) -> httpx.Client:
    return httpx.Client(base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {secret}"})


def _deliver_queued_commands() -> None:
    """What the worker does: run the queued push jobs (the real RQ job, in this process)."""
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def _failed_and_resumed(http: httpx.Client, operator: httpx.Client, *, resume_url: str) -> tuple[str, str]:
    """A run with ``resume_url``, failed by its agent and resumed by an operator, all over HTTP:
    (run id, resume command id)."""
    created = http.post(
        "/runs", json={"agent": "onboarding", "request": "Onboard Ashu", "resume_url": resume_url}
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    failed = http.post(f"/runs/{run_id}/fail", json={"error": "mail gateway 429"})
    assert failed.status_code == 200, failed.text
    item_id = failed.json()["recovery_item"]["id"]
    resumed = operator.post(f"/recovery/{item_id}/resume", json={"reason": "gateway fixed"})
    assert resumed.status_code == 202, resumed.text
    return run_id, resumed.json()["id"]


# --- Run creation: the guard -------------------------------------------------------------------

# What every refusal for where a host is (or whether it resolves) tells the agent, word for word.
NOT_ALLOWED = (
    "resume_url is not allowed: outbound requests go only to public hosts or to hosts the operator allows."
)

HEADLINE_REFUSALS = [
    ("http://169.254.169.254/latest", "link_local"),
    ("http://127.0.0.1:6379/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://10.0.0.1/", "private"),
    ("ftp://x", "scheme"),
    ("http://localhost/", "loopback"),
    ("http://resume.attacker.example/", "loopback"),  # a name that resolves to 127.0.0.1
]


@pytest.mark.django_db(transaction=True)
def test_it_refuses_resume_urls_that_reach_inside_over_http(live_server, agent_key, dns):
    dns.answers["resume.attacker.example"] = ["127.0.0.1"]
    with _http(live_server, agent_key[1]) as http:
        for url, reason in HEADLINE_REFUSALS:
            response = http.post(
                "/runs",
                json={"agent": "onboarding", "request": "Onboard Ashu", "resume_url": url},
                headers={"Idempotency-Key": f"run-{reason}-{len(url)}"},
            )
            assert response.status_code == 422, (url, response.text)
            error = response.json()["error"]
            assert error["code"] == "url_not_allowed", url
            assert error["details"]["field"] == "resume_url"
            if reason == "scheme":
                assert error["details"]["reason"] == "scheme" and "http(s)" in error["message"]
            else:
                # Where the host is stays the operator's to know (no map of the network).
                assert (error["message"], sorted(error["details"])) == (NOT_ALLOWED, ["field", "url"])
                assert "127.0.0.1" not in response.text or "127.0.0.1" in url
    # Nothing was created: no run, no stored idempotent response; the operator's audit log has why.
    assert Run.objects.count() == 0
    assert Event.objects.filter(kind="run.created").count() == 0
    assert IdempotencyRecord.objects.count() == 0
    assert dns.lookups == ["resume.attacker.example"]
    refused = Event.objects.filter(kind="run.refused", subject_id="resume_url").order_by("id")
    assert [e.data["details"]["reason"] for e in refused] == [r for _u, r in HEADLINE_REFUSALS]
    assert refused.last().data["details"]["address"] == "127.0.0.1"
    assert "resolves to a loopback address" in refused.last().reason


@pytest.mark.django_db(transaction=True)
def test_a_private_host_and_a_name_that_does_not_resolve_are_refused_alike(live_server, agent_key, dns):
    """An agent probing the internal network by resume_url learns nothing: a name that resolves
    inside, a private literal, a link-local one and a name that does not resolve all get the same
    422, word for word but for the URL it sent back; the operator's audit log says which was which."""
    dns.answers["db.corp.attacker.example"] = ["10.20.30.40"]
    dns.answers["nothing.corp.attacker.example"] = []
    probes = {
        "http://db.corp.attacker.example:5432/": "private",
        "http://nothing.corp.attacker.example:5432/": "unresolvable",
        "http://10.20.30.40:5432/": "private",
        "http://169.254.169.254/": "link_local",
    }
    with _http(live_server, agent_key[1]) as http:
        answers = {
            url: http.post("/runs", json={"agent": "a", "request": "r", "resume_url": url}, timeout=30)
            for url in probes
        }
    told = []
    for url, response in answers.items():
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["details"].pop("url") == url
        told.append(error)
    same = {"code": "url_not_allowed", "message": NOT_ALLOWED, "details": {"field": "resume_url"}}
    assert told == [same] * len(probes)
    events = Event.objects.filter(kind="run.refused", subject_id="resume_url").order_by("id")
    assert [(e.data["details"]["url"], e.data["details"]["reason"]) for e in events] == list(probes.items())
    assert events[0].data["details"]["address"] == "10.20.30.40"
    assert "resolves to a private address" in events[0].reason
    assert "did not resolve" in events[1].reason or "does not resolve" in events[1].reason
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://2130706433/", "loopback"),  # decimal 127.0.0.1, as the resolver reads it
        ("http://0x7f.1/", "loopback"),  # hex and short forms
        ("http://127.1:8000/", "loopback"),
        ("http://0177.0.0.1/", "invalid"),  # octal: the HTTP client refuses to parse it at all
        ("http://[::ffff:127.0.0.1]/", "loopback"),  # IPv4-mapped IPv6
        ("http://[::ffff:169.254.169.254]/", "link_local"),
        ("http://[2002:a9fe:a9fe::]/", "link_local"),  # 6to4 around 169.254.169.254
        ("http://[64:ff9b::a00:1]/", "private"),  # NAT64 around 10.0.0.1
        ("http://0/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("https://172.16.5.4/", "private"),
        ("http://192.168.1.10:8080/admin", "private"),
        ("http://100.64.0.1/", "private"),
        ("http://[fd12:3456::1]/", "private"),
        ("http://[fe80::1]/", "link_local"),
        ("http://240.0.0.1/", "reserved"),
        ("http://192.0.2.1/", "reserved"),
        ("http://mixed.attacker.example/", "private"),  # one public and one private answer
        ("http://gone.attacker.example/", "unresolvable"),
        ("javascript:alert(1)", "scheme"),
        ("http:///no-host", "no_host"),
        ("https://user:hunter2@127.0.0.1/", "loopback"),
    ],
)
def test_it_refuses_every_way_of_spelling_an_inside_address(api, dns, url, reason):
    dns.answers["mixed.attacker.example"] = [PUBLIC, "10.1.2.3"]
    dns.answers["gone.attacker.example"] = []
    response = api.post("/runs", {"agent": "a", "request": "r", "resume_url": url})
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert error["code"] == "url_not_allowed"
    if reason in ("invalid", "scheme", "no_host"):
        assert error["details"]["reason"] == reason  # a malformed URL says nothing about the network
    else:
        assert error["message"] == NOT_ALLOWED and "reason" not in error["details"]
    assert "hunter2" not in response.content.decode()  # credentials in a URL are never echoed
    assert not Run.objects.exists()
    [event] = Event.objects.filter(kind="run.refused", subject_id="resume_url")
    assert event.data["details"]["reason"] == reason and "hunter2" not in json.dumps(event.data)


def test_a_name_is_refused_when_it_does_not_resolve_in_time(api, dns, settings):
    settings.SAGA = {**settings.SAGA, "OUTBOUND_RESOLVE_TIMEOUT_S": 0.2}
    dns.answers["slow.attacker.example"] = [PUBLIC]
    # A lookup that takes 10 s: a request that waited for it would take that long. The bound is
    # 0.2 s; the assertion leaves room for a loaded machine (a first request in a cold process
    # took ~3 s at load average 10), not for the lookup.
    dns.delay_s = 10.0
    api.get("/runs")  # the process's first API request pays its imports outside the clock
    started = time.monotonic()
    response = api.post(
        "/runs", {"agent": "a", "request": "r", "resume_url": "http://slow.attacker.example/"}
    )
    assert time.monotonic() - started < 5
    error = error_of(response)
    assert response.status_code == 422 and error["message"] == NOT_ALLOWED
    assert not Run.objects.exists()
    [event] = Event.objects.filter(kind="run.refused", subject_id="resume_url")
    assert event.data["details"]["reason"] == "unresolvable"
    assert "did not resolve within 0.2 s" in event.reason


@pytest.mark.django_db(transaction=True)
def test_public_hosts_and_hosts_the_operator_allows_are_accepted(live_server, agent_key, dns, settings):
    dns.answers["agent.example"] = [PUBLIC, "2606:2800:220:1:248:1893:25c8:1946"]
    _allow(settings, f"127.0.0.1:{live_server.thread.port}", "agents.internal")
    urls = [
        "https://agent.example/saga/commands",  # public by what it resolves to
        f"http://127.0.0.1:{live_server.thread.port}/demo-world/agent",  # allowed host:port
        "http://Agents.Internal./resume",  # allowed by name, any port, whatever it resolves to
    ]
    with _http(live_server, agent_key[1]) as http:
        for url in urls:
            response = http.post("/runs", json={"agent": "a", "request": "r", "resume_url": url})
            assert response.status_code == 201, (url, response.text)
            assert response.json()["resume_url"] == url
        # The same host on another port is not what the operator allowed.
        refused = http.post(
            "/runs", json={"agent": "a", "request": "r", "resume_url": "http://127.0.0.1:6379/"}
        )
    assert refused.status_code == 422 and refused.json()["error"]["message"] == NOT_ALLOWED
    assert Run.objects.count() == 3


def test_the_allowed_hosts_setting_reads_names_addresses_and_ports(settings):
    _allow(settings, "Agent.Internal.", "127.0.0.1:8000", "[::1]:9000", "::1", "bücher.example")
    assert outbound.allowed_hosts() == [
        ("agent.internal", None),
        ("127.0.0.1", 8000),
        ("::1", 9000),
        ("::1", None),
        ("xn--bcher-kva.example", None),
    ]
    for bad in ("http://agent.internal", "agent.internal:http", "user@agent.internal", "[::1]x"):
        _allow(settings, bad)
        with pytest.raises(ImproperlyConfigured, match="SAGA_OUTBOUND_ALLOWED_HOSTS"):
            outbound.check_url("http://agent.internal/")


# --- Send time: checked again, pinned, no redirects ---------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_dns_answer_that_changed_since_creation_is_refused_at_send_time(
    live_server, agent_key, operator_key, dns, receiver, own_redis
):
    """DNS rebinding: public when the run is created, 127.0.0.1 when the command is pushed. The
    push is refused, the command says why, the run's audit log records it, and it is never tried
    again; the agent can still pull the command."""
    dns.answers["agent.attacker.example"] = [PUBLIC]
    resume_url = receiver.url("/resume", host="agent.attacker.example")
    with _http(live_server, agent_key[1]) as http, _http(live_server, operator_key[1]) as operator:
        run_id, command_id = _failed_and_resumed(http, operator, resume_url=resume_url)
        dns.answers["agent.attacker.example"] = ["127.0.0.1"]  # the attacker re-points the name

        _deliver_queued_commands()

        assert receiver.calls == []
        command = AgentCommand.objects.get(pk=command_id)
        assert command.delivered_at is None
        # The agent learns that it was refused, not why or what the name resolves to inside.
        assert command.delivery_error == f"Refused: {NOT_ALLOWED}"
        [event] = Event.objects.filter(run_id=run_id, kind="command.delivery_refused")
        assert event.subject_id == command_id and "resolves to a loopback address" in event.reason
        assert event.data["reason"] == "loopback" and event.data["address"] == "127.0.0.1"

        # Shown to the agent with the pending command it can still pull.
        [pulled] = http.get(f"/runs/{run_id}/commands").json()["commands"]
        assert pulled["id"] == command_id and pulled["delivery_error"] == command.delivery_error
        assert pulled["delivered_at"] is None

    # No retry storm: the sweeper does not queue it again, a stray job changes nothing.
    assert commands.commands_redeliver(now=timezone.now() + timedelta(hours=1)) == 0
    assert deliver_command(command_id=command_id) is False
    assert receiver.calls == []
    assert Event.objects.filter(run_id=run_id, kind="command.delivery_refused").count() == 1


def test_a_name_that_does_not_resolve_at_send_time_is_retried_not_refused(
    tenant, agent, alice, dns, settings
):
    dns.answers["agent.example"] = [PUBLIC]
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="a", request="r", resume_url="https://agent.example/resume"
    )
    command = commands.command_issue(run=run, kind="resume", actor=Actor.for_user(alice), reason="go on")
    dns.answers["agent.example"] = []  # a DNS outage, not a refusal

    assert deliver_command(command_id=command.pk) is False

    command.refresh_from_db()
    # Told what any refusal tells the agent, and tried again later (a DNS outage may pass).
    assert command.delivery_attempts == 1 and command.delivery_error == NOT_ALLOWED
    assert not command.delivery_error.startswith("Refused")
    assert not Event.objects.filter(kind="command.delivery_refused").exists()
    AgentCommand.objects.filter(pk=command.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert commands.commands_redeliver() == 1


def test_the_request_goes_to_the_checked_address_not_a_fresh_answer(dns, receiver, settings):
    """``post`` connects to the address the guard approved (with the URL's Host header): whatever
    the name resolves to by then is never asked."""
    dns.answers["agent.example"] = ["10.66.66.66"]
    checked = outbound.CheckedUrl(
        url=receiver.url("/resume", host="agent.example"),
        scheme="http",
        host="agent.example",
        port=receiver.port,
        addresses=("127.0.0.1",),
        allowed_by_setting=False,
    )
    response = outbound.post(checked, content=b"{}", headers={"Content-Type": "application/json"}, timeout=5)

    assert response.status_code == 200
    [call] = receiver.calls
    assert call["path"] == "/resume" and call["headers"]["Host"] == f"agent.example:{receiver.port}"
    assert dns.lookups == []


def test_https_keeps_the_name_for_tls_while_connecting_to_the_checked_address(monkeypatch):
    sent: list[httpx.Request] = []

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        assert kwargs.get("follow_redirects") is False
        sent.append(request)
        return httpx.Response(200, request=request)

    monkeypatch.setattr(httpx.Client, "send", send)
    checked = outbound.CheckedUrl(
        url="https://agent.example/saga/commands",
        scheme="https",
        host="agent.example",
        port=443,
        addresses=(PUBLIC,),
        allowed_by_setting=False,
    )
    outbound.post(checked, content=b"{}", headers={}, timeout=5)

    [request] = sent
    assert str(request.url) == f"https://{PUBLIC}/saga/commands"
    assert request.headers["Host"] == "agent.example"
    assert request.extensions["sni_hostname"] == "agent.example"


@pytest.mark.django_db(transaction=True)
def test_a_redirect_from_the_resume_url_is_not_followed(
    live_server, agent_key, operator_key, receiver, settings, own_redis
):
    _allow(settings, f"127.0.0.1:{receiver.port}")
    receiver.replies["/resume"] = (302, {"Location": receiver.url("/inside")})
    with _http(live_server, agent_key[1]) as http, _http(live_server, operator_key[1]) as operator:
        _run_id, command_id = _failed_and_resumed(http, operator, resume_url=receiver.url("/resume"))
        _deliver_queued_commands()

    assert [c["path"] for c in receiver.calls] == ["/resume"]
    command = AgentCommand.objects.get(pk=command_id)
    assert command.delivered_at is None and command.delivery_attempts == 1
    assert "302" in command.delivery_error and "not followed" in command.delivery_error


# --- Per-agent resume secrets, and commands that name their destination ----------------------


def _resume_secret(slug: str, agent: str) -> str:
    out = StringIO()
    call_command("resume_secret", tenant=slug, agent=agent, stdout=out, stderr=StringIO())
    return out.getvalue().strip().splitlines()[-1]


def _key(tenant: Any, name: str) -> str:
    return agent_key_create(tenant=tenant, name=name, scopes=["agent"], actor=Actor.system("t")).secret


@pytest.mark.django_db(transaction=True)
def test_each_agent_verifies_only_its_own_commands(
    live_server, tenant, other_tenant, agent_key, operator_key, receiver, settings, own_redis
):
    """Two agents of Acme and one of Globex, each with a run whose resume_url is its own endpoint;
    commands pushed by the real RQ job over HTTP. Each agent's endpoint accepts its own command
    with the secret ``resume_secret --agent`` prints for it, and no other agent's secret — of the
    same tenant or another, nor the old per-tenant one — verifies it; a command one agent signs
    for another with what it knows is refused."""
    _allow(settings, f"127.0.0.1:{receiver.port}", RESUME_WEBHOOK_SECRET="the-installation-master")
    secrets = {
        "/onboarding": _resume_secret("acme", "onboarding-agent"),
        "/billing": _resume_secret("acme", "billing-agent"),
        "/globex": _resume_secret("globex", "globex-bot"),
    }
    assert len({*secrets.values(), "the-installation-master"}) == 4
    assert secrets["/onboarding"] == derive_secret("the-installation-master", "resume:acme:onboarding-agent")
    receiver.secrets.update(secrets)

    billing_key, globex_key = _key(tenant, "billing-agent"), _key(other_tenant, "globex-bot")
    runs_by_path = {}
    with _http(live_server, operator_key[1]) as operator:
        for path, key in (("/onboarding", agent_key[1]), ("/billing", billing_key)):
            with _http(live_server, key) as http:
                runs_by_path[path], _command = _failed_and_resumed(
                    http, operator, resume_url=receiver.url(path)
                )
    with _http(live_server, globex_key) as http:
        created = http.post(
            "/runs", json={"agent": "b", "request": "r", "resume_url": receiver.url("/globex")}
        )
    runs_by_path["/globex"] = created.json()["id"]
    commands.command_issue(
        run=Run.objects.get(pk=runs_by_path["/globex"]), kind="cancel", actor=Actor.system("t"), reason="stop"
    )
    _deliver_queued_commands()

    pushed = {c["path"]: c for c in receiver.calls}
    assert set(pushed) == set(secrets) and all(c["verified"] for c in pushed.values())
    assert AgentCommand.objects.filter(delivered_at__isnull=False).count() == 3
    for path, call in pushed.items():
        body = json.loads(call["raw"])
        # The signed body names the run, its agent and where it was sent.
        assert (body["run_id"], body["url"]) == (runs_by_path[path], receiver.url(path))
        for other, secret in secrets.items():
            assert verify_signature(secret, call["headers"], call["raw"]) is (other == path), (path, other)
        for tenant_wide in ("resume:acme", "resume:globex"):
            assert not verify_signature(
                derive_secret("the-installation-master", tenant_wide), call["headers"], call["raw"]
            )
    assert {json.loads(c["raw"])["agent"] for c in pushed.values()} == {
        "onboarding-agent",
        "billing-agent",
        "globex-bot",
    }

    # The onboarding agent forges a cancel for the billing agent's run with the secret it has, and
    # sends it to the billing agent's endpoint: refused there.
    forged = json.dumps({**json.loads(pushed["/billing"]["raw"]), "kind": "cancel"}).encode()
    answer = httpx.post(
        receiver.url("/billing"), content=forged, headers=signed_headers(secrets["/onboarding"], forged)
    )
    assert answer.status_code == 401 and receiver.calls[-1]["verified"] is False


@pytest.mark.django_db(transaction=True)
def test_a_command_captured_on_its_way_to_one_url_is_refused_at_another(
    live_server, agent_key, operator_key, receiver, settings, own_redis
):
    """One agent, two runs, two endpoints (say an old one someone else now holds, and the current
    one). A command pushed to the first, replayed byte for byte — headers included — at the second
    within the signature's tolerance, is refused there: its signed body names the first URL."""
    _allow(settings, f"127.0.0.1:{receiver.port}", RESUME_WEBHOOK_SECRET="the-installation-master")
    secret = _resume_secret("acme", "onboarding-agent")
    receiver.secrets.update({"/first": secret, "/second": secret})
    with _http(live_server, agent_key[1]) as http, _http(live_server, operator_key[1]) as operator:
        _failed_and_resumed(http, operator, resume_url=receiver.url("/first"))
        _deliver_queued_commands()
    [captured] = receiver.calls
    assert captured["verified"] is True

    replayed = httpx.post(receiver.url("/second"), content=captured["raw"], headers=captured["headers"])

    assert replayed.status_code == 401 and receiver.calls[-1]["verified"] is False
    # The same bytes still verify where they were sent, and without a destination to check.
    assert verify_signature(secret, captured["headers"], captured["raw"], url=receiver.url("/first"))
    assert verify_signature(secret, captured["headers"], captured["raw"])


def test_the_resume_secret_command_names_what_is_missing(tenant, settings):
    settings.SAGA = {**settings.SAGA, "RESUME_WEBHOOK_SECRET": "m"}
    with pytest.raises(CommandError, match="No tenant"):
        _resume_secret("nobody", "onboarding-agent")
    with pytest.raises(CommandError, match="--agent"):
        _resume_secret("acme", "  ")
    with pytest.raises(CommandError, match="--agent"):
        call_command("resume_secret", tenant="acme", stdout=StringIO())  # the tenant alone is not enough
    settings.SAGA = {**settings.SAGA, "RESUME_WEBHOOK_SECRET": ""}
    with pytest.raises(CommandError, match="SAGA_RESUME_WEBHOOK_SECRET"):
        _resume_secret("acme", "onboarding-agent")


def test_the_guard_is_one_reusable_function():
    with pytest.raises(errors.UrlNotAllowed) as refused:
        outbound.check_url("http://169.254.169.254/latest/meta-data/", field="webhook_url")
    assert refused.value.status == 422 and refused.value.code == "url_not_allowed"
    assert refused.value.details == {
        "field": "webhook_url",
        "url": "http://169.254.169.254/latest/meta-data/",
    }
    assert (refused.value.reason, refused.value.resolved_address) == ("link_local", "169.254.169.254")
    assert "is a link-local address" in refused.value.operator_message
