"""The audit stream in the dashboard: every sink carrying a tenant's audit events with its lag
(events behind, the oldest undelivered one's age) and last error, for operators and admins — the
installation's sinks' URLs, last errors and setting problems for installation admins
(superusers) only; a tenant admin sets or removes the tenant's own sinks. The services are ``recovery.audit_stream``;
these views parse, check the role and call them."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dashboard.permissions import Capability, require_tenant, tenant_ids_with
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from ledger.models import Tenant
from recovery.audit_stream import config, delivery
from recovery.audit_stream.models import AuditSink
from recovery.decisions import refusal_sentence


class AuditSinkForm(forms.Form):
    """A tenant's sink. The URL is checked by the service (``infra.outbound``: public addresses,
    or hosts the operator allows); its refusal comes back as this form's error."""

    kind = forms.ChoiceField(label="Kind", choices=AuditSink.Kind.choices)
    url = forms.CharField(
        label="URL",
        max_length=config.URL_MAX,
        help_text="Syslog: tcp://host:port or tcp+tls://host:port. HEC: https://host:8088/services/collector/event.",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )
    token = forms.CharField(
        label="HEC token",
        required=False,
        max_length=config.TOKEN_MAX,
        help_text="HEC only. Leave blank to keep the current one. Never shown again.",
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)


def _url(tenant: Tenant | None = None) -> str:
    base = reverse("dashboard:audit-stream")
    return f"{base}?tenant={tenant.slug}" if tenant is not None else base


def _page(
    request: HtmxHttpRequest, *, wanted: str = "", form: AuditSinkForm | None = None, status: int = 200
) -> HttpResponse:
    tenant_ids = tenant_ids_with(request.user, Capability.OPERATE)
    if not tenant_ids:
        raise PermissionDenied("The audit stream is shown to operators and admins.")
    administered = list(
        Tenant.objects.filter(pk__in=tenant_ids_with(request.user, Capability.ADMINISTER)).order_by("slug")
    )
    wanted = wanted or request.GET.get("tenant", "")
    tenant = next((t for t in administered if t.slug == wanted), administered[0] if administered else None)
    # The installation's sinks are the operator's: their URLs and errors (a SIEM's address, what it
    # answered) are shown to installation admins only, never to every tenant's operators.
    installation_admin = request.user.is_superuser
    context = {
        "statuses": delivery.sink_statuses(tenant_ids=list(tenant_ids)),
        "installation_admin": installation_admin,
        "administered": administered,
        "tenant": tenant,
        "tenant_sinks": list(AuditSink.objects.filter(tenant=tenant).order_by("kind")) if tenant else [],
        "form": form or AuditSinkForm(initial={"enabled": True}),
        "installation_problems": config.check_installation() if installation_admin else [],
    }
    return render(request, "dashboard/audit_stream.html", context, status=status)


@require_GET
@login_required
def page(request: HtmxHttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
@login_required
def sink_set(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = require_tenant(request.user, Capability.ADMINISTER, slug=slug)
    if request.POST.get("remove") in AuditSink.Kind.values:
        kind = request.POST["remove"]
        if config.sink_remove(tenant=tenant, actor=common.actor(request), kind=kind):
            messages.success(request, f"Removed the {AuditSink.Kind(kind).label} sink.")
        return common.done(request, _url(tenant))
    form = AuditSinkForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            config.sink_set(
                tenant=tenant,
                actor=common.actor(request),
                kind=data["kind"],
                url=data["url"].strip(),
                token=data["token"],
                enabled=bool(data["enabled"]),
            )
        except SagaError as exc:
            field = exc.details.get("field") if isinstance(exc.details, dict) else None
            form.add_error(field if field in form.fields else None, exc.message or refusal_sentence(exc))
        else:
            messages.success(request, f"Saved the {AuditSink.Kind(data['kind']).label} sink.")
            return common.done(request, _url(tenant))
    return _page(request, wanted=tenant.slug, form=form, status=422)
