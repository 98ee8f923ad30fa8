"""The server installs itself, twice, from what is committed, exported (``git archive HEAD``).

As docs/DEPLOY.md's Procfile path says, step by step: every ``sh`` block of that section is run as
written (only the hosts, ``/srv/saga`` and the superuser's connection swapped for this test's own),
on a PostgreSQL cluster of its own that checks passwords: the owner and application roles, ``pip
install .`` into a fresh venv, the release as the owner (``check --deploy``, ``migrate``,
``db_grants --apply``, ``bootstrap``; again, changing nothing), the Procfile's two lines as the
application's role, and the probes. Then an agent writes through the API, the worker signs the
chain heads, every connection of the two processes is the application's role's, and that role is
refused DELETE, UPDATE, TRUNCATE and disabling the triggers on the audit log.

As the container image installs it: ``deploy/docker/install.sh`` (the Dockerfile's build step:
``pip install``, not editable, without the client, into a fresh venv, and the static files collected
from the installed packages) into a folder of its own, run from there through the image's
entrypoint, as a container runs it, with an owner and an application role as Compose and
Kubernetes give them: ``check --deploy`` passes, ``migrate`` migrates, creates and grants the
application's role and bootstraps (once: the second run changes nothing), ``web`` serves
``/livez``, ``/readyz`` and the login page (its template and static files from the install),
``worker`` stays up and registers with RQ, and the image's health checks (``python -m
saga_admin.probe web|worker``) pass.

Commit before running it: it tests HEAD, not the working tree."""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from packaging.utils import canonicalize_name
from rq import Worker

