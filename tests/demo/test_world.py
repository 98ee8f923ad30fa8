"""The demo world's endpoints follow the webhook protocol: signed, idempotent, 409 when already
compensated, 412 when the record drifted; its Python compensators answer the same way."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from saga_client.signing import signed_headers

from demo import compensators
from demo.models import CrmTicket, HrUser, OutboxEmail, Payment, WorkspaceLicense
from recovery.compensators import CompensationDrifted, CompensationFailed

SECRET = "world-secret-for-tests-0123456789"


@pytest.fixture(autouse=True)
def world_secret(monkeypatch):
    monkeypatch.setenv("SAGA_DEMO_WORLD_SECRET", SECRET)


def post(client, name, body, *, key="", secret=SECRET, **kwargs):
    raw = json.dumps(body).encode()
    headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed_headers(secret, raw).items()}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(
        reverse(f"demo:{name}", kwargs=kwargs), raw, content_type="application/json", **headers
    )


def webhook_body(**fields):
    body = {
        "step_id": "stp_1",
        "action_id": "act_1",
        "run_id": "run_1",
        "tenant": "acme",
        "tool": "",
        "args": {},
        "target_type": "",
        "target_id": "",
        "before_snapshot": None,
        "after_snapshot": None,
        "attempt": 1,
    }
    body.update(fields)
    return body


@pytest.fixture
def ashu(db):
    """Ashu's HR record and licence, as the onboarding agent left them."""
    user = HrUser.objects.create(email="ashu@acme.example", name="Ashu Kumar", department="Engineering")
    WorkspaceLicense.objects.create(email=user.email, sku="business-standard", monthly_cost_cents=1400)
    return user


def test_it_refuses_unsigned_and_wrongly_signed_calls(client, ashu):
    raw = json.dumps(webhook_body(args={"email": ashu.email})).encode()
    unsigned = client.post(reverse("demo:hr-delete-user"), raw, content_type="application/json")
    assert unsigned.status_code == 401
    forged = post(client, "hr-delete-user", webhook_body(args={"email": ashu.email}), secret="not-the-secret")
    assert forged.status_code == 401
    assert HrUser.objects.filter(email=ashu.email).exists()


def test_it_is_off_when_no_secret_is_configured(client, ashu, monkeypatch):
    monkeypatch.delenv("SAGA_DEMO_WORLD_SECRET")
    response = post(client, "hr-delete-user", webhook_body(args={"email": ashu.email}))
    assert response.status_code == 503
    assert HrUser.objects.filter(email=ashu.email).exists()


def test_it_deletes_the_user_once_and_then_answers_already_compensated(client, ashu):
    after = ashu.snapshot()
    first = post(
        client, "hr-delete-user", webhook_body(args={"email": ashu.email}, after_snapshot=after), key="k1"
    )
    assert first.status_code == 200 and first.json()["state"] == {"email": ashu.email, "deleted": True}
    assert not HrUser.objects.filter(email=ashu.email).exists()
    # The same step retried (same Idempotency-Key): the first answer, replayed.
    replay = post(
        client, "hr-delete-user", webhook_body(args={"email": ashu.email}, after_snapshot=after), key="k1"
    )
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    # Another compensation of the same user: already done.
    again = post(
        client, "hr-delete-user", webhook_body(args={"email": ashu.email}, after_snapshot=after), key="k2"
    )
    assert again.status_code == 409


def test_it_refuses_to_reuse_an_idempotency_key_for_another_request(client, ashu):
    post(client, "hr-delete-user", webhook_body(args={"email": ashu.email}), key="k1")
    other = post(client, "hr-delete-user", webhook_body(args={"email": "someone@acme.example"}), key="k1")
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"


def test_it_answers_412_when_hr_changed_the_user_since_the_action(client, ashu):
    after = ashu.snapshot()
    HrUser.objects.filter(pk=ashu.pk).update(manager="Jon Ives")
    response = post(client, "hr-delete-user", webhook_body(args={"email": ashu.email}, after_snapshot=after))
    assert response.status_code == 412
    assert HrUser.objects.filter(email=ashu.email).exists()


def test_a_restore_puts_the_ticket_back_unless_a_person_changed_it(client, db):
    CrmTicket.objects.create(id="T-1", subject="Outage", company="Acme Corp", priority="high", status="open")
    before = CrmTicket.objects.get(pk="T-1").snapshot()
    CrmTicket.objects.filter(pk="T-1").update(priority="low")
    after = CrmTicket.objects.get(pk="T-1").snapshot()
    CrmTicket.objects.create(id="T-2", subject="Export", company="Hooli", priority="high", status="open")
    before2 = CrmTicket.objects.get(pk="T-2").snapshot()
    CrmTicket.objects.filter(pk="T-2").update(priority="low")
    after2 = CrmTicket.objects.get(pk="T-2").snapshot()
    # Priya escalates T-2 by hand after the agent lowered it.
    CrmTicket.objects.filter(pk="T-2").update(priority="urgent", updated_by="Priya")

    restored = post(
        client,
        "crm-restore-ticket",
        webhook_body(target_id="T-1", before_snapshot=before, after_snapshot=after),
    )
    drifted = post(
        client,
        "crm-restore-ticket",
        webhook_body(target_id="T-2", before_snapshot=before2, after_snapshot=after2),
    )

    assert restored.status_code == 200 and CrmTicket.objects.get(pk="T-1").priority == "high"
    assert drifted.status_code == 412 and CrmTicket.objects.get(pk="T-2").priority == "urgent"
    repeat = post(
        client,
        "crm-restore-ticket",
        webhook_body(target_id="T-1", before_snapshot=before, after_snapshot=after),
    )
    assert repeat.status_code == 409


