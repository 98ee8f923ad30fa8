"""The demo stays a demo: /demo-world/ — pretend systems that take signed
writes and a page of their tables — is served only when SAGA_DEMO is on (``make run`` sets it),
and its page shows a person only the rows of their own tenants."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from django.test import Client

from demo.agents import World, WorldError
from demo.models import CrmTicket, HrUser, OutboxEmail, WorkspaceLicense
from demo.setup import world_seed
from tests.support.processes import ROOT, database_url_for_subprocesses

WORLD_SECRET = "world-secret-for-tests-0123456789"

# A deployment's process, asked for the demo's paths: the overview page, a forward write and a
# compensating endpoint, each signed as the demo world wants.
PROBE = """
import json, os, django
django.setup()
from django.test import Client
from saga_client.signing import signed_headers
SECRET = os.environ["SAGA_DEMO_WORLD_SECRET"]
raw = json.dumps({"email": "probe@acme.example", "name": "Probe"}).encode()
signed = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed_headers(SECRET, raw).items()}
client = Client()
print(json.dumps([
    client.get("/demo-world/").status_code,
    client.post("/demo-world/hr/users", raw, content_type="application/json", **signed).status_code,
    client.post("/demo-world/hr/saga/delete_user", raw, content_type="application/json", **signed).status_code,
    client.get("/healthz").status_code,
]))
"""


def _statuses_in_a_process(**env: str) -> list[int]:
    full_env = {
        **{k: v for k, v in os.environ.items() if k != "SAGA_DEMO"},
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "DATABASE_URL": database_url_for_subprocesses(),
        "SAGA_DEMO_WORLD_SECRET": WORLD_SECRET,
        "LOG_LEVEL": "ERROR",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demo_world_is_not_served_unless_the_demo_is_on(tenant):
    """Pass: in a process without SAGA_DEMO (and with SAGA_DEMO=0) every demo path is 404 — the
    page, a signed forward write, a signed compensating call — while the app serves; with
    SAGA_DEMO=1 the same requests reach the demo (login redirect, 201, 422 for a body without
    the args a compensation needs)."""
    for env in ({}, {"SAGA_DEMO": "0"}):
        assert _statuses_in_a_process(**env) == [404, 404, 404, 200], env
    assert not HrUser.objects.filter(email="probe@acme.example").exists()

    assert _statuses_in_a_process(SAGA_DEMO="1") == [302, 201, 422, 200]


@pytest.mark.django_db(transaction=True)
def test_each_person_sees_only_their_tenants_rows_of_the_demo_world(live_server, alice, mallory, monkeypatch):
    """Pass: Acme's and Globex's agents each onboard someone through the world's HTTP API (as the
    demo's agents do); on /demo-world/, Acme's operator sees Acme's seeded world and Acme's hire
    but none of Globex's rows, and Globex's operator the other way round. A malformed tenant
    header is a 422, not a 500, and files nothing."""
    monkeypatch.setenv("SAGA_DEMO_WORLD_SECRET", WORLD_SECRET)
    world_seed()
    world = World(live_server.url, WORLD_SECRET, timeout=60)
    try:
        for tenant, email in (("acme", "ashu@acme.example"), ("globex", "kofi.mensah@globex.example")):
            world.call(
                "POST",
                "/hr/users",
                {"email": email, "name": email.split("@")[0]},
                key=f"u-{tenant}",
                tenant=tenant,
            )
            world.call(
                "POST",
                "/workspace/licenses",
                {"email": email, "sku": "business-standard"},
                key=f"l-{tenant}",
                tenant=tenant,
            )
            world.call(
                "POST",
                "/email/messages",
                {"to": email, "subject": f"Welcome {tenant}", "body": "Hi"},
                key=f"m-{tenant}",
                tenant=tenant,
            )
        with pytest.raises(WorldError) as refused:
            world.call(
                "POST",
                "/hr/users",
                {"email": "x@y.example", "name": "X"},
                key="bad",
                tenant="acme' OR '1'='1",
            )
        assert refused.value.status == 422
    finally:
        world.close()
    assert not HrUser.objects.filter(email="x@y.example").exists()
    assert HrUser.objects.get(email="kofi.mensah@globex.example").tenant_slug == "globex"
    assert WorkspaceLicense.objects.filter(tenant_slug="globex").count() == 1
    assert OutboxEmail.objects.filter(tenant_slug="globex").count() == 1

    acme_page, globex_page = (_overview(live_server.url, person) for person in (alice, mallory))

    assert "ashu@acme.example" in acme_page and "Welcome acme" in acme_page
    assert CrmTicket.objects.filter(tenant_slug="acme").first().subject in acme_page  # the seeded world
    assert "kofi.mensah@globex.example" not in acme_page and "Welcome globex" not in acme_page
    assert "kofi.mensah@globex.example" in globex_page and "Welcome globex" in globex_page
    assert "ashu@acme.example" not in globex_page and "Welcome acme" not in globex_page
    assert CrmTicket.objects.filter(tenant_slug="acme").first().subject not in globex_page


def _overview(base_url: str, person: object) -> str:
    """The page as the person's browser gets it: a real session over HTTP."""
    client = Client()
    client.force_login(person)  # type: ignore[arg-type]
    cookies = {name: morsel.value for name, morsel in client.cookies.items()}
    response = httpx.get(f"{base_url}/demo-world/", cookies=cookies, timeout=30)
    assert response.status_code == 200, response.text[:500]
    return response.text