from tests.support.processes import (
    PostgresServer,
    RedisServer,
    database_url_for_subprocesses,
    descendants,
    free_port,
    procfile_line,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
# What reaches a process besides the deployment's own variables: pip's configuration (the index,
# the wheel folders and the certificates it is told to use here) and a locale.
PASSED_THROUGH = ("HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def _base_env(path: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH or k.startswith("PIP_")}
    return {**kept, "PATH": path}


def _run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture
def fresh_database() -> Iterator[tuple[str, str]]:
    """A database of its own, empty, on the suite's PostgreSQL, owned by a role of its own (which
    may create roles, as the postgres image's POSTGRES_USER can); and the URL of an application
    role that does not exist yet. Returns (owner's URL, application's URL); all dropped afterwards
    (roles are the cluster's, not the database's)."""
    suffix = uuid.uuid4().hex[:10]
    name, owner, app = f"saga_install_{suffix}", f"saga_owner_{suffix}", f"saga_app_{suffix}"
    admin = database_url_for_subprocesses("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{owner}" LOGIN CREATEROLE')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
    base = database_url_for_subprocesses(name)
    try:
        yield _as_user(base, owner), _as_user(base, app)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{app}"')
            conn.execute(f'DROP ROLE IF EXISTS "{owner}"')


def _as_user(url: str, user: str) -> str:
    """``url`` logging in as ``user`` (no password: the suite's server trusts its clients)."""
    return re.sub(r"^postgres://[^@]*@", f"postgres://{user}@", url)


def _export(tmp_path: Path) -> Path:
    """The committed tree, as `git archive` exports it."""
    export = tmp_path / "export"
    export.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(export, filter="data")
    return export


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The committed server installed by deploy/docker/install.sh into a fresh folder (the image's
    /opt/saga): its venv, collected static files, Procfile and entrypoint. Returns the folder."""
    export = _export(tmp_path)
    prefix = tmp_path / "opt-saga"
    # As `make install` reaches packages: pip's own configuration, nothing added here.
    env = {
        **_base_env("/usr/local/bin:/usr/bin:/bin"),
        "PYTHON": shutil.which("python3.11") or sys.executable,
    }
    _run(
        ["sh", str(export / "deploy" / "docker" / "install.sh"), str(export), str(prefix)],
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert (prefix / "static" / "staticfiles.json").exists()
    _assert_locked_versions(prefix / "venv" / "bin" / "python")
    return prefix


def _assert_locked_versions(python: Path) -> None:
    """The install took constraints.txt's version of every runtime dependency (``make lock``)."""
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed.stdout)}
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    differing = {
        name: (version, installed.get(name))
        for name, version in pins.items()
        if installed.get(name) != version
    }
    assert not differing, f"installed versions differ from constraints.txt (locked, installed): {differing}"


def _start(command: str, *, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        env=env,
        cwd=cwd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        victims = descendants(process.pid)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        for pid in [process.pid, *victims]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process.wait(timeout=10)


def _get(url: str) -> httpx.Response | None:
    try:
        # Behind the TLS-terminating proxy the settings expect (SECURE_PROXY_SSL_HEADER), by the
        # public name ALLOWED_HOSTS lists.
        headers = {"X-Forwarded-Proto": "https", "Host": "saga.example.com"}
        return httpx.get(url, headers=headers, timeout=5, follow_redirects=False)
    except httpx.TransportError:
        return None


def _logs(folder: Path) -> str:
    return "\n".join(
        f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in folder.glob("*.log")
    )


def _production_env(tmp_path: Path, prefix: Path, database_url: str, redis_url: str) -> dict[str, str]:
    """What the image's ENV and a deployment's configuration give a web or worker container
    (``database_url``: the application's role)."""
    (tmp_path / "admin-password").write_text("installed-admin-password-7731\n")
    return {
        **_base_env("/usr/local/bin:/usr/bin:/bin"),
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "STATIC_ROOT": str(prefix / "static"),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ALLOWED_HOSTS": "saga.example.com",
        "PORT": str(free_port()),
        "WEB_CONCURRENCY": "1",
        "SAGA_BOOTSTRAP_TENANT": "acme",
        "SAGA_BOOTSTRAP_ADMIN_USERNAME": "ops",
        "SAGA_BOOTSTRAP_ADMIN_EMAIL": "ops@example.com",
        "SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE": str(tmp_path / "admin-password"),
    }


def _prepare(prefix: Path, env: dict[str, str], run_dir: Path, owner_url: str) -> None:
    """What a deployment runs before it starts, through the entrypoint: the installed package (not
    the export) and no client, then check --deploy, then migrate (with the grants and the
    bootstrap) twice, as Compose's migrate service and the Kubernetes Job run it: as the owner,
    told the application's URL."""
    entrypoint = str(prefix / "entrypoint.sh")
    python = str(prefix / "venv" / "bin" / "python")
    located = _run(
        [
            python,
            "-c",
            "import importlib.util, saga_admin\nprint(saga_admin.__file__)\n"
            "print(importlib.util.find_spec('saga_client'))",
        ],
        env=env,
        cwd=run_dir,
    )
    package = next(prefix.glob("venv/lib/python*/site-packages/saga_admin/__init__.py"))
    assert located.splitlines() == [str(package), "None"]
    checked = _run([entrypoint, "check", "--deploy", "--fail-level", "WARNING"], env=env, cwd=run_dir)
    assert "no issues" in checked
    as_owner = {**env, "DATABASE_URL": owner_url, "SAGA_APP_DATABASE_URL": env["DATABASE_URL"]}
    first = _run([entrypoint, "migrate"], env=as_owner, cwd=run_dir, timeout=300)
    assert "Applying ledger.0001" in first and "Created tenant acme" in first, first
    assert "Created the role and granted saga_app_" in first, first
    assert first.rstrip().endswith("Bootstrap done."), first
    again = _run([entrypoint, "migrate"], env=as_owner, cwd=run_dir, timeout=300)
    assert "No migrations to apply." in again and again.rstrip().endswith("Nothing changed."), again
    assert "Granted saga_app_" in again and "Created the role" not in again, again


def _check_web(base: str, web: subprocess.Popen[bytes], folder: Path) -> None:
    live = wait_for(lambda: _get(f"{base}/livez") or web.poll() is not None, timeout=60, what="/livez")
    assert web.poll() is None, _logs(folder)
    assert live.status_code == 200, (live.text, _logs(folder))
    # The probes answer as a kubelet asks: by the pod's address (not in ALLOWED_HOSTS), plain HTTP.
    ready = httpx.get(f"{base}/readyz", timeout=10)
    assert (ready.status_code, ready.json()) == (200, {"database": "ok", "redis": "ok", "pages": "ok"})
    login = _get(f"{base}/login/")
    assert login is not None and login.status_code == 200, (login and login.text[:2000], _logs(folder))
    assert login.headers["content-type"].startswith("text/html")
    assert 'name="password"' in login.text and "csrfmiddlewaretoken" in login.text
    # Its stylesheet, collected from the installed dashboard package and served hashed.
    stylesheet = re.search(r'href="(/static/[^"]+\.css)"', login.text)
    assert stylesheet, login.text
    css = _get(f"{base}{stylesheet.group(1)}")
    assert css is not None and css.status_code == 200, (css, _logs(folder))
    assert css.headers["content-type"].startswith("text/css")


def _check_worker(redis_url: str, worker: subprocess.Popen[bytes], folder: Path) -> None:
    connection = redis.Redis.from_url(redis_url)
    wait_for(
        lambda: Worker.all(connection=connection) or worker.poll() is not None,
        timeout=60,
        what="the worker to register",
    )
    time.sleep(3)  # and stays up
    assert worker.poll() is None, _logs(folder)
    registered = Worker.all(connection=connection)
    assert len(registered) == 1, _logs(folder)
    assert {q.name for q in registered[0].queues} == {"default", "compensations", "notifications"}


def _probe(
    prefix: Path, process: str, env: dict[str, str], run_dir: Path
) -> subprocess.CompletedProcess[str]:
    """The image's health check (Dockerfile HEALTHCHECK, compose.yaml, the worker's liveness probe)."""
    python = str(prefix / "venv" / "bin" / "python")
    return subprocess.run(
        [python, "-m", "saga_admin.probe", process],
        env=env,
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_installed_server_serves_and_works(
    tmp_path: Path, installed: Path, fresh_database: tuple[str, str], own_redis: RedisServer
) -> None:
    run_dir = tmp_path / "run"  # outside the export: nothing of the repository on sys.path
    run_dir.mkdir()
    owner_url, app_url = fresh_database
    env = _production_env(tmp_path, installed, app_url, own_redis.url)
    _prepare(installed, env, run_dir, owner_url)
    entrypoint = str(installed / "entrypoint.sh")
    unhealthy = _probe(installed, "web", env, run_dir)
    assert unhealthy.returncode != 0 and "/livez did not answer" in unhealthy.stderr, unhealthy
    web = _start(f"{entrypoint} web", env=env, cwd=run_dir, log=tmp_path / "web.log")
    worker = _start(f"{entrypoint} worker", env=env, cwd=run_dir, log=tmp_path / "worker.log")
    try:
        _check_web(f"http://127.0.0.1:{env['PORT']}", web, tmp_path)
        _check_worker(own_redis.url, worker, tmp_path)
        for process in ("web", "worker"):
            healthy = _probe(installed, process, env, run_dir)
            assert (healthy.returncode, healthy.stdout.strip()) == (0, "healthy"), (healthy, _logs(tmp_path))
    finally:
        _stop(web)
        _stop(worker)
    gone = _probe(installed, "worker", env, run_dir)
    assert gone.returncode != 0 and "no RQ worker of host" in gone.stderr, gone


# --- docs/DEPLOY.md, "1. Procfile or a PaaS", step by step ---------------------------------------

DEPLOY_MD = ROOT / "docs" / "DEPLOY.md"
SECTION = "## 1. Procfile or a PaaS"
# The doc's blocks: build, configure (run before each later one), once, release, web, worker, check.
STEPS = ("build", "configure", "once", "release", "web", "worker", "check")
# And the backup's: dump, restore as the owner, grant, verify_audit as the application's role.
RESTORE_SECTION = "## Backup and restore"


class PasswordPostgres(PostgresServer):
    """A cluster of the test's own, as a real server is set up: TCP logins need a password (SCRAM),
    so the roles' passwords the doc sets are the ones that work; the superuser comes in over the
    cluster's own socket, as an administrator on the database host would."""

    def init(self) -> None:
        self.datadir.mkdir(parents=True)
        if self.user:
            shutil.chown(self.datadir, self.user)
            shutil.chown(self.root, self.user)
        self._run(
            "initdb", "-D", str(self.datadir), "-U", "postgres", "--auth-local=trust",
            "--auth-host=scram-sha-256", "-E", "UTF8",
        )  # fmt: skip

    @property
    def superuser_url(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.datadir}&port={self.port}"


@pytest.fixture
def private_postgres() -> Iterator[PasswordPostgres]:
    server = PasswordPostgres()
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.remove()


def _sh_blocks(heading: str) -> list[str]:
    """The ``sh`` blocks of DEPLOY.md's section ``heading``, in order."""
    text = DEPLOY_MD.read_text()
    section = text[text.index(heading) :]
    end = section.find("\n## ", len(heading))
    section = section if end < 0 else section[:end]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def _doc_steps() -> dict[str, str]:
    """The Procfile path's ``sh`` blocks, by the step each is, and the restore's."""
    blocks = _sh_blocks(SECTION)
    assert len(blocks) == len(STEPS), f"{SECTION} has {len(blocks)} sh blocks, not {len(STEPS)}"
    restore = _sh_blocks(RESTORE_SECTION)
    assert len(restore) == 1, f"{RESTORE_SECTION} has {len(restore)} sh blocks, not 1"
    return {**dict(zip(STEPS, blocks, strict=True)), "restore": restore[0]}


def test_the_doc_runs_the_procfiles_lines_as_they_are() -> None:
    """Its run steps are the Procfile's lines, so following the doc runs what a Procfile runner
    runs (a Procfile changed without the doc fails here)."""
    steps = _doc_steps()
    for name in ("web", "worker"):
        assert steps[name].splitlines() == ["cd /srv/saga", procfile_line(name)], name


def _interpreter() -> str:
    """The real Python 3.11 (not a pyenv shim), whose folder goes on the steps' PATH."""
    found = shutil.which("python3.11")
    assert found, "python3.11 is needed: DEPLOY.md builds the venv with it"
    real = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
    return str(Path(real.stdout.strip()).parent)


def _the_app_role_appends_and_cannot_rewrite(
    app_url: str, postgres: PasswordPostgres, chain: str, worker: subprocess.Popen[bytes], logs: Path
) -> None:
    """The worker signs ``chain``'s head as the application's role; that role is refused every
    rewrite of the audit log; and every connection of the two processes is that role's."""
    with psycopg.connect(app_url, autocommit=True) as app:
        wait_for(
            lambda: (
                app.execute("SELECT 1 FROM ledger_signedhead WHERE chain = %s", [chain]).fetchone()
                or worker.poll() is not None
            ),
            timeout=60,
            what="the worker to sign the run's chain head",
        )
        assert worker.poll() is None, _logs(logs)
        events = app.execute("SELECT count(*) FROM ledger_event").fetchone()
        assert events and events[0] > 0
        for statement in (
            "DELETE FROM ledger_event",
            "UPDATE ledger_event SET reason = 'rewritten'",
            "TRUNCATE ledger_event",
            "ALTER TABLE ledger_event DISABLE TRIGGER ALL",
            "DELETE FROM ledger_signedhead",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)
        assert app.execute("SELECT count(*) FROM ledger_event").fetchone() == events
    with psycopg.connect(postgres.superuser_url, autocommit=True) as admin:
        logins = admin.execute(
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = 'saga'"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchall()
    assert logins == [("saga_app",)], logins  # both processes, and nothing else, as the app role


def _restored_as_the_owner(postgres: PasswordPostgres) -> None:
    """Everything restored belongs to the owner, the definer function first of all (but what a
    trusted extension brings, which PostgreSQL gives the bootstrap superuser), and the
    application's role is refused a rewrite there as well."""
    restored = postgres.superuser_url.replace("/postgres?", "/saga_restored?")
    not_an_extensions = "NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = o.oid AND d.deptype = 'e')"
    with psycopg.connect(restored, autocommit=True) as admin:
        owners = admin.execute(
            "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc o"
            f" WHERE pronamespace = 'public'::regnamespace AND {not_an_extensions}"
            " UNION SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class o"
            f" WHERE relnamespace = 'public'::regnamespace AND {not_an_extensions}"
        ).fetchall()
        assert owners == [("saga_owner",)], owners
        definer = admin.execute(
            "SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE proname = 'saga_archived_run_events_delete'"
        ).fetchall()
        assert definer == [("saga_owner",)], definer
    app_url = f"postgres://saga_app:app-password@127.0.0.1:{postgres.port}/saga_restored"
    with (
        psycopg.connect(app_url, autocommit=True) as app,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        app.execute("DELETE FROM ledger_event")


def test_deploy_md_step_by_step_on_a_fresh_venv(
    tmp_path: Path, private_postgres: PasswordPostgres, own_redis: RedisServer
) -> None:
    export = _export(tmp_path)
    srv = tmp_path / "srv-saga"
    srv.mkdir()

    def here(block: str) -> str:
        return (
            block.replace("postgres://postgres@db.internal:5432/postgres", private_postgres.superuser_url)
            .replace("db.internal:5432", f"127.0.0.1:{private_postgres.port}")
            .replace("redis.internal:6379", f"127.0.0.1:{own_redis.port}")
            .replace("/srv/saga", str(srv))
        )

    steps = {name: here(block) for name, block in _doc_steps().items()}
    port = free_port()
    # What this test adds to the doc's configuration: its own port, one small web, and the worker
    # signing the chain heads every second (so that it writes, as the application's role).
    knobs = (
        f"export PORT={port} WEB_CONCURRENCY=1 WEB_THREADS=2"
        f" SAGA_AUDIT_KEY={secrets.token_hex(32)} SAGA_AUDIT_SIGN_INTERVAL_S=1\n"
    )
    env = _base_env(f"{_interpreter()}:/usr/local/bin:/usr/bin:/bin")

    def script(name: str) -> list[str]:
        body = steps[name] if name == "build" else steps["configure"] + knobs + steps[name]
        return ["bash", "-euo", "pipefail", "-c", body]

    def step(name: str, timeout: float = 300) -> str:
        return _run(script(name), env=env, cwd=export, timeout=timeout)

    step("build", timeout=600)
    assert (srv / "static" / "staticfiles.json").exists()
    step("once")
    released = step("release")
    assert "no issues" in released and "Applying ledger.0001" in released, released
    assert "Granted saga_app what the application needs" in released, released
    assert released.rstrip().endswith("Bootstrap done."), released

    web = subprocess.Popen(
        script("web"), env=env, cwd=export, stdout=(tmp_path / "web.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    worker = subprocess.Popen(
        script("worker"), env=env, cwd=export, stdout=(tmp_path / "worker.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    app_url = f"postgres://saga_app:app-password@127.0.0.1:{private_postgres.port}/saga"
    try:
        base = f"http://127.0.0.1:{port}"
        live = wait_for(lambda: _get(f"{base}/livez") or web.poll() is not None, timeout=90, what="/livez")
        assert web.poll() is None and live.status_code == 200, _logs(tmp_path)
        wait_for(
            lambda: Worker.all(connection=redis.Redis.from_url(own_redis.url)) or worker.poll() is not None,
            timeout=90,
            what="the worker to register",
        )
        assert worker.poll() is None, _logs(tmp_path)
        checked = step("check", timeout=120)
        assert checked.splitlines() == [
            "healthy",
            '{"database": "ok", "redis": "ok", "pages": "ok"}',
            '{"database": "ok", "redis": "ok"}',
            "healthy",
        ], checked

        # A write through the API, with the key the doc's bootstrap installed.
        key = (srv / "secrets" / "onboarding.key").read_text().strip()
        started = httpx.post(
            f"{base}/api/v1/runs",
            json={"agent": "onboarding-agent", "request": "Onboard the new hire"},
            headers={
                "Authorization": f"Bearer {key}",
                "X-Forwarded-Proto": "https",
                "Host": "saga.example.com",
            },
            timeout=30,
        )
        assert started.status_code == 201, (started.text, _logs(tmp_path))
        _the_app_role_appends_and_cannot_rewrite(
            app_url, private_postgres, f"run:{started.json()['id']}", worker, tmp_path
        )

        # The next release, while they serve: nothing to migrate, grants again, nothing to bootstrap.
        again = step("release")
        assert "No migrations to apply." in again and again.rstrip().endswith("Nothing changed."), again
        restored = step("restore")
        assert "Granted saga_app what the application needs" in restored, restored
        assert re.search(r"\b\d+ events checked\.", restored) and "intact" in restored, restored
        _restored_as_the_owner(private_postgres)
    finally:
        _stop(web)
        _stop(worker)
