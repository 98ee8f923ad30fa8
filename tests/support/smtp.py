"""A real SMTP server on this machine for the tests that read what Saga Admin mails: aiosmtpd in a
thread of the test process, on a free port, keeping every message it is sent; and the Django
settings that point the SMTP mail backend at it. A test reads the message as a recipient would
(``email`` parses the bytes that crossed the wire) and follows its links."""

from __future__ import annotations

import email
import email.policy
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from tests.support.processes import free_port, wait_for


@dataclass
class Received:
    """One message as it crossed the wire: who it was addressed to (the envelope) and its parse."""

    recipients: list[str]
    message: EmailMessage

    @property
    def text(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        assert part is not None, "the message has no text part"
        return str(part.get_content()).replace("\r\n", "\n")

    def links(self, label: str) -> list[str]:
        """The URLs on the message's lines that start with ``label:`` (``Approve``, ``Open``)."""
        return re.findall(rf"^{re.escape(label)}: (\S+)$", self.text, flags=re.MULTILINE)


@dataclass
class SmtpServer:
    port: int
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's naming
        parsed = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        with self._lock:
            self.received.append(Received(recipients=list(envelope.rcpt_tos), message=parsed))
        return "250 OK"

    def to(self, address: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if address in r.recipients]

    def wait_for_mail_to(self, address: str, *, count: int = 1) -> list[Received]:
        return wait_for(
            lambda: self.to(address) if len(self.to(address)) >= count else None,
            what=f"{count} message(s) to {address}",
        )

    def settings(self) -> dict[str, Any]:
        """Django's SMTP backend, sending here."""
        return {
            "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": self.port,
            "EMAIL_USE_TLS": False,
            "EMAIL_USE_SSL": False,
            "EMAIL_HOST_USER": "",
            "EMAIL_HOST_PASSWORD": "",
            "EMAIL_TIMEOUT": 10,
        }


@contextmanager
def smtp_server() -> Iterator[SmtpServer]:
    """An SMTP server on 127.0.0.1 for the length of the block."""
    # aiosmtpd logs every SMTP command at INFO: noise in a failing test's output.
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    server = SmtpServer(port=free_port())
    controller = Controller(server, hostname="127.0.0.1", port=server.port)
    controller.start()
    try:
        yield server
    finally:
        controller.stop()
