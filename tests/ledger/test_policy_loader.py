"""manage.py load_policies: both layouts, atomic, idempotent, precise errors."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from infra.durations import parse_duration
from ledger.models import Compensator, Event, PolicySet, ToolPolicy
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policy_file_parse
from ledger.policies.resolve import policy_resolve, policy_settings_for

FIXTURES = Path(__file__).parent / "fixtures"
NATIVE = str(FIXTURES / "policies_native.json")
AGENT_SAFETY = str(FIXTURES / "policies_agent_safety.json")
BAD = str(FIXTURES / "policies_bad.json")


def load(*args: str) -> str:
    out = StringIO()
    call_command("load_policies", *args, stdout=out)
    return out.getvalue()


def snapshot() -> list[tuple]:
    """Every policy row with its loaded_at: "changes nothing" means this is identical."""
    return (
        list(PolicySet.objects.order_by("pk").values_list())
        + list(ToolPolicy.objects.order_by("pk").values_list())
        + list(Compensator.objects.order_by("pk").values_list())
    )


def test_it_loads_the_native_layout(db, tenant):
    out = load(NATIVE)
    assert "6 created, 0 updated, 0 unchanged" in out
    charge = ToolPolicy.objects.get(tool="payments.charge")
    assert (
        charge.tenant,
        charge.risk,
        charge.approval,
        charge.action_class,
        charge.compensation,
        charge.source,
    ) == (None, "critical", "manual", "external_irreversible", "correction", NATIVE)
    assert ToolPolicy.objects.get(tool="hr.create_user").compensation_tool == "hr.delete_user"
    hr = Compensator.objects.get(tool="hr.delete_user")
    assert (hr.kind, hr.url, hr.secret_env, hr.secret) == (
        "webhook",
        "https://hr.internal/saga/delete_user",
        "HR_SAGA_SECRET",
        "",
    )
    lic = Compensator.objects.get(tool="workspace.cancel_license")
    assert (lic.kind, lic.python_path, lic.reader_path) == (
        "python",
        "some.module.cancel_license",
        "some.module.read_license",
    )
    settings = policy_settings_for(tenant)
    assert settings.auto_compensate == {"max_risk": "low"}
    assert settings.unwind == {
        "on_compensation_failure": "alert_and_continue",
        "step_timeout_s": 30,
        "max_attempts": 5,
    }
    assert policy_resolve(tenant=tenant, tool="crm.update_contact").compensation == "snapshot"


def test_it_loads_the_agent_safety_layout(db, tenant):
    out = load(AGENT_SAFETY)
    assert "(agentSafety layout)" in out and "5 created" in out
    rows = {
        p.tool: (p.risk, p.approval, p.action_class, p.compensation, p.compensation_tool)
        for p in ToolPolicy.objects.all()
    }
    assert rows == {
        "github.delete_repository": ("critical", "manual", "external_irreversible", "none", ""),
        "crm.update_contact": ("medium", "auto", "internal_update", "snapshot", ""),
        "email.send_notification": ("high", "auto", "external_irreversible", "correction", ""),
        "slack.post_message": ("low", "auto", "external_reversible", "custom", "slack.delete_message"),
    }
    policy_set = PolicySet.objects.get(tenant=None)
    assert policy_set.unwind == {"on_compensation_failure": "alert_and_continue", "step_timeout_s": 120}
    assert policy_set.audit == {"captureIntent": True, "captureSnapshot": True, "retention": "90d"}


@pytest.mark.parametrize("path", [NATIVE, AGENT_SAFETY])
def test_it_changes_nothing_when_the_same_file_is_loaded_twice(db, tenant, path):
    load(path, "--tenant", tenant.slug)
    before, events, stamp = snapshot(), Event.objects.count(), policy_stamp()
    out = load(path, "--tenant", tenant.slug)
    assert "0 created, 0 updated" in out and "Nothing changed." in out
    assert snapshot() == before
    assert Event.objects.count() == events
    # Nor does the policy stamp move: every process keeps its cached policies.
    assert policy_stamp() == stamp


def policy_stamp() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT version FROM ledger_policystamp WHERE id = 1")
        return int(cursor.fetchone()[0])


def test_it_replaces_the_scope_and_says_what_it_removed(db):
    load(NATIVE)
    out = load(AGENT_SAFETY)
    assert "1 updated" in out  # the policy set
    assert "Removed 5 no longer in the file" in out
    assert "policy payments.charge" in out and "compensator hr.delete_user" in out
    assert not ToolPolicy.objects.filter(tool="payments.charge").exists()
    assert not Compensator.objects.exists()


def test_it_loads_a_tenant_scope_without_touching_the_global_one(db, tenant, other_tenant):
    load(NATIVE)
    global_rows = snapshot()
    load(AGENT_SAFETY, "--tenant", tenant.slug)
    assert ToolPolicy.objects.filter(tenant=tenant).count() == 4
    assert policy_resolve(tenant=tenant, tool="crm.update_contact").scope == "tenant"
    assert policy_resolve(tenant=other_tenant, tool="crm.update_contact").scope == "global"
    # The tenant file has no default_policy, so the global default still applies to it.
    assert policy_settings_for(tenant).default_policy["action_class"] == "external_irreversible"
    assert [row for row in snapshot() if row in global_rows] == global_rows


def test_it_audits_a_tenant_load_once_per_change(db, tenant):
    load(NATIVE, "--tenant", tenant.slug)
    event = Event.objects.get(kind="policies.loaded")
    assert (event.tenant, event.subject_type, event.actor_type, event.actor_label) == (
        tenant,
        "policyset",
        "system",
        "load_policies",
    )
    assert event.data["created"] and event.data["source"] == NATIVE


def test_it_refuses_an_unknown_tenant(db):
    with pytest.raises(CommandError, match="Tenant 'nope' does not exist"):
        load(NATIVE, "--tenant", "nope")
    assert not PolicySet.objects.exists()


def test_it_changes_nothing_and_names_the_bad_entry_when_a_file_is_bad(db):
    load(NATIVE)
    before = snapshot()
    with pytest.raises(CommandError) as excinfo:
        load(BAD)
    message = str(excinfo.value)
    assert "nothing was changed" in message
    assert 'policies[2] (tool "payments.charge"): risk: must be one of low, medium, high, critical' in message
    assert snapshot() == before


def test_it_exits_non_zero_on_a_bad_file(db, capsys):
    from django.core.management import execute_from_command_line

    with pytest.raises(SystemExit) as excinfo:
        execute_from_command_line(["manage.py", "load_policies", BAD])
    assert excinfo.value.code == 1
    assert "risk: must be one of" in capsys.readouterr().err


def problems(data) -> list[str]:
    with pytest.raises(PolicyFileError) as excinfo:
        policy_file_parse(data, source="test.json")
    return excinfo.value.problems


def _policy(**fields):
    return {
        "tool": "hr.create_user",
        "risk": "low",
        "approval": "auto",
        "action_class": "internal_update",
        **fields,
    }


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"policies": [_policy(approval="sometimes")]},
            'policies[0] (tool "hr.create_user"): approval: must be one of auto, manual',
        ),
        (
            {"policies": [_policy(action_class="mostly_harmless")]},
            'policies[0] (tool "hr.create_user"): action_class: must be one of read_only, draft_only, internal_update, '
            "external_reversible, external_irreversible",
        ),
        (
            {"policies": [_policy(compensation="undo")]},
            'policies[0] (tool "hr.create_user"): compensation: must be one of custom, snapshot, correction, none',
        ),
        (
            {"policies": [_policy(risk="HIGH")]},  # the native layout is strict about case
            'policies[0] (tool "hr.create_user"): risk: must be one of low, medium, high, critical',
        ),
        (
            {"policies": [_policy(aproval="auto")]},
            'policies[0] (tool "hr.create_user"): aproval: unknown key',
        ),
        (
            {"policies": [{"tool": "hr.x", "risk": "low", "approval": "auto"}]},
            'policies[0] (tool "hr.x"): action_class: is required',
        ),
        ({"policies": [_policy(tool="*")]}, "matches every tool; use default_policy"),
        ({"policies": [_policy(tool="crm.[abc")]}, "unbalanced [ ]"),
        ({"policies": [_policy(tool="crm update")]}, "may contain only letters"),
        ({"policies": [_policy(), _policy()]}, 'policies[1] (tool "hr.create_user"): duplicates policies[0]'),
        (
            {"policies": [_policy(action_class="read_only", compensation="snapshot")]},
            "a read_only tool changes nothing",
        ),
        (
            {"policies": [_policy(action_class="external_irreversible", compensation="snapshot")]},
            "snapshot cannot undo an external_irreversible action",
        ),
        (
            {"compensators": {"hr.delete_user": {"webhook": "ftp://hr/x", "secret_env": "S"}}},
            'compensators["hr.delete_user"]: webhook: must be an http(s) URL',
        ),
        (
            {
                "compensators": {
                    "hr.delete_user": {"webhook": "https://hr/x", "python": "a.b", "secret_env": "S"}
                }
            },
            'compensators["hr.delete_user"]: must have exactly one of webhook, python or mcp',
        ),
        ({"compensators": {"hr.delete_user": {}}}, "must have exactly one of webhook, python or mcp"),
        (
            {"compensators": {"hr.delete_user": {"webhook": "https://hr/x"}}},
            "needs exactly one of secret or secret_env",
        ),
        ({"compensators": {"hr.delete_user": {"python": "not a path"}}}, "must be a dotted Python path"),
        ({"compensators": {"hr.*": {"python": "a.b"}}}, "must be one exact tool name, not a glob"),
        ({"unwind": {"step_timeout_s": "30"}}, "unwind: step_timeout_s: "),
        ({"unwind": {"on_compensation_failure": "panic"}}, "must be one of alert_and_continue, halt"),
        ({"polices": []}, "polices: unknown key"),
        ([], "file: must be a JSON object"),
        (
            {
                "agentSafety": {
                    "policies": {"crm.x": {"risk": "EXTREME", "approval": "AUTO", "compensation": "NONE"}}
                }
            },
            'agentSafety.policies["crm.x"]: risk: must be one of low, medium, high, critical',
        ),
        (
            {
                "agentSafety": {
                    "policies": {"crm.x": {"risk": "LOW", "approval": "AUTO", "compensation": "REWIND"}}
                }
            },
            'agentSafety.policies["crm.x"]: compensation: must be one of SNAPSHOT, CORRECTION, NONE',
        ),
        ({"agentSafety": {"unwind": {"strategy": "FIFO"}}}, "agentSafety.unwind.strategy: must be LIFO"),
        ({"agentSafety": {"unwind": {"timeout": "soon"}}}, "agentSafety.unwind.timeout: must be a duration"),
        ({"agentSafety": {}, "policies": []}, 'policies: unknown key next to "agentSafety"'),
    ],
)
def test_it_names_the_bad_entry_precisely(data, expected):
    found = problems(data)
    assert any(expected in problem for problem in found), found


def test_it_reports_every_problem_at_once():
    found = problems({"policies": [_policy(risk="x"), _policy(tool="crm.y", approval="y")]})
    assert len(found) == 2


def test_it_accepts_agent_safety_values_in_any_case_and_camel_case_keys():
    document = policy_file_parse(
        {
            "agentSafety": {
                "policies": {
                    "crm.x": {
                        "risk": "Medium",
                        "approval": "auto",
                        "compensation": "Snapshot",
                        "actionClass": "DRAFT_ONLY",
                    }
                },
                "autoCompensate": {"maxRisk": "LOW"},
                "unwind": {"onCompensationFailure": "Halt", "timeout": 45, "maxAttempts": 2},
            }
        }
    )
    assert document.policies == [
        {
            "tool": "crm.x",
            "risk": "medium",
            "approval": "auto",
            "action_class": "draft_only",
            "compensation": "snapshot",
            "compensation_tool": "",
            "compensation_args": None,
        }
    ]
    assert document.auto_compensate == {"max_risk": "low"}
    assert document.unwind == {"on_compensation_failure": "halt", "step_timeout_s": 45, "max_attempts": 2}


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("2m", 120), ("1.5h", 5400), ("500ms", 0.5), (30, 30), ("45", 45)]
)
def test_it_parses_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_it_reports_invalid_json_with_its_position(db, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"policies": [\n  {"tool": "x",}\n]}')
    with pytest.raises(CommandError, match="invalid JSON at line 2"):
        load(str(broken))


def test_it_reports_a_missing_file(db, tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        load(str(tmp_path / "nope.json"))


def test_it_keeps_a_literal_webhook_secret(db, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "compensators": {
                    "hr.delete_user": {
                        "webhook": "http://hr.internal:8080/undo",
                        "secret": "s3cret-s3cret-s3cret",
                    }
                }
            }
        )
    )
    load(str(path))
    assert Compensator.objects.get().secret == "s3cret-s3cret-s3cret"


def test_the_report_counts_what_the_file_changed_not_where_it_was_read_from(db, tenant, tmp_path: Path):
    load(NATIVE)
    # The same policies from another path: nothing changed, no row is written, no event.
    copy = tmp_path / "copy.json"
    copy.write_text(Path(NATIVE).read_text("utf-8"))

    def rows() -> list[tuple]:
        return list(ToolPolicy.objects.order_by("pk").values_list()) + list(
            Compensator.objects.order_by("pk").values_list()
        )

    before, events = rows(), Event.objects.count()
    out = load(str(copy))
    assert "0 created, 0 updated, 6 unchanged" in out
    assert rows() == before and Event.objects.count() == events  # loaded_at and source included
    assert PolicySet.objects.get(tenant=None).source == str(copy)  # it names the file in force

    # One policy changed: one row updated, and the report says one.
    document = json.loads(copy.read_text("utf-8"))
    changed = next(p for p in document["policies"] if p["tool"] == "hr.create_user")
    changed["risk"] = "critical" if changed.get("risk") != "critical" else "high"
    copy.write_text(json.dumps(document))
    out = load(str(copy))
    assert "0 created, 1 updated, 5 unchanged" in out
    assert ToolPolicy.objects.get(tool="hr.create_user").source == str(copy)
    assert ToolPolicy.objects.get(tool="payments.charge").source == NATIVE
