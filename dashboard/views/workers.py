"""The RQ dashboard (django-rq), mounted at ``/django-rq/`` behind the superuser gate.

django-rq's own views check only ``is_staff``, and a tenant admin is staff; its pages show every
tenant's jobs with their arguments. Every one of its URLs (the HTML pages and the stats JSON) is
wrapped here, so none can be reached around the gate. django-rq's second door, its entry in the
Django admin, is closed in the settings (``RQ_SHOW_ADMIN_LINK = False``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

from dashboard.permissions import can_see_workers

View = Callable[..., HttpResponse]


def superusers_only(view: View) -> View:
    """Signed-out visitors go to the login page (a superuser's session may simply have expired);
    anyone else who is not a superuser gets 404, as if the page were not there."""

    @wraps(view)
    def gated(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not can_see_workers(request.user):
            raise Http404("No such page.")
        return view(request, *args, **kwargs)

    return gated


def urlpatterns() -> list[URLPattern]:
    api = [
        URLPattern(pattern.pattern, superusers_only(pattern.callback), pattern.default_args, pattern.name)
        for pattern in get_api_urlpatterns()
    ]
    return [*api, *get_admin_urlpatterns(view_wrapper=superusers_only)]
