"""The dashboard's compensator check (recovery.compensator_checks) against real compensators: only
the specification's harmless cases, never a validly signed call (the compensator's own record of
what it received proves it), the result recorded and audited, and the flags the policies page and
the plan preview show. Then the page's POST: admins of the tenant only, tenant-scoped."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from saga_client.signing import verify_signature

from ledger.audit import Actor
from ledger.models import Compensator, Event
from recovery import compensator_checks
from recovery.models import CompensatorCheck
from tests.support.mcp_servers import http_upstream
from tests.support.processes import ROOT
from tests.support.reference_compensator import SECRET, Flaws, reference_compensator

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = json.loads((ROOT / "clients" / "spec" / "compensator-cases.json").read_text())


def test_the_server_runs_exactly_the_specifications_harmless_cases() -> None:
    for kind, server_cases in (
        ("webhook", compensator_checks.WEBHOOK_CASES),
        ("mcp", compensator_checks.MCP_CASES),
    ):
        harmless = {
            c["id"]: (c["title"], c["required"])
            for c in SPEC[kind]
            if c["harmless"] and not c.get("needs_args")
        }
        assert server_cases == harmless, kind
    refusals = {
        c["id"]: c["expect"]["pass"]
        for c in SPEC["webhook"]
        if c["id"].endswith("_refused") and c["harmless"]
    }
    assert refusals == {"unsigned_refused": [401, 403], "wrong_signature_refused": [401, 403]}
    assert list(compensator_checks.REFUSED) == [401, 403]


def _webhook(tenant, url: str, tool: str = "licenses.cancel") -> Compensator:
    return Compensator.objects.create(tenant=tenant, tool=tool, kind="webhook", url=url, secret=SECRET)


def _check(tenant, user, row) -> CompensatorCheck:
    return compensator_checks.compensator_check(tenant=tenant, actor=Actor.for_user(user), user=user, row=row)


def test_a_sound_compensator_passes_and_no_call_it_received_was_validly_signed(tenant, dave) -> None:
    with reference_compensator(Flaws(accepts_any_signature=False)) as (base, reference):
        row = _webhook(tenant, f"{base}/cancel")
        check = _check(tenant, dave, row)
    assert check.ok
    assert [(r["id"], r["verdict"]) for r in check.results] == [
        ("tls", "fail"),  # advisory: plain HTTP here
        ("reachable", "pass"),
        ("unsigned_refused", "pass"),
        ("wrong_signature_refused", "pass"),
    ]
    assert len(reference.received) == 3
    assert not any(verify_signature(SECRET, headers, raw) for headers, raw in reference.received)
    assert reference.state() == {"active": True, "cancellations": 0}
    event = Event.objects.get(kind="compensator.checked")
    assert (event.tenant_id, event.to_state, event.subject_type, event.subject_id) == (
        tenant.pk,
        "passed",
        "compensator",
        "licenses.cancel",
    )


def test_a_compensator_that_accepts_a_wrong_signature_fails_and_is_flagged(tenant, dave) -> None:
    with reference_compensator(Flaws(accepts_any_signature=True)) as (base, reference):
        row = _webhook(tenant, f"{base}/cancel")
        check = _check(tenant, dave, row)
    assert not check.ok
    verdicts = {r["id"]: (r["verdict"], r["status"]) for r in check.results}
    # The probe body names no real step: even a compensator that takes it unsigned finds nothing.
    assert verdicts["unsigned_refused"] == ("fail", 422)
    assert verdicts["wrong_signature_refused"] == ("fail", 422)
    assert reference.state() == {"active": True, "cancellations": 0}
    flag = compensator_checks.check_flags(tenant=tenant, tools=["licenses.cancel"])["licenses.cancel"]
    assert flag.startswith("This compensator failed its last check (")
    assert flag.endswith("): unsigned_refused, wrong_signature_refused.")


def test_an_unreachable_compensator_fails_reachability(tenant, dave) -> None:
    check = _check(tenant, dave, _webhook(tenant, "http://127.0.0.1:9/cancel"))
    assert not check.ok
    assert [(r["id"], r["verdict"]) for r in check.results] == [("tls", "fail"), ("reachable", "fail")]
    assert check.results[1]["detail"] == "no answer: ConnectError"


def test_flags_never_checked_stale_and_moved(tenant, dave) -> None:
    with reference_compensator(Flaws()) as (base, _):
        row = _webhook(tenant, f"{base}/cancel")
        flags = compensator_checks.check_flags(tenant=tenant, tools=["licenses.cancel", "unknown.tool"])
        assert flags == {"licenses.cancel": "This compensator has never been checked."}
        check = _check(tenant, dave, row)
    assert compensator_checks.check_flags(tenant=tenant, tools=["licenses.cancel"]) == {"licenses.cancel": ""}
    CompensatorCheck.objects.filter(pk=check.pk).update(checked_at=timezone.now() - timedelta(days=31))
    stale = compensator_checks.check_flags(tenant=tenant, tools=["licenses.cancel"])["licenses.cancel"]
    assert stale.startswith("This compensator has not been checked since ")
    # Pointed somewhere else, it has never been checked there.
    Compensator.objects.filter(pk=row.pk).update(url="http://127.0.0.1:9/elsewhere")
    moved = compensator_checks.check_flags(tenant=tenant, tools=["licenses.cancel"])
    assert moved == {"licenses.cancel": "This compensator has never been checked."}


def test_python_compensators_are_checked_by_import(tenant, dave) -> None:
    good = Compensator.objects.create(
        tenant=tenant, tool="a.undo", kind="python", python_path="demo.compensators.cancel_license"
    )
    bad = Compensator.objects.create(
        tenant=tenant, tool="b.undo", kind="python", python_path="demo.compensators.nope"
    )
    assert _check(tenant, dave, good).ok
    failed = _check(tenant, dave, bad)
    assert not failed.ok and failed.results[0]["id"] == "python_importable"


def test_mcp_compensators_are_listed_never_called(tenant, dave, tmp_path: Path) -> None:
    with http_upstream(tmp_path) as upstream:
        listed = Compensator.objects.create(
            tenant=tenant, tool="a.undo", kind="mcp", url=upstream.url, mcp_tool="delete_user"
        )
        missing = Compensator.objects.create(
            tenant=tenant, tool="b.undo", kind="mcp", url=upstream.url, mcp_tool="undo_all"
        )
        assert _check(tenant, dave, listed).ok
        check = _check(tenant, dave, missing)
        assert not check.ok and check.results[-1]["detail"] == "undo_all is not listed"
        assert upstream.calls() == []


# --- The page's POST ---------------------------------------------------------------------------------


def _post(user, tenant_id: int, compensator_id: int):
    client = Client()
    client.force_login(user)
    return client.post(reverse("dashboard:compensator-check", args=[tenant_id, compensator_id]))


def test_only_an_admin_of_the_tenant_checks_and_only_what_the_tenant_sees(
    tenant, other_tenant, dave, alice, carol, mallory
) -> None:
    with reference_compensator(Flaws()) as (base, reference):
        row = _webhook(tenant, f"{base}/cancel")
        for user in (alice, carol):
            assert _post(user, tenant.pk, row.pk).status_code == 403
        assert _post(mallory, tenant.pk, row.pk).status_code == 404  # not Mallory's tenant
        outsider = _webhook(other_tenant, f"{base}/cancel", tool="globex.undo")
        assert _post(dave, tenant.pk, outsider.pk).status_code == 404  # another tenant's
        assert reference.received == []
        assert not CompensatorCheck.objects.exists()
        response = _post(dave, tenant.pk, row.pk)
        assert response.status_code == 303
        assert response["Location"] == f"/policies/#compensator-{tenant.pk}-{row.pk}"
    assert CompensatorCheck.objects.get().checked_by == dave
    client = Client()
    client.force_login(dave)
    assert client.get(reverse("dashboard:compensator-check", args=[tenant.pk, row.pk])).status_code == 405
    page = client.get(reverse("dashboard:policies")).content.decode()
    assert f'id="compensator-{tenant.pk}-{row.pk}"' in page and 'data-verdict="pass"' in page


def test_a_global_compensator_the_tenant_overrides_is_not_checked_through_it(tenant, dave) -> None:
    shared = Compensator.objects.create(
        tenant=None, tool="licenses.cancel", kind="webhook", url="http://127.0.0.1:9/a", secret="s"
    )
    _webhook(tenant, "http://127.0.0.1:9/b")
    assert _post(dave, tenant.pk, shared.pk).status_code == 404
