"""Helpers for ``scripts/run.sh`` and ``scripts/manage.sh``: the embedded PostgreSQL under
``.data/pg``, free ports, waiting for a URL (and for the server run.sh started to be the one
listening on its port), and the one-playground-per-data-directory rule.
Standard library plus the ``pgserver`` wheel (the ``local`` extra), so it runs from the venv
before Django is configured.

    python scripts/devservers.py pg-start .data/pg saga_admin   # prints the DATABASE_URL
    python scripts/devservers.py pg-stop .data/pg
    python scripts/devservers.py free-port 8000                 # prints 8000 or the next free one
    python scripts/devservers.py free-port 8765 --except 8000   # ... skipping ports taken by us
    python scripts/devservers.py port-free 8000                 # exit 0 when 8000 is free
    python scripts/devservers.py port-free 8000 --host 0.0.0.0  # ... on that address
    python scripts/devservers.py bind-host 0.0.0.0              # SAGA_RUN_HOST checked: "BIND URLHOST"
    python scripts/devservers.py wait-url http://127.0.0.1:8000/healthz 60
    python scripts/devservers.py wait-own http://127.0.0.1:8765/mcp PID 30   # ... answered by PID's session
    python scripts/devservers.py status .data                   # the running playground, or exit 1
    python scripts/devservers.py already-running .data          # run.sh's refusal (lock held)
    python scripts/devservers.py check-leftovers .data          # run.sh, once it holds the lock
    python scripts/devservers.py stop .data                     # `make stop`

One playground per data directory. ``run.sh`` holds an exclusive ``flock`` on ``DATA/run.lock``
for as long as it lives (the kernel drops it when the process dies, however it dies, so a lock is
never stale) and keeps beside it ``run.info`` (its pid and URL), ``run.procs`` (every process it
started: name, pid, start time) and ``env`` (the environment for management commands). A start
that finds the lock held refuses; one that finds files of a dead ``run.sh`` cleans them up, unless
something that run started is still alive (its processes, or a PostgreSQL on ``DATA/pg``): then it
refuses too, naming them, because it never stops or shares a server it did not start.
"""

from __future__ import annotations

import sys


def _quiet_on_interrupt(kind: type[BaseException], value: BaseException, tb: object) -> None:
    """Ctrl-C in make run's terminal reaches this helper too (one foreground process group), on
    whatever line it is, an import included: run.sh's trap stops what was started and says so, and
    a traceback here reads as a crash under that message. Python still ends by the signal."""
    if issubclass(kind, KeyboardInterrupt):
        return
    sys.__excepthook__(kind, value, tb)  # type: ignore[arg-type]


sys.excepthook = _quiet_on_interrupt

# The imports come after the hook, so that an interrupt during them is quiet too.
# ruff: noqa: E402
import argparse
import contextlib
import fcntl
import ipaddress
import os
import pwd
import signal
import socket
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
        return probe.connect_ex((_probe_host(host), port)) != 0


def free_port(
    start: int, tries: int = 200, *, taken: frozenset[int] = frozenset(), host: str = "127.0.0.1"
) -> int:
    """The first free port from ``start`` on ``host``, skipping ``taken`` (ports chosen for
    servers that are not listening yet)."""
    for port in range(start, start + tries):
        if port not in taken and _port_free(port, host):
            return port
    raise SystemExit(f"no free port in {start}..{start + tries - 1}")


# Every interface: make run's opt-in (SAGA_RUN_HOST=0.0.0.0), never its default.
WILDCARD = "0.0.0.0"  # noqa: S104


def _probe_host(host: str) -> str:
    """Where to knock on a port the web will bind on ``host`` (the wildcard: on loopback)."""
    return "127.0.0.1" if host == WILDCARD else host


