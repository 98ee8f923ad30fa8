"""The insights page: open items, time to resolve, compensations and approval waits, as charts.

It used to be at ``/metrics/``; ``/metrics`` is Prometheus's now (``saga_admin.metrics``)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from dashboard.permissions import tenants_for
from dashboard.presenters import charts
from dashboard.selectors import insights as insights_selectors
from dashboard.views.common import HtmxHttpRequest
from ledger.models import Risk


@require_GET
@login_required
def insights(request: HtmxHttpRequest) -> HttpResponse:
    window = request.GET.get("window", "7d")
    tenants = tenants_for(request.user)
    tenant = request.GET.get("tenant", "")
    data = insights_selectors.insights(user=request.user, window=window, tenant=tenant)
    return render(
        request,
        "dashboard/insights.html",
        {
            "m": data,
            "tenants": tenants,
            "tenant": tenant,
            "windows": list(insights_selectors.INSIGHT_WINDOWS),
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


@require_GET
def insights_moved(request: HttpRequest) -> HttpResponse:
    """``/metrics/``, the page's old address: a signed-in person is sent on to ``/insights/`` (with
    the same query); anyone else gets 404, so a scraper configured with the slash is told plainly
    that nothing is there instead of being sent to the login page."""
    if not request.user.is_authenticated:
        raise Http404
    target = reverse("dashboard:insights")
    return redirect(f"{target}?{request.GET.urlencode()}" if request.GET else target)
