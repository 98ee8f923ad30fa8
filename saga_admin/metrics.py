"""``GET /metrics``: Prometheus's text exposition for the whole deployment on this host, and the
request-duration histogram every web request feeds.

The scrape adds up the multiprocess files of every web and worker process (``infra.metrics``;
our families only, with the build info: ``infra.exposition``) and reads the gauges that live in
PostgreSQL and Redis (``recovery.metrics.ScrapeCollector``).
It is behind ``Authorization: Bearer $SAGA_METRICS_TOKEN``: 404 while no token is configured (the
endpoint does not exist), 401 without the token or with another. Like the probes it is never
redirected to HTTPS, to the login or to a trailing slash.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from infra import exposition, metrics_endpoint
from recovery import metrics as recovery_metrics

# Where a request went, by its path: few values, known in advance, so every series exists (at
# zero) from start-up and no caller can make new ones.
SURFACES = ("api", "pages", "probes", "metrics", "static")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")
# The surface of a request ProbeMiddleware answered (saga_admin.health, whose HOSTLESS is the one
# list of those paths): "probes" or "metrics", set on the request as it answers.
SURFACE_ATTR = "_saga_surface"

REQUEST_SECONDS = Histogram(
    "saga_http_request_duration_seconds",
    "Time from a request reaching the application to its response, by surface "
    "(api, pages, probes, metrics, static).",
    ["surface"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
REQUESTS = Counter(
    "saga_http_requests",
    "Requests answered, by surface and status class (2xx, 3xx, 4xx, 5xx).",
    ["surface", "status"],
)
_SECONDS = {surface: REQUEST_SECONDS.labels(surface) for surface in SURFACES}
_ANSWERED = {
    (surface, status): REQUESTS.labels(surface, status) for surface in SURFACES for status in STATUS_CLASSES
}


def surface_of(request: HttpRequest) -> str:
    answered_by: str | None = getattr(request, SURFACE_ATTR, None)
    if answered_by is not None:
        return answered_by
    path = request.path_info
    if path.startswith("/api/"):
        return "api"
    if path.startswith(settings.STATIC_URL) or path == "/favicon.ico":
        return "static"
    return "pages"


class RequestMetricsMiddleware:
    """The outermost middleware: times every request (the other middleware included) and counts
    its answer. One clock read at each end and two updates of this process's metrics file."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        surface = surface_of(request)
        _SECONDS[surface].observe(time.perf_counter() - started)
        answered = _ANSWERED.get((surface, f"{response.status_code // 100}xx"))
        if answered is not None:
            answered.inc()
        return response


def _authorized(request: HttpRequest, token: str) -> bool:
    """The request carries ``Authorization: Bearer <token>`` (any header at all is input)."""
    return metrics_endpoint.bearer_matches(request.headers.get("Authorization", ""), token)


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.SAGA["METRICS_TOKEN"]
    if not token:
        raise Http404("No SAGA_METRICS_TOKEN is configured.")
    if not _authorized(request, token):
        response = HttpResponse(
            "A valid Authorization: Bearer <SAGA_METRICS_TOKEN> header is required.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if request.method not in ("GET", "HEAD"):
        response = HttpResponse("Only GET.\n", status=405, content_type="text/plain; charset=utf-8")
        response["Allow"] = "GET, HEAD"
        return response
    registry = exposition.process_registry()
    registry.register(recovery_metrics.ScrapeCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
