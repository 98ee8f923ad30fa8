"""`make run` is safe to run twice, and `make manage` reaches the playground's database; its MCP
demo gateway answers and its MCP session is in the queue.

Real processes, no mocks: ``scripts/run.sh`` in this working tree with a throwaway data directory
(``SAGA_RUN_DATA``: its own PostgreSQL, Redis, keys and logs), no live demo traffic and a free
port; a second start against the same data directory; ``make manage``; SIGTERM. The child gets
none of the suite's DATABASE_URL / REDIS_URL / SECRET_KEY: it must find its own servers, and
``make manage`` must reach them even from a shell whose DATABASE_URL points elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from mcp import Client

from tests.support.processes import ROOT, free_port, wait_for

# A whole playground per test: the slow lane (`make test-fast` leaves it out). One at a time (one
# xdist group): a playground takes the demo MCP ports 8765/8766 or the next free ones, and two
# started at the same instant by parallel workers would both find the same ones free.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("make_run")]

RUN = [shutil.which("bash") or "/bin/bash", str(ROOT / "scripts" / "run.sh")]
DEVSERVERS = [sys.executable, str(ROOT / "scripts" / "devservers.py")]
MAKE = shutil.which("make") or "make"


def child_env(data: Path, **extra: str) -> dict[str, str]:
    """The environment of a newcomer's shell: none of this suite's servers or keys."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            "DATABASE_URL",
            "REDIS_URL",
            "SECRET_KEY",
            "DEBUG",
            "DJANGO_SETTINGS_MODULE",
            "PORT",
            "PROMETHEUS_MULTIPROC_DIR",
        }
        and not key.startswith("SAGA_")
    }
    env.update({"SAGA_RUN_DATA": str(data), "SAGA_DEMO_TRAFFIC": "0", **extra})
    return env


def start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def alive(pid: int, started: str | None = None) -> bool:
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def postmaster_pid(data: Path) -> int | None:
    with suppress(OSError, ValueError, IndexError):
        return int((data / "pg" / "postmaster.pid").read_text().splitlines()[0])
    return None


def recorded(data: Path) -> list[tuple[str, int, str]]:
    """run.sh's record of what it started: (name, pid, start time)."""
    with suppress(OSError):
        return [
            (name, int(pid), started)
            for name, pid, started in (line.split() for line in (data / "run.procs").read_text().splitlines())
        ]
    return []


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def port_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _decode_address(hex_address: str) -> str:
    """An address as /proc/net/tcp{,6} write it: 32-bit words in host (little-endian) order."""
    raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port``, from the kernel's tables."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(_decode_address(address))
    return found


def outward_address() -> str | None:
    """An IPv4 address of this machine other machines could connect to (not loopback): the one
    its default route leaves from (a UDP connect sends nothing), else the first global one `ip`
    lists; None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, suppress(OSError):
        probe.connect(("198.51.100.1", 9))
        address = probe.getsockname()[0]
        if not ipaddress.IPv4Address(address).is_loopback and address != "0.0.0.0":
            return str(address)
    listed = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=False
    )
    found = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", listed.stdout)
    return found.group(1) if found else None


def reachable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) == 0


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


async def mcp_tool_names(url: str) -> list[str]:
    async with Client(url, mode="legacy") as client:
        return [tool.name for tool in (await client.list_tools()).tools]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory under /tmp (pgserver, running as its own user under root, must reach it),
    and whatever a failing test left running on it stopped afterwards."""
    data = Path(tempfile.mkdtemp(prefix="saga-run-", dir="/tmp"))
    data.chmod(0o755)
    try:
        yield data
    finally:
        subprocess.run([*DEVSERVERS, "stop", str(data)], capture_output=True, timeout=120, check=False)
        for _name, pid, started in recorded(data):
            if alive(pid, started):
                with suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        if postmaster_pid(data) and alive(postmaster_pid(data) or 0):
            subprocess.run(
                [*DEVSERVERS, "pg-stop", str(data / "pg")], capture_output=True, timeout=60, check=False
            )
        shutil.rmtree(data, ignore_errors=True)


