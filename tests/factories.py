"""Every data builder of the suite, in one place.

Ledgers are built through the real services (never by writing state fields), except
``force_status``, which exists to put a row in a state the services would refuse. Sections:
policies; runs and actions; the onboarding saga of the design notes; the reliability sagas; runs
and actions through the agent API.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Compensator, Event, PolicySet, Run, Tenant, ToolPolicy
from ledger.policies.load import LoadReport, policy_file_load, policy_file_parse
from ledger.services import checkpoints, runs
from ledger.services.actions import moves, recording
from recovery.actions.approvals import action_record_gated
from recovery.actions.reports import action_fail_and_queue, run_fail_and_queue
from recovery.models import Approval, RecoveryItem
from tests.support.api import Api
from tests.support.processes import WebhookServer

# The compensating services' webhooks: the onboarding tools' (recovery) and the reliability
# tools' (``rel.undo``, and the agent's resume URL).
HR_PATH = "/hr/delete_user"
HR_SECRET = "hr-secret"
WS_PATH = "/workspace/cancel_license"
WS_SECRET = "ws-secret"
UNDO_PATH = "/undo"
UNDO_SECRET = "undo-secret"
RESUME_PATH = "/resume"
RESUME_SECRET = "resume-secret"

_keys = itertools.count(1)


# --- Policies ------------------------------------------------------------------------------------


def load_onboarding_policies(
    *,
    license_risk: str = "medium",
    license_approval: str = "auto",
    webhooks: WebhookServer | None = None,
    auto_compensate: str | None = None,
) -> list[ToolPolicy]:
    """The onboarding scenario's global policies: creating the HR user and provisioning the
    licence run without approval and can be undone, each by the compensating tool its policy
    names; the welcome e-mail is irreversible but auto-approved; the compensating tools have
    explicit, automatic, low-risk policies of their own (a compensating tool without one would be
    governed by the default policy and wait for a human); CRM updates restore a snapshot (the
    ``crm.update_*`` glob also governs their ``….restore`` tools); money needs a human.

    ``license_risk``/``license_approval`` make undoing the licence need an approval;
    ``webhooks`` registers the two compensating tools as signed webhooks on that server;
    ``auto_compensate`` is the highest risk compensated without a human (never, by default).
    Idempotent: a builder may load them again before every run it makes."""
    rows = [
        # tool, risk, approval, action class, compensation, compensating tool
        ("hr.create_user", "medium", "auto", "internal_update", "custom", "hr.delete_user"),
        (
            "workspace.provision_license",
            license_risk,
            license_approval,
            "external_reversible",
            "custom",
            "workspace.cancel_license",
        ),
        ("email.send_welcome", "low", "auto", "external_irreversible", "none", ""),
        ("hr.delete_user", "low", "auto", "internal_update", "none", ""),
        ("workspace.cancel_license", "low", "auto", "internal_update", "none", ""),
        ("crm.update_*", "low", "auto", "internal_update", "snapshot", ""),
        ("payments.charge", "critical", "manual", "external_irreversible", "correction", ""),
        ("payments.refund", "high", "manual", "external_irreversible", "none", ""),
    ]
    policies = [
        ToolPolicy.objects.update_or_create(
            tenant=None,
            tool=tool,
            defaults={
                "risk": risk,
                "approval": approval,
                "action_class": action_class,
                "compensation": compensation,
                "compensation_tool": compensation_tool,
                "compensation_args": None,
                "source": "tests",
            },
        )[0]
        for tool, risk, approval, action_class, compensation, compensation_tool in rows
    ]
    if webhooks is not None:
        for tool, path, secret in (
            ("hr.delete_user", HR_PATH, HR_SECRET),
            ("workspace.cancel_license", WS_PATH, WS_SECRET),
        ):
            Compensator.objects.update_or_create(
                tenant=None,
                tool=tool,
                defaults={"kind": "webhook", "url": webhooks.url(path), "secret": secret},
            )
    PolicySet.objects.update_or_create(
        tenant=None,
        defaults={
            "default_policy": {},
            "unwind": {"on_compensation_failure": "alert_and_continue", "max_attempts": 5},
            "auto_compensate": {"max_risk": auto_compensate},
            "source": "tests",
        },
    )
    return policies


def load_reliability_policies(
    *, hooks: WebhookServer | None = None, max_attempts: int = 10, python_undo: str = ""
) -> None:
    """``rel.do_*`` tools are low-risk and undone by ``rel.undo`` (their policy names it; the
    webhook on ``hooks``, or a Python compensator when ``python_undo`` names one), whose own policy
    is low-risk and automatic."""
    ToolPolicy.objects.create(
        tool="rel.do_*",
        risk="low",
        approval="auto",
        action_class="external_reversible",
        compensation="custom",
        compensation_tool="rel.undo",
    )
    ToolPolicy.objects.create(
        tool="rel.undo", risk="low", approval="auto", action_class="internal_update", compensation="none"
    )
    if python_undo:
        Compensator.objects.create(tool="rel.undo", kind="python", python_path=python_undo)
    elif hooks is not None:
        Compensator.objects.create(
            tool="rel.undo", kind="webhook", url=hooks.url(UNDO_PATH), secret=UNDO_SECRET
        )
    PolicySet.objects.create(
        tenant=None,
        default_policy={},
        auto_compensate={},
        unwind={"on_compensation_failure": "alert_and_continue", "max_attempts": max_attempts},
    )


def auto_policy(
    tool: str = "hr.*", *, tenant: Tenant | None = None, action_class: str = "internal_update", **fields: Any
) -> ToolPolicy:
    """A low-risk, auto-approved policy, so actions can start without an approval."""
    values = {
        "risk": "low",
        "approval": "auto",
        "action_class": action_class,
        "compensation": "custom",
        **fields,
    }
    return ToolPolicy.objects.create(tenant=tenant, tool=tool, **values)


def load_policy_file(data: dict[str, Any], *, tenant: Tenant | None = None) -> LoadReport:
    """Load a policy file's content through the loader (validated as ``load_policies`` does)."""
    document = policy_file_parse(data, source="tests.json")
    return policy_file_load(
        document=document, source="tests.json", tenant=tenant, actor=Actor.system("tests")
    )


