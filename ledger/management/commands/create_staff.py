from __future__ import annotations

import getpass
import os
import re
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra import errors
from ledger import staff
from ledger.audit import Actor
from ledger.models import Membership
from ledger.services import keys

# A password file holds one password: a secret mounted by an orchestrator is a few bytes, and a
# path pointing at something large (a log, /dev/zero) is refused before it is read whole.
PASSWORD_FILE_MAX_BYTES = 4096
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SOURCES = (
    "--password-file PATH, --password-env NAME or --password PW (or run it in a terminal to be prompted)"
)


def password_from_file(path: str) -> str:
    """The one line of ``path`` (``-``: standard input), without its line ending."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(PASSWORD_FILE_MAX_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                raw = handle.read(PASSWORD_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise CommandError(f"Cannot read the password file {path}: {exc.strerror or exc}.") from None
    if len(raw) > PASSWORD_FILE_MAX_BYTES:
        raise CommandError(
            f"The password file {path} is over {PASSWORD_FILE_MAX_BYTES} bytes: not a password."
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CommandError(f"The password file {path} is not UTF-8 text.") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if "\n" in text or "\r" in text:
        raise CommandError(
            f"The password file {path} holds more than one line; it must hold the password alone."
        )
    if not text:
        raise CommandError(f"The password file {path} is empty.")
    return text


def password_from_env(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise CommandError(f"--password-env takes the name of an environment variable, not {name!r}.")
    value = os.environ.get(name)
    if value is None:
        raise CommandError(f"The environment variable {name} is not set.")
    if not value:
        raise CommandError(f"The environment variable {name} is empty.")
    return value


def password_from_prompt() -> str:
    if not sys.stdin.isatty():
        raise CommandError(f"No password given and no terminal to ask for one: give {SOURCES}.")
    try:
        first = getpass.getpass("Password: ")
        second = getpass.getpass("Password (again): ")
    except (EOFError, KeyboardInterrupt):
        raise CommandError("No password entered; nothing was changed.") from None
    if first != second:
        raise CommandError("The two passwords differ; nothing was changed.")
    if not first:
        raise CommandError("The password is empty; nothing was changed.")
    return first


class Command(BaseCommand):
    help = (
        "Create or update a dashboard user with a role in a tenant (creating the tenant if needed). "
        "Only the admin role reaches the Django admin. The password comes from one source: a prompt "
        "(in a terminal, when no other is given), --password-file, --password-env or --password."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            "--password-file",
            metavar="PATH",
            help="read the password from this file (its one line; a trailing newline is dropped; - is stdin)",
        )
        source.add_argument(
            "--password-env", metavar="NAME", help="read the password from the environment variable NAME"
        )
        source.add_argument(
            "--password",
            metavar="PW",
            help="the password itself: visible to every user of the machine in `ps` and kept in the "
            "shell's history; prefer the prompt, --password-file or --password-env",
        )
        parser.add_argument("--tenant", required=True, metavar="SLUG")
        parser.add_argument("--role", required=True, choices=Membership.Role.values)
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, username: str, tenant: str, role: str, email: str, **options: Any) -> None:
        password = self.password(options)
        try:
            owner = keys.tenant_get_or_create(slug=tenant)
            result = staff.staff_set(
                username=username,
                password=password,
                tenant=owner,
                role=role,
                email=email,
                actor=Actor.system("create_staff"),
            )
        except errors.SagaError as exc:
            raise CommandError(exc.message) from None
        verb = "Created" if result.user_created else "Updated"
        self.stdout.write(
            f"{verb} user {result.user.get_username()}: {role} at {owner.slug}"
            f"{' (Django admin access)' if result.user.is_staff else ''}."
        )

    @staticmethod
    def password(options: dict[str, Any]) -> str:
        """The password from its one source (argparse refuses two)."""
        if options.get("password_file") is not None:
            return password_from_file(options["password_file"])
        if options.get("password_env") is not None:
            return password_from_env(options["password_env"])
        if options.get("password") is not None:
            if not options["password"]:
                raise CommandError("--password is empty.")
            return str(options["password"])
        return password_from_prompt()