def test_a_second_make_run_refuses_and_make_manage_reaches_the_first(data_dir: Path) -> None:
    port, mcp_port, gateway_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    # The demo MCP server's and gateway's ports named by their knobs, as the web's by PORT.
    env = child_env(
        data_dir, PORT=str(port), SAGA_RUN_MCP_PORT=str(mcp_port), SAGA_RUN_GATEWAY_PORT=str(gateway_port)
    )
    # A lock left by a run that died: its process is gone, so the start cleans it up and proceeds.
    (data_dir / "run.info").write_text(f"pid={dead_pid()}\nurl=http://127.0.0.1:1\n")
    (data_dir / "run.procs").write_text(f"redis {dead_pid()} 1\n")

    out_path = data_dir.parent / f"{data_dir.name}.out"
    with out_path.open("wb") as out:
        first = subprocess.Popen(
            RUN, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    output = lambda: out_path.read_text(errors="replace")  # noqa: E731
    try:

        def up() -> bool:
            assert first.poll() is None, f"make run exited {first.returncode}:\n{output()[-4000:]}"
            return "Press Ctrl-C to stop." in output()

        wait_for(up, timeout=200, interval=0.5, what="the first make run to be up")
        procs, pg, gateway_url, redis_port = _check_the_first_run_is_up(output(), url, data_dir)
        assert gateway_url == f"http://127.0.0.1:{gateway_port}/mcp"
        assert f"Demo MCP server:         http://127.0.0.1:{mcp_port}/mcp" in output()
        _check_the_mcp_session_was_played_once(data_dir)
        _check_it_listens_on_loopback_only(output(), port, gateway_url)
        _check_a_second_start_refuses(env, data_dir, url, procs, pg)
        assert first.poll() is None
        _check_the_environment_file(data_dir)
        manage_env, args = _check_make_manage_reaches_it(data_dir, url)
        _check_sigterm_stops_everything(first, output, procs, pg, data_dir)
        assert not port_listening(port) and not port_listening(redis_port)
        assert not port_listening(int(gateway_url.rsplit(":", 1)[1].split("/", 1)[0]))
        assert not any((data_dir / name).exists() for name in ("env", "run.info", "run.procs"))

        # And with nothing running, make manage says so instead of reaching some other database.
        after = subprocess.run(
            [MAKE, "-s", "manage", args], cwd=ROOT, env=manage_env, capture_output=True, text=True, timeout=60
        )
        assert after.returncode != 0
        assert "No make run playground is running" in after.stderr and "Traceback" not in after.stderr
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                first.wait(timeout=60)
        out_path.unlink(missing_ok=True)


Procs = list[tuple[str, int, str]]


def _check_the_mcp_session_was_played_once(data_dir: Path) -> None:
    # The first start's seeding played each MCP agent's session once: one create_user reached the
    # demo MCP server (a second would fail, "A user … already exists", into a second queue item),
    # then the HR agent's promotion: one update_title (its reads are not journalled) and the
    # licence it asks for with a SKU that does not exist, which fails that session into the queue.
    journal = (data_dir / "logs" / "mcp-upstream-journal.jsonl").read_text().splitlines()
    assert [json.loads(line)["tool"] for line in journal] == [
        "create_user",
        "assign_license",
        "send_email",
        "update_title",
        "assign_license",
    ]


def _check_the_first_run_is_up(said: str, url: str, data_dir: Path) -> tuple[Procs, int, str, int]:
    """What the first start printed and started: (its processes, postgres's pid, the gateway's
    URL, the Redis port)."""
    assert "cleaned up after an earlier make run" in said
    assert get(f"{url}/healthz")[0] == 200
    # The app's own pages, as in a deployment: not Django's technical 404.
    status, body = get(f"{url}/no-such-page/")
    assert status == 404 and b"There is nothing here" in body and b"URLconf" not in body
    assert get(f"{url}/static/favicon.svg")[0] == 200  # hashed static files served with DEBUG off
    assert "make manage" in said and str(data_dir / "env") in said
    # Prometheus: the curl it printed works, with the token it generated and kept.
    assert f'curl -H "Authorization: Bearer $(cat {data_dir}/metrics-token)" {url}/metrics' in said
    token = (data_dir / "metrics-token").read_text().strip()
    status, body = get(f"{url}/metrics", token)
    assert status == 200 and b"saga_recovery_items_open{" in body and b"saga_rq_workers{" in body
    assert get(f"{url}/metrics")[0] == 401
    procs = recorded(data_dir)
    pg = postmaster_pid(data_dir)
    assert {name for name, _, _ in procs} == {"redis", "worker", "web", "mcp-upstream", "mcp-gateway"}
    assert pg
    # The MCP demo: the gateway it printed serves the demo server's tools over Streamable HTTP.
    found = re.search(r"MCP gateway \(saga-mcp\):\s+(http://127\.0\.0\.1:\d+/mcp)", said)
    assert found, said[-3000:]
    gateway_url = found.group(1)
    assert "create_user" in asyncio.run(mcp_tool_names(gateway_url))
    gateway_pid = next(pid for name, pid, _ in procs if name == "mcp-gateway")
    # Its key is in its environment only, never on its command line.
    assert "sk_" not in Path(f"/proc/{gateway_pid}/cmdline").read_text()
    redis_port = int((data_dir / "env").read_text().split("redis://127.0.0.1:", 1)[1].split("/", 1)[0])
    return procs, pg, gateway_url, redis_port


def _check_it_listens_on_loopback_only(said: str, port: int, gateway_url: str) -> None:
    # The playground serves demo logins whose passwords README publishes: its web, the demo MCP
    # server and the gateway listen on 127.0.0.1, and no other address of this machine answers.
    found = re.search(r"Demo MCP server:\s+http://127\.0\.0\.1:(\d+)/mcp", said)
    assert found, said[-3000:]
    ports = {
        "web": port,
        "mcp": int(found.group(1)),
        "gateway": int(gateway_url.rsplit(":", 1)[1].split("/")[0]),
    }
    assert {name: listening_addresses(number) for name, number in ports.items()} == {
        name: {"127.0.0.1"} for name in ports
    }
    assert "Listening on:            127.0.0.1 only" in said
    outward = outward_address()
    if outward is not None:
        assert all(reachable("127.0.0.1", number) for number in ports.values())
        assert not any(reachable(outward, number) for number in ports.values()), outward


def _check_a_second_start_refuses(
    env: dict[str, str], data_dir: Path, url: str, procs: Procs, pg: int
) -> None:
    # A second start on the same data directory — the same PORT, or none — starts nothing,
    # stops nothing, and says where the first one is and how to stop it.
    for second_env in (env, child_env(data_dir)):
        second = subprocess.run(RUN, cwd=ROOT, env=second_env, capture_output=True, text=True, timeout=90)
        said = second.stdout + second.stderr
        # Not a crash, but not a start either: run.sh says so with its own status, 3.
        assert second.returncode == 3, said
        assert f"already running from {data_dir} at {url}/" in said, said
        assert "make stop" in said and "SAGA_RUN_DATA=" in said, said
        assert "==> Starting" not in said and "==> Stopping" not in said, said
    assert get(f"{url}/healthz")[0] == 200
    assert all(alive(pid, started) for _, pid, started in procs) and alive(pg)


def _check_the_environment_file(data_dir: Path) -> None:
    # The environment file: mode 600, the playground's socket and Redis, secrets by reference.
    env_file = data_dir / "env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    text = env_file.read_text()
    assert "DATABASE_URL='postgres://postgres@" + str(data_dir / "pg").replace("/", "%2F") in text
    assert (data_dir / "secret-key").read_text().strip() not in text


def _check_make_manage_reaches_it(data_dir: Path, url: str) -> tuple[dict[str, str], str]:
    """(the environment make manage ran in, its ARGS), for the check after the stop."""
    # make manage from a shell whose DATABASE_URL/REDIS_URL point at the suite's servers: it
    # reaches the playground's database, and the key it prints works against its API.
    manage_env = {**os.environ, "SAGA_RUN_DATA": str(data_dir)}
    args = "ARGS=create_agent_key --tenant acme --name make-run-test --scopes operator"
    made = subprocess.run(
        [MAKE, "-s", "manage", args],
        cwd=ROOT,
        env=manage_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    key = made.stdout.strip().splitlines()[-1]
    assert key.startswith("sk_"), made.stdout
    status, body = get(f"{url}/api/v1/runs?limit=50", token=key)
    assert status == 200, body
    assert any(run["external_id"].startswith("demo:") for run in json.loads(body)["items"])
    # The demo MCP agents' two sessions through that gateway (the onboarding, the HR promotion)
    # each failed into the recovery queue, once.
    status, body = get(f"{url}/api/v1/recovery?limit=50", token=key)
    assert status == 200, body
    queued = [item for item in json.loads(body)["items"] if item["run"]["agent"] == "mcp-agent"]
    assert [item["reason"] for item in queued] == ["failed", "failed"], body
    assert sum("sofia.marino@@outlook.example" in item["run"]["error"] for item in queued) == 1, body
    assert get(f"{url}/api/v1/runs", token=key + "x")[0] == 401
    return manage_env, args


def _check_sigterm_stops_everything(
    first: subprocess.Popen[bytes], output: Callable[[], str], procs: Procs, pg: int, data_dir: Path
) -> None:
    # SIGTERM: everything it started stops, in reverse order, and its files go away. A stop as
    # asked is a success.
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 0, output()[-3000:]
    said = output()
    stops = [line.strip() for line in said.splitlines() if line.strip().startswith("stopped ")]
    assert stops == [
        "stopped mcp-gateway",
        "stopped web",
        "stopped worker",
        "stopped mcp-upstream",
        "stopped redis",
        "stopped postgres",
    ], said[-3000:]
    assert not any(alive(pid, started) for _, pid, started in procs)
    wait_for(lambda: not alive(pg), timeout=30, what="postgres to be gone")


def test_a_port_in_use_is_refused_before_anything_starts(data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = time.monotonic()
        run = subprocess.run(
            RUN, cwd=ROOT, env=child_env(data_dir, PORT=str(port)), capture_output=True, text=True, timeout=60
        )
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert f"PORT={port} is in use" in said and "nothing was started" in said, said
    assert "==> Starting" not in said and "==> Stopping" not in said and "    stopped" not in said, said
    assert not (data_dir / "pg").exists() and not (data_dir / "redis").exists()
    assert not (data_dir / "run.procs").exists() and not (data_dir / "env").exists()
    assert time.monotonic() - started < 30


def test_what_a_killed_run_left_behind_is_named_not_shared_and_make_stop_stops_it(data_dir: Path) -> None:
    # A killed make run (kill -9) whose redis outlived it: here a stand-in process, recorded as
    # run.sh records what it starts (its own session, pid and start time).
    leftover = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        (data_dir / "run.info").write_text(f"pid={dead_pid()}\nurl=http://127.0.0.1:1\n")
        (data_dir / "run.procs").write_text(f"redis {leftover.pid} {start_time(leftover.pid)}\n")
        run = subprocess.run(
            RUN,
            cwd=ROOT,
            env=child_env(data_dir, PORT=str(free_port())),
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = run.stdout + run.stderr
        assert run.returncode != 0, said
        assert f"redis (pid {leftover.pid})" in said and "make stop" in said, said
        assert "==> Starting" not in said and not (data_dir / "pg").exists(), said
        assert leftover.poll() is None

        manage = subprocess.run(
            [MAKE, "-s", "manage", "ARGS=check"],
            cwd=ROOT,
            env={**os.environ, "SAGA_RUN_DATA": str(data_dir)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert manage.returncode != 0 and "is gone" in manage.stderr, manage.stderr

        stop = subprocess.run(
            [MAKE, "-s", "stop"],
            cwd=ROOT,
            env={**os.environ, "SAGA_RUN_DATA": str(data_dir)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert f"stopped redis (pid {leftover.pid})" in stop.stdout
        assert leftover.wait(timeout=10) == -signal.SIGTERM
        assert not (data_dir / "run.procs").exists()
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


@pytest.mark.parametrize("where", ["every interface", "one address"])
def test_saga_run_host_opens_the_web_only_to_other_machines(data_dir: Path, where: str) -> None:
    # The opt-in: SAGA_RUN_HOST=0.0.0.0 binds the web on every interface (reachable at this
    # machine's outward address when it has one); SAGA_RUN_HOST=<an address of this machine> binds
    # it there alone, and the playground (its URL, its demo seeding through the API, its gateway)
    # works at that address. The demo MCP server and its gateway stay on 127.0.0.1 either way,
    # and the banner says what is exposed.
    outward = outward_address()
    if where == "one address" and outward is None:
        pytest.skip("this machine has no address but loopback")
    host = "0.0.0.0" if where == "every interface" else str(outward)
    url_host = "127.0.0.1" if where == "every interface" else host
    port = free_port()
    out_path = data_dir.parent / f"{data_dir.name}.out"
    with out_path.open("wb") as out:
        run = subprocess.Popen(
            RUN,
            cwd=ROOT,
            env=child_env(data_dir, PORT=str(port), SAGA_RUN_HOST=host),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    output = lambda: out_path.read_text(errors="replace")  # noqa: E731
    try:

        def up() -> bool:
            assert run.poll() is None, f"make run exited {run.returncode}:\n{output()[-4000:]}"
            return "Press Ctrl-C to stop." in output()

        wait_for(up, timeout=200, interval=0.5, what="make run to be up")
        said = output()
        assert f"Listening on:            {host} (SAGA_RUN_HOST)" in said, said[-3000:]
        assert f"Saga Admin is running:   http://{url_host}:{port}/" in said, said[-3000:]
        assert get(f"http://{url_host}:{port}/healthz")[0] == 200
        assert listening_addresses(port) == {host}
        mcp = re.search(r"Demo MCP server:\s+http://127\.0\.0\.1:(\d+)/mcp", said)
        gateway = re.search(r"MCP gateway \(saga-mcp\):\s+http://127\.0\.0\.1:(\d+)/mcp", said)
        assert mcp and gateway, said[-3000:]
        assert "create_user" in asyncio.run(mcp_tool_names(f"http://127.0.0.1:{gateway.group(1)}/mcp"))
        for number in (int(mcp.group(1)), int(gateway.group(1))):
            assert listening_addresses(number) == {"127.0.0.1"}
        if outward is not None:
            assert reachable(outward, port)
            assert not reachable(outward, int(mcp.group(1))) and not reachable(outward, int(gateway.group(1)))
        if where == "one address":
            assert not reachable("127.0.0.1", port)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                run.wait(timeout=120)
        out_path.unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("localhost", "is not an IPv4 address"),
        ("0.0.0.0; touch /tmp/x", "is not an IPv4 address"),
        ("203.0.113.7", "is not an address of this machine"),
    ],
)
def test_a_saga_run_host_it_cannot_use_is_refused_before_anything_starts(
    data_dir: Path, value: str, message: str
) -> None:
    run = subprocess.run(
        RUN,
        cwd=ROOT,
        env=child_env(data_dir, SAGA_RUN_HOST=value),
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert message in said and "Nothing was started" in said and "Traceback" not in said, said
    assert "==> Starting" not in said and not (data_dir / "pg").exists(), said
    assert not (data_dir / "run.procs").exists() and not (data_dir / "env").exists()


@pytest.mark.parametrize("host", ["0.0.0.0", "outward"])
def test_the_demo_identity_provider_is_refused_off_this_machine(data_dir: Path, host: str) -> None:
    """SAGA_DEMO_SSO=1's provider signs anyone in with any password: never served to other machines."""
    if host == "outward":
        host = outward_address() or pytest.skip("this machine has no outward IPv4 address")
    run = subprocess.run(
        RUN,
        cwd=ROOT,
        env=child_env(data_dir, SAGA_RUN_HOST=host, SAGA_DEMO_SSO="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert "SAGA_DEMO_SSO=1 runs only on this machine" in said and "Nothing was started" in said, said
    assert "==> Starting" not in said and not (data_dir / "pg").exists(), said
    assert not (data_dir / "run.procs").exists() and not (data_dir / "env").exists()


def _read_until(fd: int, out: bytearray, wanted: bytes | None, timeout: float) -> None:
    """Read a pseudo-terminal into ``out`` until ``wanted`` appears (None: until it closes)."""
    deadline = time.monotonic() + timeout
    while wanted is None or wanted not in out:
        assert time.monotonic() < deadline, (
            f"no {wanted!r} within {timeout:.0f}s:\n{out.decode(errors='replace')}"
        )
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not chunk:
                return
            out += chunk


# `-o .venv/.installed`: the suite never reinstalls the environment it runs from.
MAKE_RUN = [MAKE, "-o", ".venv/.installed", "run"]


def test_stopping_make_run_or_a_second_make_run_is_not_reported_as_an_error(data_dir: Path) -> None:
    # In a terminal Ctrl-C reaches make, run.sh and its foreground step alike: run.sh stops what it
    # started and exits 0, so make prints no "*** Error 130" (it ends itself by the signal it got,
    # silently, as GNU make does). Stopped mid-start: the same trap as when it is up.
    env = child_env(data_dir, PORT=str(free_port()))
    pid, fd = pty.fork()
    if pid == 0:  # the child: make run in the pseudo-terminal
        # As in a terminal: a suite started in the background (`pytest &`) ignores SIGINT, and a
        # shell cannot trap a signal ignored when it started.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(ROOT)
        os.execvpe(MAKE, MAKE_RUN, env)
    out = bytearray()
    try:
        _read_until(fd, out, b"==> Preparing the database", 120)
        # A second make run meanwhile: the polite refusal, and make adds no error under it.
        second = subprocess.run(MAKE_RUN, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
        said = second.stdout + second.stderr
        assert second.returncode == 0, said
        assert f"already running from {data_dir}" in said and "Nothing was started" in said, said
        assert "***" not in said and "Error" not in said, said
        os.write(fd, b"\x03")
        _read_until(fd, out, None, 120)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    said = out.decode(errors="replace")
    assert "stopped redis" in said and "stopped postgres" in said, said
    assert "***" not in said and "Error" not in said and "Traceback" not in said, said
    assert os.waitstatus_to_exitcode(status) in (0, -signal.SIGINT), said
    assert not any((data_dir / name).exists() for name in ("env", "run.info", "run.procs"))

    # `make stop` from another terminal: the make run it stops ends with 0 and no error either.
    out_path = data_dir.parent / f"{data_dir.name}.out"
    with out_path.open("wb") as log:
        run = subprocess.Popen(MAKE_RUN, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: "==> Preparing the database" in out_path.read_text(errors="replace"),
            timeout=120,
            what="the second start to get going",
        )
        stop = subprocess.run(
            [MAKE, "-s", "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert stop.returncode == 0 and "Stopped." in stop.stdout, stop.stdout + stop.stderr
        assert run.wait(timeout=60) == 0, out_path.read_text(errors="replace")
        said = out_path.read_text(errors="replace")
        assert "stopped postgres" in said and "***" not in said and "Error" not in said, said
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=60)
        out_path.unlink(missing_ok=True)
