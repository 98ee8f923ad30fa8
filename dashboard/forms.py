from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django import forms

from dashboard.selectors.queue import AGE_CHOICES, SORTS, QueueView
from infra.errors import SagaError
from ledger.models import Risk
from ledger.rules import REASON_MAX_LENGTH, REASON_REQUIRED, reason_required
from ledger.services.pauses import pause_patterns
from ledger.tool_names import tool_name_problem
from recovery.bulk.models import BulkOperation
from recovery.models import CHANNEL_EVENTS, NotificationChannel, NotificationEvent, RecoveryItem
from recovery.selectors import FILTER_TEXT_MAX_LENGTH, QUEUE_STATUSES, QueueFilter

_REASON_HELP = "Recorded in the audit log with your name."


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=REASON_MAX_LENGTH,
        help_text=_REASON_HELP,
        error_messages={"required": REASON_REQUIRED},
        widget=forms.TextInput(attrs={"autocomplete": "off", "required": True}),
    )

    def clean_reason(self) -> str:
        # The services' own rule, so the page says what the API would.
        try:
            return reason_required(self.cleaned_data["reason"])
        except SagaError as exc:
            raise forms.ValidationError(exc.message) from None


class ResumeForm(ReasonForm):
    checkpoint = forms.ChoiceField(label="Resume from checkpoint", required=False)

    def __init__(self, *args: Any, checkpoints: Sequence[Any] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["checkpoint"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "Latest checkpoint")] + [
            (c.pk, f"{c.name} ({c.created_at:%Y-%m-%d %H:%M:%S})") for c in checkpoints
        ]


class ReconcileForm(ReasonForm):
    happened = forms.TypedChoiceField(
        label="Did the call happen?",
        choices=[("yes", "Yes — it took effect"), ("no", "No — it did not happen")],
        coerce=lambda v: v == "yes",
        widget=forms.RadioSelect,
    )


class ApproveForm(ReasonForm):
    args = forms.CharField(
        label="Arguments (JSON)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code"}),
        help_text="Edit to approve different arguments; both versions are audited.",
    )
    shown_args_hash = forms.CharField(widget=forms.HiddenInput)

    def clean_args(self) -> Any:
        raw = self.cleaned_data["args"].strip()
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("Arguments must be a JSON object.")
        return value


class BulkForm(ReasonForm):
    """The selected item ids come from ``request.POST.getlist("items")``; how many may be handled
    at once and which risks qualify is the bulk service's rule, not the form's."""

    operation = forms.ChoiceField(choices=[("close", "Close"), ("compensate", "Compensate")])


class BulkByFilterForm(ReasonForm):
    """A bulk decision by filter: the action, the count the operator saw (a different one now is the
    service's ``count_changed``), and past the threshold, that count typed again."""

    action = forms.ChoiceField(label="Decision", choices=BulkOperation.Action.choices)
    expected_count = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    confirm_count = forms.IntegerField(
        label="Type the number of items to confirm",
        required=False,
        min_value=0,
        widget=forms.TextInput(attrs={"inputmode": "numeric", "autocomplete": "off"}),
    )

    def __init__(self, *args: Any, threshold: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threshold = threshold

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        count = data.get("expected_count")
        if count is not None and count > self.threshold and data.get("confirm_count") != count:
            self.add_error("confirm_count", f"Type {count} to confirm a decision over {count} items.")
        return data


class QueueFilterForm(forms.Form):
    q = forms.CharField(
        label="Search",
        required=False,
        max_length=500,
        widget=forms.TextInput(
            attrs={"type": "search", "placeholder": "run id, external id, target, tool, request…"}
        ),
    )
    tenant = forms.ChoiceField(label="Tenant", required=False)
    risk = forms.ChoiceField(label="Risk", required=False, choices=[("", "Any risk"), *Risk.choices])
    reason = forms.ChoiceField(
        label="Reason", required=False, choices=[("", "Any reason"), *RecoveryItem.Reason.choices]
    )
    status = forms.ChoiceField(
        label="Status", required=False, choices=[(s, s.capitalize()) for s in QUEUE_STATUSES]
    )
    age = forms.ChoiceField(
        label="Older than", required=False, choices=[("", "Any age"), *[(k, k) for k in AGE_CHOICES]]
    )
    sort = forms.ChoiceField(
        label="Sort",
        required=False,
        choices=[("newest", "Newest first"), ("oldest", "Oldest first"), ("risk", "Highest risk first")],
    )
    agent = forms.CharField(
        label="Agent",
        required=False,
        max_length=FILTER_TEXT_MAX_LENGTH["agent"],
        widget=forms.TextInput(attrs={"placeholder": "agent or key name", "spellcheck": "false"}),
    )
    tool = forms.CharField(
        label="Tool",
        required=False,
        max_length=FILTER_TEXT_MAX_LENGTH["tool"],
        widget=forms.TextInput(attrs={"placeholder": "crm.update_*", "spellcheck": "false"}),
    )
    signature = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def clean_tool(self) -> str:
        tool = str(self.cleaned_data["tool"]).strip()
        problem = tool_name_problem(tool, glob=True) if tool else ""
        if problem:
            raise forms.ValidationError(f"The tool {problem}.")
        return tool

    def __init__(self, *args: Any, tenants: Sequence[Any] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "All tenants")] + [(t.slug, t.name) for t in tenants]

    def view(self) -> QueueView:
        """The queue's one filter and the page's choices; an invalid value falls back to its
        default rather than failing the page."""
        data = (
            self.cleaned_data
            if self.is_valid()
            else {name: self.cleaned_data.get(name, "") for name in self.fields if name not in self.errors}
        )
        sort = data.get("sort") or "newest"
        age = data.get("age") or ""
        return QueueView(
            queue_filter=QueueFilter(
                tenant_slug=data.get("tenant") or "",
                risk=data.get("risk") or "",
                reason=data.get("reason") or "",
                status=data.get("status") or "unresolved",
                older_than=AGE_CHOICES.get(age),
                search=data.get("q") or "",
                signature=data.get("signature") or "",
                agent=data.get("agent") or "",
                tool=data.get("tool") or "",
            ),
            age=age,
            sort=sort if sort in SORTS else "newest",
        )


