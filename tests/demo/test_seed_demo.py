"""`seed_demo` against a live server and a real `saga_worker` process: every failure story lands in
the recovery queue with its reason, and compensating the onboarding run puts the demo world
back (the HR user is gone and the licence cancelled in the world's own tables)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from demo import agents
from tests.support.processes import ROOT, database_url_for_subprocesses, descendants, wait_for, work_under_way

SECRET = "seed-test-world-secret-0123456789"
# Short enough to see the lost agent within seconds; long enough that no healthy run (each takes
# about a second here) is mistaken for a lost one.
HEARTBEAT_TIMEOUT_S = "8"


@pytest.fixture
def world_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    # The live server (this process) verifies with it, the worker (a subprocess) signs with it.
    monkeypatch.setenv("SAGA_DEMO_WORLD_SECRET", SECRET)
    return SECRET


@pytest.fixture
def saga_worker(live_server: Any, world_secret: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The Procfile's worker, on the test database and this test's Redis db."""
    import redis
    from django.conf import settings

    redis_url = str(settings.RQ_QUEUES["default"]["URL"])
    # Our own Redis db: leftovers of an earlier, interrupted run must not leak into this one.
    redis.Redis.from_url(redis_url).flushdb()
    env: dict[str, str] = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": redis_url,
        "SAGA_DEMO_WORLD_SECRET": world_secret,
        "SAGA_HEARTBEAT_TIMEOUT_S": HEARTBEAT_TIMEOUT_S,
        "SAGA_SWEEP_INTERVAL_S": "1",
        "DB_CONN_MAX_AGE": "0",
    }
    log_path = tmp_path / "worker.log"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "saga_worker", "default", "compensations", "notifications"],
        cwd=ROOT,
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield process
    # rq's work horses call setpgrp, so killing the worker's group misses them: find them first,
    # so none outlives the test and touches the next one.
    victims = descendants(process.pid)
    process.kill()
    process.wait(timeout=10)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _keep_waiting_agents_alive(demo: agents.Demo, stop: threading.Event) -> None:
    # What make run's live traffic process does: the harness waiting on the vendor payment's
    # approval keeps heartbeating, so it is not mistaken for a lost agent.
    while not stop.is_set():
        agents.tend_waiting_runs(demo)
        stop.wait(2)


def _open_reasons() -> dict[str, str]:
    from recovery.models import RecoveryItem

    return {
        item.run.external_id: item.reason
        for item in RecoveryItem.objects.select_related("run").exclude(status=RecoveryItem.Status.RESOLVED)
    }


def _none_never_checked(said: str) -> Any:
    """Asserts the seed said what it checked and no compensator in force for Acme is flagged
    "never been checked"; returns the checks of its webhook compensator ``hr.delete_user`` (one,
    after a first seed)."""
    from ledger import upstreams
    from ledger.models import Tenant
    from recovery import compensator_checks
    from recovery.models import CompensatorCheck

    assert "Demo compensators: " in said
    acme = Tenant.objects.get(slug="acme")
    flags = compensator_checks.check_flags(
        tenant=acme, tools=[row.tool for row in upstreams.compensators_in_force(tenant_id=acme.pk)]
    )
    assert flags and not [tool for tool, flag in flags.items() if "never been checked" in flag], flags
    checks = CompensatorCheck.objects.filter(tenant=acme, tool="hr.delete_user")
    assert checks.count() == 1
    return checks


def _seed_again_adds_nothing(url: str, webhook_checks: Any) -> None:
    from django.contrib.auth import get_user_model

    from demo.models import AgentCredential
    from ledger.models import AgentKey, Run

    def counts() -> tuple[int, ...]:
        return (
            Run.objects.count(),
            AgentKey.objects.count(),
            AgentCredential.objects.count(),
            get_user_model().objects.count(),
        )

    before = counts()
    call_command("seed_demo", url=url)
    assert counts() == before
    assert not webhook_checks.get().ok or webhook_checks.count() == 1  # passed: not checked again


