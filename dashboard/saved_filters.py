"""Saved queue filters: an operator names the queue's current filter for themselves and finds it
again as a link, with how many items it matches now. Each user sees, renames and deletes only their
own (another's is not found).

What is stored is the queue's query string, read through the queue's filter form on save (values
the queue does not know are refused, and it is stored as the form reads it) and again on every use:
the link opens the queue, which validates its query like any other; the count reads it through the
same form. Whatever fields the filter has — including ones added after a filter was saved — come
along, since the form, not this module, knows them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.http import QueryDict
from django.utils.http import urlencode

from dashboard.forms import QueueFilterForm
from dashboard.models import SavedFilter
from dashboard.selectors import queue as queue_selectors
from infra import errors

MAX_PER_USER = 50
# The queue's own paging and polling parameters: where the list was, not what it filters.
_NOT_FILTERS = ("cursor", "since")


def _name(value: str) -> str:
    name = " ".join(str(value).split())
    if not name:
        raise errors.ValidationFailed("Give the filter a name.", details={"name": "required"})
    if len(name) > SavedFilter.NAME_MAX_LENGTH:
        raise errors.ValidationFailed(
            f"A filter's name is at most {SavedFilter.NAME_MAX_LENGTH} characters.",
            details={"name": "too_long", "max_length": SavedFilter.NAME_MAX_LENGTH},
        )
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise errors.ValidationFailed(
            "A filter's name is plain text: no control or formatting characters.",
            details={"name": "control_characters"},
        )
    return name


def queue_form(query: str, *, tenants: Sequence[Any]) -> QueueFilterForm:
    """The queue's filter form over ``query`` (a stored or submitted query string)."""
    data = QueryDict(query[: SavedFilter.QUERY_MAX_LENGTH], mutable=True)
    for name in _NOT_FILTERS:
        data.pop(name, None)
    return QueueFilterForm(data, tenants=tenants)


def _query(query: str, *, tenants: Sequence[Any]) -> str:
    if len(query) > SavedFilter.QUERY_MAX_LENGTH:
        raise errors.ValidationFailed(
            f"This filter is too long to save (at most {SavedFilter.QUERY_MAX_LENGTH} characters).",
            details={"query": "too_long"},
        )
    form = queue_form(query, tenants=tenants)
    if not form.is_valid():
        fields = ", ".join(sorted(form.errors))
        raise errors.ValidationFailed(
            f"The filter has values the queue does not accept ({fields}); apply a filter, then save it.",
            details={"query": sorted(form.errors)},
        )
    normalised = urlencode(form.view().as_query())
    if not normalised:
        raise errors.ValidationFailed(
            "There is no filter to save: the queue shows everything unresolved. Choose a filter first.",
            details={"query": "empty"},
        )
    return normalised


@transaction.atomic
def saved_filter_create(*, user: Any, name: str, query: str, tenants: Sequence[Any]) -> SavedFilter:
    """Save ``query`` (the queue's current query string) as ``name`` for ``user``. A name the user
    already uses, a name empty or too long, a filter the queue does not accept, or more than
    MAX_PER_USER filters → ``ValidationFailed``; nothing is saved."""
    name = _name(name)
    normalised = _query(query, tenants=tenants)
    # The user's row lock serialises two tabs saving at once against the per-user bound.
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    if SavedFilter.objects.filter(user=user).count() >= MAX_PER_USER:
        raise errors.ValidationFailed(
            f"You have {MAX_PER_USER} saved filters, the most there can be; delete one first.",
            details={"saved_filters": "too_many", "max": MAX_PER_USER},
        )
    try:
        with transaction.atomic():
            return SavedFilter.objects.create(user=user, name=name, query=normalised)
    except IntegrityError:
        raise _taken(name) from None


def _taken(name: str) -> errors.ValidationFailed:
    return errors.ValidationFailed(
        f"You already have a filter called “{name}”; choose another name.", details={"name": "taken"}
    )


def saved_filter_get(*, user: Any, pk: Any) -> SavedFilter:
    """The user's own saved filter; another user's, or none, is the same 404."""
    saved = SavedFilter.objects.filter(pk=pk, user=user).first() if str(pk).isdigit() else None
    if saved is None:
        raise errors.NotFound.for_id("Saved filter", str(pk))
    return saved


@transaction.atomic
def saved_filter_rename(*, saved: SavedFilter, name: str) -> SavedFilter:
    name = _name(name)
    try:
        with transaction.atomic():
            SavedFilter.objects.filter(pk=saved.pk).update(name=name)
    except IntegrityError:
        raise _taken(name) from None
    saved.name = name
    return saved


def saved_filter_delete(*, saved: SavedFilter) -> None:
    SavedFilter.objects.filter(pk=saved.pk).delete()


@dataclass(frozen=True)
class SavedFilterLink:
    saved: SavedFilter
    query: str  # as the queue's form reads it now
    count: int
    capped: bool
    current: bool
    # The stored filter's fields the queue no longer accepts (a tool glob saved before globs'
    # classes were checked, a retired value): left out of the link and its count, and said so.
    ignored: str = ""


def saved_filter_links(*, user: Any, tenants: Sequence[Any], current_query: str) -> list[SavedFilterLink]:
    """The user's saved filters, by name, each read through the queue's form again and counted
    now (one statement for all of them: ``queue_selectors.queue_counts``)."""
    saved = list(SavedFilter.objects.filter(user=user).order_by("name", "id")[:MAX_PER_USER])
    forms = {s.pk: queue_form(s.query, tenants=tenants) for s in saved}
    views = {pk: form.view() for pk, form in forms.items()}
    counts = queue_selectors.queue_counts(user=user, views=views)
    links = []
    for s in saved:
        query = urlencode(views[s.pk].as_query())
        count = counts.get(s.pk, 0)
        links.append(
            SavedFilterLink(
                saved=s,
                query=query,
                count=min(count, queue_selectors.COUNT_CAP),
                capped=count > queue_selectors.COUNT_CAP,
                current=bool(query) and query == current_query,
                # Field names only: a stored value is shown by the queue's form, escaped, on use.
                ignored=", ".join(sorted(forms[s.pk].errors)),
            )
        )
    return links
