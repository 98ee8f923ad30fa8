"""Demo agents: small harnesses that do real work in the demo world and record it in Saga Admin
with the Python client, exactly as an agent author would. They only speak HTTP (the Saga Admin
API and the demo world's endpoints); what people do meanwhile (approving, editing a ticket by
hand, clicking Compensate) lives in ``demo.people``.

Each ``Scenario`` is one story. Most succeed; the failing ones each end in the recovery queue in
one of the ways the design knows (``expected_reason``).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any, cast

import httpx
from saga_client import ApprovalPending, ApprovalRejected, Run, Saga, SagaError
from saga_client.responses import RunDetailDict
from saga_client.signing import signed_headers

# --- The demo world, as the agents' tools see it ----------------------------------------------


class WorldError(Exception):
    """A demo-world system refused a call. ``retryable`` tells the Saga client whether a retry
    could help (it records it on the failed action)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retryable = status >= 500 or status == 429


TENANT_HEADER = "X-Demo-Tenant"


class World:
    """The demo world's HTTP API. Every call is signed with the world's secret, and writes carry
    an Idempotency-Key so a retried tool call cannot act twice."""

    def __init__(
        self,
        base_url: str,
        secret: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/demo-world", timeout=timeout, transport=transport
        )
        self._secret = secret

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        key: str = "",
        tenant: str = "",
    ) -> dict[str, Any]:
        raw = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", **signed_headers(self._secret, raw)}
        if key:
            headers["Idempotency-Key"] = key
        if tenant:
            # Whose agent this is: the world files what it creates under that tenant, and shows
            # each person only their tenants' rows.
            headers[TENANT_HEADER] = tenant
        response = self._http.request(method, path, content=raw, headers=headers)
        try:
            data = response.json() if response.content else {}
        except ValueError:
            data = {}
        if response.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            raise WorldError(
                response.status_code,
                error.get("code", "http_error"),
                error.get("message", response.text[:300]),
            )
        return data

    def state(self, path: str) -> dict[str, Any]:
        return self.call("GET", path)["state"]


def world_step(
    run: Run,
    world: World,
    tool: str,
    *,
    path: str,
    target: tuple[str, str],
    args: dict[str, Any],
    body: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    compensate: tuple[str, dict[str, Any]] | None = None,
    before: Any = None,
    intent: dict[str, Any] | None = None,
    wait: bool = True,
    tenant: str = "acme",
) -> dict[str, Any]:
    """One recorded tool call against the demo world, by an agent of ``tenant``. The world call
    reuses the action's idempotency key, so a replayed step and a retried HTTP call both land once.
    ``wait=False``: a step that needs approval raises ``ApprovalPending`` instead of waiting for
    the decision."""
    key = run.step_key(tool, target, args)
    return run.step(
        tool,
        target=target,
        args=args,
        compensate=compensate,
        before=before,
        intent=intent,
        idempotency_key=key,
        do=lambda effective: world.call(
            "POST", path, body(effective) if body else effective, key=f"fwd:{key}", tenant=tenant
        ),
        after=lambda result: result.get("state") if isinstance(result, dict) else None,
        wait=wait,
    )


def open_run(saga: Saga, **fields: Any) -> Run:
    """Create the run now. For stories that end without completing or failing it themselves (a
    verification the server turns into a failure, an agent that dies mid-run), where the
    context manager's automatic complete/fail on exit would be wrong."""
    return saga.run(**fields).open()


# --- The harness ------------------------------------------------------------------------------


@dataclass
class Demo:
    """What a scenario needs: a Saga client per tenant, the world, and the people."""

    base_url: str
    keys: dict[str, str]  # tenant slug → agent API key
    world: World
    people: Any  # demo.people module (or a stand-in with the same functions)
    poll_interval_s: float = 0.5
    _clients: dict[str, Saga] = field(default_factory=dict)

    def saga(self, tenant: str = "acme") -> Saga:
        if tenant not in self._clients:
            saga = Saga(
                self.base_url, self.keys[tenant], poll_interval_s=self.poll_interval_s, approval_timeout_s=120
            )
            # The read the policies' ``before`` names for hr.update_title, registered once: the
            # client takes every such step's before- and after-image through it, so the agents'
            # steps carry no image code (demo.readers.get_user is the worker's side of the read).
            saga.reader("hr.get_user")(self._get_user)
            self._clients[tenant] = saga
        return self._clients[tenant]

    def _get_user(self, email: str) -> dict[str, Any]:
        """hr.get_user, as the agents read it: ``{"user": <the HR record>}``."""
        return {"user": self.world.state(f"/hr/users/{email}")}

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self.world.close()

    def run_exists(self, tenant: str, external_id: str) -> bool:
        return any(True for _ in self.saga(tenant).list_runs(external_id=external_id))


