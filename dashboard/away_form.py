"""The away form: in which tenant, until when (UTC), and who covers. It only parses; the rules (a
future moment at most 90 days ahead, a delegate who is another active approver of the same tenant,
no loop) are ``ledger.away``'s, so the page says what the service refuses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms

# Django's username length: a longer value names nobody.
USERNAME_MAX = 150


class AwayForm(forms.Form):
    tenant = forms.TypedChoiceField(label="Tenant", coerce=int)
    away_until = forms.DateTimeField(
        label="Away until (UTC)",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"],
        error_messages={
            "required": "Say until when you are away.",
            "invalid": "Away until: not a date and time.",
        },
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    delegate = forms.CharField(
        label="Who covers for you",
        max_length=USERNAME_MAX,
        error_messages={"required": "Choose who covers for you."},
    )

    def __init__(self, *args: Any, tenants: Sequence[Any] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        assert isinstance(field, forms.TypedChoiceField)
        field.choices = [(t.pk, t.name) for t in tenants]
        field.error_messages["invalid_choice"] = "Choose one of the tenants you approve in."
        if len(tenants) == 1:
            field.initial, field.required = tenants[0].pk, False

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("tenant") in (None, ""):
            cleaned["tenant"] = self.fields["tenant"].initial
        return cleaned
