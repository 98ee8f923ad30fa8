"""One tenant's names under a zone that never answers cannot make another tenant's URLs fail.

The outbound guard resolves names on threads of their own, and a lookup cannot be interrupted: a
stuck one holds its thread until the C library gives up. With one pool of 4 threads per process for
every tenant, a tenant that sent a few ``resume_url``s under a zone whose DNS server never answers
filled the pool, and every other tenant's checks waited behind them and were refused as
unresolvable. The threads are now shared out per tenant (``infra.outbound._FairResolver``).

Nothing stands in for the resolver: a real web server (the Procfile's gunicorn) runs in a mount
namespace of its own whose /etc/resolv.conf names a DNS server of this test, which answers names
under ``ok.`` with a public address and never answers names under ``silent.`` (the C library told
to wait 10 s per query, far beyond the guard's 1 s bound). (``unshare`` and port 53 need root, as in
``test_resolve_bound.py``.)
"""

from __future__ import annotations

import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from ledger.models import Run
from tests.security.test_resolve_bound import LIBC_TIMEOUT_S, SilentDns, _answers, _env, _start, _stop
from tests.support.processes import free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ZONE = "saga-test.example"
PUBLIC_ADDRESS = "93.184.216.34"  # a public address: the guard lets it through (nothing connects)
FLOOD = 8  # tenant A's lookups under the silent zone, at once
BOUND_S = 1.0
MARGIN_S = 3.0


@dataclass
class ZonedDns(SilentDns):
    """Answers A queries for names under ``ok.<ZONE>`` with ``PUBLIC_ADDRESS`` (other types: no
    data); reads and never answers every other query."""

    silent_names: set[str] = field(default_factory=set)


def _question(query: bytes) -> tuple[str, int, int]:
    """The query's name, its type, and where its question ends."""
    labels, at = [], 12
    while query[at]:
        labels.append(query[at + 1 : at + 1 + query[at]].decode("ascii", "replace").lower())
        at += 1 + query[at]
    qtype = struct.unpack("!H", query[at + 1 : at + 3])[0]
    return ".".join(labels), qtype, at + 5


def _reply(query: bytes, qtype: int, end: int) -> bytes:
    answers = b""
    if qtype == 1:  # A
        answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(PUBLIC_ADDRESS)
    header = query[:2] + struct.pack("!HHHHH", 0x8180, 1, 1 if answers else 0, 0, 0)
    return header + query[12:end] + answers


@pytest.fixture
def zoned_dns(tmp_path: Path) -> Iterator[ZonedDns]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _attempt in range(20):
        address = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    else:
        raise AssertionError("no loopback address had port 53 free (binding it needs root)")
    resolv_conf = tmp_path / "resolv.conf"
    resolv_conf.write_text(f"nameserver {address}\noptions timeout:{LIBC_TIMEOUT_S} attempts:1\n")
    dns = ZonedDns(address=address, resolv_conf=resolv_conf)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with suppress(TimeoutError, OSError, IndexError, struct.error):
                query, peer = sock.recvfrom(4096)
                dns.queries.append(query)
                name, qtype, end = _question(query)
                if name.endswith(f".silent.{ZONE}"):
                    dns.silent_names.add(name)
                    continue  # never answered
                if name.endswith(f"ok.{ZONE}"):
                    sock.sendto(_reply(query, qtype, end), peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield dns
    stop.set()
    thread.join(timeout=5)
    sock.close()


def test_a_tenants_silent_zone_does_not_make_another_tenants_urls_unresolvable(
    zoned_dns, agent_key, outsider_key, redis_server, tmp_path
):
    """Fail (before): while tenant A's lookups under the silent zone held the 4 shared resolver
    threads, tenant B's ``resume_url`` under the answering zone was refused 422 as not allowed
    ("did not resolve within 1 s"). Pass: B's run is created at once, while A's own further lookups
    still wait for A's share and are refused after the bound."""
    port = free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    web = _start(
        zoned_dns.namespaced(
            [
                gunicorn,
                "saga_admin.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
                "--worker-class",
                "gthread",
                "--threads",
                str(FLOOD + 8),
            ]
        ),
        env=_env(redis_server.url),
        log=tmp_path / "web.log",
    )
    flood_answers: list[int] = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(f"{base}/healthz"), timeout=60, what="gunicorn to serve")
        tenant_a = httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {agent_key[1]}"}
        )
        tenant_b = httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {outsider_key[1]}"}
        )
        with tenant_a, tenant_b:
            for api in (tenant_a, tenant_b):  # a first request's imports
                assert (
                    api.post("/runs", json={"agent": "a", "request": "warm up"}, timeout=60).status_code
                    == 201
                )

            def flood(n: int) -> None:
                answer = tenant_a.post(
                    "/runs",
                    json={"agent": "a", "request": "r", "resume_url": f"https://n{n}.silent.{ZONE}/c"},
                    timeout=30,
                )
                flood_answers.append(answer.status_code)

            threads = [threading.Thread(target=flood, args=(n,), daemon=True) for n in range(FLOOD)]
            for thread in threads:
                thread.start()
            # The resolver threads A may hold are held: its DNS server was asked and is silent.
            wait_for(lambda: len(zoned_dns.silent_names) >= 4, timeout=10, interval=0.02, what="A's lookups")

            started = time.monotonic()
            other = tenant_b.post(
                "/runs",
                json={"agent": "b", "request": "r", "resume_url": f"https://hooks.ok.{ZONE}/commands"},
                timeout=30,
            )
            took = time.monotonic() - started
            for thread in threads:
                thread.join(timeout=30)
    finally:
        _stop(web)
    log = (tmp_path / "web.log").read_text(errors="replace")[-3000:]

    assert other.status_code == 201, (other.text, log)
    assert took < BOUND_S + MARGIN_S, took
    assert Run.objects.filter(resume_url=f"https://hooks.ok.{ZONE}/commands").count() == 1
    assert flood_answers == [422] * FLOOD  # A's own names: refused after the bound, as before
