"""Helpers for ``scripts/run.sh``: the embedded PostgreSQL under ``.data/pg``, free ports, waiting
for a URL. Standard library plus the ``pgserver`` wheel (the ``local`` extra), so it runs from
the venv before Django is configured.

    python scripts/devservers.py pg-start .data/pg saga_admin   # prints the DATABASE_URL
    python scripts/devservers.py pg-stop .data/pg
    python scripts/devservers.py free-port 8000                 # prints 8000 or the next free one
    python scripts/devservers.py wait-url http://127.0.0.1:8000/healthz 60
"""

from __future__ import annotations

import argparse
import os
import pwd
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path
from typing import Any


def _quiet_pgserver() -> None:
    # pgserver asks platformdirs for a runtime directory and warns when XDG_RUNTIME_DIR is unset
    # (always, under make); the fallback it picks is fine, the warning only confuses newcomers.
    warnings.filterwarnings("ignore", module="platformdirs")


def pg_start(datadir: Path, dbname: str) -> str:
    """Start (initialising on first use) a real PostgreSQL in ``datadir`` and return a URL for
    ``dbname``, creating that database if needed.

    pgserver listens on a unix socket inside ``datadir`` only, so it never fights another
    PostgreSQL for a TCP port. As root it runs the server as its own system user ``pgserver``
    (created with useradd on first use) because postgres refuses to run as root.
    """
    _quiet_pgserver()
    import pgserver
    import psycopg

    datadir.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this helper; run.sh stops it with pg-stop.
    server = pgserver.get_server(datadir.resolve(), cleanup_mode=None)
    info = server.get_postmaster_info()
    host = str(info.socket_dir) if info.socket_dir else f"{info.hostname}:{info.port}"
    # Any: these become psycopg.connect's keyword arguments, each of its own type.
    conninfo: dict[str, Any] = {
        "host": str(info.socket_dir) if info.socket_dir else info.hostname,
        "user": "postgres",
        "dbname": "postgres",
        "autocommit": True,
    }
    if info.port and not info.socket_dir:
        conninfo["port"] = info.port
    with psycopg.connect(**conninfo) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{dbname}"')
    if info.socket_dir:
        return f"postgres://postgres@{urllib.parse.quote(host, safe='')}/{dbname}"
    return f"postgres://postgres@{host}/{dbname}"


def pg_stop(datadir: Path) -> None:
    _quiet_pgserver()
    # pgserver makes one function per bundled binary (pg_ctl, initdb, …) when it is imported.
    from pgserver import pg_ctl  # type: ignore[attr-defined]

    if not (datadir / "postmaster.pid").exists():
        return
    # The server runs as whoever owns the data directory (pgserver's own user when we are root).
    owner = pwd.getpwuid(datadir.stat().st_uid).pw_name
    user = owner if os.geteuid() == 0 and owner != "root" else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=datadir.resolve(), user=user, timeout=60)


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Without SO_REUSEADDR a port in TIME_WAIT from a previous run would look taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    # Bindable is not enough when another server listens on the wildcard address only.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex((host, port)) != 0


def free_port(start: int, tries: int = 200) -> int:
    for port in range(start, start + tries):
        if _port_free(port):
            return port
    raise SystemExit(f"no free port in {start}..{start + tries - 1}")


def wait_url(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - a local URL we built
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise SystemExit(f"{url} did not answer 200 within {timeout_s:.0f}s (last: {last})")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("pg-start")
    start.add_argument("datadir", type=Path)
    start.add_argument("dbname")
    stop = sub.add_parser("pg-stop")
    stop.add_argument("datadir", type=Path)
    port = sub.add_parser("free-port")
    port.add_argument("start", type=int)
    wait = sub.add_parser("wait-url")
    wait.add_argument("url")
    wait.add_argument("timeout", type=float)
    args = parser.parse_args(argv)

    if args.command == "pg-start":
        print(pg_start(args.datadir, args.dbname))
    elif args.command == "pg-stop":
        pg_stop(args.datadir)
    elif args.command == "free-port":
        print(free_port(args.start))
    elif args.command == "wait-url":
        wait_url(args.url, args.timeout)


if __name__ == "__main__":
    main(sys.argv[1:])