def test_a_refund_compensates_a_charge_found_through_the_after_snapshot(client, db):
    charge = post(client, "payments-charges", {"customer": "Hooli", "amount_cents": 5000}, key="fwd-1")
    assert charge.status_code == 201
    payment_id = charge.json()["state"]["payment_id"]

    refund = post(client, "payments-refund", webhook_body(after_snapshot=charge.json()["state"]), key="stp-1")
    again = post(client, "payments-refund", webhook_body(after_snapshot=charge.json()["state"]), key="stp-2")

    assert refund.status_code == 201 and refund.json()["state"]["status"] == "refunded"
    assert again.status_code == 409
    payment = Payment.objects.get(pk=payment_id)
    assert payment.refunded_cents == 5000 and payment.refunds.count() == 1


def test_a_forward_call_repeated_with_its_key_acts_once(client, db):
    body = {"to": "dana@acme.example", "subject": "Hello", "body": "Hi"}
    first = post(client, "email-messages", body, key="fwd-email")
    second = post(client, "email-messages", body, key="fwd-email")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert OutboxEmail.objects.count() == 1


def test_a_malformed_address_is_refused_by_the_email_gateway(client, db):
    response = post(client, "email-messages", {"to": "ashu@@gmail.com", "subject": "Welcome", "body": "Hi"})
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_recipient"
    assert OutboxEmail.objects.count() == 0


def test_a_correction_follows_a_sent_email_once(client, db):
    sent = post(
        client, "email-messages", {"to": "dana@acme.example", "subject": "Your refund", "body": "Done"}
    )
    message = sent.json()["state"]
    first = post(client, "email-send-correction", webhook_body(after_snapshot=message))
    second = post(client, "email-send-correction", webhook_body(after_snapshot=message))
    assert first.status_code == 201 and first.json()["state"]["subject"] == "Correction: Your refund"
    assert second.status_code == 409


def test_the_python_license_compensator_cancels_once_and_then_reports_done(ashu):
    fields = {"args": {"email": ashu.email}, "target_id": ashu.email, "after_snapshot": None}
    state = compensators.cancel_license(**fields, idempotency_key="stp-lic")
    assert state["state"]["status"] == "cancelled"
    assert WorkspaceLicense.objects.get(email=ashu.email).status == "cancelled"
    # A different step (new key) finds it cancelled: already compensated is done, not an error.
    assert compensators.cancel_license(**fields, idempotency_key="stp-lic-2") == {"state": None}


def test_the_python_contact_compensator_reports_drift_and_permanent_failure(db):
    from demo.models import CrmContact

    contact = CrmContact.objects.create(
        id="C-1", name="Dana", email="dana@acme.example", company="Acme", tier="standard"
    )
    before = contact.snapshot()
    CrmContact.objects.filter(pk="C-1").update(tier="enterprise")
    after = CrmContact.objects.get(pk="C-1").snapshot()
    CrmContact.objects.filter(pk="C-1").update(tier="growth")  # someone else changed it since

    with pytest.raises(CompensationDrifted):
        compensators.restore_contact(
            target_id="C-1", before_snapshot=before, after_snapshot=after, idempotency_key="stp-c1"
        )
    with pytest.raises(CompensationFailed):
        compensators.restore_contact(
            target_id="C-404", before_snapshot=before, after_snapshot=after, idempotency_key="stp-c404"
        )
    assert CrmContact.objects.get(pk="C-1").tier == "growth"


def test_bad_input_from_a_caller_is_a_422_not_a_500(client, db):
    CrmTicket.objects.create(id="T-1", subject="Outage", company="Acme Corp")
    bad_date = post(client, "hr-users", {"email": "x@acme.example", "name": "X", "start_date": "next monday"})
    bad_value = post(client, "crm-ticket", {"changes": {"status": {"nested": True}}}, ticket_id="T-1")
    bad_type = post(client, "payments-charges", {"customer": "Hooli", "amount_cents": True})
    assert [r.status_code for r in (bad_date, bad_value, bad_type)] == [422, 422, 422]
    assert not HrUser.objects.exists() and CrmTicket.objects.get(pk="T-1").status == "open"
