"""Single sign-on's settings, from the environment only (``sso_settings_from_env``, read once by
saga_admin/settings.py into ``settings.SAGA_SSO``), checked when the process starts: a half
configuration refuses to start, naming what is missing, rather than showing a button that fails.

SSO is off while ``SAGA_OIDC_ISSUER`` is unset, and then nothing changes: no button, no callback
(404), password sign-in only. ``SAGA_LOCAL_LOGIN=0`` turns password sign-in off, and is
refused without SSO (nobody could sign in at all).

mozilla-django-oidc reads its own ``OIDC_*`` Django settings; ours are named for operators and
handed to it by ``oidc_setting``, which the backend and the views use as their ``get_settings``.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from infra.env import env_secret
from infra.throttle import parse_rate

# The callback's URL name (dashboard/auth_urls.py): the redirect URI registered at the provider
# is this path on SAGA_PUBLIC_URL's host, /oidc/callback/.
CALLBACK_URL_NAME = "sso-callback"
DEFAULT_SCOPES = "openid email profile"
DEFAULT_CLAIM = "groups"
DEFAULT_PREFIX = "saga"


@dataclass(frozen=True)
class SsoSettings:
    issuer: str = ""
    client_id: str = ""
    client_secret: str = ""
    scopes: str = DEFAULT_SCOPES
    # The claim whose values name tenant and role ("saga:acme:approver"), and their first part.
    claim: str = DEFAULT_CLAIM
    prefix: str = DEFAULT_PREFIX
    # What the login page's button says: "Sign in with <provider_name>".
    provider_name: str = "single sign-on"
    # Each request to the provider (discovery, token, keys, userinfo) may take this long.
    timeout_s: float = 10.0
    local_login: bool = True
    # How many sign-ins one client address may start (``/oidc/authenticate/`` without one under
    # way) per window: each writes a session row for its state, nonce and PKCE verifier. As
    # high as the API's unauthenticated rate: an office signs in from one address.
    start_rate: str = "60/m"

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r}: use 1 or 0.")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_provider_url(url: str, *, what: str) -> None:
    """An https URL; plain http only to this machine (a local test or demo provider): tokens and
    the client secret travel to these URLs."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
        return
    raise ImproperlyConfigured(f"{what}={url!r}: an https:// URL is required (plain http only to localhost).")


def sso_settings_from_env() -> SsoSettings:
    """The ``SAGA_OIDC_*`` variables and ``SAGA_LOCAL_LOGIN``; ``ImproperlyConfigured`` naming the
    variable when they do not make a working configuration."""
    issuer = os.environ.get("SAGA_OIDC_ISSUER", "").strip()
    client_id = os.environ.get("SAGA_OIDC_CLIENT_ID", "").strip()
    client_secret = env_secret("SAGA_OIDC_CLIENT_SECRET").strip()
    local_login = _env_bool("SAGA_LOCAL_LOGIN", True)
    if not issuer:
        if client_id or client_secret:
            raise ImproperlyConfigured(
                "SAGA_OIDC_CLIENT_ID or SAGA_OIDC_CLIENT_SECRET is set but SAGA_OIDC_ISSUER is not: "
                "set the identity provider's issuer URL to turn single sign-on on."
            )
        if not local_login:
            raise ImproperlyConfigured(
                "SAGA_LOCAL_LOGIN=0 turns password sign-in off, but single sign-on is not configured "
                "(SAGA_OIDC_ISSUER): nobody could sign in."
            )
        return SsoSettings()
    check_provider_url(issuer, what="SAGA_OIDC_ISSUER")
    missing = [
        name
        for name, value in (("SAGA_OIDC_CLIENT_ID", client_id), ("SAGA_OIDC_CLIENT_SECRET", client_secret))
        if not value
    ]
    if missing:
        raise ImproperlyConfigured(
            f"SAGA_OIDC_ISSUER is set, so single sign-on needs {' and '.join(missing)} too "
            "(the client registered at the identity provider)."
        )
    scopes = " ".join(os.environ.get("SAGA_OIDC_SCOPES", DEFAULT_SCOPES).split())
    if "openid" not in scopes.split():
        raise ImproperlyConfigured(f"SAGA_OIDC_SCOPES={scopes!r} must include openid.")
    claim = os.environ.get("SAGA_OIDC_ROLES_CLAIM", "").strip() or DEFAULT_CLAIM
    prefix = os.environ.get("SAGA_OIDC_ROLE_PREFIX", "").strip() or DEFAULT_PREFIX
    if ":" in prefix:
        raise ImproperlyConfigured(
            f"SAGA_OIDC_ROLE_PREFIX={prefix!r}: no colon (values are prefix:tenant:role)."
        )
    try:
        timeout_s = float(os.environ.get("SAGA_OIDC_TIMEOUT_S", "") or 10.0)
    except ValueError:
        raise ImproperlyConfigured("SAGA_OIDC_TIMEOUT_S must be a number of seconds.") from None
    start_rate = os.environ.get("SAGA_OIDC_START_RATE", "").strip() or SsoSettings.start_rate
    try:
        parse_rate(start_rate)
    except ValueError:
        raise ImproperlyConfigured(
            f"SAGA_OIDC_START_RATE={start_rate!r}: a count per period, such as 60/m."
        ) from None
    return SsoSettings(
        issuer=issuer,
        client_id=client_id,
        client_secret=client_secret,
        scopes=scopes,
        claim=claim,
        prefix=prefix,
        provider_name=os.environ.get("SAGA_OIDC_PROVIDER_NAME", "").strip() or "single sign-on",
        timeout_s=max(timeout_s, 0.1),
        local_login=local_login,
        start_rate=start_rate,
    )


