"""``python -m saga_client.mcp``: the ``saga-mcp`` command (``saga_client.mcp.cli.main``)."""

from __future__ import annotations

import sys

from saga_client.mcp.cli import main

if __name__ == "__main__":
    sys.exit(main())
