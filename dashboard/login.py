"""What the login page says when django-axes has locked a (username, address) pair out.

axes calls ``locked_out`` (settings.AXES_LOCKOUT_CALLABLE) instead of answering with its own bare
text: the person sees the login page again, with a plain sentence saying why and for how long.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from axes.helpers import get_client_username, get_cool_off
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def duration_text(delta: timedelta) -> str:
    """``timedelta(minutes=90)`` → "1 hour 30 minutes"; seconds only below a minute."""
    total = max(int(delta.total_seconds()), 1)
    if total < 60:
        return f"{total} second{'s' if total != 1 else ''}"
    hours, minutes = divmod(round(total / 60), 60)
    parts = [f"{hours} hour{'s' if hours != 1 else ''}"] if hours else []
    if minutes:
        parts.append(f"{minutes} minute{'s' if minutes != 1 else ''}")
    return " ".join(parts)


def lockout_message(cool_off: timedelta | None) -> str:
    if cool_off is None:
        return (
            "Too many failed sign-ins for this account from your address. Signing in from here is "
            "locked until an administrator lifts the lock."
        )
    # Every attempt during the lock starts the cool-off again (axes'
    # AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT), so the full period is what is left now.
    return (
        "Too many failed sign-ins for this account from your address. Signing in is paused for "
        f"{duration_text(cool_off)}: try again after that, or ask an administrator to lift the lock."
    )


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    cool_off = get_cool_off(request)
    username = get_client_username(request, credentials) or ""
    context = {
        "form": AuthenticationForm(request, initial={"username": username}),
        "next": request.POST.get("next") or request.GET.get("next", ""),
        "lockout_message": lockout_message(cool_off),
    }
    response = render(request, "registration/login.html", context, status=429)
    if cool_off is not None:
        response["Retry-After"] = str(max(int(cool_off.total_seconds()), 1))
    return response
