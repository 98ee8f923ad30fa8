"""The metrics page: open items, time to resolve, compensations and approval waits, as charts."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard.presenters import charts
from dashboard.selectors import metrics as metrics_selectors
from dashboard.selectors import tenants as tenant_selectors
from dashboard.views.common import HtmxHttpRequest
from ledger.models import Risk


@require_GET
@login_required
def metrics(request: HtmxHttpRequest) -> HttpResponse:
    window = request.GET.get("window", "7d")
    tenants = tenant_selectors.visible_tenants(user=request.user)
    tenant = request.GET.get("tenant", "")
    data = metrics_selectors.metrics(user=request.user, window=window, tenant=tenant)
    return render(
        request,
        "dashboard/metrics.html",
        {
            "m": data,
            "tenants": tenants,
            "tenant": tenant,
            "windows": list(metrics_selectors.METRIC_WINDOWS),
            "risk_chart": charts.bar_chart(
                data.open_by_risk, css_prefix="risk-", keys=[r.value for r in Risk]
            ),
            "reason_chart": charts.bar_chart(data.open_by_reason),
            "tools_chart": charts.bar_chart(data.top_failing_tools),
            "latency_chart": charts.bar_chart(
                [
                    ("Unwind p50", data.unwind_p50_s),
                    ("Unwind p95", data.unwind_p95_s),
                    ("Approval wait p50", data.approval_p50_s),
                    ("Approval wait p95", data.approval_p95_s),
                ],
                unit="s",
            ),
        },
    )
