"""A policy file's ``audit.retention`` (ledger.policies.retention), read as a hostile tenant admin
would write it: a window of the policy grammar, and a destination at or under one the operator
allows (SAGA_ARCHIVE_ALLOWED_URLS), refused with a clear message otherwise and changing nothing."""

from __future__ import annotations

import pytest

from ledger.archive.destinations import DestinationError, destination_check, destination_parse
from ledger.models import PolicySet
from ledger.policies.errors import PolicyFileError
from tests.factories import load_policy_file

pytestmark = pytest.mark.django_db

ALLOWED = ["file:///srv/saga-archive", "s3://saga-archive/runs"]


@pytest.fixture(autouse=True)
def allowed(settings):
    settings.SAGA = {**settings.SAGA, "ARCHIVE_ALLOWED_URLS": ALLOWED}


def _refused(retention, *, tenant=None, agent_safety: bool = False) -> str:
    data = {"audit": {"retention": retention}}
    before = list(PolicySet.objects.values())
    with pytest.raises(PolicyFileError) as excinfo:
        load_policy_file({"agentSafety": data} if agent_safety else data, tenant=tenant)
    assert list(PolicySet.objects.values()) == before
    return str(excinfo.value)


def test_both_layouts_load_a_retention_per_tenant_and_globally(tenant):
    load_policy_file(
        {"audit": {"retention": {"closed_runs": "90d", "archive": "s3://saga-archive/runs/acme"}}},
        tenant=tenant,
    )
    load_policy_file(
        {
            "agentSafety": {
                "audit": {"retention": {"closedRuns": "15m", "archive": "file:///srv/saga-archive"}}
            }
        }
    )
    assert PolicySet.objects.get(tenant=tenant).audit == {
        "retention": {"closed_runs": "90d", "archive": "s3://saga-archive/runs/acme"}
    }
    assert PolicySet.objects.get(tenant=None).audit == {
        "retention": {"closed_runs": "15m", "archive": "file:///srv/saga-archive"}
    }


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("forever", "must be a duration such as 90d"),
        ("0s", "must be at least 1s"),
        ("500ms", "must be at least 1s"),
        ("-1d", "must be a duration such as 90d"),
        ("99999999d", "must be at most 36500d"),
        (90, "(a string), got int"),
        (True, "(a string), got bool"),
        (None, "(a string), got NoneType"),
        (["90d"], "(a string), got list"),
    ],
)
def test_a_bad_window_is_refused(tenant, window, message):
    text = _refused({"closed_runs": window, "archive": "file:///srv/saga-archive"}, tenant=tenant)
    assert "audit.retention: closed_runs: " in text and message in text


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        ("file:///etc/", "is not at or under a destination the operator allows"),
        ("file:///etc/cron.d", "is not at or under a destination the operator allows"),
        ("file:///srv/saga-archive/../../etc", "no '.' or '..' segments"),
        ("file:///srv/saga-archive/./x", "no '.' or '..' segments"),
        ("file:///srv/saga-archive-other", "is not at or under a destination the operator allows"),
        ("file:///srv/saga-archive/%2e%2e/etc", "percent-encoding"),
        ("file:///srv/saga-archive//x", "empty path segments"),
        ("file:///srv/saga-archive/a\\..\\b", "backslashes"),
        ("file:///srv/saga-archive/a b", "spaces"),
        ("file:///srv/saga-archive?x=1", "query"),
        ("file://evil.example.com/srv/saga-archive", "absolute path"),
        ("file:srv/saga-archive", "must be an s3://bucket/prefix or a file:///absolute/path URL"),
        ("/srv/saga-archive", "must be an s3://bucket/prefix or a file:///absolute/path URL"),
        ("s3://another-bucket/runs", "is not at or under a destination the operator allows"),
        ("s3://saga-archive/other", "is not at or under a destination the operator allows"),
        ("s3://saga-archive/runs/../other", "no '.' or '..' segments"),
        ("s3://Saga_Archive/runs", "is not a valid S3 bucket name"),
        ("https://saga-archive.s3.amazonaws.com/runs", "must be an s3://bucket/prefix"),
        ("s3://saga-archive/" + "x" * 600, "longer than 500"),
        (123, "must be a string URL"),
        (None, "must be a string URL"),
        ({"url": "file:///srv/saga-archive"}, "must be a string URL"),
    ],
)
def test_a_destination_the_operator_does_not_allow_is_refused(tenant, archive, message):
    text = _refused({"closed_runs": "90d", "archive": archive}, tenant=tenant)
    assert "audit.retention: archive: " in text and message in text


def test_the_retention_object_itself_is_checked(tenant):
    assert "audit.retention: must be an object" in _refused(90, tenant=tenant)
    assert "audit.retention: must be an object" in _refused(["90d"], tenant=tenant)
    text = _refused({"closed_runs": "90d"}, tenant=tenant)
    assert "audit.retention: archive: is required" in text
    text = _refused(
        {"closed_runs": "90d", "archive": "file:///srv/saga-archive", "delete": True}, tenant=tenant
    )
    assert "audit.retention: delete: unknown key" in text
    text = _refused({"closedRuns": "0s", "archive": "file:///etc"}, tenant=tenant, agent_safety=True)
    assert "agentSafety.audit.retention: closed_runs: must be at least 1s" in text
    assert "agentSafety.audit.retention: archive: file:///etc is not at or under" in text


def test_without_an_allow_list_no_retention_can_be_configured(tenant, settings):
    settings.SAGA = {**settings.SAGA, "ARCHIVE_ALLOWED_URLS": []}
    text = _refused({"closed_runs": "90d", "archive": "file:///srv/saga-archive"}, tenant=tenant)
    assert (
        "no archive destination is allowed on this installation" in text
        and "SAGA_ARCHIVE_ALLOWED_URLS" in text
    )


def test_destinations_are_compared_segment_by_segment():
    assert destination_check("file:///srv/saga-archive/acme/", ALLOWED).url == "file:///srv/saga-archive/acme"
    assert destination_check("s3://saga-archive/runs", ALLOWED).path == "runs"
    with pytest.raises(DestinationError):
        destination_check("s3://saga-archive/runsx", ALLOWED)
    with pytest.raises(DestinationError, match="root directory"):
        destination_parse("file:///")
    with pytest.raises(DestinationError, match="SAGA_ARCHIVE_ALLOWED_URLS entry"):
        destination_check("file:///srv/x", ["file:///srv/../x"])


def test_the_earlier_bare_string_spelling_is_still_accepted_and_archives_nothing(tenant):
    """agentSafety files said ``"retention": "90d"`` while ``audit`` was only stored: they still
    load (kept as written), and such a retention names no destination, so nothing is archived."""
    from recovery.archive.policy import tenant_retentions

    load_policy_file({"agentSafety": {"audit": {"retention": "400d", "include": ["intent"]}}}, tenant=tenant)
    assert PolicySet.objects.get(tenant=tenant).audit == {"retention": "400d", "include": ["intent"]}
    assert tenant_retentions() == []
