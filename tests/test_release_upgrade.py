"""The upgrade docs/DEPLOY.md ("Upgrades") describes, from the previous release to this tree, while
an agent's traffic runs, and the code rolled back.

The previous release is the commit CHANGELOG.md names for it (the entry below this one). Its code is
a ``git archive`` of that commit, run from its folder with ``PYTHONPATH`` in this venv (its
dependencies are this release's: pyproject.toml's ranges did not move between the two). Then, on a
database of its own and a Redis of its own:

1. the previous release is installed: ``migrate``, ``bootstrap`` (a tenant and an agent key), its
   web (the Procfile's line of that release) and its worker;
2. an agent records steps through the web all along: a run, an action recorded and started,
   succeeded, the run read back and completed; every fourth run failed instead, and an operator
   compensates it. Every answer must be the one expected, and at the end of each phase every
   unwind asked for so far has completed (carried out by the workers running then);
3. this release's ``migrate`` runs while the previous release's web and worker serve;
4. this release's web and worker start; the traffic moves to the new web; the old processes stop;
5. rolled back: the previous release's web and worker start again on the migrated schema, the
   traffic moves to them, this release's stop.

Afterwards the upgraded schema is the schema a fresh install of this release makes (``pg_dump
--schema-only``, compared): a migration edited after its release would leave an upgraded database
different from a new one.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from ledger.services.keys import agent_key_new_secret
from tests.support.processes import (
    RedisServer,
    WebhookServer,
    database_url_for_subprocesses,
    descendants,
    free_port,
    serve_webhooks,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"
# The traffic's tools: a read-only one, and one undone by a webhook (the test's own server).
UNDO_PATH, UNDO_SECRET = "/hr/delete_user", "upgrade-undo-secret-0123456789"


def _policies(undo_url: str) -> dict:
    return {
        "policies": [
            {"tool": "crm.read_account", "risk": "low", "approval": "auto", "action_class": "read_only"},
            {
                "tool": "hr.create_user",
                "risk": "medium",
                "approval": "auto",
                "action_class": "internal_update",
                "compensation": "custom",
                "compensation_tool": "hr.delete_user",
            },
            {"tool": "hr.delete_user", "risk": "low", "approval": "auto", "action_class": "internal_update"},
        ],
        "compensators": {"hr.delete_user": {"webhook": undo_url, "secret": UNDO_SECRET}},
    }


def previous_release() -> tuple[str, str]:
    """(version, commit) of the release CHANGELOG.md lists after the newest one."""
    text = CHANGELOG.read_text(encoding="utf-8")
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\][^\n]*\n(.*?)(?=^## \[|\Z)", text, flags=re.M | re.S)
    assert len(releases) >= 2, "CHANGELOG.md names no previous release"
    version, body = releases[1]
    commit = re.search(r"\bcommit `([0-9a-f]{40})`", body)
    assert commit, f"CHANGELOG.md's {version} entry names no commit (`commit \\`<40 hex>\\``)"
    return version, commit[1]


def test_the_changelog_names_a_previous_release_on_this_history():
    version, commit = previous_release()
    done = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"])
    assert done.returncode == 0, f"{version}'s commit {commit} is not an ancestor of HEAD"


@dataclass
class Tree:
    """A release's code: where it is, and its Procfile's lines."""

    path: Path
    name: str

    def procfile(self, process: str) -> str:
        for line in (self.path / "Procfile").read_text().splitlines():
            if line.startswith(f"{process}:"):
                return line.split(":", 1)[1].strip()
        raise AssertionError(f"{self.name}: no {process}: line in its Procfile")


@dataclass
class Deployment:
    """One database and one Redis; processes of either release started on them."""

    env: dict[str, str]
    logs: Path
    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def run(self, tree: Tree, *args: str, extra: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "saga_admin", *args],
            cwd=tree.path,
            env={**self.env, "PYTHONPATH": str(tree.path), **(extra or {})},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{tree.name}: {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, tree: Tree, process: str, port: int = 0) -> subprocess.Popen[bytes]:
        log = self.logs / f"{tree.name}-{process}-{len(self.started)}.log"
        env = {**self.env, "PYTHONPATH": str(tree.path), "PORT": str(port), "WEB_BIND_HOST": "127.0.0.1"}
        popen = subprocess.Popen(
            ["bash", "-c", f"exec {tree.procfile(process)}"],
            cwd=tree.path,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append((log.name, popen))
        if process == "web":

            def ready() -> bool:
                assert popen.poll() is None, f"{log.name} exited:\n{log.read_text(errors='replace')[-3000:]}"
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(ready, timeout=90, what=f"{tree.name}'s web to be ready")
        return popen

    @staticmethod
    def stop(popen: subprocess.Popen[bytes]) -> None:
        """As a rolling update stops a pod: SIGTERM (gunicorn and RQ finish what they hold)."""
        if popen.poll() is not None:
            return
        victims = descendants(popen.pid)
        with suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in [popen.pid, *victims]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            popen.wait(timeout=10)

    def stop_all(self) -> None:
        for _name, popen in self.started:
            self.stop(popen)

    def alive(self, popen: subprocess.Popen[bytes]) -> None:
        name = next(n for n, p in self.started if p is popen)
        assert popen.poll() is None, (
            f"{name} exited:\n{(self.logs / name).read_text(errors='replace')[-3000:]}"
        )


class Traffic(threading.Thread):
    """An agent's steps, one after another, against whichever web ``target`` names at the time:
    mostly a read-only tool call recorded, started, succeeded, read back and the run completed;
    every fourth, a user created, then the run failed and an operator compensating it (the unwind
    is the worker's, checked by ``unwinds_done``)."""

    def __init__(self, agent_key: str, operator_key: str, target: str) -> None:
        super().__init__(daemon=True)
        self.keys = {"agent": agent_key, "operator": operator_key}
        self.target = target
        self.stopping = threading.Event()
        self.steps = 0
        self.unwinds: list[str] = []
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stopping.is_set():
                try:
                    self._step(client, self.target, undone=self.steps % 4 == 3)
                    self.steps += 1
                except (AssertionError, httpx.HTTPError) as exc:
                    self.failures.append(f"step {self.steps} on {self.target}: {exc}")

    def _call(
        self, client: httpx.Client, base: str, who: str, method: str, path: str, status: int, body=None
    ):
        headers = {"Authorization": f"Bearer {self.keys[who]}"}
        response = client.request(method, f"{base}/api/v1{path}", json=body, headers=headers)
        assert response.status_code == status, (
            f"{method} {path}: {response.status_code} {response.text[:300]}"
        )
        return response.json()

    def _step(self, client: httpx.Client, base: str, *, undone: bool) -> None:
        def agent(method: str, path: str, status: int, body: object = None) -> dict:
            return self._call(client, base, "agent", method, path, status, body)

        n = uuid.uuid4().hex[:12]
        run = agent("POST", "/runs", 201, {"agent": "upgrader", "request": f"step {n}"})
        tool, args = (
            ("hr.create_user", {"email": f"{n}@example.com"}) if undone else ("crm.read_account", {"n": n})
        )
        body = {"tool": tool, "idempotency_key": f"k-{n}", "args": args, "start": True}
        action = agent("POST", f"/runs/{run['id']}/actions", 201, body)
        agent("POST", f"/actions/{action['id']}/succeed", 200, {"result": {"ok": n}})
        detail = agent("GET", f"/runs/{run['id']}", 200)
        assert [a["status"] for a in detail["actions"]] == ["succeeded"], detail["actions"]
        if not undone:
            agent("POST", f"/runs/{run['id']}/complete", 200, {"summary": "done"})
            return
        failed = agent("POST", f"/runs/{run['id']}/fail", 200, {"error": "the next step broke"})
        item = failed["recovery_item"]["id"]
        unwind = self._call(
            client, base, "operator", "POST", f"/recovery/{item}/compensate", 202, {"reason": "undo"}
        )
        self.unwinds.append(unwind["id"])

    def moved_on(self, steps: int = 4, timeout: float = 60) -> None:
        """Wait until ``steps`` more steps have succeeded (on whatever ``target`` is now)."""
        goal = self.steps + steps
        wait_for(lambda: self.steps >= goal or self.failures, timeout=timeout, what=f"{steps} more steps")
        assert not self.failures, "\n".join(self.failures[:5])

    def unwinds_done(self, timeout: float = 60) -> None:
        """Every unwind asked for so far completed (by whichever worker runs now)."""
        asked = list(self.unwinds)
        assert asked, "no unwind was asked for yet"

        def statuses() -> dict[str, str]:
            with httpx.Client(timeout=10) as client:
                return {
                    unwind: self._call(client, self.target, "operator", "GET", f"/unwinds/{unwind}", 200)[
                        "status"
                    ]
                    for unwind in asked
                }

        try:
            wait_for(lambda: set(statuses().values()) == {"completed"}, timeout=timeout, what="the unwinds")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {statuses()}") from exc


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """Two empty databases of their own (the upgraded one and a fresh install's), dropped after."""
    names = [f"saga_upgrade_{uuid.uuid4().hex[:10]}", f"saga_fresh_{uuid.uuid4().hex[:10]}"]
    with psycopg.connect(database_url_for_subprocesses("postgres"), autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url_for_subprocesses(names[0]), database_url_for_subprocesses(names[1])
    finally:
        with psycopg.connect(database_url_for_subprocesses("postgres"), autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def previous(tmp_path: Path) -> Tree:
    version, commit = previous_release()
    folder = tmp_path / f"saga-admin-{version}"
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return Tree(folder, f"v{version}")


def _schema(url: str) -> str:
    dump = subprocess.run(
        ["pg_dump", "--schema-only", "--no-owner", url], capture_output=True, text=True, check=True
    )
    # pg_dump's \restrict lines carry a random key each run.
    return "\n".join(
        line for line in dump.stdout.splitlines() if not line.startswith(("\\restrict", "\\unrestrict"))
    )


def _bootstrap_files(folder: Path, keys: dict[str, str], undo_url: str) -> dict[str, str]:
    """The bootstrap variables of the deployment (a tenant, the agent's and the operator's keys,
    the traffic's policies), their files written into ``folder``."""
    listed = []
    for scope, key in keys.items():
        (folder / f"{scope}.key").write_text(key)
        listed.append({"name": f"upgrade-{scope}", "scopes": [scope], "secret_file": f"{scope}.key"})
    (folder / "keys.json").write_text(json.dumps({"keys": listed}))
    (folder / "policies.json").write_text(json.dumps(_policies(undo_url)))
    return {
        "SAGA_BOOTSTRAP_TENANT": "acme",
        "SAGA_BOOTSTRAP_AGENT_KEYS_FILE": str(folder / "keys.json"),
        "SAGA_BOOTSTRAP_POLICY_FILE": str(folder / "policies.json"),
    }


def _environment(folder: Path, database_url: str, redis_url: str) -> dict[str, str]:
    """What every process of either release runs with: development mode, as the suite's."""
    (folder / "metrics").mkdir()
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "DEBUG": "1",
        "SECRET_KEY": "upgrade-test-" + "k" * 50,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "4",
        # The processes of both releases add up their metrics apart from the suite's.
        "PROMETHEUS_MULTIPROC_DIR": str(folder / "metrics"),
    }


def test_upgrade_from_the_previous_release_under_traffic_and_roll_back(
    previous: Tree, databases: tuple[str, str], tmp_path: Path
):
    upgraded_url, fresh_url = databases
    current = Tree(ROOT, "head")
    redis = RedisServer()
    redis.start()
    deployment = Deployment(env=_environment(tmp_path, upgraded_url, redis.url), logs=tmp_path)
    try:
        with serve_webhooks({UNDO_PATH: UNDO_SECRET}) as undo:
            _upgrade_and_roll_back(deployment, previous, current, undo, tmp_path)
        # Each unwind undid its user once, with the signature the compensator expects.
        assert undo.calls and all(call.signature_ok for call in undo.calls)
        assert len({call.key for call in undo.calls}) == len(undo.calls)
    finally:
        deployment.stop_all()
        redis.stop()

    # The upgraded schema is a fresh install's.
    deployment.env["DATABASE_URL"] = fresh_url
    deployment.run(current, "migrate", "--noinput", "-v0")
    assert _schema(upgraded_url) == _schema(fresh_url)


def _upgrade_and_roll_back(
    deployment: Deployment, previous: Tree, current: Tree, undo: WebhookServer, folder: Path
) -> None:
    # 1. The previous release, installed as its DEPLOY.md said: migrate, bootstrap, processes.
    # The key format is the same in both releases (bootstrap --print-new-key's).
    keys = {scope: agent_key_new_secret() for scope in ("agent", "operator")}
    bootstrap_env = _bootstrap_files(folder, keys, undo.url(UNDO_PATH))
    deployment.run(previous, "migrate", "--noinput", "-v0")
    deployment.run(previous, "bootstrap", extra=bootstrap_env)
    old_port = free_port()
    old_web = deployment.start(previous, "web", old_port)
    old_worker = deployment.start(previous, "worker")
    traffic = Traffic(keys["agent"], keys["operator"], f"http://127.0.0.1:{old_port}")
    traffic.start()
    traffic.moved_on()
    traffic.unwinds_done()

    # 2. This release's migrations, while the previous release serves and undoes.
    out = deployment.run(current, "migrate", "--noinput")
    assert "Applying" in out, "the upgrade applied no migration: the previous release is this one"
    deployment.run(current, "bootstrap", extra=bootstrap_env)
    traffic.moved_on()
    traffic.unwinds_done()
    deployment.alive(old_web)
    deployment.alive(old_worker)

    # 3. This release's processes beside the previous release's (either worker may take a job the
    # other release's web queued); the traffic moves to the new web; the previous release's stop.
    new_port = free_port()
    new_web = deployment.start(current, "web", new_port)
    new_worker = deployment.start(current, "worker")
    traffic.target = f"http://127.0.0.1:{new_port}"
    traffic.moved_on()
    deployment.stop(old_web)
    deployment.stop(old_worker)
    traffic.moved_on()
    traffic.unwinds_done()

    # 4. Rolled back: the previous release's code on the migrated schema.
    back_port = free_port()
    back_web = deployment.start(previous, "web", back_port)
    back_worker = deployment.start(previous, "worker")
    traffic.target = f"http://127.0.0.1:{back_port}"
    traffic.moved_on()
    deployment.stop(new_web)
    deployment.stop(new_worker)
    traffic.moved_on()
    traffic.unwinds_done()
    deployment.alive(back_web)
    deployment.alive(back_worker)

    traffic.stopping.set()
    traffic.join(timeout=30)
    assert not traffic.failures, "\n".join(traffic.failures[:5])