@contextmanager
def expected_failure(*kinds: type[BaseException]) -> Iterator[None]:
    """The story fails on purpose; the run is already in the recovery queue when we get here."""
    with suppress(*kinds):
        yield


@dataclass(frozen=True)
class Scenario:
    slug: str
    tenant: str
    agent: str
    title: str
    play: Callable[[Demo, str], None]
    # The recovery item this story leaves open (None: it leaves none).
    expected_reason: str | None = None
    # Stories that only settle once the worker has compensated something.
    needs_worker: bool = False


# --- Onboarding -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hire:
    name: str
    email: str
    personal_email: str
    department: str
    title: str
    manager: str
    sku: str = "business-standard"
    start_date: str = "2025-02-03"

    @property
    def first_name(self) -> str:
        return self.name.split()[0]


def onboard(demo: Demo, external_id: str, hire: Hire, *, tenant: str = "acme", company: str = "Acme") -> None:
    """The onboarding saga from the background article: HR record, paid licence, welcome email."""
    saga = demo.saga(tenant)
    with saga.run(
        agent="onboarding-agent",
        request=f"Onboard new hire {hire.name} ({hire.email})",
        external_id=external_id,
        user_id="hr-portal",
        goal="New hire can log in on day one",
        metadata={"demo": True, "department": hire.department, "company": company},
    ) as run:
        onboarding_steps(demo, run, hire, company=company, tenant=tenant)


def onboarding_steps(demo: Demo, run: Run, hire: Hire, *, company: str, tenant: str = "acme") -> None:
    """The saga's steps. On a resumed run the steps that already succeeded replay their recorded
    results (same idempotency keys) and only what is left runs."""
    world_step(
        run,
        demo.world,
        "hr.create_user",
        tenant=tenant,
        path="/hr/users",
        target=("user", hire.email),
        args={
            "email": hire.email,
            "name": hire.name,
            "department": hire.department,
            "title": hire.title,
            "manager": hire.manager,
            "start_date": hire.start_date,
        },
        compensate=("hr.delete_user", {"email": hire.email}),
        intent={
            "reasoning": f"{hire.name} signed the offer; HR needs a record before anything else.",
            "confidence": 0.97,
        },
    )
    world_step(
        run,
        demo.world,
        "workspace.provision_license",
        tenant=tenant,
        path="/workspace/licenses",
        target=("user", hire.email),
        args={"email": hire.email, "sku": hire.sku},
        intent={"reasoning": f"{hire.department} staff get {hire.sku}.", "confidence": 0.9},
    )
    run.checkpoint(
        "accounts-ready",
        state={"email": hire.email, "next": "welcome email"},
        summary=f"{hire.name} has an HR record and a {hire.sku} licence; the welcome email is next.",
        recovery_instructions="Resume sends only the welcome email (the first two steps replay). "
        "Compensate deletes the HR record and cancels the licence.",
    )
    world_step(
        run,
        demo.world,
        "email.send_welcome",
        tenant=tenant,
        path="/email/messages",
        target=("email", hire.personal_email),
        args={
            "to": hire.personal_email,
            "subject": f"Welcome to {company}, {hire.first_name}!",
            "body": f"Hi {hire.first_name}, your account {hire.email} is ready. "
            f"Your manager {hire.manager} will meet you on {hire.start_date}.",
        },
        intent={
            "reasoning": "Send the welcome message to the personal address from the offer letter.",
            "confidence": 0.74,
        },
    )