def charge_policy(
    *, rules: list[Any] | None = None, limits: list[Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """``payments.charge``: medium risk, no approval, irreversible, with these rules and limits."""
    return {
        "tool": "payments.charge",
        "risk": "medium",
        "approval": "auto",
        "action_class": "external_irreversible",
        "compensation": "none",
        **({"rules": rules} if rules is not None else {}),
        **({"limits": limits} if limits is not None else {}),
        **fields,
    }


# --- People and their keys -----------------------------------------------------------------------


def member(tenant: Tenant, username: str, role: str = "approver") -> Any:
    """The user ``username`` with ``role`` in ``tenant`` (created, or given that role there)."""
    from django.contrib.auth import get_user_model

    from ledger.models import Membership

    user, _ = get_user_model().objects.get_or_create(username=username)
    Membership.objects.update_or_create(user=user, tenant=tenant, defaults={"role": role})
    return user


def issue_key(tenant: Tenant, name: str, *scopes: str, owner: Any = None) -> tuple[Any, str]:
    """A key of ``scopes`` (default: agent) issued through the ledger, as (AgentKey, secret). An
    approver key belongs to a person: without ``owner``, a person of its own,
    ``<name>-owner``, an approver of ``tenant`` (so keys of different names are different people)."""
    from ledger.services.keys import agent_key_create

    scope_list = list(scopes) or ["agent"]
    if owner is None and "approver" in scope_list:
        owner = member(tenant, f"{name}-owner")
    issued = agent_key_create(
        tenant=tenant, name=name, scopes=scope_list, actor=Actor.system("tests"), owner=owner
    )
    return issued.key, issued.secret


# --- Runs and actions ----------------------------------------------------------------------------


def make_run(tenant: Tenant, actor: Actor, **fields: Any) -> Run:
    return runs.run_create(
        tenant=tenant, actor=actor, agent="onboarding", request="Onboard Ashu Kumar", **fields
    )


def record(run: Run, actor: Actor, key: str, *, tool: str = "hr.create_user", **fields: Any) -> Action:
    """An action recorded by the ledger alone (no approval gate): planned, or awaiting approval."""
    fields.setdefault("args", {"email": f"{key}@company.com"})
    return recording.action_record(run=run, actor=actor, tool=tool, idempotency_key=key, **fields).action


def perform_action(
    run: Run,
    agent: Actor,
    tool: str,
    *,
    target_id: str,
    args: dict[str, Any],
    target_type: str = "user",
    compensation: Any = None,
    before: Any = None,
    after: Any = None,
    result: Any = None,
    reasoning: str = "",
    fail: str = "",
    unknown: bool = False,
) -> Action:
    """An action recorded through the approval gate and started, then succeeded (with ``result``,
    ``{"ok": True}`` unless given), failed with ``fail``, or failed with an unknown outcome."""
    action = action_record_gated(
        run=run,
        actor=agent,
        tool=tool,
        idempotency_key=f"{run.pk}-{tool}-{next(_keys)}",
        target_type=target_type,
        target_id=target_id,
        args=args,
        intent={"reasoning": reasoning or f"Step: {tool}", "confidence": 0.87},
        before_snapshot=before,
        compensation=compensation,
    ).action
    moves.action_start(action=action, actor=agent)
    if fail or unknown:
        action_fail_and_queue(
            action=action,
            actor=agent,
            error=fail or "timed out",
            retryable=True,
            layer="tool",
            outcome_unknown=unknown,
        )
    else:
        moves.action_succeed(
            action=action,
            actor=agent,
            result={"ok": True} if result is None else result,
            after_snapshot=after,
        )
    action.refresh_from_db()
    return action


def force_status(obj: Action | Run, status: str) -> Action | Run:
    """Test setup only: put a row straight into ``status`` (bypassing the services) so that every
    refused transition can be tried from every state."""
    type(obj).objects.filter(pk=obj.pk).update(status=status)
    obj.refresh_from_db()
    return obj


@contextlib.contextmanager
def refused(
    obj: Action | Run, *, current: str, error: type[errors.SagaError] = errors.InvalidTransition
) -> Iterator[None]:
    """Expect the block to raise ``error`` naming ``current``, and to change nothing: the row is
    identical and no audit event was written."""
    model = type(obj)
    before = model.objects.filter(pk=obj.pk).values().get()
    events_before = Event.objects.count()
    with pytest.raises(error) as excinfo:
        yield
    if isinstance(excinfo.value, errors.InvalidTransition):
        assert excinfo.value.current == current
        assert excinfo.value.details["current"] == current
    assert excinfo.value.details.get("current", current) == current
    assert model.objects.filter(pk=obj.pk).values().get() == before
    assert Event.objects.count() == events_before


# --- The onboarding saga of the design notes -------------------------------------------------------


@dataclass
class OnboardingSaga:
    run: Run
    create_user: Action
    provision_license: Action
    send_welcome: Action
    item: RecoveryItem | None = None


def onboarding_saga(
    tenant: Tenant,
    agent: Actor,
    *,
    name: str = "Ashu Kumar",
    email: str = "ashu@company.com",
    extra_actions: int = 0,
    fail_run: bool = True,
) -> OnboardingSaga:
    """hr.create_user and workspace.provision_license succeed (a checkpoint between them),
    ``extra_actions`` CRM updates follow, and email.send_welcome fails (step 3); with
    ``fail_run`` the run fails into the recovery queue. Loads no policies: the caller loads the
    variant of ``load_onboarding_policies`` it needs first."""
    run = runs.run_create(
        tenant=tenant,
        actor=agent,
        agent="onboarding-agent",
        request=f"Onboard new hire {name} ({email})",
        external_id=f"hire-{email}",
        user_id="hr-portal",
        goal="Account, licence and welcome mail",
        trace_url="https://traces.example.com/t/123",
    )
    create_user = perform_action(
        run,
        agent,
        "hr.create_user",
        target_id=email,
        args={"name": name, "email": email},
        compensation={"tool": "hr.delete_user", "args": {"email": email}},
        after={"email": email, "status": "active"},
        reasoning="The HR ticket asks for an account first.",
    )
    checkpoints.checkpoint_write(
        run=run,
        actor=agent,
        name="account-created",
        state={"step": 1, "email": email},
        recovery_instructions="Resume at licence provisioning.",
    )
    provision_license = perform_action(
        run,
        agent,
        "workspace.provision_license",
        target_id=email,
        args={"sku": "business-standard"},
        compensation={"tool": "workspace.cancel_license", "args": {"email": email}},
        before={"license": None},
        after={"license": "business-standard"},
        reasoning="A paid licence is needed for mail.",
    )
    for i in range(extra_actions):
        perform_action(
            run,
            agent,
            f"crm.update_contact_{i}",
            target_id=f"contact-{i}",
            args={"field": "owner", "value": i},
            before={"owner": "nobody", "stage": "lead"},
            after={"owner": i, "stage": "lead"},
        )
    send_welcome = perform_action(
        run,
        agent,
        "email.send_welcome",
        target_id=email,
        args={"template": "welcome"},
        fail="429 rate limited by mail gateway",
    )
    saga = OnboardingSaga(
        run=run, create_user=create_user, provision_license=provision_license, send_welcome=send_welcome
    )
    if fail_run:
        outcome = run_fail_and_queue(
            run=run, actor=agent, error="email gateway rate-limited", failed_action=send_welcome
        )
        saga.item = outcome.item
        run.refresh_from_db()
    return saga


def onboarding_run(tenant: Tenant, agent: Actor, **options: Any) -> tuple[Run, RecoveryItem]:
    """The onboarding saga with the default policies loaded, failed into the recovery queue:
    (run, its open item), as the queue shows it. ``options`` are ``onboarding_saga``'s."""
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent, **options)
    assert saga.item is not None
    return saga.run, saga.item


def gated_run(tenant: Tenant, agent: Actor, *, amount: int = 40) -> tuple[Run, Action, Approval]:
    """A run whose refund waits in the approval inbox: (run, action, approval)."""
    load_onboarding_policies()
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="support-agent", request=f"Refund order 7 ({amount} EUR)"
    )
    action = action_record_gated(
        run=run,
        actor=agent,
        tool="payments.refund",
        idempotency_key=f"refund-{next(_keys)}",
        target_type="order",
        target_id="order-7",
        args={"amount": amount, "currency": "EUR"},
        intent={"reasoning": "Customer was double charged.", "confidence": 0.91},
        before_snapshot={"refunded": 0},
    ).action
    return run, action, action.approvals.get()


