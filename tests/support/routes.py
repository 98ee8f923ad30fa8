"""Every dashboard URL, enumerated from the URL resolver, so a new page cannot escape a check."""

from __future__ import annotations

import re
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver


def dashboard_patterns() -> list[tuple[str, str]]:
    """(route, name) of every dashboard URL, from the resolver."""
    found = []

    def walk(patterns: list[Any], prefix: str, namespace: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern), entry.namespace or namespace)
            elif isinstance(entry, URLPattern) and namespace == "dashboard":
                found.append((prefix + str(entry.pattern), f"{namespace}:{entry.name}"))

    walk(get_resolver().url_patterns, "/", "")
    return found


def fill_route(route: str, world: dict[str, str]) -> str:
    """``route`` with each ``<converter:name>`` replaced by ``world[name]``."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in world, f"{route}: no object for <{name}>; add one to acme_world"
        return world[name]

    return re.sub(r"<(?:\w+:)?(\w+)>", value, route)
