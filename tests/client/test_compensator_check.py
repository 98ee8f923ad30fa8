"""``saga-compensator-check``, the command, run as an engineer runs it against real compensators:
the demo world's webhook compensator (every required case passes, and its drift detection is
seen), a reference compensator with one deliberate flaw at a time (each flaw reported by the case
that owns it, with exit status 1), and the demo MCP server's tools.

The cases file the kit ships must be the specification's (``clients/spec/compensator-cases.json``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from demo import services
from tests.support.mcp_servers import http_upstream
from tests.support.processes import ROOT
from tests.support.reference_compensator import SECRET, Flaws, reference_compensator

pytestmark = pytest.mark.slow

KIT = shutil.which("saga-compensator-check") or str(ROOT / ".venv" / "bin" / "saga-compensator-check")


def check(*args: str, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    """Run the command with ``--json``: (exit status, the verdicts by case id, stderr)."""
    env = {**os.environ, "COMPENSATOR_SECRET": SECRET}
    done = subprocess.run([KIT, *args, "--json"], capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode == 2:
        return 2, {}, done.stderr
    cases = {case["id"]: case for case in json.loads(done.stdout)["cases"]}
    return done.returncode, cases, done.stderr


def verdicts(cases: dict[str, Any]) -> dict[str, str]:
    return {case_id: case["verdict"] for case_id, case in cases.items()}


def test_the_kit_ships_the_specifications_cases() -> None:
    shipped = ROOT / "clients" / "python" / "saga_client" / "compensator_check" / "cases.json"
    spec = ROOT / "clients" / "spec" / "compensator-cases.json"
    assert json.loads(shipped.read_text()) == json.loads(spec.read_text())


# --- The demo world's compensator ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_demo_worlds_compensator_passes_every_required_case(
    live_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SAGA_DEMO_WORLD_SECRET", SECRET)
    with transaction.atomic():
        created = services.hr_user_create(email="dana@acme.test", name="Dana", department="Ops", title="SRE")
    assert created.ok, created.body
    snapshot = created.body["state"]
    request = tmp_path / "step.json"
    request.write_text(
        json.dumps(
            {
                "tool": "hr.delete_user",
                "args": {"email": "dana@acme.test"},
                "target_type": "hr_user",
                "target_id": "dana@acme.test",
                "after_snapshot": snapshot,
            }
        )
    )
    base = f"{live_server.url}/demo-world/hr"
    status, cases, stderr = check(
        f"{base}/saga/delete_user",
        "--secret-env",
        "COMPENSATOR_SECRET",
        "--request",
        str(request),
        "--state-url",
        f"{base}/users/dana@acme.test",
        "--calls",
        "5",
        # The in-process server shares this machine with the suite: a generous step timeout.
        "--timeout",
        "30",
    )
    assert status == 0, (
        {
            k: (v["verdict"], v["status"], v["detail"])
            for k, v in cases.items()
            if v["verdict"] not in ("pass", "fail") or k == "reachable"
        },
        stderr,
    )
    assert verdicts(cases) == {
        "tls": "fail",  # not required: served over plain HTTP here, reported as a warning
        "reachable": "pass",
        "unsigned_refused": "pass",
        "wrong_signature_refused": "pass",
        "stale_timestamp_refused": "pass",
        "malformed_body_refused": "pass",
        "drift_detected": "pass",
        "valid_call_succeeds": "pass",
        "replay_is_done": "pass",
        "unknown_fields_accepted": "pass",
        "latency_within_timeout": "pass",
    }
    assert cases["drift_detected"]["status"] == 412
    assert cases["valid_call_succeeds"]["status"] == 200
    assert "p99" in cases["latency_within_timeout"]["detail"]
    # The real effect happened once: the user is gone.
    assert services.hr_user_read(email="dana@acme.test").status == 404


@pytest.mark.django_db(transaction=True)
def test_the_demo_worlds_licence_compensator_passes_too(
    live_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without a state URL: the cases that compare states say so by passing on status alone."""
    monkeypatch.setenv("SAGA_DEMO_WORLD_SECRET", SECRET)
    with transaction.atomic():
        assert services.hr_user_create(email="lee@acme.test", name="Lee").ok
        licence = services.license_provision(email="lee@acme.test", sku="business-plus")
    assert licence.ok, licence.body
    request = tmp_path / "step.json"
    request.write_text(
        json.dumps(
            {
                "tool": "workspace.cancel_license",
                "args": {"email": "lee@acme.test"},
                "target_id": "lee@acme.test",
                "after_snapshot": licence.body["state"],
            }
        )
    )
    url = f"{live_server.url}/demo-world/workspace/saga/cancel_license"
    status, cases, stderr = check(
        url,
        "--secret-env",
        "COMPENSATOR_SECRET",
        "--request",
        str(request),
        "--calls",
        "3",
        "--timeout",
        "30",
    )
    assert status == 0, ({k: v for k, v in cases.items() if v["verdict"] != "pass"}, stderr)
    assert {k for k, v in verdicts(cases).items() if v != "pass"} == {"tls"}
    assert cases["drift_detected"]["status"] == 412


