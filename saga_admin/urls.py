from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from saga_admin.api.app import api
from saga_admin.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
    path("django-rq/", include("django_rq.urls")),
    path("demo-world/", include("demo.urls")),
    path("", include("dashboard.auth_urls")),
    path("", include("dashboard.urls")),
]
