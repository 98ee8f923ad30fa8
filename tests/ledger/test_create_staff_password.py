"""create_staff's password sources: a prompt (in a terminal), a file, the environment or the
command line; exactly one, and every bad source refused with a message and nothing written."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.models import Membership
from tests.support.processes import ROOT, database_url_for_subprocesses

PASSWORD = "lilac-orbit-7-canoe"
ROLE = ("--tenant", "acme", "--role", "viewer")


def create_staff(*args: str) -> str:
    out = StringIO()
    call_command("create_staff", "erin", *args, *ROLE, stdout=out)
    return out.getvalue()


def assert_nobody_created() -> None:
    assert not get_user_model().objects.filter(username="erin").exists()
    assert not Membership.objects.exists()


@pytest.mark.parametrize("ending", ["", "\n", "\r\n"])
def test_it_reads_the_password_from_a_file_without_its_line_ending(db, tmp_path, ending):
    secret = tmp_path / "password"
    secret.write_bytes(f"{PASSWORD}{ending}".encode())
    assert "Created user erin: viewer at acme" in create_staff("--password-file", str(secret))
    assert get_user_model().objects.get(username="erin").check_password(PASSWORD)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\n", "is empty"),
        (f"{PASSWORD}\nsecond line\n".encode(), "more than one line"),
        (b"x" * 5000, "over 4096 bytes"),
        (b"\xff\xfe-not-utf8", "not UTF-8"),
    ],
)
def test_it_refuses_a_password_file_that_is_not_one_password(db, tmp_path, content, message):
    secret = tmp_path / "password"
    secret.write_bytes(content)
    with pytest.raises(CommandError, match=message):
        create_staff("--password-file", str(secret))
    assert_nobody_created()


@pytest.mark.parametrize("name", ["missing", "."])
def test_it_refuses_a_password_file_it_cannot_read(db, tmp_path, name):
    with pytest.raises(CommandError, match="Cannot read the password file"):
        create_staff("--password-file", str(tmp_path / name))
    assert_nobody_created()


def test_it_reads_the_password_from_the_environment(db, monkeypatch):
    monkeypatch.setenv("ERIN_PASSWORD", PASSWORD)
    create_staff("--password-env", "ERIN_PASSWORD")
    assert get_user_model().objects.get(username="erin").check_password(PASSWORD)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ERIN_PASSWORD", None, "ERIN_PASSWORD is not set"),
        ("ERIN_PASSWORD", "", "ERIN_PASSWORD is empty"),
        ("NOT A NAME", None, "takes the name of an environment variable"),
        ("", None, "takes the name of an environment variable"),
    ],
)
def test_it_refuses_an_unusable_environment_variable(db, monkeypatch, name, value, message):
    monkeypatch.delenv("ERIN_PASSWORD", raising=False)
    if value is not None:
        monkeypatch.setenv(name, value)
    with pytest.raises(CommandError, match=message):
        create_staff("--password-env", name)
    assert_nobody_created()


def test_the_environment_password_still_meets_the_validators(db, monkeypatch):
    monkeypatch.setenv("ERIN_PASSWORD", "password1234")
    with pytest.raises(CommandError, match="too common"):
        create_staff("--password-env", "ERIN_PASSWORD")
    assert_nobody_created()


@pytest.mark.parametrize(
    "sources",
    [
        ("--password", PASSWORD, "--password-env", "ERIN_PASSWORD"),
        ("--password-file", "/dev/null", "--password", PASSWORD),
        ("--password-file", "/dev/null", "--password-env", "ERIN_PASSWORD"),
    ],
)
def test_it_refuses_two_sources(db, monkeypatch, sources):
    monkeypatch.setenv("ERIN_PASSWORD", PASSWORD)
    with pytest.raises(CommandError, match="not allowed with argument"):
        create_staff(*sources)
    assert_nobody_created()


def test_it_refuses_an_empty_command_line_password(db):
    with pytest.raises(CommandError, match="--password is empty"):
        create_staff("--password", "")
    assert_nobody_created()


def test_the_help_says_a_command_line_password_shows_in_ps():
    out = StringIO()
    from ledger.management.commands.create_staff import Command

    Command().create_parser("manage.py", "create_staff").print_help(out)
    text = " ".join(out.getvalue().split())
    assert "visible to every user of the machine in `ps`" in text
    for source in ("--password-file PATH", "--password-env NAME", "--password PW"):
        assert source in text


# The real command in a process of its own: the prompt needs a terminal, and a missing one must
# be noticed rather than waited on.
def _env() -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "REDIS_URL") if name in os.environ}
    return {**keep, "DEBUG": "1", "DATABASE_URL": database_url_for_subprocesses()}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_without_a_source_or_a_terminal_it_refuses_and_says_what_to_give():
    done = subprocess.run(
        [sys.executable, "manage.py", "create_staff", "erin", *ROLE],
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no terminal to ask for one" in done.stderr and "--password-file" in done.stderr
    assert "Traceback" not in done.stderr
    assert_nobody_created()


def _read_until(fd: int, marker: bytes, seen: bytearray, deadline: float) -> None:
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} from the command; it said {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal closed: the command ended
                chunk = b""
            assert chunk, f"the command ended before {marker!r}; it said {bytes(seen)!r}"
            seen += chunk


def _prompted(first: str, second: str) -> tuple[int, bytes]:
    """create_staff in a pseudo-terminal, answering its two prompts; its status and output."""
    leader, follower = os.openpty()
    child = subprocess.Popen(
        [sys.executable, "manage.py", "create_staff", "erin", *ROLE],
        cwd=ROOT,
        env=_env(),
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    seen = bytearray()
    try:
        deadline = time.monotonic() + 120
        _read_until(leader, b"Password: ", seen, deadline)
        os.write(leader, first.encode() + b"\n")
        _read_until(leader, b"(again): ", seen, deadline)
        os.write(leader, second.encode() + b"\n")
        status = child.wait(timeout=120)
        while select.select([leader], [], [], 0.2)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(leader)
    return status, bytes(seen)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_in_a_terminal_it_prompts_twice_without_echo_and_creates_the_user():
    status, said = _prompted(PASSWORD, PASSWORD)
    assert status == 0, said
    assert b"Created user erin: viewer at acme" in said
    assert PASSWORD.encode() not in said  # not echoed
    assert get_user_model().objects.get(username="erin").check_password(PASSWORD)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_in_a_terminal_two_different_answers_change_nothing():
    status, said = _prompted(PASSWORD, PASSWORD + "-typo")
    assert status == 1, said
    assert b"The two passwords differ" in said
    assert_nobody_created()