HIRES = {
    "ashu": Hire(
        "Ashu Kumar",
        "ashu@acme.example",
        "ashu.kumar@@gmail.com",
        "Engineering",
        "Backend engineer",
        "Jon Ives",
    ),
    "maya": Hire(
        "Maya Chen",
        "maya.chen@acme.example",
        "maya.chen@fastmail.example",
        "Design",
        "Product designer",
        "Jon Ives",
    ),
    "omar": Hire(
        "Omar Haddad",
        "omar.haddad@acme.example",
        "omar.h@proton.example",
        "Sales",
        "Account executive",
        "Jon Ives",
        sku="business-starter",
    ),
    "lena": Hire(
        "Lena Vogel",
        "lena.vogel@acme.example",
        "lena.vogel@posteo.example",
        "Finance",
        "Controller",
        "Jon Ives",
        sku="business-plus",
    ),
    "kofi": Hire(
        "Kofi Mensah",
        "kofi.mensah@globex.example",
        "kofi.mensah@mail.example",
        "Support",
        "Support engineer",
        "Tom Becker",
    ),
}


def _onboard_ok(key: str, tenant: str = "acme", company: str = "Acme") -> Callable[[Demo, str], None]:
    return lambda demo, external_id: onboard(demo, external_id, HIRES[key], tenant=tenant, company=company)


def _hire_from_run(run: Mapping[str, Any]) -> Hire | None:
    """Rebuild the hire from what the run recorded (the harness's only memory after a restart)."""
    actions = {a["tool"]: a for a in run.get("actions", [])}
    user, license_, welcome = (
        actions.get(t) for t in ("hr.create_user", "workspace.provision_license", "email.send_welcome")
    )
    if not (user and license_ and welcome):
        return None
    args = user["args"]
    return Hire(
        args["name"],
        args["email"],
        welcome["args"]["to"],
        args["department"],
        args["title"],
        args["manager"],
        sku=license_["args"]["sku"],
        start_date=args["start_date"],
    )


def onboarding_resume(demo: Demo, run_id: str, command: Mapping[str, Any]) -> str:
    """An operator chose Resume: re-read the offer letter (the personal address had a doubled @)
    and carry on. The HR record and the licence replay; only the welcome email is sent."""
    saga = demo.saga("acme")
    run = saga.attach(run_id)
    saga.ack_command(command["id"])
    hire = _hire_from_run(run.run)
    if hire is None:
        run.complete("Resumed, but the run never reached the welcome email; nothing left to do here.")
        return f"resumed {run_id}: nothing left to do"
    fixed = replace(hire, personal_email=re.sub("@+", "@", hire.personal_email))
    company = (run.run.get("metadata") or {}).get("company", "Acme")
    with expected_failure(WorldError), run:
        onboarding_steps(demo, run, fixed, company=company)
    return f"resumed {run_id}: welcome email to {fixed.personal_email}"


def onboard_failing_welcome(demo: Demo, external_id: str) -> None:
    """The model copied the personal address with a doubled @: the email gateway refuses it after
    the HR record and the paid licence already exist."""
    with expected_failure(WorldError):
        onboard(demo, external_id, HIRES["ashu"])


# --- CRM --------------------------------------------------------------------------------------


def ticket_update(
    demo: Demo,
    run: Run,
    ticket_id: str,
    changes: dict[str, Any],
    *,
    reasoning: str,
    confidence: float = 0.85,
) -> dict[str, Any]:
    return world_step(
        run,
        demo.world,
        "crm.update_ticket",
        path=f"/crm/tickets/{ticket_id}",
        target=("ticket", ticket_id),
        args={"ticket_id": ticket_id, "changes": changes},
        body=lambda effective: {"changes": effective["changes"], "by": run.run.get("agent") or "agent"},
        before=lambda: demo.world.state(f"/crm/tickets/{ticket_id}"),
        intent={"reasoning": reasoning, "confidence": confidence},
    )


def crm_priority_bump(
    demo: Demo, external_id: str, *, ticket_id: str = "T-1011", company: str = "Hooli", priority: str = "high"
) -> None:
    """Raise a ticket's priority and check the change landed on the right customer."""
    saga = demo.saga("acme")
    with saga.run(
        agent="crm-agent",
        request=f"Raise the priority of {company}'s ticket {ticket_id} to {priority}",
        external_id=external_id,
        metadata={"demo": True},
    ) as run:
        result = ticket_update(
            demo,
            run,
            ticket_id,
            {"priority": priority},
            reasoning=f"{company} reported a blocker on {ticket_id}.",
        )
        state = result["state"]
        saga.verify_action(
            run.actions[-1]["id"],
            ok=state["company"] == company and state["priority"] == priority,
            expected={"ticket_id": ticket_id, "company": company, "priority": priority},
            actual={
                "ticket_id": state["ticket_id"],
                "company": state["company"],
                "priority": state["priority"],
            },
        )


