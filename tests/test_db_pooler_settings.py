"""The database settings behind a connection pooler (SAGA_DB_POOLER, SAGA_DB_JIT_OFF;
docs/CONFIGURATION.md): what the settings give Django for each, read from a fresh process as a
deployment's environment sets them. tests/recovery/test_pooler.py runs the product behind a real
PgBouncer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.processes import ROOT

PROBE = (
    "import json, django; django.setup(); from django.conf import settings; "
    "db = settings.DATABASES['default']; "
    "print(json.dumps([db.get('OPTIONS', {}).get('options', ''), db['DISABLE_SERVER_SIDE_CURSORS']]))"
)


def _settings(**env: str) -> subprocess.CompletedProcess[str]:
    base = {key: value for key, value in os.environ.items() if not key.startswith("SAGA_DB_")}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "saga_admin.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "options", "no_server_cursors"),
    [
        # A direct connection: JIT off through the startup options, server-side cursors allowed.
        ({}, "-c jit=off", False),
        # PgBouncer refuses any `options`; transaction pooling also loses cursors between fetches.
        ({"SAGA_DB_POOLER": "transaction"}, "", True),
        ({"SAGA_DB_POOLER": "session"}, "", False),
        # Asked for explicitly, the option is sent behind a pooler too.
        ({"SAGA_DB_POOLER": "transaction", "SAGA_DB_JIT_OFF": "1"}, "-c jit=off", True),
        ({"SAGA_DB_JIT_OFF": "0"}, "", False),
        # Added to DATABASE_URL's own options, not in their place.
        (
            {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x?options=-c%20work_mem%3D8MB"},
            "-c work_mem=8MB -c jit=off",
            False,
        ),
    ],
)
def test_the_pooler_setting_decides_the_startup_options_and_cursors(env, options, no_server_cursors):
    done = _settings(**env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [options, no_server_cursors]


def test_an_unknown_pooler_mode_stops_the_settings_naming_it():
    done = _settings(SAGA_DB_POOLER="statement")
    assert done.returncode != 0
    assert "SAGA_DB_POOLER='statement': set it to `transaction` or `session`" in done.stderr
