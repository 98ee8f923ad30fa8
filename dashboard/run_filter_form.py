"""The Runs page's filter bar: it parses what the query string holds (text, a status, a tool, two
times) and builds the one ``ledger.run_filter.RunFilter``, whose own validation speaks for every
field; whatever is wrong comes back as sentences for the page, never as a 500."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms

from infra.errors import SagaError
from ledger.models import Run
from ledger.run_filter import AGENT_MAX_LENGTH, SEARCH_MAX_LENGTH, RunFilter

# The browser's datetime-local value ("2026-11-05T14:30", seconds optional) or a plain date; read
# in the server's time zone (UTC), which the labels say.
_TIME_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]
_TIME_ERROR = "Enter a date and time like 2026-11-05T14:30 (UTC)."
ECHO_MAX_LENGTH = 2 * SEARCH_MAX_LENGTH


class RunFilterForm(forms.Form):
    q = forms.CharField(
        label="Run, action or target id, or text",
        required=False,
        # The filter's own limit says what is wrong with a longer one; the form only stops a
        # megabyte before it is stripped and searched.
        max_length=SEARCH_MAX_LENGTH * 4,
        widget=forms.TextInput(
            attrs={"type": "search", "placeholder": "run_…, act_…, external or target id, request text…"}
        ),
    )
    # Selects rendered from choices but parsed as text: a value that is not among the choices is
    # the filter's to refuse (a tenant the user does not see simply matches nothing), and its
    # message never echoes what was sent.
    tenant = forms.CharField(label="Tenant", required=False, max_length=200, widget=forms.Select)
    agent = forms.CharField(
        label="Agent",
        required=False,
        max_length=AGENT_MAX_LENGTH * 4,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )
    status = forms.CharField(
        label="Status",
        required=False,
        max_length=200,
        widget=forms.Select(choices=[("", "Any status"), *Run.Status.choices]),
    )
    tool = forms.CharField(
        label="Tool",
        required=False,
        max_length=1000,
        widget=forms.TextInput(
            attrs={"autocomplete": "off", "spellcheck": "false", "placeholder": "crm.update_*"}
        ),
    )
    after = forms.DateTimeField(
        label="Started after (UTC)",
        required=False,
        input_formats=_TIME_FORMATS,
        error_messages={"invalid": _TIME_ERROR},
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    before = forms.DateTimeField(
        label="Started before (UTC)",
        required=False,
        input_formats=_TIME_FORMATS,
        error_messages={"invalid": _TIME_ERROR},
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, *args: Any, tenants: Sequence[Any] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        widget = self.fields["tenant"].widget
        assert isinstance(widget, forms.Select)
        widget.choices = [("", "All tenants")] + [(t.slug, t.name) for t in tenants]

    def run_filter(self) -> tuple[RunFilter, list[str]]:
        """The filter the fields describe, and what is wrong with them (a sentence each). With
        anything wrong the filter is the empty one and the page lists nothing: a list that quietly
        dropped a filter would look like an answer to it."""
        if not self.is_valid():
            # The bar shows what was typed back, except what no field takes anyway: a megabyte
            # sent in a link is not echoed into the page.
            shown = {name: self.data.get(name, "") for name in self.fields}
            self.data = {
                name: "" if name in self.errors and len(str(value)) > ECHO_MAX_LENGTH else value
                for name, value in shown.items()
            }
            problems = [
                f"{self.fields[name].label}: {error}" if name in self.fields else str(error)
                for name, errors in self.errors.items()
                for error in errors
            ]
            return RunFilter(), problems
        data = self.cleaned_data
        try:
            built = RunFilter(
                tenant_slug=data["tenant"] or "",
                agent=data["agent"] or "",
                status=data["status"] or "",
                tool=data["tool"] or "",
                started_after=data["after"],
                started_before=data["before"],
                search=data["q"] or "",
            )
        except SagaError as exc:
            return RunFilter(), [exc.message]
        return built, []