def crm_wrong_record(demo: Demo, external_id: str) -> None:
    """Asked to escalate Acme's T-1042, the model transposed the digits and updated Initech's
    T-1024. The agent's own check after the write catches it."""
    saga = demo.saga("acme")
    run = open_run(
        saga,
        agent="crm-agent",
        request="Acme Corp's production outage: raise ticket T-1042 to urgent",
        external_id=external_id,
        metadata={"demo": True},
    )
    result = ticket_update(
        demo,
        run,
        "T-1024",
        {"priority": "urgent"},
        reasoning="The customer's outage ticket is T-1024.",
        confidence=0.62,
    )
    state = result["state"]
    saga.verify_action(
        run.actions[-1]["id"],
        ok=False,
        expected={"ticket_id": "T-1042", "company": "Acme Corp"},
        actual={"ticket_id": state["ticket_id"], "company": state["company"]},
        reason=f"Updated {state['ticket_id']} ({state['company']}) instead of T-1042 (Acme Corp): "
        "wrong record id.",
    )


def ticket_triage_drift(demo: Demo, external_id: str) -> None:
    """The agent lowers a stale ticket's priority; minutes later the support lead escalates the
    same ticket by hand. When the run then fails, the automatic undo must not overwrite her."""
    saga = demo.saga("acme")
    with (
        expected_failure(WorldError),
        saga.run(
            agent="triage-agent",
            request="Lower the priority of tickets idle for 30 days (T-1007, T-1099)",
            external_id=external_id,
            metadata={"demo": True},
        ) as run,
    ):
        ticket_update(demo, run, "T-1007", {"priority": "low"}, reasoning="No customer reply for 34 days.")
        demo.people.person_edits_ticket(
            ticket_id="T-1007",
            by="Priya Raman (support lead)",
            changes={"priority": "urgent", "status": "escalated"},
        )
        ticket_update(demo, run, "T-1099", {"priority": "low"}, reasoning="No customer reply for 41 days.")


def contact_tiers_sync(demo: Demo, external_id: str, *, die_after: int | None = None) -> None:
    """Copy customer tiers from billing into the CRM. With ``die_after`` the agent's process is
    killed mid-run: no failure report, just silence, and the heartbeat goes stale."""
    changes = [("C-203", "enterprise"), ("C-205", "growth"), ("C-202", "growth")]
    saga = demo.saga("acme")
    run = open_run(
        saga,
        agent="crm-sync-agent",
        request="Sync customer tiers from billing into the CRM",
        external_id=external_id,
        metadata={"demo": True, "contacts": len(changes)},
    )
    for done, (contact_id, tier) in enumerate(changes, start=1):
        world_step(
            run,
            demo.world,
            "crm.update_contact",
            path=f"/crm/contacts/{contact_id}",
            target=("contact", contact_id),
            args={"contact_id": contact_id, "changes": {"tier": tier}},
            body=lambda effective: {"changes": effective["changes"]},
            before=lambda contact_id=contact_id: demo.world.state(f"/crm/contacts/{contact_id}"),
            intent={"reasoning": f"Billing lists {contact_id} on the {tier} plan.", "confidence": 0.93},
        )
        run.heartbeat(f"{done}/{len(changes)} contacts synced")
        if die_after is not None and done == die_after:
            return  # the process died here (OOM-killed): nothing more is ever reported
    run.complete(f"{len(changes)} contact tiers synced from billing.")


# --- HR titles --------------------------------------------------------------------------------

NOAH, GRACE, PRIYA = "noah.kim@acme.example", "grace.obi@acme.example", "priya.raman@acme.example"


