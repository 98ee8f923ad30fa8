"""The login lockout (django-axes), through axes' own hooks.

- Who a client is (``client_ip``, settings.AXES_CLIENT_IP_CALLABLE): the address the API's throttle
  counts too — ``REMOTE_ADDR``, or the address our own proxies saw when ``SAGA_TRUSTED_PROXY_HOPS``
  says they stand in front — with an IPv6 client counted by its /64. One host commonly holds a
  whole /64, so counting single IPv6 addresses would let it take a fresh address per guess.
- What locks (``LockoutHandler``, settings.AXES_HANDLER): the (username, address) pair after
  ``AXES_FAILURE_LIMIT`` failures, and also the username alone after
  ``LOGIN_USERNAME_FAILURE_LIMIT`` failures from any number of addresses, so guessing one account's
  password from many addresses stops too.
- Which browser it is (``dashboard.known_devices``): one that signed in as the username before is
  counted by itself, not by its address, so others' guesses from behind the same address (a proxy
  no setting names) do not lock it out.
- What the person is told (``locked_out``, settings.AXES_LOCKOUT_CALLABLE): the login page again,
  with a plain sentence saying why and for how long, instead of axes' own bare text.
- What the login page offers (``login_options``): the password form unless SAGA_LOCAL_LOGIN=0, and
  single sign-on's button when it is configured (dashboard/sso/).
"""

from __future__ import annotations

import ipaddress
import threading
from datetime import timedelta
from typing import Any

import structlog
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from dashboard import known_devices
from dashboard.sso.conf import local_login_enabled, sso
from infra.conf import saga
from infra.durations import duration_words
from infra.throttle import client_network

log = structlog.get_logger(__name__)
_warned = threading.Event()


def login_options() -> dict[str, Any]:
    """What the login page offers, for every view that renders it (the login, the lockout)."""
    conf = sso()
    return {
        "local_login": local_login_enabled(),
        "sso_enabled": conf.enabled,
        "sso_provider": conf.provider_name,
        "sso_start_url": reverse("sso-start"),
    }


def client_ip(request: HttpRequest) -> str | None:
    """The address a login attempt is counted against (settings.AXES_CLIENT_IP_CALLABLE): the
    API throttle's rule (``infra.throttle.client_network``), an IPv6 client's /64 written as the
    network's first address (axes stores an IP address, not a network). None when there is no
    usable address."""
    if saga().trusted_proxy_hops == 0 and request.META.get("HTTP_X_FORWARDED_FOR") and not _warned.is_set():
        _warned.set()
        # A proxy stands in front that no setting names: every client it forwards has its address,
        # so five wrong passwords from anyone lock that username out for everyone behind it. Said
        # once per process, loudly: the fix is the deployment's (docs/DEPLOY.md, "Proxies").
        log.warning(
            "login.untrusted_proxy",
            remote_addr=request.META.get("REMOTE_ADDR", ""),
            hint="a sign-in came with X-Forwarded-For while SAGA_TRUSTED_PROXY_HOPS=0: behind a "
            "proxy, every client is counted as the proxy's address; set SAGA_TRUSTED_PROXY_HOPS",
        )
    network = client_network(request)
    if isinstance(network, ipaddress.IPv6Network):
        return str(network.network_address)
    return str(network) if network is not None else None


def username_failures(request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
    """Failed sign-ins for the attempt's username within the cool-off, from every address."""
    username = get_client_username(request, credentials)
    if not username:
        return 0
    attempts = AccessAttempt.objects.filter(username=username)
    cool_off = get_cool_off(request)
    if cool_off is not None:  # the window axes counts the pair's failures in
        attempts = attempts.filter(attempt_time__gte=timezone.now() - cool_off)
    return int(attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0)


def username_ceiling_reached(request: HttpRequest, credentials: dict[str, Any] | None = None) -> bool:
    return username_failures(request, credentials) >= settings.LOGIN_USERNAME_FAILURE_LIMIT


class LockoutHandler(AxesDatabaseHandler):
    """axes' database handler with a second, higher ceiling per username.

    axes has one failure limit for all its lockout criteria, and a plain ``"username"`` criterion
    at that limit would let anyone lock any account out with five guesses. So the criterion stays
    the (username, address) pair (settings.AXES_LOCKOUT_PARAMETERS), and the failures counted for
    an attempt are the pair's, or the limit itself once the username has had
    ``LOGIN_USERNAME_FAILURE_LIMIT`` failures from all addresses together: axes then locks
    (and refuses the next attempt) exactly as it does for the pair, with the same cool-off.

    A known device (``dashboard.known_devices``) is counted by its own failures in place of the
    pair's: the ceiling per username still holds it."""

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        own = known_device_failures(request, credentials)
        pair = own if own is not None else super().get_failures(request, credentials)
        if username_ceiling_reached(request, credentials):
            return max(pair, int(get_failure_limit(request, credentials)))
        return int(pair)

    def user_login_failed(
        self, sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
    ) -> None:
        if request is not None:
            device = known_devices.device_for(request, get_client_username(request, credentials))
            if device is not None:  # before axes counts: it asks get_failures whether to lock
                known_devices.count_failure(device, get_cool_off(request))
        super().user_login_failed(sender, credentials, request, **kwargs)


def known_device_failures(request: HttpRequest, credentials: dict[str, Any] | None = None) -> int | None:
    """The failures of the known device this attempt comes from; None when it is not one (or Redis
    cannot say), and the address is what counts."""
    device = known_devices.device_for(request, get_client_username(request, credentials))
    return known_devices.failures(device) if device is not None else None


def duration_text(delta: timedelta) -> str:
    """``timedelta(minutes=90)`` → "1 hour 30 minutes"; seconds only below a minute."""
    return duration_words(max(int(delta.total_seconds()), 1), rounded=True, largest="hour")


def lockout_message(cool_off: timedelta | None, *, every_address: bool = False, device: bool = False) -> str:
    if every_address:
        why = "Too many failed sign-ins for this account from many addresses."
    elif device:
        why = "Too many failed sign-ins for this account from this browser."
    else:
        why = "Too many failed sign-ins for this account from your address."
    if cool_off is None:
        where = "to this account" if every_address else "from here"
        return f"{why} Signing in {where} is locked until an administrator lifts the lock."
    # Every attempt during the lock starts the cool-off again (axes'
    # AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT), so the full period is what is left now.
    return (
        f"{why} Signing in is paused for {duration_text(cool_off)}: try again after that, or ask "
        "an administrator to lift the lock."
    )


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    cool_off = get_cool_off(request)
    username = get_client_username(request, credentials) or ""
    context = {
        **login_options(),
        "form": AuthenticationForm(request, initial={"username": username}),
        "next": request.POST.get("next") or request.GET.get("next", ""),
        "lockout_message": lockout_message(
            cool_off,
            every_address=username_ceiling_reached(request, credentials),
            device=known_device_failures(request, credentials) is not None,
        ),
    }
    response = render(request, "registration/login.html", context, status=429)
    if cool_off is not None:
        response["Retry-After"] = str(max(int(cool_off.total_seconds()), 1))
    return response