@pytest.mark.slow
def test_it_seeds_one_item_per_failure_story_and_compensation_fixes_the_world(
    live_server: Any, saga_worker: subprocess.Popen[bytes], world_secret: str, tmp_path: Path
) -> None:
    from django.contrib.auth import get_user_model

    from demo import people
    from demo.models import HrUser, WorkspaceLicense
    from demo.setup import agent_secret
    from ledger.audit import Actor
    from ledger.models import Action, Run
    from recovery.actions.compensations import unwind_start
    from recovery.models import Approval, RecoveryItem

    seeded = StringIO()
    call_command("seed_demo", url=live_server.url, stdout=seeded)

    # The seed checked the demo's own compensators: none is shown "never checked", and what
    # passed is not checked again on the next seed (asserted below).
    webhook_checks = _none_never_checked(seeded.getvalue())

    demo = agents.Demo(
        base_url=live_server.url,
        keys={"acme": agent_secret("acme-agents")},
        world=agents.World(live_server.url, world_secret),
        people=people,
    )
    stop = threading.Event()
    tender = threading.Thread(target=_keep_waiting_agents_alive, args=(demo, stop), daemon=True)
    tender.start()
    try:
        expected = {
            agents.external_id_for(s): s.expected_reason for s in agents.SCENARIOS if s.expected_reason
        }
        assert set(expected.values()) == {"failed", "verification_failed", "agent_lost", "state_drift"}
        # The lost agent needs the heartbeat timeout to pass; the drift needs the worker's unwind.
        wait_for(
            lambda: _open_reasons() == expected,
            timeout=60,
            interval=0.25,
            what=f"the queue to hold exactly {expected} (it holds {_open_reasons()})",
            progress=work_under_way(tmp_path / "worker.log"),
        )
    finally:
        stop.set()
        tender.join(timeout=10)
        demo.close()

    # The low-risk failure was undone without anyone; the vendor payment waits in the inbox.
    auto = Run.objects.get(external_id="demo:support-reply-auto")
    assert auto.status == Run.Status.COMPENSATED
    assert auto.recovery_items.get().resolution == RecoveryItem.Resolution.AUTO_COMPENSATED
    vendor = Run.objects.get(external_id="demo:vendor-payment")
    assert vendor.status == Run.Status.RUNNING
    assert Approval.objects.filter(run=vendor, status=Approval.Status.PENDING).count() == 1
    # The charge that came too early carries the pivot warning.
    pivot_run = Run.objects.get(external_id="demo:refund-pivot")
    assert any(w["code"] == "pivot_order" for a in pivot_run.actions.all() for w in a.warnings)

    # Seeding again adds nothing: no runs, keys or logins twice, no check of what passed.
    _seed_again_adds_nothing(live_server.url, webhook_checks)

    # Alice compensates the onboarding run; the worker undoes it in the demo world.
    onboarding = Run.objects.get(external_id="demo:onboard-ashu")
    assert HrUser.objects.filter(email="ashu@acme.example").exists()
    assert WorkspaceLicense.objects.get(email="ashu@acme.example").status == WorkspaceLicense.Status.ACTIVE
    item = onboarding.recovery_items.get(status=RecoveryItem.Status.OPEN)
    alice = get_user_model().objects.get(username="alice")
    unwind_start(item=item, actor=Actor.for_user(alice), reason="Bad personal email; undo and retry later")

    wait_for(
        lambda: Run.objects.get(pk=onboarding.pk).status == Run.Status.COMPENSATED,
        timeout=60,
        interval=0.25,
        what="the onboarding run to be compensated",
        progress=work_under_way(tmp_path / "worker.log"),
    )
    assert not HrUser.objects.filter(email="ashu@acme.example").exists()
    assert WorkspaceLicense.objects.get(email="ashu@acme.example").status == WorkspaceLicense.Status.CANCELLED
    assert set(onboarding.actions.values_list("tool", "status")) == {
        ("hr.create_user", Action.Status.COMPENSATED),
        ("workspace.provision_license", Action.Status.COMPENSATED),
        ("email.send_welcome", Action.Status.FAILED),
    }
    assert RecoveryItem.objects.get(pk=item.pk).resolution == RecoveryItem.Resolution.COMPENSATED

    # Acme's on-call channel heard about it: make run's console e-mail backend prints the mails
    # to the worker's log, each with the link to the run's page.
    worker_log = tmp_path / "worker.log"
    wait_for(
        lambda: f"/runs/{onboarding.pk}/" in worker_log.read_text(errors="replace"),
        timeout=30,
        what="the on-call e-mail about the onboarding run in the worker's log",
    )
    log_text = worker_log.read_text(errors="replace")
    assert "To: oncall@acme.demo.saga.local" in log_text
    assert "Subject: [Saga Admin]" in log_text


def test_a_resumed_onboarding_run_sends_the_corrected_welcome_email_and_succeeds(
    live_server: Any, world_secret: str
) -> None:
    from django.contrib.auth import get_user_model

    from demo import people
    from demo.models import OutboxEmail
    from demo.setup import agent_secret, demo_setup
    from ledger.audit import Actor
    from ledger.models import Run
    from recovery.actions.resolutions import item_resume

    demo_setup(base_url=live_server.url)
    demo = agents.Demo(
        base_url=live_server.url,
        keys={"acme": agent_secret("acme-agents")},
        world=agents.World(live_server.url, world_secret),
        people=people,
    )
    try:
        agents.onboard_failing_welcome(demo, "demo:onboard-ashu")
        run = Run.objects.get(external_id="demo:onboard-ashu")
        assert run.status == Run.Status.FAILED and not OutboxEmail.objects.exists()

        alice = get_user_model().objects.get(username="alice")
        item_resume(
            item=run.recovery_items.get(),
            actor=Actor.for_user(alice),
            reason="The personal address has a typo; carry on",
        )
        notes = agents.tend_waiting_runs(demo)
    finally:
        demo.close()

    assert notes == [f"resumed {run.pk}: welcome email to ashu.kumar@gmail.com"]
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    # The HR record and the licence were not created twice: those steps replayed.
    assert list(run.actions.order_by("seq").values_list("tool", "status")) == [
        ("hr.create_user", "succeeded"),
        ("workspace.provision_license", "succeeded"),
        ("email.send_welcome", "failed"),
        ("email.send_welcome", "succeeded"),
    ]
    assert list(OutboxEmail.objects.values_list("to", flat=True)) == ["ashu.kumar@gmail.com"]