def title_update(demo: Demo, run: Run, email: str, title: str, *, reasoning: str) -> dict[str, Any]:
    """hr.update_title: an update, undone exactly by the same tool with the title it replaced. The
    policy reads the record before (``hr.get_user``, its ``before``); the client takes that
    before-image through the reader registered on it (``Demo.saga``): no image code here."""
    return world_step(
        run,
        demo.world,
        "hr.update_title",
        path=f"/hr/users/{email}/title",
        target=("user", email),
        args={"email": email, "title": title},
        body=lambda effective: {"title": effective["title"]},
        intent={"reasoning": reasoning, "confidence": 0.9},
    )


def reorg_titles_undone(demo: Demo, external_id: str) -> None:
    """Apply the reorg's title changes from HR's spreadsheet. Noah's lands; Grace's cell was blank
    and HR refuses a blank title, so the run fails. Everything it did is low risk: Saga Admin undoes
    it by itself, putting Noah's title back to exactly what it was and reading it back to prove it."""
    saga = demo.saga("acme")
    with (
        expected_failure(WorldError),
        saga.run(
            agent="hr-agent",
            request="Apply the reorg's title changes: Noah Kim to Engineering manager, Grace Obi's from the sheet",
            external_id=external_id,
            metadata={"demo": True},
        ) as run,
    ):
        title_update(demo, run, NOAH, "Engineering manager", reasoning="Noah leads the platform team now.")
        title_update(demo, run, GRACE, "", reasoning="Grace's row in the sheet (its title cell is empty).")


def title_drift(demo: Demo, external_id: str) -> None:
    """The agent retitles Priya; minutes later the COO corrects her title by hand in the HR system.
    When the run then fails, the automatic undo finds her record no longer as the agent left it
    and refuses: the COO's title stays, and the run waits in the queue as drifted."""
    saga = demo.saga("acme")
    with (
        expected_failure(WorldError),
        saga.run(
            agent="hr-agent",
            request="Support reorg: Priya Raman to Support manager, Grace Obi to Senior support engineer",
            external_id=external_id,
            metadata={"demo": True},
        ) as run,
    ):
        title_update(demo, run, PRIYA, "Support manager", reasoning="Priya runs the support team now.")
        demo.people.person_edits_hr_record(
            email=PRIYA, by="Jon Ives (COO)", changes={"title": "Head of Customer Support"}
        )
        title_update(
            demo,
            run,
            GRACE,
            "Senior support engineer\nReports to: Priya Raman",
            reasoning="Grace's new title, as the reorg memo words it.",
        )


# --- Email ------------------------------------------------------------------------------------


def support_reply(demo: Demo, external_id: str, *, bad_priority: bool = False) -> None:
    """Draft a reply and flag the ticket. With ``bad_priority`` the model invents a priority the
    CRM does not have; everything the run did is low risk, so Saga Admin undoes it by itself."""
    saga = demo.saga("acme")
    context = expected_failure(WorldError) if bad_priority else _nothing()
    with (
        context,
        saga.run(
            agent="support-reply-agent",
            request="Reply to Dana about the API outage (T-1042)",
            external_id=external_id,
            metadata={"demo": True},
        ) as run,
    ):
        world_step(
            run,
            demo.world,
            "email.create_draft",
            path="/email/drafts",
            target=("email", "dana@acme.example"),
            args={
                "to": "dana@acme.example",
                "subject": "Re: Production outage",
                "body": "Hi Dana, we found the cause of the 503s and a fix is rolling out now.",
            },
            intent={"reasoning": "A human agent reviews drafts before they go out.", "confidence": 0.88},
        )
        ticket_update(
            demo,
            run,
            "T-1042",
            {"priority": "P1" if bad_priority else "high"},
            reasoning="Outage tickets are top priority.",
            confidence=0.7,
        )


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# --- Payments ---------------------------------------------------------------------------------


