"""Everything ``seed_demo`` puts in place before the demo agents run: tenants, the demo policy
files, dashboard logins for each role, the agents' API keys, and what the demo world's systems
already held before any agent touched them. Every function is idempotent: a second call finds
its work done and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from demo.models import AgentCredential, CrmContact, CrmTicket, HrUser, Payment, WorkspaceLicense
from ledger import staff, upstreams
from ledger.audit import Actor
from ledger.models import AgentKey, Membership, Tenant
from ledger.policies.load import LoadReport, policy_file_load, policy_file_parse, policy_file_read
from ledger.services import keys
from recovery import compensator_checks
from recovery.actions import channels
from recovery.models import NotificationChannel

POLICY_DIR = Path(__file__).resolve().parent / "policies"
# The origin the policy files are written for (make run's default port). seed_demo rewrites it to
# the server's real URL, since the webhook compensators must reach the demo world where it runs.
POLICY_FILE_ORIGIN = "http://127.0.0.1:8000"
# The URL the policy file's MCP compensators (the people.* tools) are written for: the demo MCP
# server's default address. make run picks a free port for that server and hands its URL to
# seed_demo (SAGA_DEMO_MCP_URL), which rewrites this one to it.
MCP_FILE_URL = "http://127.0.0.1:8765/mcp"

SEEDER = Actor.system("seed_demo")

TENANTS = {"acme": "Acme Corp", "globex": "Globex Ltd"}

# One login per role, named like the test personas. A demo password for a demo: `make run` is a
# local playground, and the README says so.
DEMO_PASSWORD = "saga-demo-pass"


@dataclass(frozen=True)
class DemoLogin:
    username: str
    role: str
    tenant: str
    what: str
    also: tuple[str, ...] = ()  # further tenants the login is a member of, with the same role

    @property
    def tenants(self) -> str:
        return ", ".join((self.tenant, *self.also))


LOGINS = (
    DemoLogin(
        "admin", "admin", "acme", "everything, incl. the Django admin and RQ dashboards", also=("globex",)
    ),
    DemoLogin("alice", "operator", "acme", "resumes, compensates and closes runs in the recovery queue"),
    DemoLogin("bob", "approver", "acme", "approves or rejects risky actions and compensations"),
    DemoLogin("carol", "viewer", "acme", "can look, not touch"),
    DemoLogin("mallory", "operator", "globex", "an operator at another tenant: sees none of Acme's runs"),
)

# Which key each demo agent uses: (tenant, key name, scopes). The demo's agents share one agent
# name per tenant, so each reaches every demo run of its tenant; the supervisor is recovery
# automation (it reads every run, writes none). The demo's approver is a person: bob, in the inbox.
# make run's saga-mcp gateway is an agent of its own (its runs are the MCP sessions through it).
AGENT_KEYS = {
    "acme-agents": ("acme", "demo-agents", ["agent"]),
    "acme-mcp-gateway": ("acme", "demo-mcp-gateway", ["agent"]),
    "acme-supervisor": ("acme", "demo-supervisor", ["operator"]),
    "globex-agents": ("globex", "demo-agents", ["agent"]),
}


# --- Policies --------------------------------------------------------------------------------


def _rewrite_origin(value: Any, origin: str, mcp_url: str) -> Any:
    if isinstance(value, str) and value == MCP_FILE_URL:
        return mcp_url
    if isinstance(value, str) and value.startswith(POLICY_FILE_ORIGIN + "/"):
        return origin.rstrip("/") + value[len(POLICY_FILE_ORIGIN) :]
    if isinstance(value, dict):
        return {key: _rewrite_origin(item, origin, mcp_url) for key, item in value.items()}
    if isinstance(value, list):
        return [_rewrite_origin(item, origin, mcp_url) for item in value]
    return value


def policies_load_demo(*, base_url: str, mcp_url: str = "") -> list[LoadReport]:
    """The native-layout file is the global policy set; the agentSafety one is Acme's own (its CRM
    tools), layered on top, so both layouts are in force at once.

    The MCP demo's policies (the ``people.*`` tools of make run's gateway, undone by MCP
    compensators) are part of the global file rather than a third one: a policy file is the whole
    truth for its scope, so a file of their own loaded for Acme would remove Acme's CRM policies.
    ``mcp_url`` is where the demo MCP server answers (default: the address the file names)."""
    reports = []
    for name, tenant_slug in (("native.json", None), ("agent_safety.json", "acme")):
        path = POLICY_DIR / name
        data = _rewrite_origin(policy_file_read(path), base_url, mcp_url or MCP_FILE_URL)
        document = policy_file_parse(data, source=f"demo/policies/{name}")
        tenant = Tenant.objects.get(slug=tenant_slug) if tenant_slug else None
        reports.append(
            policy_file_load(document=document, source=f"demo/policies/{name}", tenant=tenant, actor=SEEDER)
        )
    return reports


# --- Tenants, logins, keys -------------------------------------------------------------------


def tenants_ensure() -> dict[str, Tenant]:
    return {slug: keys.tenant_get_or_create(slug=slug, name=name) for slug, name in TENANTS.items()}


def logins_ensure(tenants: dict[str, Tenant]) -> None:
    """Create the demo logins that are missing. An existing one is left alone: its password may
    have been changed on purpose, and hashing five passwords on every start costs seconds."""
    user_model = get_user_model()
    for login in LOGINS:
        user = user_model.objects.filter(username=login.username).first()
        if (
            user is None
            or not Membership.objects.filter(
                user=user, tenant=tenants[login.tenant], role=login.role
            ).exists()
        ):
            user = staff.staff_set(
                username=login.username,
                password=DEMO_PASSWORD,
                tenant=tenants[login.tenant],
                role=login.role,
                actor=SEEDER,
                email=f"{login.username}@demo.saga.local",
            ).user
        if login.username == "admin":
            # The one login that sees every demo tenant and every admin page (RQ's included).
            for slug in login.also:
                staff.membership_set(user=user, tenant=tenants[slug], role="admin", actor=SEEDER)
            if not user.is_superuser:
                user.is_superuser = True
                user.is_staff = True
                user.save(update_fields=["is_superuser", "is_staff"])


@transaction.atomic
def agent_secret(name: str) -> str:
    """The API key of one demo agent, minting it (through the ledger, like create_agent_key) only
    when the harness has none or its key was revoked."""
    tenant_slug, key_name, scopes = AGENT_KEYS[name]
    stored = (
        AgentCredential.objects.select_for_update().filter(tenant_slug=tenant_slug, name=key_name).first()
    )
    if stored is not None and AgentKey.objects.filter(pk=stored.key_id, revoked_at__isnull=True).exists():
        return stored.secret
    tenant = keys.tenant_get_or_create(slug=tenant_slug, name=TENANTS.get(tenant_slug, ""))
    issued = keys.agent_key_create(tenant=tenant, name=key_name, scopes=scopes, actor=SEEDER)
    AgentCredential.objects.update_or_create(
        tenant_slug=tenant_slug, name=key_name, defaults={"key_id": issued.key.pk, "secret": issued.secret}
    )
    return issued.secret


# --- The world before the agents -------------------------------------------------------------

CONTACTS = [
    ("C-201", "Dana Whitfield", "dana@acme.example", "Acme Corp", "standard", "Sam"),
    ("C-202", "Luis Ortega", "luis@initech.example", "Initech", "standard", "Sam"),
    ("C-203", "Mei Tanaka", "mei@umbrella.example", "Umbrella Health", "growth", "Ravi"),
    ("C-204", "Tom Becker", "tom@globex.example", "Globex Ltd", "enterprise", "Ravi"),
    ("C-205", "Ana Souza", "ana@hooli.example", "Hooli", "standard", "Sam"),
]
TICKETS = [
    ("T-1007", "Invoices show the wrong VAT rate", "Umbrella Health", "C-203", "high", "open", "Ravi"),
    ("T-1011", "Cannot export reports to CSV", "Hooli", "C-205", "normal", "open", "Sam"),
    ("T-1024", "Password reset email arrives late", "Initech", "C-202", "low", "open", "Sam"),
    ("T-1042", "Production outage: API returns 503", "Acme Corp", "C-201", "high", "open", "Ravi"),
    ("T-1050", "Request for an annual plan quote", "Globex Ltd", "C-204", "normal", "open", "Sam"),
    ("T-1063", "Duplicate charge on invoice INV-7781", "Hooli", "C-205", "normal", "open", "Sam"),
]
EMPLOYEES = [
    ("priya.raman@acme.example", "Priya Raman", "Support", "Support lead", "Jon Ives"),
    ("jon.ives@acme.example", "Jon Ives", "Operations", "COO", ""),
    ("noah.kim@acme.example", "Noah Kim", "Engineering", "Senior engineer", "Jon Ives"),
    ("grace.obi@acme.example", "Grace Obi", "Support", "Support engineer", "Priya Raman"),
]
PAYMENTS = [
    # The customer was charged twice for INV-7781 and filed a chargeback on the duplicate.
    ("pay_inv7781_a", "Hooli", 129_900, "Invoice INV-7781", False),
    ("pay_inv7781_b", "Hooli", 129_900, "Invoice INV-7781 (duplicate)", True),
    ("pay_inv7702", "Umbrella Health", 54_000, "Invoice INV-7702", False),
]


# Whose the seeded world is (its employees, customers, tickets and payments): Acme's.
WORLD_OWNER = "acme"


@transaction.atomic
def world_seed() -> None:
    """What the demo world's systems held before the agents started (get-or-create, so a person's
    later edits in the world survive a second seed)."""
    for cid, name, email, company, tier, owner in CONTACTS:
        CrmContact.objects.get_or_create(
            id=cid,
            defaults={
                "name": name,
                "email": email,
                "company": company,
                "tier": tier,
                "owner": owner,
                "tenant_slug": WORLD_OWNER,
            },
        )
    for tid, subject, company, contact, priority, status, assignee in TICKETS:
        CrmTicket.objects.get_or_create(
            id=tid,
            defaults={
                "subject": subject,
                "company": company,
                "contact_id": contact,
                "priority": priority,
                "status": status,
                "assignee": assignee,
                "updated_by": "seed",
                "tenant_slug": WORLD_OWNER,
            },
        )
    for email, name, department, title, manager in EMPLOYEES:
        _, created = HrUser.objects.get_or_create(
            email=email,
            defaults={
                "name": name,
                "department": department,
                "title": title,
                "manager": manager,
                "start_date": date(2023, 3, 1),
                "tenant_slug": WORLD_OWNER,
            },
        )
        if created:
            WorkspaceLicense.objects.create(
                email=email, sku="business-standard", monthly_cost_cents=1400, tenant_slug=WORLD_OWNER
            )
    for pid, customer, amount, description, disputed in PAYMENTS:
        Payment.objects.get_or_create(
            id=pid,
            defaults={
                "customer": customer,
                "amount_cents": amount,
                "description": description,
                "disputed": disputed,
                "tenant_slug": WORLD_OWNER,
            },
        )


# Acme's on-call address: under `make run` the console e-mail backend prints each notification to
# the worker's log (.data/logs/worker.log).
DEMO_ONCALL = "oncall@acme.demo.saga.local"


# Bob, Acme's approver: his approval e-mails carry his own Approve and Reject links
# (recovery.notifications.email_links), printed in the worker's log like the on-call's.
DEMO_APPROVERS = "bob@demo.saga.local"
APPROVAL_EVENTS = ["approval.requested", "approval.reminder", "approval.escalated"]


def notification_channels_ensure(tenants: dict[str, Tenant]) -> None:
    """Acme's on-call e-mail channel (every event, any risk) and its approvers' (approvals only)."""
    if not NotificationChannel.objects.filter(tenant=tenants["acme"], name="On-call e-mail").exists():
        channels.channel_create(
            tenant=tenants["acme"], actor=SEEDER, name="On-call e-mail", kind="email", target=DEMO_ONCALL
        )
    if not NotificationChannel.objects.filter(tenant=tenants["acme"], name="Approvers' e-mail").exists():
        channels.channel_create(
            tenant=tenants["acme"],
            actor=SEEDER,
            name="Approvers' e-mail",
            kind="email",
            target=DEMO_APPROVERS,
            events=APPROVAL_EVENTS,
        )


@dataclass(frozen=True)
class DemoSetup:
    tenants: dict[str, Tenant]
    policy_reports: list[LoadReport]


def demo_setup(*, base_url: str, mcp_url: str = "") -> DemoSetup:
    tenants = tenants_ensure()
    reports = policies_load_demo(base_url=base_url, mcp_url=mcp_url)
    logins_ensure(tenants)
    for name in AGENT_KEYS:
        agent_secret(name)
    world_seed()
    notification_channels_ensure(tenants)
    return DemoSetup(tenants=tenants, policy_reports=reports)


def compensators_check() -> str:
    """Check the demo's own compensators, once they can answer (the web, its demo world and the
    demo MCP server are up: the seeding step), with the protocol's harmless cases
    (``recovery.compensator_checks``): each one in force for a demo tenant that has no passing
    check where it points now. A first playground then shows none "never checked"; a later start
    checks only what is new or failed. Returns what it did, in a sentence."""
    checked, passed, failed = 0, 0, []
    for tenant in Tenant.objects.filter(slug__in=list(TENANTS)).order_by("slug"):
        rows = upstreams.compensators_in_force(tenant_id=tenant.pk)
        latest = compensator_checks.latest_checks(tenant=tenant, rows=rows)
        for row in rows:
            if (done := latest.get(row.tool)) is not None and done.ok:
                continue
            check = compensator_checks.compensator_check(tenant=tenant, actor=SEEDER, user=None, row=row)
            checked += 1
            if check.ok:
                passed += 1
            else:
                failed.append(f"{tenant.slug}/{row.tool}")
    if not checked:
        return "all checked already."
    said = f"{checked} checked, {passed} passed"
    return f"{said}; failed: {', '.join(failed)} (see the Policies page)." if failed else f"{said}."


def policy_summary(reports: list[LoadReport]) -> str:
    return "; ".join(f"{r.source} → {r.scope} ({r.summary()})" for r in reports)


def logins_table() -> str:
    width = max(len(login.username) for login in LOGINS)
    tenants = max(len(login.tenants) for login in LOGINS)
    lines = [
        f"  {'login'.ljust(width)}  password         role      {'tenants'.ljust(tenants)}  what they can do"
    ]
    for login in LOGINS:
        lines.append(
            f"  {login.username.ljust(width)}  {DEMO_PASSWORD}   {login.role.ljust(8)}  "
            f"{login.tenants.ljust(tenants)}  {login.what}"
        )
    return "\n".join(lines)
