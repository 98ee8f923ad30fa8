"""Login and logout, outside the dashboard namespace because settings.LOGIN_URL names "login".

Django's LoginView authenticates through the configured backends (axes first, so repeated
failures lock the username/IP out) and rotates the session key on login."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
