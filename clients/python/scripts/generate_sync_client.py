"""Generate the blocking client, ``saga_client/client.py``, from the asyncio one, ``saga_client/aio.py``.

As httpcore does: the async module is the source, ``unasync`` drops its ``async``/``await`` and
renames each async name to its blocking twin (``REPLACEMENTS`` below), and the result is committed.
What the two clients genuinely do differently is not generated: it is written by hand, side by
side, in ``saga_client/_twins.py`` (and the ``@saga.tool`` decorators in ``saga_client/tools.py``),
and ``aio.py`` calls the async half by names this table maps to the blocking half.

The output is tidied with ruff (import order, ``yield from``, the formatter) under the client's own
configuration, so that the committed file is lint clean as generated.

    python clients/python/scripts/generate_sync_client.py           # rewrite client.py
    python clients/python/scripts/generate_sync_client.py --check   # exit 1 if client.py differs

``clients/python/tests/test_client_generated.py`` runs ``--check``: edit ``aio.py``, then run this.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

DISTRIBUTION = Path(__file__).resolve().parents[1]
SOURCE = DISTRIBUTION / "saga_client" / "aio.py"
TARGET = DISTRIBUTION / "saga_client" / "client.py"

# Async name → its blocking twin (beyond unasync's own: ``__aenter__``, ``AsyncIterator``, …).
REPLACEMENTS = {
    # The client's own classes and functions.
    "AsyncSaga": "Saga",
    "AsyncRun": "Run",
    "current_async_run": "current_run",
    "async_run": "sync_run",
    "AsyncTool": "Tool",
    # The hand-written differences (saga_client._twins).
    "AsyncPerform": "Perform",
    "AsyncRunBase": "RunBase",
    "async_invoke": "invoke",
    "accept_async_callables": "refuse_async_callables",
    "async_attached": "attached",
    # httpx and the standard library.
    "AsyncClient": "Client",
    "AsyncBaseTransport": "BaseTransport",
    "aclose": "close",
    "asyncio": "time",
}

HEADER = (
    "# Generated from saga_client/aio.py by clients/python/scripts/generate_sync_client.py (unasync):\n"
    "# do not edit. Edit aio.py, then run that script; a test fails while the two disagree.\n"
)

# What the unasync output may need, and only that: imports sorted again (``asyncio`` became
# ``time``), ``for x in xs: yield x`` as ``yield from xs``, imports only the async code used.
RUFF_FIXES = "I001,UP028,F401"


def generate() -> str:
    """The blocking client as generated from the current ``aio.py``."""
    with tempfile.TemporaryDirectory() as tmp:
        source_dir, target_dir = Path(tmp, "aio"), Path(tmp, "sync")
        source_dir.mkdir()
        source = source_dir / TARGET.name
        source.write_text(SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
        rule = unasync.Rule(f"{source_dir}/", f"{target_dir}/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(source)], [rule])
        generated = (target_dir / TARGET.name).read_text(encoding="utf-8")
    return _tidied(HEADER + generated)


def _tidied(code: str) -> str:
    for command in (
        ["check", "--fix-only", "--unsafe-fixes", "--select", RUFF_FIXES],
        ["format"],
    ):
        code = subprocess.run(  # noqa: S603 - this interpreter running ruff on our own code
            [sys.executable, "-m", "ruff", *command, "--stdin-filename", str(TARGET), "-"],
            input=code,
            capture_output=True,
            text=True,
            check=True,
            cwd=DISTRIBUTION,
        ).stdout
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with client.py instead of writing it")
    args = parser.parse_args(argv)
    generated = generate()
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if not args.check:
        if generated != current:
            TARGET.write_text(generated, encoding="utf-8")
            print(f"wrote {TARGET.relative_to(DISTRIBUTION)}")
        return 0
    if generated == current:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(keepends=True),
        generated.splitlines(keepends=True),
        "saga_client/client.py (committed)",
        "saga_client/client.py (generated from aio.py)",
    )
    sys.stdout.writelines(diff)
    print(
        "\nsaga_client/client.py is not what aio.py generates: edit aio.py (not client.py), then run "
        "python clients/python/scripts/generate_sync_client.py",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