def bind_host(value: str) -> tuple[str, str]:
    """``make run``'s SAGA_RUN_HOST, checked: the address the web binds (an IPv4 address of this
    machine, or 0.0.0.0 for all of them) and the host of the URL it is reached at from here."""
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise SystemExit(
            f"SAGA_RUN_HOST={value!r} is not an IPv4 address: give 127.0.0.1 (the default: this "
            "machine only), 0.0.0.0 (every interface) or one address of this machine."
        ) from None
    if address.is_unspecified:
        return WILDCARD, "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((str(address), 0))
        except OSError:
            raise SystemExit(f"SAGA_RUN_HOST={value} is not an address of this machine.") from None
    return str(address), str(address)


def wait_url(url: str, timeout_s: float, *, any_status: bool = False) -> None:
    """Wait until ``url`` answers 200 (with ``any_status``: answers at all, as an MCP endpoint does
    a bare GET, with a 4xx)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - a local URL we built
                if response.status == 200 or any_status:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            if any_status:
                return
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.3)
    wanted = "at all" if any_status else "200"
    raise SystemExit(f"{url} did not answer {wanted} within {timeout_s:.0f}s (last: {last})")


# --- Is the listener on a port the process we started? ----------------------------------------

# A server that lost its port to another program exits (or never listens), and whoever holds the
# port answers its URL instead: waiting for "any answer" would take a stranger (another
# playground's gateway, say) for ours. run.sh starts each server as the leader of its own session
# (setsid); a listener is ours when a process of that session holds its socket.

# Where a server bound on loopback may be answered from: loopback itself and the wildcards.
_LOCAL_LISTEN = {"127.0.0.1", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1"}  # noqa: S104


def _decode_address(hex_address: str) -> str:
    """An address as /proc/net/tcp{,6} write it: 32-bit words in host (little-endian) order."""
    raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def listening_inodes(port: int) -> set[int]:
    """The socket inodes of every TCP socket listening on ``port`` where a connection to
    127.0.0.1 may land (loopback or a wildcard address), from the kernel's tables."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                # 0A: LISTEN.
                if (
                    fields[3] == "0A"
                    and int(hex_port, 16) == port
                    and _decode_address(address) in _LOCAL_LISTEN
                ):
                    found.add(int(fields[9]))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[3])


def _holders(inodes: set[int]) -> list[str]:
    """Who holds these sockets, as "pid N (command)", as far as /proc lets us see."""
    held = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _socket_inodes(int(entry.name)) & inodes:
            with contextlib.suppress(OSError):
                comm = (entry / "comm").read_text().strip()
                held.append(f"pid {entry.name} ({comm})")
    return held


def listener_state(port: int, leader: int) -> str:
    """``"ours"`` when something listens on ``port`` and every such listener belongs to the
    session ``leader`` leads; ``"none"`` when nothing listens yet; ``"foreign"`` when another
    program holds a listener there (alone, or beside ours: then connections may reach either)."""
    listening = listening_inodes(port)
    if not listening:
        return "none"
    ours: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _session_of(int(entry.name)) == leader:
            ours |= _socket_inodes(int(entry.name))
    return "ours" if listening <= ours else "foreign"


# wait-own's exit status when another program answers on the port: run.sh then tries another
# port (or, for a port you chose, refuses).
PORT_TAKEN = 3


def wait_own(url: str, leader: int, timeout_s: float) -> int:
    """Wait until the server ``run.sh`` started as session leader ``leader`` listens on ``url``'s
    port and answers there (any HTTP status: an MCP endpoint answers a bare GET with a 4xx).
    0 when it does; ``PORT_TAKEN`` when another program listens on that port; 1 when it exits
    first or does not answer in time."""
    port = urllib.parse.urlsplit(url).port
    assert port is not None, url
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = listener_state(port, leader)
        if state == "foreign":
            held = ", ".join(_holders(listening_inodes(port))) or "a process this user cannot see"
            print(
                f"port {port} is taken by another program ({held}), not by the server this make run started."
            )
            return PORT_TAKEN
        if _start_time(leader) is None:
            print(f"the server meant for port {port} exited before it listened there.")
            return 1
        if state == "ours":
            try:
                wait_url(url, max(deadline - time.monotonic(), 1.0), any_status=True)
            except SystemExit as exc:
                print(exc)
                return 1
            return 0
        time.sleep(0.2)
    print(f"the server meant for port {port} did not listen there within {timeout_s:.0f}s.")
    return 1