# --- A reference compensator, broken one way at a time ---------------------------------------------

SAMPLE = {
    "tool": "licenses.cancel",
    "args": {"seat": "seat-1"},
    "target_id": "seat-1",
    "after_snapshot": {"seat": "seat-1"},
}


def _check_reference(flaws: Flaws, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    request = tmp_path / "step.json"
    request.write_text(json.dumps(SAMPLE))
    with reference_compensator(flaws) as (base, _):
        return check(
            f"{base}/cancel",
            "--secret-env",
            "COMPENSATOR_SECRET",
            "--request",
            str(request),
            "--state-url",
            f"{base}/state",
            "--calls",
            "3",
            *extra,
        )


def test_a_sound_compensator_passes(tmp_path: Path) -> None:
    status, cases, stderr = _check_reference(Flaws(), tmp_path)
    assert status == 0, (
        {
            k: (v["verdict"], v["status"], v["detail"])
            for k, v in cases.items()
            if v["verdict"] not in ("pass", "fail") or k == "reachable"
        },
        stderr,
    )
    failing = {k: v for k, v in verdicts(cases).items() if v != "pass"}
    assert failing == {"tls": "fail"}


@pytest.mark.parametrize(
    ("flaws", "failing"),
    [
        # The unsigned call cancelled the seat, so the valid call finds it done (409), and says by whom.
        (
            Flaws(accepts_any_signature=True),
            {"unsigned_refused", "wrong_signature_refused", "stale_timestamp_refused", "valid_call_succeeds"},
        ),
        (Flaws(not_idempotent=True), {"replay_is_done"}),
        (Flaws(rejects_unknown_fields=True), {"unknown_fields_accepted"}),
        (Flaws(crashes_on_malformed_body=True), {"malformed_body_refused"}),
    ],
    ids=["accepts-a-wrong-signature", "not-idempotent", "500-on-an-unknown-field", "500-on-a-malformed-body"],
)
def test_each_flaw_is_reported_by_its_case_and_fails_the_check(
    flaws: Flaws, failing: set[str], tmp_path: Path
) -> None:
    status, cases, stderr = _check_reference(flaws, tmp_path)
    assert status == 1, (cases, stderr)
    assert {k for k, v in verdicts(cases).items() if v == "fail"} == failing | {"tls"}
    if flaws.not_idempotent:
        assert "the target's state changed" in cases["replay_is_done"]["detail"]
    if flaws.accepts_any_signature:
        assert cases["unsigned_refused"]["detail"].startswith("answered 200, expected 401 or 403")
        assert cases["valid_call_succeeds"]["detail"] == (
            "answered 409 (already done): carried out earlier by the unsigned_refused call"
        )


def test_a_compensator_without_drift_detection_is_not_supported_not_failed(tmp_path: Path) -> None:
    status, cases, stderr = _check_reference(Flaws(ignores_drift=True), tmp_path)
    assert status == 0, (
        {
            k: (v["verdict"], v["status"], v["detail"])
            for k, v in cases.items()
            if v["verdict"] not in ("pass", "fail") or k == "reachable"
        },
        stderr,
    )
    assert cases["drift_detected"]["verdict"] == "not_supported"
    # The drift call did the work; the valid call's 409 ("already done") is then a pass.
    assert (cases["valid_call_succeeds"]["verdict"], cases["valid_call_succeeds"]["status"]) == ("pass", 409)


def test_a_compensator_slower_than_the_step_timeout_fails_the_latency_case(tmp_path: Path) -> None:
    status, cases, stderr = _check_reference(Flaws(delay_s=0.5), tmp_path, "--timeout", "0.3")
    assert status == 1, (cases, stderr)
    # Every call that does the work is too slow; the refusals are quick.
    slow = {"valid_call_succeeds", "unknown_fields_accepted", "latency_within_timeout"}
    assert {k for k, v in verdicts(cases).items() if v == "fail"} == slow | {"tls"}
    assert (
        "too slow" in cases["latency_within_timeout"]["detail"]
        or "slower" in cases["latency_within_timeout"]["detail"]
    )
    # The worker would retry with the same key; the kit does, and says what the retry got.
    assert cases["valid_call_succeeds"]["detail"].startswith(
        "no answer within the timeout (0.3 s); retried with the same key: "
    )


def test_the_harmless_cases_never_send_a_valid_signature(tmp_path: Path) -> None:
    """--harmless-only runs without the secret and leaves the target as it was."""
    with reference_compensator(Flaws()) as (base, _):
        env = {key: value for key, value in os.environ.items() if key != "COMPENSATOR_SECRET"}
        done = subprocess.run(
            [KIT, f"{base}/cancel", "--harmless-only", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        state = json.loads(
            subprocess.run(["curl", "-s", f"{base}/state"], capture_output=True, text=True).stdout
        )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [case["id"] for case in json.loads(done.stdout)["cases"]]
    assert ran == ["tls", "reachable", "unsigned_refused", "wrong_signature_refused"]
    assert state == {"active": True, "cancellations": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the compensator's URL is needed"),
        (["ftp://x/undo", "--secret-env", "COMPENSATOR_SECRET"], "not an http(s) URL"),
        (["http://127.0.0.1:9/undo"], "the compensator's secret is needed"),
        (["http://127.0.0.1:9/undo", "--secret-env", "NOT_SET_ANYWHERE"], "NOT_SET_ANYWHERE is not set"),
        (
            ["http://127.0.0.1:9/undo", "--secret-env", "COMPENSATOR_SECRET", "--request", "/nonexistent"],
            "--request",
        ),
        (["--mcp", "http://127.0.0.1:9/mcp"], "--mcp needs --tool NAME"),
        (["--mcp", "http://127.0.0.1:9/mcp", "--tool", "x", "--args", "[1]"], "--args"),
        (["--reader", "ftp://x/read", "--secret-env", "COMPENSATOR_SECRET"], "not an http(s) URL"),
        (["--reader", "http://127.0.0.1:9/read"], "secret is needed"),
        (["http://127.0.0.1:9/undo", "--reader", "http://127.0.0.1:9/read"], "give one of"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    status, _, stderr = check(*args)
    assert status == 2 and message in stderr, stderr


# --- Webhook readers ----------------------------------------------------------------------------------


def _check_reader(flaws: Flaws, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    request = tmp_path / "read.json"
    request.write_text(
        json.dumps({"tool": "seats.get_seat", "args": {"seat": "seat-1"}, "path": "seat.active"})
    )
    with reference_compensator(flaws) as (base, _):
        return check(
            "--reader", f"{base}/read", "--secret-env", "COMPENSATOR_SECRET", "--request", str(request),
            "--state-url", f"{base}/seat", *extra,
        )  # fmt: skip


def test_a_sound_reader_passes_every_reader_case(tmp_path: Path) -> None:
    status, cases, stderr = _check_reader(Flaws(), tmp_path)
    assert status == 0, (cases, stderr)
    assert verdicts(cases) == {
        "reader_reachable": "pass",
        "reader_unsigned_refused": "pass",
        "reader_wrong_signature_refused": "pass",
        "reader_stale_timestamp_refused": "pass",
        "reader_read_answers_state": "pass",
        "reader_state_matches": "pass",
    }
    assert cases["reader_read_answers_state"]["detail"] == "state true"


def test_a_reader_that_accepts_any_signature_fails_the_refusal_cases(tmp_path: Path) -> None:
    status, cases, stderr = _check_reader(Flaws(reader_accepts_any_signature=True), tmp_path)
    assert status == 1, (cases, stderr)
    assert {k for k, v in verdicts(cases).items() if v == "fail"} == {
        "reader_unsigned_refused",
        "reader_wrong_signature_refused",
        "reader_stale_timestamp_refused",
    }
    assert cases["reader_unsigned_refused"]["detail"].startswith("answered 200, expected 401 or 403")


def test_a_reader_without_the_state_envelope_fails_the_read_case(tmp_path: Path) -> None:
    status, cases, stderr = _check_reader(Flaws(reader_answers_bare_state=True), tmp_path)
    assert status == 1, (cases, stderr)
    assert cases["reader_read_answers_state"]["verdict"] == "fail"
    assert '{"state": …}' in cases["reader_read_answers_state"]["detail"]
    # Nothing to compare: the optional state case says why, and does not block on its own.
    assert cases["reader_state_matches"]["verdict"] == "error"


def test_without_a_state_url_the_reader_state_case_is_left_out(tmp_path: Path) -> None:
    request = tmp_path / "read.json"
    request.write_text(json.dumps({"tool": "seats.get_seat", "args": {"seat": "seat-1"}}))
    with reference_compensator(Flaws()) as (base, _):
        status, cases, stderr = check(
            "--reader", f"{base}/read", "--secret-env", "COMPENSATOR_SECRET", "--request", str(request)
        )
    assert status == 0, (cases, stderr)
    assert "reader_state_matches" not in cases and len(cases) == 5


# --- MCP compensators --------------------------------------------------------------------------------


def test_an_mcp_compensator_is_checked_against_its_tool(tmp_path: Path) -> None:
    with http_upstream(tmp_path) as upstream:
        status, cases, stderr = check(
            "--mcp", upstream.url, "--tool", "delete_user", "--args", '{"email": "a@acme.test"}'
        )
        assert status == 0, (
            {
                k: (v["verdict"], v["status"], v["detail"])
                for k, v in cases.items()
                if v["verdict"] not in ("pass", "fail") or k == "reachable"
            },
            stderr,
        )
        assert set(verdicts(cases).values()) == {"pass"}
        assert upstream.tools_called() == ["delete_user"]

        status, cases, _ = check("--mcp", upstream.url, "--tool", "undo_everything", "--args", "{}")
        assert status == 1 and cases["mcp_tool_exists"]["verdict"] == "fail"
        assert "undo_everything is not listed" in cases["mcp_tool_exists"]["detail"]

        status, cases, _ = check(
            "--mcp", upstream.url, "--tool", "delete_user", "--args", '{"mail": "a@acme.test"}'
        )
        assert status == 1 and cases["mcp_args_match_schema"]["verdict"] == "fail"

        args = '{"email": "nobody@acme.test", "sku": "pro"}'
        status, cases, _ = check("--mcp", upstream.url, "--tool", "assign_license", "--args", args)
        assert status == 1 and cases["mcp_call_succeeds"]["verdict"] == "fail"
        assert cases["mcp_call_succeeds"]["detail"].startswith("isError: ")
        assert "No user nobody@acme.test" in cases["mcp_call_succeeds"]["detail"]


def test_an_mcp_server_that_is_down_fails_the_reachability_case() -> None:
    status, cases, _ = check("--mcp", "http://127.0.0.1:9/mcp", "--tool", "delete_user", "--timeout", "3")
    assert status == 1
    assert cases["mcp_reachable"]["verdict"] == "fail"
