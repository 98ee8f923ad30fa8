from __future__ import annotations

from functools import cached_property
from typing import Any

from django.http import HttpRequest

from dashboard import permissions
from dashboard.selectors import live


class Nav:
    """Navigation data, computed only if a template asks for it (login pages never do)."""

    def __init__(self, request: HttpRequest) -> None:
        self.user = request.user

    @cached_property
    def pending_approvals(self) -> str:
        return live.nav_badge(user=self.user)

    @cached_property
    def can_approve(self) -> bool:
        return permissions.can_anywhere(self.user, permissions.Capability.APPROVE)

    @cached_property
    def can_operate(self) -> bool:
        return permissions.can_anywhere(self.user, permissions.Capability.OPERATE)

    @cached_property
    def can_administer(self) -> bool:
        return permissions.can_anywhere(self.user, permissions.Capability.ADMINISTER)

    @property
    def can_see_workers(self) -> bool:
        return permissions.can_see_workers(self.user)


def nav(request: HttpRequest) -> dict[str, Any]:
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {"nav": Nav(request)}
