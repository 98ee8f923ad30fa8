"""The recovery queue's one filter (``recovery.selectors.QueueFilter``): validated where it is
built, and built the same way by the dashboard's filter form and the operator API's query."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.forms import QueueFilterForm
from infra import errors
from recovery.selectors import QueueFilter
from saga_admin.api.schemas.queue import ItemFilters


@pytest.mark.parametrize("field", ["status", "reason", "risk"])
def test_an_unknown_value_is_refused_where_the_filter_is_built(field: str) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        QueueFilter(**{field: "nonsense"})  # type: ignore[arg-type]
    assert refused.value.details == {field: "nonsense"}


def test_defaults_are_the_unresolved_items_and_a_search_is_trimmed() -> None:
    assert QueueFilter(status="").status == "unresolved"
    assert QueueFilter(search="  run_123  ").search == "run_123"


def test_the_form_and_the_api_build_the_same_filter() -> None:
    form = QueueFilterForm({"status": "open", "risk": "high", "reason": "agent_lost", "age": "1h"})
    api = ItemFilters.model_validate(
        {"status": "open", "risk": "high", "reason": "agent_lost", "older_than": 60}
    )
    assert (
        form.view().queue_filter
        == api.queue_filter()
        == QueueFilter(status="open", risk="high", reason="agent_lost", older_than=timedelta(hours=1))
    )