def refund_pivot_too_early(demo: Demo, external_id: str) -> None:
    """Fix a double charge: the agent re-bills the corrected amount first (the irreversible pivot)
    and only then updates the ticket and tries the refund, which the processor refuses. Saga
    Admin flags the order: compensatable steps belong before the pivot."""
    saga = demo.saga("acme")
    with (
        expected_failure(WorldError),
        saga.run(
            agent="billing-agent",
            request="Hooli was charged twice for INV-7781: refund the duplicate and re-bill "
            "the corrected amount ($1,199.00)",
            external_id=external_id,
            metadata={"demo": True},
        ) as run,
    ):
        approver = demo.people.approve_when_asked(
            run_id=run.id, username="bob", reason="Corrected amount matches the amended invoice."
        )
        try:
            world_step(
                run,
                demo.world,
                "payments.charge",
                path="/payments/charges",
                target=("invoice", "INV-7781"),
                args={
                    "customer": "Hooli",
                    "amount_cents": 119_900,
                    "currency": "USD",
                    "description": "INV-7781 (corrected amount)",
                },
                intent={
                    "reasoning": "Bill the corrected amount, then refund the duplicate.",
                    "confidence": 0.8,
                },
            )
        finally:
            approver.join(timeout=30)
        ticket_update(
            demo,
            run,
            "T-1063",
            {"status": "refund_pending"},
            reasoning="Tell support the refund is under way.",
        )
        world_step(
            run,
            demo.world,
            "payments.refund",
            path="/payments/refunds",
            target=("payment", "pay_inv7781_b"),
            args={"payment_id": "pay_inv7781_b", "reason": "Duplicate charge for INV-7781"},
            intent={"reasoning": "pay_inv7781_b is the duplicate.", "confidence": 0.9},
        )


def refund_done_right(demo: Demo, external_id: str) -> None:
    """The same kind of fix in saga order: the reversible ticket update first, the irreversible
    refund last."""
    saga = demo.saga("acme")
    with saga.run(
        agent="billing-agent",
        request="Umbrella Health overpaid INV-7702 by $90: refund the difference",
        external_id=external_id,
        metadata={"demo": True},
    ) as run:
        ticket_update(demo, run, "T-1007", {"assignee": "Billing"}, reasoning="Billing owns refunds.")
        world_step(
            run,
            demo.world,
            "payments.refund",
            path="/payments/refunds",
            target=("payment", "pay_inv7702"),
            args={"payment_id": "pay_inv7702", "amount_cents": 9_000, "reason": "Overpayment on INV-7702"},
            intent={"reasoning": "Refund exactly the overpaid amount.", "confidence": 0.95},
        )


VENDOR_PAYMENT = {
    "customer": "Northwind Logistics",
    "amount_cents": 4_820_000,
    "currency": "USD",
    "description": "Invoice NW-2231, freight Q4",
}


def vendor_payment_requested(demo: Demo, external_id: str) -> None:
    """A large vendor payment: policy says a person approves it first. The agent records the
    charge, parks the run at a checkpoint and waits (``tend_waiting_runs`` picks it up)."""
    saga = demo.saga("acme")
    run = open_run(
        saga,
        agent="ap-agent",
        request="Pay Northwind Logistics invoice NW-2231 ($48,200.00)",
        external_id=external_id,
        metadata={"demo": True},
    )
    try:
        world_step(
            run,
            demo.world,
            "payments.charge",
            path="/payments/charges",
            target=("invoice", "NW-2231"),
            args=dict(VENDOR_PAYMENT),
            intent={"reasoning": "Invoice is due in 3 days and matches PO-5512.", "confidence": 0.91},
            wait=False,
        )
    except ApprovalPending as pending:
        run.checkpoint(
            "awaiting-payment-approval",
            state={"invoice": "NW-2231"},
            pending_action_ids=[pending.action_id],
            completed_action_ids=[],
            requires_user_approval=True,
            summary="Waiting for an approver to release the $48,200.00 payment.",
        )
        return
    run.complete("Northwind Logistics paid without waiting for an approval.")


def vendor_payment_continue(demo: Demo, run_id: str) -> str:
    """One look at a parked vendor payment: heartbeat; when decided, pay (or stand down) and
    finish the run. Returns the run's state as the agent sees it."""
    saga = demo.saga("acme")
    run = saga.attach(run_id)
    run.heartbeat("waiting for payment approval")
    attached = cast(RunDetailDict, run.run)  # attach loads the run with its actions (GET /runs/{id})
    if not any(a["tool"] == "payments.charge" for a in attached.get("actions", [])):
        return str(run.run["status"])
    # The same step again (the same idempotency key): it runs once approved.
    try:
        world_step(
            run,
            demo.world,
            "payments.charge",
            path="/payments/charges",
            target=("invoice", "NW-2231"),
            args=dict(VENDOR_PAYMENT),
            wait=False,
        )
    except ApprovalPending:
        return "waiting"
    except ApprovalRejected:
        run.complete("The approver rejected the payment; nothing was charged.")
        return "succeeded"
    run.complete("Northwind Logistics paid after approval.")
    return "succeeded"


