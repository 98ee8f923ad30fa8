"""A real PgBouncer (Debian's, scripts/ensure-pgbouncer.sh) in transaction pooling mode, in front of
the PostgreSQL the tests use, for the database this test process uses (pytest-django's test_…
copy, read from the connection settings when it starts). Its own pgbouncer.ini and userlist in a
fresh folder, on a free port, stopped at the end.

Few server connections per database (``POOL_SIZE``), all kept open and handed out in turn
(``server_round_robin``), so the processes behind it really do share them and one client's next
transaction runs on another server connection, as under load: a session's state (a lock, a
``SET``, a cursor) that outlives its transaction lands on another client's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support.processes import free_port, wait_for

BINARY = Path("/usr/sbin/pgbouncer")
POOL_SIZE = 3


class PgBouncer:
    def __init__(self, *, host: str, port: int, user: str, password: str, databases: list[str]) -> None:
        self.server = (host or "127.0.0.1", port or 5432)
        self.user = user or "postgres"
        self.password = password
        self.databases = databases
        self.port = 0
        self.folder = Path(tempfile.mkdtemp(prefix="saga-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str | None = None) -> str:
        password = f":{self.password}" if self.password else ""
        return f"postgres://{self.user}{password}@127.0.0.1:{self.port}/{dbname or self.databases[0]}"

    @property
    def log_path(self) -> Path:
        return self.folder / "pgbouncer.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _write_config(self) -> Path:
        host, port = self.server
        databases = "\n".join(f"{name} = host={host} port={port} dbname={name}" for name in self.databases)
        # md5 with the password when the server wants one; else trust (the user must still be listed).
        auth = "md5" if self.password else "trust"
        (self.folder / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        config = self.folder / "pgbouncer.ini"
        config.write_text(
            f"""[databases]
{databases}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = {auth}
auth_file = {self.folder / "userlist.txt"}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
min_pool_size = {POOL_SIZE}
server_round_robin = 1
max_client_conn = 500
server_login_retry = 1
logfile = {self.log_path}
pidfile = {self.folder / "pgbouncer.pid"}
admin_users = {self.user}
"""
        )
        return config

    def start(self) -> None:
        if not BINARY.exists():
            raise AssertionError(f"{BINARY} is missing: run scripts/ensure-pgbouncer.sh (make test does)")
        self.port = free_port()
        config = self._write_config()
        command = [str(BINARY), str(config)]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root: as the postgres system user, which owns its folder.
            for path in [self.folder, *self.folder.iterdir()]:
                shutil.chown(path, "postgres")
            command[1:1] = ["-u", "postgres"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=30, what=f"pgbouncer to answer on port {self.port}")

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"pgbouncer exited ({self.process.returncode}):\n{self.log()[-3000:]}")
        try:
            with psycopg.connect(self.url(), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # pgbouncer: an immediate shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)
