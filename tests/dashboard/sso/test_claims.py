"""A claim's values → tenant and role, read as hostile input: what is not ours is passed over,
what is ours but malformed is ignored with a log line, and nothing grants more than it names."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from dashboard.sso.claims import MAX_VALUE_CHARS, MAX_VALUES, roles_from_claim


def _roles(value: object, prefix: str = "saga") -> dict[str, str]:
    return roles_from_claim(value, prefix=prefix, claim="groups")


def test_it_maps_tenant_and_role():
    assert _roles(["saga:acme:approver", "saga:globex:viewer"]) == {"acme": "approver", "globex": "viewer"}


def test_it_passes_over_other_applications_groups_silently():
    with capture_logs() as logs:
        assert _roles(["Domain Users", "jira:acme:admin", "sagas:acme:admin", "SAGA:acme:admin"]) == {}
    assert logs == []


def test_it_reads_a_lone_string_as_one_value():
    assert _roles("saga:acme:operator") == {"acme": "operator"}


def test_an_absent_claim_grants_nothing():
    assert _roles(None) == {}
    assert _roles([]) == {}


@pytest.mark.parametrize("value", [{"saga:acme:admin": True}, 42, True, 1.5])
def test_a_claim_that_is_not_a_list_grants_nothing(value):
    with capture_logs() as logs:
        assert _roles(value) == {}
    assert [entry["event"] for entry in logs] == ["sso.claim_ignored"]


def test_nested_and_non_string_values_are_ignored_with_a_log_line():
    with capture_logs() as logs:
        roles = _roles([["saga:acme:admin"], {"saga": "x"}, None, 7, "saga:acme:viewer"])
    assert roles == {"acme": "viewer"}
    assert [entry["event"] for entry in logs] == ["sso.claim_value_ignored"] * 4


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("saga:acme", "not prefix:tenant:role"),
        ("saga:acme:approver:extra", "not prefix:tenant:role"),
        ("saga::admin", "not a tenant slug"),
        ("saga:ac me:admin", "not a tenant slug"),
        ("saga:acme/../globex:admin", "not a tenant slug"),
        ("saga:acmé:admin", "not a tenant slug"),
        ("saga:acme\n:admin", "not a tenant slug"),
        ("saga:" + "a" * 65 + ":admin", "not a tenant slug"),
        ("saga:acme:superuser", "unknown role"),
        ("saga:acme:Admin", "unknown role"),
        ("saga:acme:", "unknown role"),
    ],
)
def test_malformed_values_of_ours_are_ignored_with_a_log_line(value, reason):
    with capture_logs() as logs:
        assert _roles([value, "saga:globex:viewer"]) == {"globex": "viewer"}
    assert len(logs) == 1
    assert logs[0]["event"] == "sso.claim_value_ignored"
    assert logs[0]["reason"].startswith(reason)


def test_a_very_long_value_is_not_parsed_nor_logged_whole():
    long_value = "saga:acme:admin" + "x" * 10_000
    with capture_logs() as logs:
        assert _roles([long_value, "saga:" + "a" * MAX_VALUE_CHARS + ":admin"]) == {}
    assert len(logs) == 2
    assert all("x" * 100 not in repr(entry) for entry in logs)


def test_it_reads_at_most_max_values():
    values = [f"other-group-{n}" for n in range(MAX_VALUES)] + ["saga:acme:admin"]
    with capture_logs() as logs:
        assert _roles(values) == {}
    assert [entry["event"] for entry in logs] == ["sso.claim_truncated"]


def test_several_roles_for_one_tenant_give_the_one_latest_in_order():
    with capture_logs() as logs:
        assert _roles(["saga:acme:admin", "saga:acme:viewer"]) == {"acme": "admin"}
        assert _roles(["saga:acme:operator", "saga:acme:approver"]) == {"acme": "approver"}
    assert {entry["event"] for entry in logs} == {"sso.claim_roles_conflict"}
    assert _roles(["saga:acme:viewer", "saga:acme:viewer"]) == {"acme": "viewer"}


def test_the_prefix_is_configurable():
    assert _roles(["saga:acme:admin", "saga-prod:acme:viewer"], prefix="saga-prod") == {"acme": "viewer"}


@pytest.mark.parametrize(
    "slug", ["a" * 64, "a" * 65, "ac-me_1", "ac.me", "ACME", "acme\n", "ac me", "acmé", ""]
)
def test_a_claim_names_exactly_the_slugs_a_tenant_can_have(slug):
    from django.core.exceptions import ValidationError

    from ledger.models import Tenant

    try:
        Tenant._meta.get_field("slug").clean(slug, None)
        allowed = True
    except ValidationError:
        allowed = False
    assert bool(_roles([f"saga:{slug}:viewer"])) is allowed


def test_the_role_order_is_the_memberships():
    from dashboard.sso.claims import ROLE_ORDER
    from ledger.models import Membership

    assert ROLE_ORDER == ["viewer", "operator", "approver", "admin"] == list(Membership.Role.values)
