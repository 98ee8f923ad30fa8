"""Keyed audit chain heads (ledger.audit_signing): the worker signs every chain that moved, and
verify_audit holds every signed head against its chain, so a writer with the application's
database role (INSERT allowed, no key) cannot append forged events that pass."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from ledger import audit_signing
from ledger.audit import GENESIS, _event_digest, _hashed_fields, audit_heads_verify, audit_verify
from ledger.models import Event, Run, SignedHead
from ledger.services import runs
from recovery import scheduling
from recovery.audit_stream import records
from tests.factories import make_run, record
from tests.support.processes import wait_for

KEY = "test-audit-key-0123456789abcdef"
ROLE = "saga_app_forger"


@pytest.fixture
def keyed(settings):
    settings.AUDIT_KEY = KEY
    return settings


@pytest.fixture
def run(tenant, agent):
    run = make_run(tenant, agent)
    record(run, agent, "k1")
    runs.run_fail(run=run, actor=agent, error="boom")
    return run


def _verify() -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("verify_audit", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _verify_fails() -> str:
    err = StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("verify_audit", stdout=StringIO(), stderr=err)
    assert excinfo.value.returncode == 1
    return str(excinfo.value) + "\n" + err.getvalue()


def _as_app_role() -> None:
    """The application's least-privileged role (``db_grants``), inside the test's transaction."""
    out = StringIO()
    call_command("db_grants", role=ROLE, stdout=out)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {ROLE} NOLOGIN")
        for statement in out.getvalue().splitlines():
            if statement.strip():
                cursor.execute(statement)
        cursor.execute(f"SET ROLE {ROLE}")


def _reset_role() -> None:
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")


def _forge(run: Run, *, kind: str, created_at, data: dict) -> Event:
    """What a writer with the application's role can do without the key: compute the next link
    of the run's chain, INSERT it with raw SQL and move the run's recorded head to it."""
    head = Run.objects.values_list("audit_head", flat=True).get(pk=run.pk)
    forged = Event(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        chain=f"run:{run.pk}",
        kind=kind,
        subject_type="run",
        subject_id=run.pk,
        actor_type=Event.ActorType.USER,
        actor_id="1",
        actor_label="alice",
        data=data,
        created_at=created_at,
        prev_hash=head or GENESIS,
    )
    forged.hash = _event_digest(forged.prev_hash, _hashed_fields(forged))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_event (tenant_id, run_id, chain, kind, subject_type, subject_id, from_state, "
            "to_state, actor_type, actor_id, actor_label, reason, data, created_at, prev_hash, hash) "
            "VALUES (%s, %s, %s, %s, %s, %s, '', '', %s, %s, %s, '', %s::jsonb, %s, %s, %s) RETURNING id",
            [
                forged.tenant_id,
                forged.run_id,
                forged.chain,
                kind,
                forged.subject_type,
                forged.subject_id,
                forged.actor_type,
                forged.actor_id,
                forged.actor_label,
                json.dumps(data),
                created_at,
                forged.prev_hash,
                forged.hash,
            ],
        )
        forged.id = cursor.fetchone()[0]
        cursor.execute("UPDATE ledger_run SET audit_head = %s WHERE id = %s", [forged.hash, run.pk])
    return forged


def test_the_signing_pass_signs_every_chain_and_verify_audit_checks_each_head(keyed, run):
    assert audit_signing.audit_heads_sign() == 2  # the run's chain and the tenant's
    head = SignedHead.objects.get(chain=f"run:{run.pk}")
    newest = Event.objects.filter(run=run).order_by("-id").first()
    assert (head.position, head.head, head.event_id) == (3, newest.hash, newest.pk)
    assert head.key_id == audit_signing.key_id(KEY.encode())
    out, _ = _verify()
    assert "2 signed heads verified." in out
    assert "not yet signed" not in out
    assert "Audit log intact" in out


def test_a_pass_signs_only_the_chains_that_moved_and_reports_the_rest_as_not_yet_signed(keyed, run, agent):
    audit_signing.audit_heads_sign()
    assert audit_signing.audit_heads_sign() == 0
    other = make_run(run.tenant, agent)
    out, _ = _verify()
    assert "1 event in 1 chain not yet signed" in out
    assert audit_signing.audit_heads_sign() == 1
    assert SignedHead.objects.filter(chain=f"run:{other.pk}").count() == 1
    assert "not yet signed" not in _verify()[0]


def test_a_pass_commits_as_it_goes_and_the_next_one_resumes_where_it_stopped(
    keyed, tenant, agent, monkeypatch
):
    made = [make_run(tenant, agent) for _ in range(5)]
    monkeypatch.setattr(audit_signing, "CHAINS_PER_TRANSACTION", 2)
    monkeypatch.setattr(audit_signing, "TRANSACTIONS_PER_PASS", 1)
    # Six chains (five runs and the tenant's), two a pass: three passes, none signed twice.
    assert [audit_signing.audit_heads_sign() for _ in range(4)] == [2, 2, 2, 0]
    assert SignedHead.objects.count() == 6
    assert {f"run:{run.pk}" for run in made} <= set(SignedHead.objects.values_list("chain", flat=True))
    monkeypatch.setattr(audit_signing, "TRANSACTIONS_PER_PASS", 20)
    record(made[0], agent, "k9")
    assert audit_signing.audit_heads_sign() == 1


def test_a_forged_backdated_event_appended_under_the_app_role_after_a_signed_head_is_caught(keyed, run):
    audit_signing.audit_heads_sign()
    signed = SignedHead.objects.get(chain=f"run:{run.pk}")
    # The forger dates an approval before the failure it would excuse; every protection is on.
    _as_app_role()
    forged = _forge(
        run, kind="approval.granted", created_at=signed.signed_at - timedelta(hours=1), data={"by": "alice"}
    )
    _reset_role()
    # The hash chain alone cannot tell: it links up and ends at the run's recorded head.
    assert audit_verify() == (Event.objects.count(), None)
    assert audit_heads_verify() == []
    failure = _verify_fails()
    assert f"chain run:{run.pk}: event {forged.pk} (approval.granted) claims" in failure
    assert "before the head signed at" in failure


def test_a_signed_head_forged_for_a_forged_event_fails_verification(keyed, run):
    audit_signing.audit_heads_sign()
    _as_app_role()
    forged = _forge(run, kind="approval.granted", created_at=timezone.now(), data={})
    # Dated now, it is only "not yet signed"; the forger then makes up a signed head for it.
    SignedHead.objects.create(
        tenant_id=run.tenant_id,
        chain=f"run:{run.pk}",
        position=4,
        event_id=forged.pk,
        head=forged.hash,
        signed_at=timezone.now(),
        key_id=audit_signing.key_id(KEY.encode()),
        signature="0" * 64,
    )
    _reset_role()
    failure = _verify_fails()
    assert f"chain run:{run.pk}: the signed head at position 4" in failure
    assert "has a signature that does not verify (forged or altered)" in failure


def test_a_signed_head_that_is_no_longer_a_prefix_of_its_chain_fails(keyed, run):
    audit_signing.audit_heads_sign()
    first = Event.objects.filter(run=run).order_by("id").first()
    signed_at = timezone.now()
    # Correctly signed (say, by a stolen key) but at the wrong position: not this chain's prefix.
    SignedHead.objects.create(
        tenant_id=run.tenant_id,
        chain=f"run:{run.pk}",
        position=7,
        event_id=first.pk,
        head=first.hash,
        signed_at=signed_at,
        key_id=audit_signing.key_id(KEY.encode()),
        signature=audit_signing.chain_head_signature(
            KEY.encode(), chain=f"run:{run.pk}", position=7, head=first.hash, signed_at=signed_at
        ),
    )
    assert (
        f"the signed head at position 7 (signed {audit_signing.signed_time(signed_at)}) is no longer a prefix"
        in (_verify_fails())
    )


def test_a_changed_key_is_caught(keyed, run):
    audit_signing.audit_heads_sign()
    old_id = audit_signing.key_id(KEY.encode())
    keyed.AUDIT_KEY = "another key entirely"
    failure = _verify_fails()
    assert f"chain run:{run.pk}: the signed head at position 3" in failure
    assert f"was signed with another key (key id {old_id}" in failure


def test_without_a_key_nothing_is_signed_and_verify_says_so(settings, run):
    settings.AUDIT_KEY = ""
    assert audit_signing.audit_heads_sign() == 0
    assert not SignedHead.objects.exists()
    out, _ = _verify()
    assert "Chain heads unsigned: SAGA_AUDIT_KEY (or SAGA_AUDIT_KEY_FILE) is not set" in out
    assert "Audit log intact" in out


def test_a_signed_head_whose_event_is_gone_fails(keyed, tenant):
    SignedHead.objects.create(
        tenant=tenant,
        chain="run:vanished",
        position=1,
        event_id=10**12,
        head="a" * 64,
        signed_at=timezone.now(),
        key_id="x",
        signature="0" * 64,
    )
    assert f"names event {10**12}, which is not in the log" in _verify_fails()


def test_signed_heads_are_append_only_even_for_the_owner(keyed, run):
    audit_signing.audit_heads_sign()
    for sql in (
        "UPDATE ledger_signedhead SET head = 'x'",
        "DELETE FROM ledger_signedhead",
        "TRUNCATE ledger_signedhead",
    ):
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    assert SignedHead.objects.count() == 2


def test_the_app_role_may_only_read_and_append_signed_heads(keyed, run):
    audit_signing.audit_heads_sign()
    _as_app_role()
    for sql in ("UPDATE ledger_signedhead SET head = 'x'", "DELETE FROM ledger_signedhead"):
        with (
            pytest.raises(DatabaseError, match="permission denied"),
            transaction.atomic(),
            connection.cursor() as c,
        ):
            c.execute(sql)
    _reset_role()


def test_a_chain_that_does_not_link_up_is_never_signed(keyed, run):
    # A forged event that does not even link (its prev_hash is made up): the signer refuses.
    Event.objects.create(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        chain=f"run:{run.pk}",
        kind="forged",
        subject_type="run",
        subject_id=run.pk,
        actor_type=Event.ActorType.SYSTEM,
        created_at=timezone.now(),
        prev_hash="f" * 64,
        hash="e" * 64,
    )
    assert audit_signing.sign_chain(f"run:{run.pk}", tenant_id=run.tenant_id, key=KEY.encode()) is None
    assert not SignedHead.objects.filter(chain=f"run:{run.pk}").exists()


def test_the_stream_signs_its_heads_by_the_same_rule_under_its_own_context():
    signature = records.head_signature(b"k", tenant="acme", position=3, head="h" * 64, time="t")
    assert signature == audit_signing.sign_head(
        b"k", context="saga-audit-head:v1", scope="acme", position=3, head="h" * 64, time="t"
    )
    # A stream head cannot pass for a chain head (and the other way round).
    assert signature != audit_signing.sign_head(
        b"k", context=audit_signing.CHAIN_HEAD_CONTEXT, scope="acme", position=3, head="h" * 64, time="t"
    )


def test_the_worker_signs_heads_periodically(settings):
    settings.AUDIT_SIGN_INTERVAL_S = 30.0
    [job] = [p for p in scheduling.periodic_jobs() if p.func == "recovery.jobs.audit_heads_sign"]
    assert job.every_s == 30.0


@pytest.mark.django_db(transaction=True)
def test_concurrent_signers_make_one_head_per_chain_and_position(settings, tenant, agent):
    settings.AUDIT_KEY = KEY
    made = [make_run(tenant, agent) for _ in range(5)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def sign(whole_pass: bool) -> None:
        try:
            barrier.wait(timeout=30)
            if whole_pass:
                audit_signing.audit_heads_sign()
            else:
                for run in made:
                    audit_signing.sign_chain(f"run:{run.pk}", tenant_id=tenant.pk, key=KEY.encode())
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sign, args=(n % 2 == 0,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    for run in made:
        assert list(SignedHead.objects.filter(chain=f"run:{run.pk}").values_list("position", flat=True)) == [
            1
        ]
    audit_signing.audit_heads_sign()  # whatever a skipped pass left, the next one signs
    out, _ = _verify()
    assert "not yet signed" not in out
    assert "Audit log intact" in out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_signs_the_chains_that_move_and_verify_audit_passes(
    transactional_db, start_worker, workers, settings, tenant, agent
):
    settings.AUDIT_KEY = KEY  # this process verifies with the key the worker signs with
    run = make_run(tenant, agent)
    start_worker(SAGA_AUDIT_KEY=KEY, SAGA_AUDIT_SIGN_INTERVAL_S="0.5")

    def signed_through(run_: Run) -> bool:
        newest = Event.objects.filter(run=run_).order_by("-id").values_list("hash", flat=True).first()
        return SignedHead.objects.filter(chain=f"run:{run_.pk}", head=newest).exists()

    wait_for(lambda: signed_through(run), timeout=60, what="the worker's first signed head")
    record(run, agent, "k2")
    wait_for(lambda: signed_through(run), timeout=60, what="the head signed again after the run moved")
    assert list(SignedHead.objects.filter(chain=f"run:{run.pk}").values_list("position", flat=True)) == [1, 2]
    out, _ = _verify()
    assert "signed heads verified." in out
    assert "Audit log intact" in out
