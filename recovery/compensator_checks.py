"""Checking a registered compensator from the dashboard, safely: only the compensator protocol's
harmless cases, which never send a validly signed call, so they cannot undo anything.

The cases are the specification's (``clients/spec/compensator-cases.json``: the webhook cases
marked ``harmless``, with the same ids, titles and expected answers; a test holds the two equal)
run by the server's own code, as the webhook signature has one specification and two
implementations: the server installs without the client.

- webhook: ``tls`` (HTTPS with a certificate that verifies; advisory), ``reachable`` (answers HTTP
  to an unsigned ``{}``), ``unsigned_refused`` and ``wrong_signature_refused`` (a step-shaped body
  without a signature, then signed with a random secret: 401 or 403). Calls go through the worker's
  own webhook client (no redirects followed, the step timeout), and what the compensator answered
  is never echoed beyond its status: the check must not read the inside of another system for
  whoever can press the button.
- MCP: ``mcp_reachable`` and ``mcp_tool_exists`` (``initialize`` and ``tools/list``; no tool called).
- Python (a callable named by the policy file): ``python_importable``.

``compensator_check`` runs them and records the result (``CompensatorCheck``, audited);
``check_flags`` says which compensators the policies page and the plan preview flag: never checked
where they point now, failing their last check, or last checked longer ago than
``SAGA_COMPENSATOR_CHECK_MAX_AGE_DAYS`` (30).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from infra import deadline
from infra.conf import saga
from infra.signing import signed_headers
from ledger import upstreams
from ledger.audit import Actor, audit_record
from ledger.models import Compensator, Tenant
from recovery import compensators
from recovery.models import CompensatorCheck

PASS, FAIL = "pass", "fail"
REFUSED = (401, 403)

# id -> (title, required), as the specification words them.
WEBHOOK_CASES: dict[str, tuple[str, bool]] = {
    "tls": ("Served over HTTPS with a certificate that verifies", False),
    "reachable": ("Answers HTTP within the timeout", True),
    "unsigned_refused": ("A request without a signature is refused", True),
    "wrong_signature_refused": ("A request signed with another secret is refused", True),
}
MCP_CASES: dict[str, tuple[str, bool]] = {
    "mcp_reachable": ("The MCP server answers (initialize)", True),
    "mcp_tool_exists": ("The compensating tool is listed", True),
}
PYTHON_CASES: dict[str, tuple[str, bool]] = {
    "python_importable": ("The callable the policy names can be imported", True),
}


@dataclass(frozen=True)
class CaseResult:
    id: str
    title: str
    required: bool
    verdict: str
    status: int | None = None
    detail: str = ""


def fingerprint(row: Compensator) -> str:
    """Where a compensator points: a check is of that target, not of the tool's name."""
    where = "|".join([row.kind, row.url, row.mcp_tool, row.python_path])
    return hashlib.sha256(where.encode()).hexdigest()


def _result(
    cases: dict[str, tuple[str, bool]],
    case_id: str,
    verdict: str,
    status: int | None = None,
    detail: str = "",
) -> CaseResult:
    title, required = cases[case_id]
    return CaseResult(case_id, title, required, verdict, status, detail)


def _probe_body(row: Compensator) -> bytes:
    """A step-shaped body that names no real step: even a compensator that accepted it unsigned
    would find nothing of its own to undo (ids unknown to any system, no args)."""
    probe = f"saga-check-{uuid.uuid4().hex}"
    fields: dict[str, Any] = {
        "step_id": probe,
        "action_id": probe,
        "run_id": probe,
        "tenant": "saga-check",
        "tool": row.tool,
        "args": {},
        "target_type": "",
        "target_id": "",
        "before_snapshot": None,
        "after_snapshot": None,
        "attempt": 1,
    }
    return json.dumps(fields).encode()


def _webhook(row: Compensator) -> list[CaseResult]:
    client = compensators.webhook_client()
    base = {"Content-Type": "application/json", "User-Agent": "saga-admin-compensator-check/1"}
    results = [
        _result(WEBHOOK_CASES, "tls", PASS)
        if row.url.lower().startswith("https://")
        else _result(WEBHOOK_CASES, "tls", FAIL, detail="served over plain HTTP")
    ]
    try:
        reached = deadline.post(
            client,
            row.url,
            deadline_s=compensators.call_timeout_s(),
            content=b"{}",
            headers={**base, "Idempotency-Key": f"saga-check-{uuid.uuid4().hex}"},
        )
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        what = "the certificate does not verify" if "CERTIFICATE" in str(exc).upper() else type(exc).__name__
        if results[0].verdict == PASS and what != type(exc).__name__:
            results[0] = _result(WEBHOOK_CASES, "tls", FAIL, detail=what)
        results.append(_result(WEBHOOK_CASES, "reachable", FAIL, detail=f"no answer: {what}"))
        return results
    results.append(_result(WEBHOOK_CASES, "reachable", PASS, reached.status_code))
    body = _probe_body(row)
    for case_id, extra in (
        ("unsigned_refused", {}),
        ("wrong_signature_refused", signed_headers(secrets.token_hex(16), body)),
    ):
        headers = {**base, "Idempotency-Key": f"saga-check-{uuid.uuid4().hex}", **extra}
        try:
            status = deadline.post(
                client, row.url, deadline_s=compensators.call_timeout_s(), content=body, headers=headers
            ).status_code
        except httpx.HTTPError as exc:
            results.append(_result(WEBHOOK_CASES, case_id, FAIL, detail=f"no answer: {type(exc).__name__}"))
            continue
        if status in REFUSED:
            results.append(_result(WEBHOOK_CASES, case_id, PASS, status))
        else:
            results.append(
                _result(WEBHOOK_CASES, case_id, FAIL, status, f"answered {status}, expected 401 or 403")
            )
    return results


