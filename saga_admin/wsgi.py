from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application

from infra import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
try:
    # Traces, when OTEL_EXPORTER_OTLP_ENDPOINT is set: before the application is built, so Django's
    # instrumentation middleware is in place (infra/telemetry.py; nothing happens otherwise).
    telemetry.telemetry_start(service="saga-admin-web", django=True)
    application = get_wsgi_application()
except ImproperlyConfigured as exc:
    # The settings refuse an unsafe configuration (no SECRET_KEY with DEBUG off). The server must
    # not start, and its log should say why in one line rather than a page of Django internals.
    raise ImproperlyConfigured(f"Saga Admin will not start: {exc}") from None
