"""What the image's build context holds (``.dockerignore``): never the deployment's secrets."""

from __future__ import annotations

import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_bootstrap_secrets_stay_out_of_the_build_context() -> None:
    """DEPLOY.md has the admin's password and agent keys written under
    bootstrap/ beside compose.yaml; without an ignore line, ``docker compose build`` sent them to
    the builder (and a ``COPY . …`` would bake them into a layer). Docker's rule: a pattern leaves
    out the path it matches and everything under it."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        return any(fnmatch.fnmatchcase(prefix, pattern) for pattern in patterns for prefix in prefixes)

    for secret in ("bootstrap/admin-password", "bootstrap/keys.json", "bootstrap/onboarding.key"):
        assert ignored(secret), secret
    assert not any(p.startswith("!") for p in patterns)  # nothing brings them back in
