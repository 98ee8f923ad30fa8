"""What a policy file's author and an agent are told about before-images: the load-time warnings
(templates no read fills, a read with no reader, a template path the tool's recorded results lack)
and the record's ``before_image_missing`` warning. Real database, the real loader and recorder."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.policies.before_checks import RECENT_RESULTS, before_warnings
from ledger.policies.load import policy_load_warnings
from tests.factories import load_policy_file, make_run, new_run, perform_action, record
from tests.support.api import Api

pytestmark = pytest.mark.django_db

READ = {"tool": "inv.get_item", "risk": "low", "approval": "auto", "action_class": "read_only"}
BEFORE = {"tool": "inv.get_item", "args": {"id": "$args.item"}, "path": "item"}
READER = {"inv.get_item": {"python": "inventory.readers.get_item"}}


def _set_price(**fields):
    return {
        "tool": "inv.set_price",
        "risk": "low",
        "approval": "auto",
        "action_class": "internal_update",
        "compensation": "custom",
        "compensation_tool": "inv.set_price",
        "compensation_args": {"item": "$args.item", "price": "$before.price"},
        "before": BEFORE,
        **fields,
    }


def _undo_policy():
    return {"tool": "inv.undo", "risk": "low", "approval": "auto", "action_class": "internal_update"}


def _codes(tenant):
    return [(w.code, w.policy) for w in before_warnings(tenant=tenant)]


def test_image_templates_without_a_before_read_are_a_warning_naming_each_key(tenant):
    policy = _set_price(compensation_args={"item": "$args.item", "price": "$before.price", "was": "$after"})
    del policy["before"]
    report = load_policy_file({"policies": [policy]}, tenant=tenant)
    [warning] = [w for w in report.warnings if "before- or after-image" in w]
    assert warning.startswith(
        "policy inv.set_price: compensation_args.price ($before.price), compensation_args.was ($after)"
    )
    assert 'has no "before" read' in warning and "saga-mcp" in warning
    assert _codes(tenant) == [("before_missing", "inv.set_price")]


def test_a_before_read_without_a_reader_is_a_warning_naming_both_and_a_reader_silences_it(tenant):
    report = load_policy_file({"policies": [READ, _set_price()]}, tenant=tenant)
    [warning] = [w for w in report.warnings if "has no reader" in w]
    assert "policy inv.set_price" in warning and "inv.get_item" in warning
    assert "drift" in warning and "verify" in warning

    report = load_policy_file({"policies": [READ, _set_price()], "readers": READER}, tenant=tenant)
    assert not [w for w in report.warnings if "has no reader" in w]
    assert _codes(tenant) == []


def test_a_global_reader_serves_a_tenants_policy(tenant):
    load_policy_file({"policies": [], "readers": READER})
    load_policy_file({"policies": [READ, _set_price()]}, tenant=tenant)
    assert _codes(tenant) == []
    # The global scope alone has no policy naming the read, so nothing to warn about there.
    assert before_warnings(tenant=None) == []


def test_load_policies_prints_the_warnings(tenant, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"policies": [READ, _set_price()]}))
    err = StringIO()
    call_command("load_policies", str(path), "--tenant", tenant.slug, stdout=StringIO(), stderr=err)
    assert "Warning: policy inv.set_price: its before read inv.get_item has no reader" in err.getvalue()


def test_a_result_template_whose_path_the_tools_results_lack_is_warned_about(tenant, agent):
    policy = _set_price(compensation_args={"item": "$args.item", "price": "$result.previous_price"})
    del policy["before"]
    load_policy_file({"policies": [policy]}, tenant=tenant)
    assert _codes(tenant) == []  # nothing recorded yet: nothing is known
    run = make_run(tenant, agent)
    for n in range(3):
        perform_action(
            run, agent, "inv.set_price", target_id=f"i{n}", args={"item": f"i{n}"}, result={"ok": True}
        )
    [warning] = [w.message for w in before_warnings(tenant=tenant)]
    assert warning.startswith(
        "policy inv.set_price: compensation_args.price ($result.previous_price): the last 3 results of "
        "inv.set_price have no 'previous_price'"
    )
    # Once the tool returns it, some lack it still: counted.
    perform_action(
        run, agent, "inv.set_price", target_id="i9", args={"item": "i9"}, result={"previous_price": 2}
    )
    [warning] = [w.message for w in before_warnings(tenant=tenant)]
    assert "3 of the last 4 results of inv.set_price have no 'previous_price'" in warning
    # The check reads a bounded window, one query for the policy.
    with CaptureQueriesContext(connection) as queries:
        before_warnings(tenant=tenant)
    window = [q["sql"] for q in queries.captured_queries if "#>" in q["sql"]]
    assert len(window) == 1 and f"LIMIT {RECENT_RESULTS}" in window[0]


def test_every_result_having_the_path_is_no_warning(tenant, agent):
    policy = _set_price(compensation_args={"item": "$args.item", "price": "$result.item.price"})
    del policy["before"]
    load_policy_file({"policies": [policy]}, tenant=tenant)
    run = make_run(tenant, agent)
    perform_action(
        run, agent, "inv.set_price", target_id="a", args={"item": "a"}, result={"item": {"price": 0}}
    )
    perform_action(
        run, agent, "inv.set_price", target_id="b", args={"item": "b"}, result={"item": {"price": None}}
    )
    assert _codes(tenant) == []
    # Another tenant's results are not this tenant's tool's.
    assert before_warnings(tenant=None) == []


def test_a_before_template_whose_path_the_before_images_lack_is_warned_about(tenant, agent):
    load_policy_file({"policies": [READ, _set_price()], "readers": READER}, tenant=tenant)
    run = make_run(tenant, agent)
    perform_action(run, agent, "inv.set_price", target_id="a", args={"item": "a"}, before={"cost": 1})
    perform_action(run, agent, "inv.set_price", target_id="b", args={"item": "b"}, before={"price": 1})
    # Recorded without an image: not counted here (its record was warned).
    perform_action(run, agent, "inv.set_price", target_id="c", args={"item": "c"})
    [warning] = [w.message for w in before_warnings(tenant=tenant)]
    assert "($before.price): 1 of the last 2 before-images of inv.set_price has no 'price'" in warning
    assert warning in policy_load_warnings(tenant=tenant)


def test_a_glob_policy_is_not_checked_against_the_ledger(tenant, agent):
    policy = _set_price(tool="inv.set_*", compensation_args={"price": "$result.previous_price"})
    del policy["before"]
    load_policy_file({"policies": [policy]}, tenant=tenant)
    run = make_run(tenant, agent)
    perform_action(run, agent, "inv.set_price", target_id="a", args={"item": "a"})
    assert _codes(tenant) == []


# --- The record's warning ------------------------------------------------------------------------


def test_a_record_without_the_before_image_its_policy_takes_is_warned(tenant, agent):
    load_policy_file({"policies": [READ, _set_price()], "readers": READER}, tenant=tenant)
    run = make_run(tenant, agent)
    action = record(run, agent, "k-1", tool="inv.set_price", args={"item": "a"})
    [warning] = [w for w in action.warnings if w["code"] == "before_image_missing"]
    assert warning["read"] == "inv.get_item"
    assert "inv.set_price" in warning["message"] and "cannot restore the value exactly" in warning["message"]
    # Stored with the action, and a replay answers the same.
    action.refresh_from_db()
    assert [w["code"] for w in action.warnings] == ["before_image_missing"]
    replay = record(run, agent, "k-1", tool="inv.set_price", args={"item": "a"})
    assert [w["code"] for w in replay.warnings] == ["before_image_missing"]


def test_a_record_with_its_before_image_or_a_policy_without_before_is_not_warned(tenant, agent):
    policy = _set_price()
    load_policy_file({"policies": [READ, policy, _undo_policy()], "readers": READER}, tenant=tenant)
    run = make_run(tenant, agent)
    imaged = record(run, agent, "k-1", tool="inv.set_price", args={"item": "a"}, before_snapshot={"price": 3})
    assert imaged.warnings == []
    plain = record(run, agent, "k-2", tool="inv.undo", args={"item": "a"})
    assert "before_image_missing" not in [w["code"] for w in plain.warnings]


def test_the_record_warning_is_on_the_api_answer(tenant, agent_key):
    load_policy_file({"policies": [READ, _set_price()], "readers": READER}, tenant=tenant)
    api = Api(agent_key[1])
    run = new_run(api)
    body = {"tool": "inv.set_price", "target_id": "a", "args": {"item": "a", "price": 9}}
    blind = api.post(f"/runs/{run['id']}/actions", {**body, "idempotency_key": "blind"})
    assert blind.status_code == 201, blind.content
    assert [w["code"] for w in blind.json()["warnings"]] == ["before_image_missing"]
    imaged = api.post(
        f"/runs/{run['id']}/actions", {**body, "idempotency_key": "imaged", "before_snapshot": {"price": 3}}
    )
    assert imaged.status_code == 201 and imaged.json()["warnings"] == []


def test_a_global_policy_is_checked_against_every_tenants_newest_results(tenant, other_tenant, agent):
    """The global scope's check reads each tenant's newest results through the (tenant, tool,
    -created_at) index, in one query, and judges the newest of all of them."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create

    policy = _set_price(compensation_args={"item": "$args.item", "price": "$result.previous_price"})
    del policy["before"]
    load_policy_file({"policies": [policy]}, tenant=None)
    other = Actor.for_key(
        agent_key_create(
            tenant=other_tenant, name="globex-agent", scopes=["agent"], actor=Actor.system("t")
        ).key
    )
    perform_action(
        make_run(tenant, agent), agent, "inv.set_price", target_id="a", args={"item": "a"}, result={}
    )
    perform_action(
        make_run(other_tenant, other),
        other,
        "inv.set_price",
        target_id="b",
        args={"item": "b"},
        result={"previous_price": 1},
    )
    with CaptureQueriesContext(connection) as queries:
        [warning] = [w.message for w in before_warnings(tenant=None)]
    assert "1 of the last 2 results of inv.set_price has no 'previous_price'" in warning
    window = [q["sql"] for q in queries.captured_queries if "#>" in q["sql"]]
    assert len(window) == 1 and "UNION ALL" in window[0]
