"""The policy file's unwind block is parsed once, when the file is loaded; the engine freezes what
was loaded into each unwind and parses nothing itself (it once read ``"2m"`` as 0 seconds)."""

from __future__ import annotations

import pytest

from ledger.audit import Actor
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policy_file_load, policy_file_parse
from ledger.policies.resolve import policy_settings_for
from recovery.actions.compensations import unwind_start
from recovery.models import Unwind
from tests.factories import load_onboarding_policies, onboarding_saga

LOADER = Actor.system("tests")


def _load(document: dict, tenant=None) -> None:
    policy_file_load(document=policy_file_parse(document), source="tests", tenant=tenant, actor=LOADER)


def _unwind_for(tenant, agent, alice) -> Unwind:
    saga = onboarding_saga(tenant, agent)
    assert saga.item is not None
    return unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo it")


def test_it_freezes_the_loaded_duration_and_failure_mode_into_the_unwind(tenant, agent, alice):
    load_onboarding_policies()
    _load(
        {
            "agentSafety": {
                "policies": {
                    "hr.create_user": {
                        "risk": "MEDIUM",
                        "approval": "AUTO",
                        "compensation": "CUSTOM",
                        "compensationTool": "hr.delete_user",
                    }
                },
                "unwind": {"strategy": "LIFO", "onCompensationFailure": "HALT", "timeout": "2m"},
            }
        },
        tenant=tenant,  # over the global onboarding policies, which stay in force
    )
    unwind = _unwind_for(tenant, agent, alice)
    assert unwind.on_failure == Unwind.OnFailure.HALT
    assert unwind.plan["settings"] == {"on_failure": "halt", "step_timeout_s": 120.0, "max_attempts": 5}
    assert set(unwind.steps.values_list("max_attempts", flat=True)) == {5}


def test_a_bad_duration_is_a_load_error_and_changes_nothing(tenant):
    before = policy_settings_for(tenant).unwind
    with pytest.raises(PolicyFileError, match=r"agentSafety\.unwind\.timeout: must be a duration"):
        _load({"agentSafety": {"policies": {}, "unwind": {"timeout": "two minutes"}}})
    assert policy_settings_for(tenant).unwind == before


def test_the_attempts_default_to_the_setting_until_a_file_sets_them(tenant, agent, alice, settings):
    settings.SAGA = {**settings.SAGA, "DEFAULT_MAX_ATTEMPTS": 7}
    assert policy_settings_for(tenant).unwind_settings.max_attempts == 7
    _load({"unwind": {"max_attempts": 2}})
    assert policy_settings_for(tenant).unwind_settings.max_attempts == 2
