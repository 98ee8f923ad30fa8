"""docs/INTEGRATING.md's Python client example runs as written: its stand-in systems are defined
in the block itself, so a reader who copies it gets a script that runs, not a ``NameError``.

The code block is read from docs/INTEGRATING.md, not copied here, and run as its reader runs it: a
script in its own process, ``SAGA_URL`` and ``SAGA_API_KEY`` in its environment, against a live
server with what the page says the reader has: `make run`'s demo setup (its tenants and policies,
through ``demo.setup.demo_setup`` as ``seed_demo --setup-only`` loads them) and a key made by step 1
of its "Four steps" (``create_agent_key --tenant acme --name my-agent``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from demo.setup import demo_setup
from ledger.models import Run
from tests.support.processes import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def integrating_client_example() -> str:
    """The Python block of docs/INTEGRATING.md's "The Python client" section (the one importing Saga)."""
    doc = (ROOT / "docs" / "INTEGRATING.md").read_text(encoding="utf-8")
    section = doc.split("### The Python client", 1)[1].split("\n### ", 1)[0]
    blocks = [block for block in re.findall(r"```python\n(.*?)```", section, re.S) if "import Saga" in block]
    assert len(blocks) == 1, (
        "docs/INTEGRATING.md's Python client section should hold one example importing Saga"
    )
    return blocks[0]


def test_integrating_python_client_example_runs_as_written(live_server, tmp_path):
    demo_setup(base_url=live_server.url)
    out = StringIO()
    call_command("create_agent_key", "--tenant", "acme", "--name", "my-agent", stdout=out)
    key = out.getvalue().rstrip("\n").splitlines()[-1]
    script = tmp_path / "onboarding.py"
    script.write_text(integrating_client_example(), encoding="utf-8")
    env = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**env, "SAGA_URL": live_server.url, "SAGA_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    run = Run.objects.get(external_id="HR-17")
    assert (run.status, run.request) == ("succeeded", "Onboard Ashu Kumar")
    assert [(a.tool, a.status) for a in run.actions.order_by("seq")] == [
        ("hr.create_user", "succeeded"),
        ("workspace.provision_license", "succeeded"),
        ("email.send_welcome", "succeeded"),
    ]
    assert list(run.checkpoints.values_list("name", flat=True)) == ["accounts-ready"]