# --- The seed ---------------------------------------------------------------------------------

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("onboard-maya", "acme", "onboarding-agent", "Onboarding that went fine", _onboard_ok("maya")),
    Scenario("onboard-omar", "acme", "onboarding-agent", "Onboarding that went fine", _onboard_ok("omar")),
    Scenario("crm-bump-t1011", "acme", "crm-agent", "CRM priority change, verified", crm_priority_bump),
    Scenario("refund-inv7702", "acme", "billing-agent", "Refund in saga order", refund_done_right),
    Scenario("support-reply", "acme", "support-reply-agent", "Draft reply", support_reply),
    Scenario(
        "onboard-kofi",
        "globex",
        "onboarding-agent",
        "Onboarding at another tenant",
        _onboard_ok("kofi", tenant="globex", company="Globex"),
    ),
    Scenario("onboard-lena", "acme", "onboarding-agent", "Onboarding that went fine", _onboard_ok("lena")),
    # The failures, one per way a run lands in the queue.
    Scenario(
        "onboard-ashu",
        "acme",
        "onboarding-agent",
        "Onboarding fails at the welcome email",
        onboard_failing_welcome,
        expected_reason="failed",
    ),
    Scenario(
        "crm-wrong-record",
        "acme",
        "crm-agent",
        "Wrong record id caught by verification",
        crm_wrong_record,
        expected_reason="verification_failed",
    ),
    Scenario(
        "refund-pivot",
        "acme",
        "billing-agent",
        "Irreversible charge too early (pivot warning)",
        refund_pivot_too_early,
        expected_reason="failed",
    ),
    Scenario(
        "contact-sync-lost",
        "acme",
        "crm-sync-agent",
        "Agent died mid-run (stale heartbeat)",
        lambda demo, ext: contact_tiers_sync(demo, ext, die_after=2),
        expected_reason="agent_lost",
    ),
    Scenario(
        "ticket-triage-drift",
        "acme",
        "triage-agent",
        "Undo blocked: a person changed the ticket",
        ticket_triage_drift,
        expected_reason="state_drift",
        needs_worker=True,
    ),
    Scenario(
        "support-reply-auto",
        "acme",
        "support-reply-agent",
        "Low-risk failure undone automatically",
        lambda demo, ext: support_reply(demo, ext, bad_priority=True),
        needs_worker=True,
    ),
    Scenario("vendor-payment", "acme", "ap-agent", "Payment waiting for approval", vendor_payment_requested),
    Scenario(
        "reorg-titles",
        "acme",
        "hr-agent",
        "Title change undone exactly and verified",
        reorg_titles_undone,
        needs_worker=True,
    ),
    Scenario(
        "title-drift",
        "acme",
        "hr-agent",
        "Undo refused: the COO changed the title by hand",
        title_drift,
        expected_reason="state_drift",
        needs_worker=True,
    ),
)


def external_id_for(scenario: Scenario) -> str:
    return f"demo:{scenario.slug}"


@dataclass
class SeedReport:
    played: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def seed(demo: Demo, *, log: Callable[[str], None] = print) -> SeedReport:
    """Play every scenario whose run does not exist yet (by external id): seeding twice adds
    nothing."""
    report = SeedReport()
    for scenario in SCENARIOS:
        external_id = external_id_for(scenario)
        if demo.run_exists(scenario.tenant, external_id):
            report.skipped.append(scenario.slug)
            continue
        scenario.play(demo, external_id)
        report.played.append(scenario.slug)
        log(f"  {scenario.tenant}/{scenario.agent}: {scenario.title}")
    return report


# --- Live traffic (--continuous) --------------------------------------------------------------

