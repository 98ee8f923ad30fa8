"""The provider's metadata from OpenID Connect discovery (``<issuer>/.well-known/openid-configuration``),
fetched when a sign-in needs it and kept for an hour per process: one configuration variable, the
issuer, instead of four endpoint URLs to copy by hand, and keys the provider rotates are found
without a restart (mozilla-django-oidc reads the key set itself, at every sign-in)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
from django.core.exceptions import ImproperlyConfigured

from dashboard.sso.conf import SsoSettings, check_provider_url
from infra import deadline

CACHE_S = 3600.0
_MAX_DOCUMENT_BYTES = 512 * 1024


class DiscoveryError(Exception):
    """The provider's metadata cannot be had or cannot be used; the message says why."""


@dataclass(frozen=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str


_cache: dict[str, tuple[float, ProviderMetadata]] = {}
_lock = threading.Lock()


def discovery_url(issuer: str) -> str:
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def provider_metadata(conf: SsoSettings) -> ProviderMetadata:
    """The metadata of ``conf.issuer``, from this process's cache while it is fresh."""
    now = time.monotonic()
    with _lock:
        cached = _cache.get(conf.issuer)
    if cached is not None and now - cached[0] < CACHE_S:
        return cached[1]
    metadata = fetch_metadata(conf)
    with _lock:
        _cache[conf.issuer] = (now, metadata)
    return metadata


def forget_metadata() -> None:
    """Empty the cache (a test that starts another provider on the same issuer URL)."""
    with _lock:
        _cache.clear()


def fetch_metadata(conf: SsoSettings) -> ProviderMetadata:
    url = discovery_url(conf.issuer)
    try:
        with deadline.client() as client:
            response = deadline.get(client, url, deadline_s=conf.timeout_s)
    except httpx.HTTPError as exc:
        raise DiscoveryError(f"{url} cannot be reached ({type(exc).__name__}).") from None
    if response.status_code != 200:
        raise DiscoveryError(f"{url} answered {response.status_code}.")
    if len(response.content) > _MAX_DOCUMENT_BYTES:
        raise DiscoveryError(f"{url} answered a document larger than {_MAX_DOCUMENT_BYTES} bytes.")
    try:
        document = response.json()
    except ValueError:
        raise DiscoveryError(f"{url} answered something other than JSON.") from None
    if not isinstance(document, dict):
        raise DiscoveryError(f"{url} answered JSON that is not an object.")
    fields = ("issuer", "authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
    values: dict[str, str] = {}
    for name in fields:
        value = document.get(name)
        if not isinstance(value, str) or not value:
            raise DiscoveryError(f"{url} names no {name}.")
        try:
            check_provider_url(value, what=name)
        except ImproperlyConfigured as exc:
            raise DiscoveryError(f"{url}: {exc}") from None
        values[name] = value
    # The issuer the document names is the one ID tokens must carry (OIDC Discovery 4.3): a
    # document served for another issuer is not this provider's.
    if values["issuer"].rstrip("/") != conf.issuer.rstrip("/"):
        raise DiscoveryError(
            f"{url} is the metadata of issuer {values['issuer']!r}, not of SAGA_OIDC_ISSUER {conf.issuer!r}."
        )
    return ProviderMetadata(**values)
