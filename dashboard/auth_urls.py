"""Login and logout, outside the dashboard namespace because settings.LOGIN_URL names "login";
and single sign-on's two ends (dashboard/views/sso.py), 404 while it is not configured.

Django's LoginView authenticates through the configured backends (axes first, so repeated
failures lock the username/IP out) and rotates the session key on login."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard.views import sso

urlpatterns = [
    path("login/", sso.SagaLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The redirect URI to register at the identity provider: <SAGA_PUBLIC_URL>/oidc/callback/.
    path("oidc/authenticate/", sso.SsoStart.as_view(), name="sso-start"),
    path("oidc/callback/", sso.SsoCallback.as_view(), name="sso-callback"),
]
