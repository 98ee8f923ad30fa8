"""Signing in: the login page (password sign-in, single sign-on's button, or both), the two ends
of single sign-on (sending the person to the provider; the provider sending them back), the page
of someone whose sign-in worked but who has no role here, and the Django admin's own login form
closed while password sign-in is off."""

from __future__ import annotations

import math
from typing import Any

import structlog
from django.contrib import admin, auth
from django.contrib.auth.views import LoginView
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from dashboard import known_devices, permissions
from dashboard.login import login_options
from dashboard.sso import discovery
from dashboard.sso.backend import FAILURE_ATTR
from dashboard.sso.conf import local_login_enabled, oidc_setting, sso
from infra import throttle

log = structlog.get_logger(__name__)

# How long the session a sign-in starts in lives while nobody is signed in to it: it holds the
# state, nonce and PKCE verifier for the provider's answer, which a person gives within minutes.
# Every anonymous start writes such a row; short-lived, the hourly ``recovery.jobs.sessions_prune``
# deletes it soon after, rather than SESSION_COOKIE_AGE later or never.
SSO_STATE_MAX_AGE_S = 10 * 60

# Why the login page is shown again after single sign-on (``?sso=``), in words.
SSO_MESSAGES = {
    "failed": "Signing in with {provider} did not complete. Try again; if it keeps failing, ask an administrator.",
    "unavailable": "{provider} cannot be reached just now. Try again in a moment.",
}


class SagaLoginView(LoginView):
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(login_options())
        message = SSO_MESSAGES.get(self.request.GET.get("sso", ""))
        if message and sso().enabled:
            context["sso_message"] = message.format(provider=sso().provider_name)
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not local_login_enabled():
            # The form is not shown; a hand-made POST is refused before any password is checked.
            return render(
                request,
                "registration/login.html",
                {
                    **login_options(),
                    "next": request.POST.get("next", ""),
                    "sso_message": f"Password sign-in is turned off here: sign in with {sso().provider_name}.",
                },
                status=403,
            )
        response: HttpResponse = super().post(request, *args, **kwargs)
        return response

    def form_valid(self, form: Any) -> HttpResponse:
        response: HttpResponse = super().form_valid(form)
        # This browser is known for this username now: another client's guesses from its address
        # do not lock it out (dashboard.known_devices).
        known_devices.issue(response, form.get_user().get_username())
        return response


def admin_login(request: HttpRequest) -> HttpResponse:
    """``/admin/login/``: the Django admin's own password form while password sign-in is on; the
    dashboard's login page (with single sign-on) while it is off."""
    if local_login_enabled():
        response: HttpResponse = admin.site.login(request)
        return response
    query = urlencode({"next": request.GET.get("next", reverse("admin:index"))})
    return HttpResponseRedirect(f"{reverse('login')}?{query}")


class SsoStart(OIDCAuthenticationRequestView):  # type: ignore[misc]  # the library is untyped
    """``/oidc/authenticate/``: to the provider's authorization endpoint, with state, nonce and a
    PKCE challenge kept in the session."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, **kwargs: Any) -> None:
        # The library's reads the endpoints here; ours come from discovery, in get().
        View.__init__(self, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponseBase:
        conf = sso()
        if not conf.enabled:
            raise Http404("Single sign-on is not configured.")
        # A start without a sign-in already under way writes a new session row (a browser's
        # retry adds its state to its own session, which the library caps): one address may
        # start only so many. With the cache down it is let through: the row is short-lived and
        # pruned either way.
        fresh = "oidc_states" not in request.session  # a made-up session cookie is fresh too
        window = (
            throttle.fixed_window(f"sso-start:{throttle.client_address(request)}", conf.start_rate)
            if fresh
            else None
        )
        if window is not None and not window.allowed:
            log.warning("sso.start_throttled", client=throttle.client_address(request))
            retry = max(1, math.ceil(window.retry_after))
            refused = HttpResponse(
                f"Too many sign-ins started from your address: try again in {retry} s.",
                status=429,
                content_type="text/plain; charset=utf-8",
            )
            refused["Retry-After"] = str(retry)
            return refused
        try:
            metadata = discovery.provider_metadata(conf)
        except discovery.DiscoveryError as exc:
            log.warning("sso.provider_unavailable", detail=str(exc))
            return HttpResponseRedirect(f"{reverse('login')}?sso=unavailable")
        self.OIDC_OP_AUTH_ENDPOINT = metadata.authorization_endpoint
        self.OIDC_RP_CLIENT_ID = conf.client_id
        response: HttpResponseBase = super().get(request)
        if not request.user.is_authenticated:
            request.session.set_expiry(SSO_STATE_MAX_AGE_S)
        return response


class SsoCallback(OIDCAuthenticationCallbackView):  # type: ignore[misc]  # the library is untyped
    """``/oidc/callback/``, the redirect URI: the code exchanged and checked (``SsoBackend``), then
    signed in, or the no-access page, or back to the login page saying it did not work."""

    get_settings = staticmethod(oidc_setting)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not sso().enabled:
            raise Http404("Single sign-on is not configured.")
        response: HttpResponseBase = super().dispatch(request, *args, **kwargs)
        return response

    def login_success(self) -> HttpResponseBase:
        if not (permissions.tenant_ids_for(self.user) or permissions.can_see_workers(self.user)):
            # Signed in at the provider, but no role here: not signed in here (a session with
            # nothing to show would be a blank queue), and told so plainly. (A superuser without
            # a role still has the Django admin and the workers' pages.)
            if self.request.user.is_authenticated:
                auth.logout(self.request)
            log.info("sso.no_access", user=self.user.get_username())
            return render(
                self.request,
                "registration/no_access.html",
                {
                    "sso_provider": sso().provider_name,
                    "person": self.user,
                    "claim": sso().claim,
                    "prefix": sso().prefix,
                },
                status=403,
            )
        # Signed in: the session lives as any dashboard session does, not as the sign-in's state.
        self.request.session.set_expiry(None)
        response: HttpResponseBase = super().login_success()
        return response

    def login_failure(self) -> HttpResponseBase:
        reason = getattr(self.request, FAILURE_ATTR, "")
        code = "unavailable" if reason == "provider_unavailable" else "failed"
        return HttpResponseRedirect(f"{reverse('login')}?sso={code}")
