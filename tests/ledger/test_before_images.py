"""Policy ``before`` and ``readers``: what the loader accepts and refuses (each error naming its
key), what it stores, and the image rules every reader of a ``before`` shares."""

from __future__ import annotations

import json
import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from ledger.models import StateReader, ToolPolicy
from ledger.policies.before_images import (
    NoImage,
    differences_sentence,
    image_at,
    image_differences,
    images_equal,
    read_result,
)
from ledger.policies.compensation_args import TemplateUnfillable, compensation_args_fill
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policy_file_parse
from ledger.policies.resolve import policy_resolve

READ = {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"}


def _update(**fields):
    return {
        "tool": "crm.update_contact",
        "risk": "medium",
        "approval": "auto",
        "action_class": "internal_update",
        "compensation": "custom",
        "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
        "compensation_tool": "crm.update_contact",
        "compensation_args": {"id": "$args.id", "email": "$before.email"},
        **fields,
    }


def problems(data) -> list[str]:
    with pytest.raises(PolicyFileError) as excinfo:
        policy_file_parse(data, source="test.json")
    return excinfo.value.problems


def test_a_policy_with_before_and_a_reader_loads_and_is_stored(db, tenant, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "policies": [READ, _update()],
                "readers": {"crm.get_contact": {"mcp": "http://crm.internal/mcp", "tool": "get_contact"}},
            }
        )
    )
    out = StringIO()
    call_command("load_policies", str(path), "--tenant", tenant.slug, stdout=out)
    assert ToolPolicy.objects.get(tool="crm.update_contact").before == {
        "tool": "crm.get_contact",
        "args": {"id": "$args.id"},
        "path": "contact",
    }
    reader = StateReader.objects.get(tool="crm.get_contact")
    assert (reader.kind, reader.url, reader.mcp_tool, reader.tenant) == (
        "mcp",
        "http://crm.internal/mcp",
        "get_contact",
        tenant,
    )
    assert (
        policy_resolve(tenant=tenant, tool="crm.update_contact").as_dict()["before"]["tool"]
        == "crm.get_contact"
    )
    # A policy without before keeps its frozen form as it was.
    assert "before" not in policy_resolve(tenant=tenant, tool="crm.get_contact").as_dict()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"policies": [_update()]},
            'policies[0] (tool "crm.update_contact"): before.tool: no policy in this file names "crm.get_contact"',
        ),
        (
            {"policies": [{**READ, "action_class": "internal_update"}, _update()]},
            'policies[1] (tool "crm.update_contact"): before.tool: "crm.get_contact" is governed by the policy for '
            '"crm.get_contact", whose action_class is internal_update; a read must be read_only',
        ),
        (
            {"policies": [READ, _update(before={"tool": "crm.get_contact", "args": {"id": "$result.id"}})]},
            "before.args.id: '$result.id' cannot be filled before the call",
        ),
        (
            {"policies": [READ, _update(before={"tool": "crm.get_*", "args": {}})]},
            "must be one exact tool name",
        ),
        (
            {"policies": [READ, _update(before={"tool": "crm.get_contact", "path": "a..b"})]},
            "must be a dotted path into the read's result",
        ),
        (
            {"policies": [READ, _update(before={"tool": "crm.get_contact", "extra": 1})]},
            "before.extra",
        ),
        (
            {"policies": [READ, _update(compensation_args={"email": "$befor.email"})]},
            "compensation_args.email: '$befor.email' is not a template",
        ),
        (
            {"policies": [{**READ, "before": {"tool": "crm.get_contact"}}]},
            "before: a read_only tool changes nothing",
        ),
        (
            {"policies": [READ], "readers": {"crm.get_contact": {"mcp": "http://x/mcp"}}},
            "an mcp reader needs the tool to call on that server",
        ),
        (
            {"policies": [READ], "readers": {"crm.get_contact": {"webhook": "http://x/read"}}},
            "a webhook needs exactly one of secret or secret_env",
        ),
        (
            {"policies": [READ], "readers": {"crm.get_contact": {"python": "x.y", "mcp": "http://x/"}}},
            "must have exactly one of webhook, python or mcp",
        ),
    ],
)
def test_the_loader_refuses_bad_before_and_readers_naming_the_key(data, expected):
    assert any(expected in problem for problem in problems(data)), problems(data)