def _mcp(row: Compensator) -> list[CaseResult]:
    missing = sorted({env for env in row.headers_env.values() if not os.environ.get(env)})
    if missing:
        return [
            _result(
                MCP_CASES,
                "mcp_reachable",
                FAIL,
                detail=f"{', '.join(missing)} not set in this process's environment",
            )
        ]
    headers = {name: os.environ[env] for name, env in row.headers_env.items()}
    try:
        names = compensators.mcp_tool_names(url=row.url, headers=headers)
    except Exception as exc:  # noqa: BLE001 - any failure to talk to the server is the verdict
        leaves = getattr(exc, "exceptions", None)
        cause = leaves[0] if leaves else exc
        return [_result(MCP_CASES, "mcp_reachable", FAIL, detail=f"no answer: {type(cause).__name__}")]
    listed = _result(MCP_CASES, "mcp_tool_exists", PASS)
    if row.mcp_tool not in names:
        listed = _result(MCP_CASES, "mcp_tool_exists", FAIL, detail=f"{row.mcp_tool} is not listed")
    return [_result(MCP_CASES, "mcp_reachable", PASS), listed]


def _python(row: Compensator) -> list[CaseResult]:
    try:
        target = import_string(row.python_path)
    except Exception as exc:  # noqa: BLE001 - a module that fails to import, however, fails the case
        return [_result(PYTHON_CASES, "python_importable", FAIL, detail=f"{type(exc).__name__}: {exc}"[:200])]
    if not callable(target):
        return [_result(PYTHON_CASES, "python_importable", FAIL, detail=f"{row.python_path} is not callable")]
    return [_result(PYTHON_CASES, "python_importable", PASS)]


def run_harmless(row: Compensator) -> list[CaseResult]:
    """The harmless cases for the compensator's kind, in the specification's order."""
    if row.kind == Compensator.Kind.WEBHOOK:
        return _webhook(row)
    if row.kind == Compensator.Kind.MCP:
        return _mcp(row)
    return _python(row)


def compensator_in_force(*, tenant: Tenant, compensator_id: int) -> Compensator | None:
    """A compensator the tenant's pages list (``upstreams.compensators_in_force``): its own, or a
    global one it does not override."""
    in_force = upstreams.compensators_in_force(tenant_id=tenant.pk)
    return next((row for row in in_force if row.pk == compensator_id), None)


def compensator_check(*, tenant: Tenant, actor: Actor, user: Any, row: Compensator) -> CompensatorCheck:
    """Run the harmless cases against ``row`` and record the result for ``tenant`` (audited as
    ``compensator.checked``). The calls happen before the transaction that records them."""
    results = run_harmless(row)
    ok = not any(r.required and r.verdict != PASS for r in results)
    with transaction.atomic():
        check = CompensatorCheck.objects.create(
            tenant=tenant,
            tool=row.tool,
            fingerprint=fingerprint(row),
            ok=ok,
            results=[asdict(r) for r in results],
            checked_by=user,
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            kind="compensator.checked",
            subject=f"compensator:{row.tool}",
            to_state="passed" if ok else "failed",
            data={"kind": row.kind, "cases": {r.id: r.verdict for r in results}},
        )
    return check


def latest_checks(*, tenant: Tenant, rows: list[Compensator]) -> dict[str, CompensatorCheck]:
    """The newest check of each row where it points now, by tool."""
    wanted = {row.tool: fingerprint(row) for row in rows}
    latest: dict[str, CompensatorCheck] = {}
    for check in CompensatorCheck.objects.filter(tenant=tenant, tool__in=wanted).order_by(
        "tool", "-checked_at"
    ):
        if check.tool not in latest and check.fingerprint == wanted[check.tool]:
            latest[check.tool] = check
    return latest


def check_flag(check: CompensatorCheck | None) -> str:
    """Why a compensator is flagged ("" when it is not): never checked, failing, or stale."""
    if check is None:
        return "This compensator has never been checked."
    when = timezone.localtime(check.checked_at).strftime("%Y-%m-%d %H:%M")
    if not check.ok:
        failed = ", ".join(r["id"] for r in check.results if r["required"] and r["verdict"] != PASS)
        return f"This compensator failed its last check ({when}): {failed}."
    if timezone.now() - check.checked_at > timedelta(days=saga().compensator_check_max_age_days):
        return f"This compensator has not been checked since {when}."
    return ""


def check_flags(*, tenant: Tenant, tools: list[str]) -> dict[str, str]:
    """The flag of each registered compensator serving one of ``tools`` for the tenant (tools no
    row serves are left out: the plan says so already)."""
    rows = [
        row for tool in set(tools) if (row := compensators.compensator_row(tenant_id=tenant.pk, tool=tool))
    ]
    latest = latest_checks(tenant=tenant, rows=rows)
    return {row.tool: check_flag(latest.get(row.tool)) for row in rows}