FIRST = [
    "Ada",
    "Ben",
    "Chloe",
    "Diego",
    "Elif",
    "Farah",
    "Gus",
    "Hana",
    "Ivan",
    "Jade",
    "Kai",
    "Lior",
    "Mia",
    "Nico",
    "Olu",
    "Pia",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
    "Uma",
    "Vik",
    "Wen",
    "Yara",
    "Zed",
]
LAST = [
    "Adams",
    "Brandt",
    "Costa",
    "Dubois",
    "Eze",
    "Fischer",
    "Garcia",
    "Huang",
    "Ito",
    "Jensen",
    "Khan",
    "Larsen",
    "Moreau",
    "Novak",
    "Okafor",
    "Park",
    "Quist",
    "Rossi",
    "Singh",
    "Tan",
]
DEPARTMENTS = [
    ("Engineering", "Software engineer"),
    ("Design", "Designer"),
    ("Sales", "Account executive"),
    ("Support", "Support engineer"),
    ("Finance", "Analyst"),
]


def _random_hire(rng: random.Random, *, broken_email: bool) -> Hire:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    suffix = uuid.uuid4().hex[:4]
    email = f"{first}.{last}.{suffix}@acme.example".lower()
    personal = f"{first}.{last}@@mail.example" if broken_email else f"{first}.{last}.{suffix}@mail.example"
    department, title = rng.choice(DEPARTMENTS)
    return Hire(
        f"{first} {last}",
        email,
        personal.lower(),
        department,
        title,
        "Jon Ives",
        sku=rng.choice(["business-starter", "business-standard", "business-plus"]),
    )


def live_scenario(demo: Demo, rng: random.Random) -> str:
    """One run of background traffic: mostly healthy work, now and then a failure."""
    external_id = f"live:{uuid.uuid4().hex[:12]}"
    roll = rng.random()
    if roll < 0.45:
        hire = _random_hire(rng, broken_email=False)
        onboard(demo, external_id, hire)
        return f"onboarded {hire.name}"
    if roll < 0.65:
        ticket_id, company = rng.choice(
            [("T-1011", "Hooli"), ("T-1050", "Globex Ltd"), ("T-1007", "Umbrella Health")]
        )
        crm_priority_bump(
            demo, external_id, ticket_id=ticket_id, company=company, priority=rng.choice(["normal", "high"])
        )
        return f"re-prioritised {ticket_id}"
    if roll < 0.80:
        support_reply(demo, external_id)
        return "drafted a support reply"
    if roll < 0.92:
        hire = _random_hire(rng, broken_email=True)
        with expected_failure(WorldError):
            onboard(demo, external_id, hire)
        return f"onboarding of {hire.name} failed at the welcome email"
    crm_wrong_record(demo, external_id)
    return "updated the wrong ticket (verification failed)"


def tend_waiting_runs(demo: Demo) -> list[str]:
    """Keep parked vendor payments alive (heartbeat) and carry them out once decided; carry on
    with onboarding runs an operator resumed."""
    notes = []
    saga = demo.saga("acme")
    for run in saga.list_runs(agent="onboarding-agent", status="running"):
        for command in saga.commands(run["id"]):
            if command["kind"] == "resume":
                notes.append(onboarding_resume(demo, run["id"], command))
                break
    for run in demo.saga("acme").list_runs(agent="ap-agent", status="running"):
        state = vendor_payment_continue(demo, run["id"])
        if state != "waiting":
            notes.append(f"vendor payment {run['id']}: {state}")
    return notes


def continuous(
    demo: Demo,
    *,
    every_s: float = 20.0,
    stop: threading.Event | None = None,
    log: Callable[[str], None] = print,
    seed_value: int | None = None,
) -> None:
    """Produce a run every ``every_s`` seconds and tend waiting runs every few seconds, until
    ``stop`` is set (or forever)."""
    rng = random.Random(seed_value)  # noqa: S311 - demo traffic, not security
    stop = stop or threading.Event()
    next_run = time.monotonic()
    while not stop.is_set():
        try:
            for note in tend_waiting_runs(demo):
                log(note)
            if time.monotonic() >= next_run:
                log(live_scenario(demo, rng))
                next_run = time.monotonic() + every_s
        except (httpx.HTTPError, SagaError, WorldError, OSError) as exc:
            # A live demo outlives a restarting web process: report, wait, carry on.
            log(f"demo traffic: {type(exc).__name__}: {exc}")
        stop.wait(5.0)
