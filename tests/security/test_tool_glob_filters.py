"""A tool glob the queue cannot match (``[z-a]``, ``[!]``) is a 422 or a form
error on every path that filters the recovery queue by tool, never a 500. Those globs once became
invalid PostgreSQL regular expressions: the operator API's queue list, its bulk preview, the
dashboard's queue and bulk preview answered 500, and a saved filter holding one broke its owner's
landing page (the queue) on every load. One check (``ledger.tool_names.glob_problem``) refuses them
everywhere, and ``glob_regex`` only ever hands the database a valid expression."""

from __future__ import annotations

import fnmatch
import string

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dashboard.models import SavedFilter
from ledger.tool_names import glob_regex, is_tool_glob, tool_name_problem
from recovery.bulk.models import BulkOperation
from tests.recovery.bulk_support import crm_policies, failing_runs
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db

QUEUE = reverse("dashboard:queue")
PREVIEW = reverse("dashboard:bulk-preview")
BAD_GLOBS = ["[z-a]", "[!]", "crm.[9-0]*", "crm.[", "crm.]x", "[!a-zA-Z0-9_.:/-]"]


@pytest.fixture
def crm_items(tenant, agent):
    crm_policies()
    return failing_runs(tenant, agent, 2)


@pytest.mark.parametrize("tool", BAD_GLOBS)
def test_the_api_queue_and_bulk_preview_answer_422_for_a_glob_the_queue_cannot_match(
    operator_key, crm_items, tool
):
    operator = Api(operator_key[1])
    response = operator.get("/recovery", {"tool": tool})
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] == "invalid_request"
    response = operator.post(
        "/recovery/bulk",
        {"filter": {"tool": tool}, "action": "close", "reason": "upstream broke", "preview": True},
    )
    assert response.status_code == 422, response.content
    assert not BulkOperation.objects.exists()


@pytest.mark.parametrize("tool", BAD_GLOBS)
def test_the_dashboard_queue_shows_the_glob_as_a_form_error(client, alice, crm_items, tool):
    client.force_login(alice)
    response = client.get(QUEUE, {"tool": tool})
    assert response.status_code == 200
    assert 'class="field-error">The tool ' in response.content.decode()


def test_a_dashboard_bulk_on_such_a_glob_is_refused_not_widened(client, alice, crm_items):
    client.force_login(alice)
    response = client.get(PREVIEW, {"tool": "[z-a]", "reason": "failed"})
    assert response.status_code == 303
    assert response["Location"].startswith(QUEUE + "?")
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert said and said[-1].startswith(
        "Correct the filter before deciding in bulk: The tool has the range z-a"
    )
    response = client.post(
        f"{PREVIEW}?tool=%5Bz-a%5D&reason=failed", {"action": "close", "reason": "x", "expected_count": 2}
    )
    assert response.status_code == 303
    assert not BulkOperation.objects.exists()


def test_a_saved_filter_stored_with_such_a_glob_does_not_break_the_landing_page(client, alice, crm_items):
    # Saved before the check existed (the form of the time accepted it).
    SavedFilter.objects.create(user=alice, name="Broken", query="tool=%5Bz-a%5D&reason=failed")
    SavedFilter.objects.create(user=alice, name="Fine", query="tool=crm.update_%2A")
    client.force_login(alice)
    response = client.get(QUEUE)
    assert response.status_code == 200
    page = response.content.decode()
    assert f'href="{QUEUE}?reason=failed"' in page  # the link without the glob
    assert "ignoring what the queue no longer accepts: tool" in page
    assert 'aria-label="2 matching">2</span>' in page  # the good one, counted


_ALPHABET = string.ascii_letters[:6] + "XYZ09_.:/-*?[]!"
_NAMES = ["crm.update", "a", "b-1", "Z", "0", "x:y/z", "_", "crm.a9", "-", "ab.cd"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ALPHABET, min_size=1, max_size=8))
@example("[f-a]")
@example("[!]")
@example("[!]a]x")
def test_every_glob_becomes_a_valid_expression_and_an_accepted_one_matches_as_fnmatch(glob):
    assert is_tool_glob(glob)
    regex = glob_regex(glob)
    with connection.cursor() as cursor:
        # Raises for an invalid expression: whatever the glob, accepted or not, there is none.
        cursor.execute("SELECT name, name ~ %s FROM unnest(%s::text[]) AS name", [regex, _NAMES])
        matched = dict(cursor.fetchall())
    if not tool_name_problem(glob, glob=True):
        assert matched == {name: fnmatch.fnmatchcase(name, glob) for name in _NAMES}, regex
