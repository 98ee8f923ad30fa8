"""Tool names follow one documented rule (ledger.tool_names) on every path that takes one: the
action record (the tool and an agent-named compensating tool), pauses' tool patterns, and the
policy file (tool globs, compensators, compensation_tool, an MCP compensator's tool). A name with
a line break once made it into an e-mail subject and failed the notification job on every retry."""

from __future__ import annotations

import django_rq
import pytest
from django.core import mail
from rq import SimpleWorker

from infra import errors
from ledger.models import Action, Event, Pause, ToolPolicy
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policy_file_parse
from ledger.services import runs
from ledger.services.actions import recording
from recovery.actions.approvals import action_record_gated
from recovery.models import Notification
from recovery.notifications.outbox import notify_approval_requested
from tests.factories import new_run
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db

# What an attacker (or a buggy agent) sends: header injection, control characters, look-alikes.
BAD_NAMES = [
    "hr.create_user\r",
    "hr.create_user\r\nBcc: everyone@company.com",
    "hr.create_user\n",
    "hr.create_user\t",
    "hr.create_user\x1b[31m",
    "hr create_user",
    "hr.create_user\u2028",
    "hr.create_usеr",  # a Cyrillic "е"
    "hr.create_user\u200b",  # a zero-width space
]
# Names in use (docs, demo, tests, MCP gateways with and without a namespace) keep working.
GOOD_NAMES = [
    "hr.create_user",
    "people.create_user",
    "create_user",
    "github/repos.delete",
    "server:tool",
    "DATA_EXPORT_v2",
    "user-profile.update",
    "x" * 200,
]


@pytest.fixture
def api(agent_key) -> Api:
    return Api(agent_key[1])


@pytest.fixture
def operator(operator_key) -> Api:
    return Api(operator_key[1])


@pytest.fixture
def run(api, onboarding_policies) -> dict:
    return new_run(api)


def _refused_field(response) -> str:
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert error["code"] == "invalid_request", error
    (field,) = {e["field"] for e in error["details"]["errors"]}
    return field


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_action_with_a_bad_tool_name_is_refused_naming_the_field(api, run, name):
    """Pass: 422 invalid_request naming ``tool``, and nothing is recorded or audited."""
    events = Event.objects.count()
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": name, "args": {}, "idempotency_key": "bad-name"},
    )
    assert _refused_field(response) == "tool"
    assert not Action.objects.exists() and Event.objects.count() == events


@pytest.mark.parametrize("name", ["hr.delete_user\r\nBcc: x@y.z", "hr.delete_user "])
def test_an_agent_named_compensating_tool_with_a_bad_name_is_refused(api, run, name):
    response = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "args": {"email": "ashu@company.com"},
            "idempotency_key": "bad-compensation",
            "compensation": {"tool": name, "args": {}},
        },
    )
    assert _refused_field(response) == "compensation.tool"
    assert not Action.objects.exists()


def test_the_rule_is_the_documented_charset_and_length(api, run):
    """Pass: the names in use (docs, demo, MCP gateways with and without a namespace, 200
    characters) are recorded; one character past the charset or the length is refused."""
    for number, name in enumerate(GOOD_NAMES):
        response = api.post(
            f"/runs/{run['id']}/actions", {"tool": name, "args": {}, "idempotency_key": f"k{number}"}
        )
        assert response.status_code == 201, (name, response.content)
        assert response.json()["tool"] == name
    for name in ("x" * 201, "", "hr.create_user!", "hr.create_user*", "hr.(create)", "hr.create_user\u00e9"):
        response = api.post(
            f"/runs/{run['id']}/actions", {"tool": name, "args": {}, "idempotency_key": "k-bad"}
        )
        assert _refused_field(response) == "tool", name
    assert Action.objects.count() == len(GOOD_NAMES)