# --- Reliability sagas ---------------------------------------------------------------------------


@dataclass
class FailedSaga:
    run: Run
    actions: list[Action]
    item: RecoveryItem


def failed_saga(tenant: Tenant, agent: Actor, *, steps: int = 3, resume_url: str = "") -> FailedSaga:
    """A run whose ``steps`` ``rel.do_<n>`` actions succeeded, each undone by ``rel.undo``, then
    failed into the recovery queue (``load_reliability_policies`` first)."""
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="reliability", request="change the world", resume_url=resume_url
    )
    done = [
        perform_action(
            run,
            agent,
            f"rel.do_{n}",
            target_type="thing",
            target_id=f"thing-{n}",
            args={"n": n},
            compensation={"tool": "rel.undo", "args": {"n": n}},
            after={"n": n},
            result={"ok": n},
        )
        for n in range(1, steps + 1)
    ]
    outcome = run_fail_and_queue(run=run, actor=agent, error="step failed")
    assert outcome.item is not None
    run.refresh_from_db()
    return FailedSaga(run=run, actions=done, item=outcome.item)


# --- Through the agent API -----------------------------------------------------------------------


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


# --- Before-images and what an undo read back ----------------------------------------------------

CONTACT_IMAGE_POLICIES: dict[str, Any] = {
    "policies": [
        {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"},
        {
            "tool": "crm.update_contact",
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
            "compensation_tool": "crm.update_contact",
            "compensation_args": {"id": "$args.id", "email": "$before.email", "phone": "$before.phone"},
        },
    ],
    "readers": {"crm.get_contact": {"python": "crm.readers.get_contact"}},
}


def imaged_undo(
    tenant: Tenant,
    agent: Actor,
    *,
    before: Any,
    after: Any,
    step_status: str = "",
    verified: bool | None = None,
    read_checks: dict[str, Any] | None = None,
    error: str = "",
    run: Run | None = None,
) -> tuple[Run, Action, Any]:
    """A ``crm.update_contact`` whose policy takes images, recorded with ``before`` and succeeded
    with ``after`` (the contact images); with ``step_status``, an undo step of a finished unwind in
    that state, with ``verified``, ``read_checks`` and ``error`` as the worker would leave them
    (written directly: the reads themselves are the worker's)."""
    from recovery.models import Unwind, UnwindStep

    load_policy_file(CONTACT_IMAGE_POLICIES, tenant=tenant)
    run = run or runs.run_create(
        tenant=tenant, actor=agent, agent="crm-agent", request="Update Bea's contact details"
    )
    action = perform_action(
        run, agent, "crm.update_contact", target_id="c-7", args={"id": "c-7"}, before=before, after=after
    )
    if not step_status:
        return run, action, None
    unwind = Unwind.objects.create(
        tenant=tenant, run=run, reason="undo the update", status=Unwind.Status.FAILED
    )
    step = UnwindStep.objects.create(
        unwind=unwind,
        action=action,
        position=0,
        tool=action.compensation_tool,
        args=action.compensation_args,
        strategy=action.compensation_strategy,
        status=step_status,
        idempotency_key=f"step-{action.pk}",
        verified=verified,
        read_checks=read_checks,
        error=error,
        attempts=1,
    )
    return run, action, step
