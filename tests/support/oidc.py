"""A real OpenID Provider for the single sign-on tests: oidc-provider (npm, certified) run by Node
from tests/peers/oidc/provider.mjs, with an in-memory store, one client (the Saga web server under
test) and accounts read from a JSON file at every lookup, so a test changes someone's groups
between two sign-ins by rewriting the file (``OidcPeer.set_account``)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT

PEER_DIR = ROOT / "tests" / "peers" / "oidc"
CLIENT_ID = "saga-admin-tests"
CLIENT_SECRET = "tests-only-client-secret-0123456789"
SCOPES = "openid email profile groups"


def ensure_peer_installed() -> None:
    """npm ci of the peer from its lock file, once (the script is a no-op when it is current)."""
    subprocess.run(["bash", str(ROOT / "scripts" / "ensure-oidc-peer.sh")], check=True, timeout=300)


@dataclass
class OidcPeer:
    issuer: str
    accounts_path: Path
    process: subprocess.Popen[bytes]

    def accounts(self) -> dict[str, Any]:
        return dict(json.loads(self.accounts_path.read_text()))

    def set_account(self, login: str, **claims: Any) -> None:
        """Create or replace the account ``login`` (its ``sub``); the next lookup sees it."""
        accounts = self.accounts()
        accounts[login] = claims
        partial = self.accounts_path.with_suffix(".partial")
        partial.write_text(json.dumps(accounts))
        os.replace(partial, self.accounts_path)  # never a half-written file to the provider


@contextmanager
def oidc_peer(*, redirect_uris: list[str], accounts: dict[str, Any], workdir: Path) -> Iterator[OidcPeer]:
    ensure_peer_installed()
    workdir.mkdir(parents=True, exist_ok=True)
    accounts_path = workdir / "oidc-accounts.json"
    accounts_path.write_text(json.dumps(accounts))
    log = (workdir / "oidc-peer.log").open("wb")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "OIDC_PEER_HOST": "127.0.0.1",
        "OIDC_PEER_PORT": "0",
        "OIDC_PEER_CLIENT_ID": CLIENT_ID,
        "OIDC_PEER_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_PEER_REDIRECT_URIS": ",".join(redirect_uris),
        "OIDC_PEER_ACCOUNTS": str(accounts_path),
    }
    process = subprocess.Popen(
        ["node", str(PEER_DIR / "provider.mjs")],
        cwd=PEER_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    try:
        issuer = _read_issuer(process, deadline=time.monotonic() + 30)
        yield OidcPeer(issuer=issuer, accounts_path=accounts_path, process=process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        log.close()


def _read_issuer(process: subprocess.Popen[bytes], *, deadline: float) -> str:
    """The first line the provider prints once it listens: {"issuer": ...}."""
    assert process.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], max(deadline - time.monotonic(), 0))
        if ready:
            line = process.stdout.readline()
            if not line:
                break
            return str(json.loads(line)["issuer"])
    raise RuntimeError(f"the OpenID Provider did not start (exit code {process.poll()}); see its log")