def test_a_pause_with_a_bad_tool_pattern_is_refused_naming_the_field(operator):
    """Pass: a pattern with a control character or a space inside is refused (422 naming ``tool``,
    no pause written; whitespace around it is trimmed, as the dashboard's form always did); globs
    of the rule's characters still pause."""
    for pattern in ("payments.*\r\nBcc: x", "pay\rments.*", "payments *", "payments.\x1b*", "pay\u2028*"):
        response = operator.post("/pauses", {"tool": pattern, "reason": "INC-42"})
        assert _refused_field(response) == "tool", pattern
    assert not Pause.objects.exists()
    for pattern in ("payments.*", "crm.update_?", "hr.[!d]*", "github/repos.*", "*"):
        response = operator.post("/pauses", {"tool": pattern, "reason": "INC-42"})
        assert response.status_code == 201, (pattern, response.content)


def test_the_record_service_holds_every_other_path_to_the_same_rule(tenant, agent):
    """Pass: a caller that skips the API's schema (a job, the dashboard, a test) gets the same
    refusal from the service, for the tool and for the compensating tool, and nothing is written."""
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu")
    with pytest.raises(errors.ValidationFailed) as refused:
        recording.action_record(run=run, actor=agent, tool="payments.charge\r", idempotency_key="s-1")
    assert refused.value.details["errors"][0]["field"] == "tool"
    with pytest.raises(errors.ValidationFailed) as refused:
        recording.action_record(
            run=run,
            actor=agent,
            tool="hr.create_user",
            idempotency_key="s-2",
            compensation={"tool": "hr.delete_user\n", "args": {}},
        )
    assert refused.value.details["errors"][0]["field"] == "compensation.tool"
    assert not Action.objects.exists()


def _policy(**fields):
    return {
        "tool": "hr.create_user",
        "risk": "low",
        "approval": "auto",
        "action_class": "internal_update",
        **fields,
    }


@pytest.mark.parametrize(
    "document",
    [
        # "$" in a Python regex also matches before a final newline: these once loaded.
        {"policies": [_policy(tool="crm.update_*\n")]},
        {"policies": [_policy(tool="hr.create_user\n")]},
        {"policies": [_policy(compensation="custom", compensation_tool="hr.delete_user\n")]},
        {"compensators": {"hr.delete_user\n": {"python": "some.module.undo"}}},
        {"compensators": {"hr.delete_user": {"mcp": "https://hr.example.com/mcp", "tool": "delete_user\n"}}},
    ],
)
def test_the_policy_file_refuses_tool_names_outside_the_rule(document):
    with pytest.raises(PolicyFileError):
        policy_file_parse(document, source="test.json")


def _work_notifications() -> None:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def test_an_approval_mail_for_a_name_written_before_the_rule_is_still_sent(
    settings, tenant, agent, django_capture_on_commit_callbacks
):
    """Pass: an approval whose tool name carries "\\r\\n" (a row written before the rule) is mailed
    by a real RQ job: one message, a subject without control characters, the row delivered. Before,
    the mail library refused the header (BadHeaderError) and the job failed on every retry."""
    settings.SAGA = {**settings.SAGA, "NOTIFY_EMAILS": ["oncall@acme.test"], "NOTIFY_WEBHOOKS": []}
    queue = django_rq.get_queue("notifications")
    queue.empty()
    ToolPolicy.objects.create(
        tool="payments.charge", risk="critical", approval="manual", action_class="external_irreversible"
    )
    run = runs.run_create(tenant=tenant, actor=agent, agent="billing", request="Pay invoice 7")
    action = action_record_gated(
        run=run, actor=agent, tool="payments.charge", idempotency_key="pay-7", args={"amount": 1}
    ).action
    approval = action.approvals.get()
    # As stored before tool names had a rule (the API and the services refuse it now).
    type(approval).objects.filter(pk=approval.pk).update(tool="payments.charge\r\nBcc: everyone@company.com")
    approval.refresh_from_db()
    Notification.objects.all().delete()
    mail.outbox.clear()

    with django_capture_on_commit_callbacks(execute=True):
        notify_approval_requested(approval)
    _work_notifications()

    (row,) = Notification.objects.all()
    assert row.status == Notification.Status.DELIVERED, row.last_error
    (message,) = mail.outbox
    assert "payments.charge" in message.subject
    assert not any(ch in message.subject for ch in "\r\n\x00")
    # The text stayed inside the subject: no header of its own, no extra recipient.
    assert message.message()["Bcc"] is None and message.recipients() == ["oncall@acme.test"]
    queue.empty()
