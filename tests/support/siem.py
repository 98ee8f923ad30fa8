"""Real SIEM-side receivers for the audit stream tests: a syslog receiver over TCP (optionally
TLS) that parses RFC 5424 messages framed by octet counting (RFC 6587), and an HTTP(S) receiver in
the manner of Splunk's HTTP Event Collector. Each keeps what it received, in arrival order, and
can be stopped and started again on the same port (a sink outage)."""

from __future__ import annotations

import json
import re
import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.processes import quiet_port

# RFC 5424: HEADER SP STRUCTURED-DATA [SP MSG]
_HEADER = re.compile(
    rb"<(?P<pri>\d{1,3})>(?P<version>[1-9]\d{0,2}) (?P<timestamp>\S+) (?P<hostname>\S+) "
    rb"(?P<app>\S+) (?P<procid>\S+) (?P<msgid>\S+) "
)
_SD_PARAM = re.compile(r'\s+([^\s=\]"]{1,32})="((?:\\.|[^"\\])*)"')
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SyslogMessage:
    pri: int
    timestamp: str
    hostname: str
    app: str
    msgid: str
    sd_id: str
    params: dict[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


def parse_rfc5424(frame: bytes) -> SyslogMessage:
    """One message, strictly: the header, one SD element (or ``-``), then the MSG with its BOM."""
    header = _HEADER.match(frame)
    if header is None:
        raise ValueError(f"not an RFC 5424 header: {frame[:80]!r}")
    if header["version"] != b"1":
        raise ValueError("RFC 5424 version must be 1")
    rest = frame[header.end() :].decode("utf-8")
    sd_id, params = "-", {}
    if rest.startswith("["):
        end = _sd_end(rest)
        element = rest[1:end]
        sd_id, _, body = element.partition(" ")
        params = {m[1]: re.sub(r"\\(.)", r"\1", m[2]) for m in _SD_PARAM.finditer(" " + body)}
        rest = rest[end + 1 :]
    elif rest.startswith("-"):
        rest = rest[1:]
    else:
        raise ValueError("no structured data")
    if not rest.startswith(" \ufeff"):
        raise ValueError("the MSG must be UTF-8 with its BOM")
    return SyslogMessage(
        pri=int(header["pri"]),
        timestamp=header["timestamp"].decode(),
        hostname=header["hostname"].decode(),
        app=header["app"].decode(),
        msgid=header["msgid"].decode(),
        sd_id=sd_id,
        params=params,
        text=rest[2:],
    )


def _sd_end(text: str) -> int:
    escaped = in_value = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            in_value = not in_value
        elif char == "]" and not in_value:
            return index
    raise ValueError("unterminated structured data")


def read_frames(stream: Any) -> list[bytes]:
    """Octet-counted frames (``<length> <message>``) until the end of the stream."""
    frames: list[bytes] = []
    while True:
        digits = b""
        while True:
            byte = stream.read(1)
            if not byte:
                if digits:
                    raise ValueError("the stream ended inside a frame's length")
                return frames
            if byte == b" ":
                break
            if not byte.isdigit() or len(digits) > 9:
                raise ValueError(f"bad octet count {digits + byte!r}")
            digits += byte
        body = stream.read(int(digits))
        if len(body) != int(digits):
            raise ValueError("the stream ended inside a frame")
        frames.append(body)


@dataclass
class _Base:
    tls: ssl.SSLContext | None = None
    port: int = field(default_factory=quiet_port)
    messages: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: Any = None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[Any]:
        with self.lock:
            return list(self.messages)

    def _serve(self, server: Any) -> None:
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


class _TLSMixin:
    context: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()  # type: ignore[misc]
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_side=True)
        return sock, address


class SyslogReceiver(_Base):
    """Parses every frame as RFC 5424; keeps ``SyslogMessage``s."""

    def start(self) -> SyslogReceiver:
        receiver = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    parsed = [parse_rfc5424(frame) for frame in read_frames(self.rfile)]
                except (ValueError, OSError) as exc:
                    with receiver.lock:
                        receiver.errors.append(str(exc))
                    return
                with receiver.lock:
                    receiver.messages.extend(parsed)

        class Server(_TLSMixin, socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        Server.context = self.tls
        self._serve(Server(("127.0.0.1", self.port), Handler))
        return self

    def url(self) -> str:
        return f"{'tcp+tls' if self.tls else 'tcp'}://127.0.0.1:{self.port}"


class HecReceiver(_Base):
    """Splunk HEC's collector: ``Authorization: Splunk <token>``, a body of concatenated
    ``{"time", "event", ...}`` objects; keeps each object (the envelope), in order."""

    token: str = "hec-token"

    def start(self) -> HecReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Splunk {receiver.token}":
                    self._answer(401, {"text": "Invalid token", "code": 4})
                    return
                decoder, text, objects, at = json.JSONDecoder(), raw.decode(), [], 0
                while at < len(text.strip()):
                    while text[at].isspace():
                        at += 1
                    value, at = decoder.raw_decode(text, at)
                    objects.append(value)
                if not all(isinstance(o, dict) and "event" in o and "time" in o for o in objects):
                    self._answer(400, {"text": "Event field is required", "code": 12})
                    return
                with receiver.lock:
                    receiver.messages.extend(objects)
                self._answer(200, {"text": "Success", "code": 0})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
                pass

        class Server(_TLSMixin, ThreadingHTTPServer):
            allow_reuse_address = True

        Server.context = self.tls
        self._serve(Server(("127.0.0.1", self.port), Handler))
        return self

    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/services/collector/event"
