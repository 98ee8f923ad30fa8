"""The demo's exact undo of an update: the world's hr.update_title and its reader
hr.get_user, the policy file's before and readers for them (and for the demo MCP server's
update_title), and the two seeded runs: a title change undone exactly, and an undo refused as
drift because the COO changed the title by hand after the agent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse
from saga_client.signing import signed_headers

from demo import agents, compensators, readers, services
from demo.models import HrUser
from ledger.policies.before_images import image_at, images_equal
from recovery.compensators import CompensationDrifted, CompensationFailed
from tests.support.processes import wait_for, work_under_way

SECRET = "title-test-world-secret-0123456789"


@pytest.fixture
def world_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SAGA_DEMO_WORLD_SECRET", SECRET)
    return SECRET


@pytest.fixture
def noah(db: Any) -> HrUser:
    return HrUser.objects.create(
        email="noah.kim@acme.example", name="Noah Kim", department="Engineering", title="Senior engineer"
    )


def _post_title(client: Any, email: str, body: dict[str, Any], *, key: str = "") -> Any:
    raw = json.dumps(body).encode()
    headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed_headers(SECRET, raw).items()}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    url = reverse("demo:hr-user-title", kwargs={"email": email})
    return client.post(url, raw, content_type="application/json", **headers)


def test_update_title_changes_the_record_and_the_reader_reads_the_new_value(
    client: Any, noah: HrUser, world_secret: str
) -> None:
    before = image_at(readers.get_user(args={"email": noah.email}), "user")
    assert before == noah.snapshot() and before["title"] == "Senior engineer"

    response = _post_title(client, noah.email, {"title": "Engineering manager"}, key="k1")
    assert response.status_code == 200
    assert response.json()["state"]["title"] == "Engineering manager"
    noah.refresh_from_db()
    assert noah.title == "Engineering manager"
    # The reader reads the world now: its image is the record the call answered with.
    now = image_at(readers.get_user(args={"email": noah.email}), "user")
    assert images_equal(now, response.json()["state"])
    # The same key again is the same call: answered once, changed once.
    again = _post_title(client, noah.email, {"title": "Engineering manager"}, key="k1")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("title", "said"), [("", "required"), ("   ", "required"), ("A\nB", "one line"), ("x" * 201, "at most")]
)
def test_a_title_that_is_not_one_is_refused_and_changes_nothing(noah: HrUser, title: str, said: str) -> None:
    result = services.hr_user_update_title(email=noah.email, title=title)
    assert result.status == 422 and result.body["error"]["code"] == "invalid_title"
    assert said in result.body["error"]["message"]
    noah.refresh_from_db()
    assert noah.title == "Senior engineer"


def test_a_person_with_no_record_is_not_found_by_the_update_or_the_reader(db: Any) -> None:
    assert services.hr_user_update_title(email="nobody@acme.example", title="CTO").status == 404
    with pytest.raises(LookupError, match="No HR record for nobody@acme.example"):
        readers.get_user(args={"email": "nobody@acme.example"})
    with pytest.raises(ValueError, match="needs an email"):
        readers.get_user(args={})


def test_the_undo_puts_the_title_back_exactly_and_refuses_a_record_someone_changed(noah: HrUser) -> None:
    before = noah.snapshot()
    after = services.hr_user_update_title(email=noah.email, title="Engineering manager").body["state"]

    undone = compensators.restore_title(
        args={"email": noah.email, "title": before["title"]},
        target_id=noah.email,
        after_snapshot=after,
        idempotency_key="stp_1:1",
    )
    assert images_equal(undone["state"], before)
    noah.refresh_from_db()
    assert images_equal(noah.snapshot(), before)
    # Undone already (a retried step): done, nothing changes.
    again = compensators.restore_title(
        args={"email": noah.email, "title": before["title"]},
        target_id=noah.email,
        after_snapshot=after,
        idempotency_key="stp_2:1",
    )
    assert again["state"]["title"] == "Senior engineer"

    # The agent changes it again, then a person corrects it by hand: the undo must not clobber them.
    after = services.hr_user_update_title(email=noah.email, title="Engineering manager").body["state"]
    services.hr_user_edit_by_person(email=noah.email, who="Jon Ives", title="Head of Platform")
    with pytest.raises(CompensationDrifted, match="changed since the agent's action"):
        compensators.restore_title(
            args={"email": noah.email, "title": "Senior engineer"},
            target_id=noah.email,
            after_snapshot=after,
            idempotency_key="stp_3:1",
        )
    noah.refresh_from_db()
    assert noah.title == "Head of Platform"
    with pytest.raises(CompensationFailed, match="invalid_title"):
        compensators.restore_title(
            args={"email": noah.email}, target_id=noah.email, after_snapshot=None, idempotency_key="stp_4:1"
        )


def test_the_demo_policy_files_load_with_before_and_readers(db: Any) -> None:
    from demo.setup import demo_setup
    from ledger.models import Compensator, StateReader, ToolPolicy

    mcp_url = "http://127.0.0.1:9876/mcp"
    demo_setup(base_url="http://127.0.0.1:8000", mcp_url=mcp_url)

    for tool, read in (("hr.update_title", "hr.get_user"), ("people.update_title", "people.get_user")):
        policy = ToolPolicy.objects.get(tenant=None, tool=tool)
        assert policy.before == {"tool": read, "args": {"email": "$args.email"}, "path": "user"}
        assert (policy.compensation_tool, policy.compensation_args) == (
            tool,
            {"email": "$args.email", "title": "$before.title"},
        )
        assert ToolPolicy.objects.get(tenant=None, tool=read).action_class == "read_only"
    readers_in_force = {
        r.tool: (r.kind, r.python_path, r.url, r.mcp_tool) for r in StateReader.objects.filter(tenant=None)
    }
    assert readers_in_force == {
        "hr.get_user": ("python", "demo.readers.get_user", "", ""),
        # Where the demo MCP server answers (make run's port), as its MCP compensators are.
        "people.get_user": ("mcp", "", mcp_url, "get_user"),
    }
    assert Compensator.objects.get(tenant=None, tool="people.update_title").url == mcp_url
    assert (
        Compensator.objects.get(tenant=None, tool="hr.update_title").python_path
        == "demo.compensators.restore_title"
    )


def test_the_world_seed_leaves_a_hand_edited_title_alone(db: Any) -> None:
    from demo.setup import world_seed

    world_seed()
    services.hr_user_edit_by_person(email=agents.PRIYA, who="Jon Ives", title="Head of Customer Support")
    rows = HrUser.objects.count()
    world_seed()
    assert HrUser.objects.count() == rows
    assert HrUser.objects.get(email=agents.PRIYA).title == "Head of Customer Support"


TITLE_SCENARIOS = tuple(s for s in agents.SCENARIOS if s.slug in ("reorg-titles", "title-drift"))


def test_the_seeded_title_runs_undo_one_exactly_and_refuse_the_other_as_drift_and_seed_once(
    live_server: Any, world_secret: str, start_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from demo import people
    from demo.setup import agent_secret, demo_setup
    from ledger.models import Action, Run
    from recovery.models import RecoveryItem, UnwindStep

    assert [s.slug for s in TITLE_SCENARIOS] == ["reorg-titles", "title-drift"]
    demo_setup(base_url=live_server.url)
    worker = start_worker(SAGA_DEMO_WORLD_SECRET=world_secret)
    demo = agents.Demo(
        base_url=live_server.url,
        keys={"acme": agent_secret("acme-agents")},
        world=agents.World(live_server.url, world_secret),
        people=people,
    )
    # Only the two title stories: the rest of the seed is test_seed_demo's.
    monkeypatch.setattr(agents, "SCENARIOS", TITLE_SCENARIOS)
    try:
        first = agents.seed(demo, log=lambda _: None)
        assert first.played == ["reorg-titles", "title-drift"]
        undone = Run.objects.get(external_id="demo:reorg-titles")
        drifted = Run.objects.get(external_id="demo:title-drift")

        def settled() -> bool:
            return Run.objects.get(pk=undone.pk).status == Run.Status.COMPENSATED and (
                RecoveryItem.objects.filter(run=drifted, reason="state_drift")
                .exclude(status=RecoveryItem.Status.RESOLVED)
                .exists()
            )

        wait_for(
            settled,
            timeout=60,
            interval=0.25,
            what="the reorg run compensated and the drift run in the queue as state_drift",
            progress=work_under_way(worker.log_path),
        )

        # Undone exactly: Noah's record is as it was before the agent, field for field.
        noah = HrUser.objects.get(email=agents.NOAH)
        changed = undone.actions.get(tool="hr.update_title", status=Action.Status.COMPENSATED)
        assert changed.before_snapshot["title"] == "Senior engineer"
        assert changed.after_snapshot["title"] == "Engineering manager"
        assert images_equal(noah.snapshot(), changed.before_snapshot)
        assert undone.recovery_items.get().resolution == RecoveryItem.Resolution.AUTO_COMPENSATED

        # Refused as drift: the COO's hand edit stands, the agent's title was not put back over it.
        priya = HrUser.objects.get(email=agents.PRIYA)
        assert priya.title == "Head of Customer Support"
        retitled = drifted.actions.get(seq=1)
        assert (retitled.tool, retitled.status) == ("hr.update_title", Action.Status.COMPENSATION_FAILED)
        assert (retitled.before_snapshot["title"], retitled.after_snapshot["title"]) == (
            "Support lead",
            "Support manager",
        )
        assert UnwindStep.objects.get(action=retitled).status == UnwindStep.Status.DRIFTED
        # The worker read Noah's record back after the undo: the restore is verified.
        restored = UnwindStep.objects.get(action=changed)
        assert restored.status == UnwindStep.Status.DONE and restored.verified is True

        # Seeding again plays neither story, so the hand edit is not made twice and nothing moves.
        runs, titles = Run.objects.count(), dict(HrUser.objects.values_list("email", "title"))
        second = agents.seed(demo, log=lambda _: None)
        assert (second.played, second.skipped) == ([], ["reorg-titles", "title-drift"])
        assert Run.objects.count() == runs
        assert dict(HrUser.objects.values_list("email", "title")) == titles
    finally:
        demo.close()