# --- One playground per data directory -----------------------------------------------------

LOCK = "run.lock"
INFO = "run.info"
PROCS = "run.procs"
ENV = "env"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), or None when there is no
    such process (or only its zombie). A pid and its start time name one process: a pid reused
    later does not match."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # A zombie has exited: it only waits for its parent to read its status.
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of a PostgreSQL running on ``pgdata`` (its postmaster.pid names a live postgres)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return pid if comm in {"postgres", "postmaster"} else None


def _locked(data: Path) -> bool:
    """True while a ``run.sh`` holds the lock on ``data`` (a playground is starting or running)."""
    path = data / LOCK
    if not path.exists():
        return False
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _info(data: Path) -> dict[str, str]:
    try:
        lines = (data / INFO).read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _leftovers(data: Path) -> list[tuple[str, int]]:
    """What a dead ``run.sh`` started that is still alive: (name, pid), in start order."""
    alive: list[tuple[str, int]] = []
    with contextlib.suppress(OSError):
        for line in (data / PROCS).read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit() and _start_time(int(parts[1])) == parts[2]:
                alive.append((parts[0], int(parts[1])))
    pg = _postmaster_pid(data / "pg")
    if pg is not None:
        alive.insert(0, ("postgres", pg))
    return alive


def _make(data: Path, target: str) -> str:
    """How to say ``make TARGET`` for this data directory."""
    default = (Path(__file__).resolve().parent.parent / ".data").resolve()
    prefix = "" if data.resolve() == default else f"SAGA_RUN_DATA={data} "
    return f"{prefix}make {target}"


def already_running(data: Path) -> str:
    info = _info(data)
    pid = info.get("pid", "?")
    url = info.get("url")
    where = f"at {url}/" if url else "(still starting; no URL yet)"
    return "\n".join(
        [
            f"Saga Admin is already running from {data} {where} (make run, pid {pid}).",
            "Nothing was started and nothing was stopped.",
            f'  Use it:    {_make(data, "manage")} ARGS="create_agent_key --tenant acme --name my-agent"',
            f"  Stop it:   Ctrl-C in its terminal, or {_make(data, 'stop')}",
            "  A second one beside it: a separate clone, or its own data directory and port, e.g.",
            "             SAGA_RUN_DATA=/tmp/saga-2 PORT=8100 make run",
            "             (or your own servers: DATABASE_URL=… REDIS_URL=… SAGA_RUN_DATA=… make run)",
        ]
    )


def check_leftovers(data: Path) -> int:
    """Called by run.sh once it holds the lock. Refuse (1) when a previous run's servers are still
    alive; otherwise clean up a dead run's files (0)."""
    alive = _leftovers(data)
    if alive:
        names = ", ".join(f"{name} (pid {pid})" for name, pid in alive)
        print(
            f"An earlier make run on {data} is gone, but what it started is still running: {names}.\n"
            "Nothing was started and nothing was stopped: this start would share or fight over them.\n"
            f"  Stop them:  {_make(data, 'stop')}",
            file=sys.stderr,
        )
        return 1
    stale = _info(data).get("pid")
    for name in (INFO, PROCS, ENV):
        (data / name).unlink(missing_ok=True)
    if stale:
        print(f"    (cleaned up after an earlier make run, pid {stale}, that is no longer running)")
    return 0