class CompensateForm(ReasonForm):
    """The compensate decision: what to undo (the ticked plan steps, read with
    ``request.POST.getlist("action_ids")``, or everything after a checkpoint), the plan_hash of the
    plan the operator read, and the stage (choosing, or confirming a reviewed selection). Which
    choices are valid is the planner's rule, not the form's."""

    scope = forms.ChoiceField(
        choices=[("actions", "The ticked actions"), ("checkpoint", "Everything after a checkpoint")],
        required=False,
    )
    to_checkpoint = forms.CharField(required=False, max_length=40)
    plan_hash = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)
    stage = forms.ChoiceField(choices=[("choose", "choose"), ("confirm", "confirm")], required=False)


class PauseForm(ReasonForm):
    """A pause (kill switch): an agent and/or a tool, in one of the tenants the user operates."""

    tenant = forms.TypedChoiceField(label="Tenant", coerce=int)
    agent = forms.CharField(
        label="Agent",
        required=False,
        max_length=200,
        help_text="Exact name or glob (onboarding-*): the key's name or the agent a run declares.",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )
    tool = forms.CharField(
        label="Tool",
        required=False,
        max_length=200,
        help_text="Exact name or glob (payments.*).",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )

    def __init__(self, *args: Any, tenants: Sequence[Any] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["tenant"]
        assert isinstance(field, forms.TypedChoiceField)
        field.choices = [(t.pk, t.name) for t in tenants]
        if len(tenants) == 1:
            # One tenant to choose from: the form need not ask.
            field.initial, field.required = tenants[0].pk, False

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("tenant") in (None, ""):
            cleaned["tenant"] = self.fields["tenant"].initial
        try:
            cleaned["agent"], cleaned["tool"] = pause_patterns(
                agent=cleaned.get("agent", ""), tool=cleaned.get("tool", "")
            )
        except SagaError as exc:
            raise forms.ValidationError(exc.message) from None
        return cleaned


# --- Notification settings ---------------------------------------------------------------------


class ChannelForm(forms.Form):
    """A notification channel. The destination is checked by the service (the model's rule: e-mail
    addresses, a URL the outbound guard accepts, a PagerDuty routing key); its refusal comes back
    as this form's error."""

    name = forms.CharField(label="Name", max_length=100)
    kind = forms.ChoiceField(label="Kind", choices=NotificationChannel.Kind.choices)
    target = forms.CharField(
        label="Send to",
        max_length=2000,
        required=False,
        help_text=(
            "E-mail: addresses, comma-separated. Webhook, Slack and Teams: the URL. PagerDuty: the "
            "Events API endpoint, blank for the installation's."
        ),
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )
    secret = forms.CharField(
        label="Webhook secret or PagerDuty routing key",
        required=False,
        max_length=500,
        help_text=(
            "Webhooks: leave blank to generate one (shown once) or keep the current one. PagerDuty: "
            "the integration's routing key (blank keeps the current one). Never shown again."
        ),
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )
    events = forms.MultipleChoiceField(
        label="Events",
        required=False,
        choices=[(e, NotificationEvent(e).label) for e in CHANNEL_EVENTS],
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every event.",
    )
    min_risk = forms.ChoiceField(label="Minimum risk", choices=Risk.choices, initial=Risk.LOW)
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)

    def settings(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data["events"] = list(data.get("events") or [])
        return data


class SlackAppForm(forms.Form):
    signing_secret = forms.CharField(
        label="Signing secret",
        max_length=200,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Your Slack app's Signing Secret (Basic Information → App Credentials).",
    )