def sso() -> SsoSettings:
    """The settings in force (``settings.SAGA_SSO``; tests override it)."""
    value = getattr(settings, "SAGA_SSO", None)
    return value if isinstance(value, SsoSettings) else SsoSettings()


def local_login_enabled() -> bool:
    return _local_login(sso())


def _local_login(conf: SsoSettings) -> bool:
    # Without SSO, password sign-in is the only way in: never off (the settings refuse it too).
    return conf.local_login or not conf.enabled


SSO_BACKEND = "dashboard.sso.backend.SsoBackend"
PASSWORD_BACKEND = "django.contrib.auth.backends.ModelBackend"


def authentication_backends(conf: SsoSettings) -> list[str]:
    """``settings.AUTHENTICATION_BACKENDS`` for this configuration. Single sign-on's backend first
    (a successful sign-in is not held by the password lockout); django-axes' always, since it
    refuses a locked-out address whatever backend would answer; the password backend only while
    password sign-in is on, so with ``SAGA_LOCAL_LOGIN=0`` no password authenticates anywhere
    (a hand-made POST to any login form, ``Client.login``, a view added later). The SSO backend
    is a ``ModelBackend`` too: permissions and session users are read as before."""
    backends = ["axes.backends.AxesStandaloneBackend"]
    if conf.enabled:
        backends.insert(0, SSO_BACKEND)
    if _local_login(conf):
        backends.append(PASSWORD_BACKEND)
    return backends


# What mozilla-django-oidc asks for by its own setting names. The provider's endpoints are not
# here: they come from discovery, set on the backend and the view when a sign-in starts.
def oidc_setting(attr: str, *default: Any) -> Any:
    conf = sso()
    values: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": conf.client_id,
        "OIDC_RP_CLIENT_SECRET": conf.client_secret,
        "OIDC_RP_SCOPES": conf.scopes,
        # The ID token's signature: RS256, the algorithm every provider must offer (OIDC Core 15.1).
        "OIDC_RP_SIGN_ALGO": "RS256",
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_TOKEN_USE_BASIC_AUTH": True,
        "OIDC_TIMEOUT": conf.timeout_s,
        "OIDC_VERIFY_SSL": True,
        "OIDC_AUTHENTICATION_CALLBACK_URL": CALLBACK_URL_NAME,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": False,
        "LOGIN_REDIRECT_URL_FAILURE": "/login/?sso=failed",
    }
    if attr in values:
        return values[attr]
    if default:
        return getattr(settings, attr, default[0])
    return getattr(settings, attr)
