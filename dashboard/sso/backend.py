"""The authentication backend the SSO callback signs in through: mozilla-django-oidc's (the code
exchanged with PKCE, the ID token's signature and nonce checked against the provider's keys), with
what it leaves out done here:

- the ID token's ``iss`` must be the provider's issuer and its ``aud`` must name our client, and
  the userinfo answer must be about the same ``sub`` (OIDC Core 3.1.3.7 and 5.3.2);
- the user is found by issuer and ``sub`` (``accounts.sso_sign_in``), never by e-mail;
- the role claim is read from the userinfo answer, or from the ID token when the provider puts it
  only there (Microsoft Entra ID's ``groups`` and ``roles``);
- any failure (the provider unreachable, a refused code, a bad token, an answer of the wrong
  shape) is a failed sign-in with a log line, never a 500.

It answers only the SSO callback's requests, and only while SSO is configured; a password sign-in
goes past it to the backends after it. It is listed first so a successful SSO sign-in is not held
by the password lockout (the provider throttles its own password guesses); a failed one falls
through to django-axes, which counts it against the address as it counts failed passwords."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jwt
import requests
import structlog
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest
from django.urls import Resolver404, resolve
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from dashboard.sso import accounts, claims, discovery
from dashboard.sso.conf import CALLBACK_URL_NAME, oidc_setting, sso

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = structlog.get_logger(__name__)

# Why a sign-in failed, for the page the person is sent to (request attribute).
FAILURE_ATTR = "saga_sso_failure"


def _text(claims_: dict[str, Any], name: str) -> str:
    value = claims_.get(name)
    return value if isinstance(value, str) else ""


def _verified_email(userinfo: dict[str, Any], payload: dict[str, Any]) -> str:
    """The person's e-mail address only when the provider says it verified it (``email_verified``
    true, in the answer that gave the address): an address is who a person is for the approval
    rules (``recovery.transitions.approvals.same_person``) and where approval details are sent, so
    one the person merely typed is neither. "" otherwise."""
    for claims_ in (userinfo, payload):
        email = _text(claims_, "email")
        if email:
            verified = claims_.get("email_verified")
            # Some providers send the boolean as a string.
            return email if verified is True or verified == "true" else ""
    return ""


def _is_callback(request: HttpRequest) -> bool:
    """Whether the request is for the SSO callback, read as the URL resolver routed it: from
    ``path_info``, the path below any ``SCRIPT_NAME`` prefix (an installation mounted under
    ``/saga``), which ``reverse()`` would include and ``path_info`` does not."""
    try:
        return resolve(request.path_info).url_name == CALLBACK_URL_NAME
    except Resolver404:
        return False


class SsoBackend(OIDCAuthenticationBackend):  # type: ignore[misc]  # the library is untyped
    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds a backend for every request of a signed-in session (to load its user):
        # nothing here may reach the provider. The endpoints are set when a sign-in needs them.
        self.UserModel = get_user_model()

    def get_user(self, user_id: Any) -> User | None:
        """The signed-in session's user, as long as they are active: mozilla-django-oidc's own
        ``get_user`` skips Django's ``is_active`` check, so a deactivated account's open sessions
        went on working until they expired."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        conf = sso()
        if request is None or not conf.enabled or not _is_callback(request):
            return None
        try:
            metadata = discovery.provider_metadata(conf)
        except discovery.DiscoveryError as exc:
            self._failed(request, "provider_unavailable", str(exc))
            return None
        self.metadata = metadata
        self.OIDC_OP_TOKEN_ENDPOINT = metadata.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = metadata.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = metadata.jwks_uri
        self.OIDC_RP_CLIENT_ID = conf.client_id
        self.OIDC_RP_CLIENT_SECRET = conf.client_secret
        self.OIDC_RP_SIGN_ALGO = oidc_setting("OIDC_RP_SIGN_ALGO")
        self.OIDC_RP_IDP_SIGN_KEY = None
        try:
            user: User | None = super().authenticate(request, **kwargs)
        except (
            requests.RequestException,
            SuspiciousOperation,
            jwt.PyJWTError,
            ValueError,
            KeyError,
            # JSON of the wrong shape where the library reads an object (a token answer or a key
            # set that is a list, a string, null): a broken or hostile provider, refused alike.
            TypeError,
            AttributeError,
            accounts.NoFreeUsername,
        ) as exc:
            self._failed(request, "refused", f"{type(exc).__name__}: {str(exc)[:300]}")
            return None
        if user is None and not hasattr(request, FAILURE_ATTR):
            self._failed(request, "refused", "the provider's answer was not accepted")
        return user

    def _failed(self, request: HttpRequest, reason: str, detail: str) -> None:
        log.warning("sso.sign_in_failed", reason=reason, detail=detail)
        setattr(request, FAILURE_ATTR, reason)
        return None

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User | None:
        conf = sso()
        issuer = self.metadata.issuer
        if payload.get("iss") != issuer:
            raise SuspiciousOperation(f"the ID token's issuer is {payload.get('iss')!r}, not {issuer!r}")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if conf.client_id not in audiences:
            raise SuspiciousOperation("the ID token is not for this client (aud)")
        subject = payload.get("sub")
        if not isinstance(subject, str) or not subject or len(subject) > 255:
            raise SuspiciousOperation("the ID token has no usable sub")
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != subject:
            raise SuspiciousOperation("the userinfo answer is about another subject than the ID token")
        claim_value = userinfo[conf.claim] if conf.claim in userinfo else payload.get(conf.claim)
        wanted = claims.roles_from_claim(claim_value, prefix=conf.prefix, claim=conf.claim)
        profile = accounts.Profile(
            preferred_username=_text(userinfo, "preferred_username") or _text(payload, "preferred_username"),
            email=_verified_email(userinfo, payload),
            first_name=_text(userinfo, "given_name"),
            last_name=_text(userinfo, "family_name"),
        )
        signed_in = accounts.sso_sign_in(issuer=issuer, subject=subject, profile=profile, wanted=wanted)
        log.info(
            "sso.signed_in",
            user=signed_in.user.get_username(),
            created=signed_in.created,
            roles=wanted,
            added=signed_in.added,
            changed=signed_in.changed,
            removed=signed_in.removed,
            unknown_tenants=signed_in.unknown_tenants,
            kept_local=signed_in.kept_local,
        )
        return signed_in.user