def playground_status(data: Path) -> int:
    if _locked(data) and (data / ENV).exists():
        print(_info(data).get("url", ""))
        return 0
    if _locked(data):
        print(f"The playground on {data} is still starting; try again in a few seconds.", file=sys.stderr)
        return 1
    alive = _leftovers(data)
    if alive:
        names = ", ".join(f"{name} (pid {pid})" for name, pid in alive)
        print(
            f"The make run on {data} is gone; what it started is still running ({names}). "
            f"Stop it with `{_make(data, 'stop')}`, then start again with `{_make(data, 'run')}`.",
            file=sys.stderr,
        )
        return 1
    print(
        f"No make run playground is running on {data}. Start one with `make run` in another terminal "
        "(one started with SAGA_RUN_DATA=DIR is reached with the same SAGA_RUN_DATA=DIR here).",
        file=sys.stderr,
    )
    return 1


def _wait_gone(pid: int, start: str | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _start_time(pid) != start:
            return True
        time.sleep(0.1)
    return False


def playground_stop(data: Path) -> int:
    """``make stop``: ask the running ``run.sh`` to stop (it stops everything it started, in
    reverse order), or stop what a dead one left behind."""
    if _locked(data):
        pid = int(_info(data).get("pid", "0"))
        if not pid:
            print(
                f"The playground on {data} is starting and has not said its pid yet; try again.",
                file=sys.stderr,
            )
            return 1
        start = _start_time(pid)
        print(f"Stopping the make run on {data} (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, start, 90):
            print(f"pid {pid} has not stopped within 90 s; see {data}/logs/", file=sys.stderr)
            return 1
        print("Stopped.")
        return 0
    alive = _leftovers(data)
    if not alive:
        print(f"No make run playground is running on {data}; nothing to stop.")
        return 0
    for name, pid in reversed(alive):
        if name == "postgres":
            pg_stop(data / "pg")
        else:
            start = _start_time(pid)
            # Each was started as the leader of its own process group (setsid).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            if not _wait_gone(pid, start, 10):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        print(f"    stopped {name} (pid {pid}), left behind by an earlier make run")
    for name in (INFO, PROCS, ENV):
        (data / name).unlink(missing_ok=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per helper above."""
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
    port.add_argument("--except", dest="taken", type=int, nargs="*", default=[], metavar="PORT")
    port.add_argument("--host", default="127.0.0.1")
    free = sub.add_parser("port-free")
    free.add_argument("port", type=int)
    free.add_argument("--host", default="127.0.0.1")
    sub.add_parser("bind-host").add_argument("value")
    wait = sub.add_parser("wait-url")
    wait.add_argument("url")
    wait.add_argument("timeout", type=float)
    wait.add_argument("--any-status", action="store_true")
    own = sub.add_parser("wait-own")
    own.add_argument("url")
    own.add_argument("leader", type=int)
    own.add_argument("timeout", type=float)
    for name in ("status", "already-running", "check-leftovers", "stop"):
        sub.add_parser(name).add_argument("data", type=Path)
    return parser


def _ports(args: argparse.Namespace) -> None:
    if args.command == "free-port":
        print(free_port(args.start, taken=frozenset(args.taken), host=args.host))
    elif args.command == "port-free":
        sys.exit(0 if _port_free(args.port, args.host) else 1)
    else:
        print(*bind_host(args.value))


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)

    if args.command == "pg-start":
        print(pg_start(args.datadir, args.dbname))
    elif args.command == "pg-stop":
        pg_stop(args.datadir)
    elif args.command in ("free-port", "port-free", "bind-host"):
        _ports(args)
    elif args.command == "wait-url":
        wait_url(args.url, args.timeout, any_status=args.any_status)
    elif args.command == "wait-own":
        sys.exit(wait_own(args.url, args.leader, args.timeout))
    elif args.command == "status":
        sys.exit(playground_status(args.data))
    elif args.command == "already-running":
        print(already_running(args.data), file=sys.stderr)
    elif args.command == "check-leftovers":
        sys.exit(check_leftovers(args.data))
    elif args.command == "stop":
        sys.exit(playground_stop(args.data))


if __name__ == "__main__":
    main(sys.argv[1:])