def test_a_read_result_is_structured_content_or_one_json_object_text():
    assert read_result(structured={"a": 1}, texts=["ignored"]) == {"a": 1}
    assert read_result(texts=['{"contact": {"email": "a@b"}}']) == {"contact": {"email": "a@b"}}
    for texts, why in [
        ([], "no text"),
        (["not json"], "not JSON"),
        (["[1, 2]"], "not an object"),
        (['{"a": 1}', '{"b": 2}'], "2 text blocks"),
    ]:
        with pytest.raises(NoImage, match=why):
            read_result(texts=texts)


def test_an_image_is_the_value_at_the_path():
    result = {"contact": {"email": "a@b", "tags": ["x", "y"]}, "empty": None}
    assert image_at(result, "contact") == {"email": "a@b", "tags": ["x", "y"]}
    assert image_at(result, "contact.tags.1") == "y"
    assert image_at(result, None) is result
    with pytest.raises(NoImage, match="no 'contact.phone'"):
        image_at(result, "contact.phone")
    with pytest.raises(NoImage, match="null at 'empty'"):
        image_at(result, "empty")


def test_images_compare_as_json_values():
    assert images_equal({"a": 1, "b": [1, 2.0]}, {"b": [1.0, 2], "a": 1.0})
    assert not images_equal({"a": 1}, {"a": "1"})
    assert not images_equal({"a": True}, {"a": 1})
    assert not images_equal([1, 2], [2, 1])
    assert not images_equal(float("nan"), float("nan"))
    diffs = image_differences({"email": "a@b", "phone": "1"}, {"email": "c@d"})
    assert diffs == [
        {"path": "email", "expected": "a@b", "actual": "c@d"},
        {"path": "phone", "expected": "1", "actual": None, "absent": "actual"},
    ]
    assert differences_sentence(diffs) == 'email is "c@d", not "a@b"; phone is gone'


def test_compensation_args_take_before_and_after():
    template = {"id": "$args.id", "email": "$before.email", "was": "$after", "lit": "$$before"}
    filled = compensation_args_fill(
        template,
        args={"id": 7},
        target_id="",
        target_type="",
        before={"email": "old@x"},
        after={"email": "new@x"},
    )
    assert filled == {"id": 7, "email": "old@x", "was": {"email": "new@x"}, "lit": "$before"}
    with pytest.raises(TemplateUnfillable, match="no before-image"):
        compensation_args_fill(
            template, args={"id": 7}, target_id="", target_type="", before=None, after=None
        )
    # Not known yet (at record time): left as written.
    assert (
        compensation_args_fill(template, args={"id": 7}, target_id="", target_type="")["email"]
        == "$before.email"
    )


VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "clients" / "spec" / "vectors" / "before_images.json").read_text()
)


@pytest.mark.parametrize("case", VECTORS["fill"], ids=lambda c: c["name"])
def test_the_server_fills_before_args_as_the_vectors_say(case):
    from ledger.policies.before_images import before_read_args

    call = {"args": case["args"], "target_id": case["target_id"], "target_type": case["target_type"]}
    if "error" in case:
        with pytest.raises(TemplateUnfillable, match=re.escape(case["error"])):
            before_read_args({"args": case["template"]}, **call)
    else:
        assert before_read_args({"args": case["template"]}, **call) == case["expected"]


@pytest.mark.parametrize("case", VECTORS["result"], ids=lambda c: c["name"])
def test_the_server_reads_results_as_the_vectors_say(case):
    if "error" in case:
        with pytest.raises(NoImage, match=case["error"]):
            read_result(structured=case["structured"], texts=case["texts"])
    else:
        assert read_result(structured=case["structured"], texts=case["texts"]) == case["expected"]


@pytest.mark.parametrize("case", VECTORS["image"], ids=lambda c: c["name"])
def test_the_server_takes_images_as_the_vectors_say(case):
    if "error" in case:
        with pytest.raises(NoImage, match=re.escape(case["error"])):
            image_at(case["result"], case["path"])
    else:
        assert image_at(case["result"], case["path"]) == case["expected"]


@pytest.mark.parametrize("case", VECTORS["equal"], ids=lambda c: c["name"])
def test_the_server_compares_images_as_the_vectors_say(case):
    assert images_equal(case["left"], case["right"]) is case["equal"]
    assert images_equal(case["right"], case["left"]) is case["equal"]
