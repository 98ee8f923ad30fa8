"""What a tool name may be: the one rule every path that takes one applies.

A tool name travels far from where it is recorded: into e-mail subjects, Slack messages, webhook
bodies, log lines, audit events, the dashboard, and MCP clients. A name with a line break or a
control character in it broke an e-mail notification job (a ``\\r`` in a header is refused by the
mail library), and one with spaces or invisible characters can pass for another tool on a page.
So a tool name is a short run of plain ASCII:

- letters, digits, and ``.`` ``_`` ``-`` (the characters MCP's tool-name guidance allows), plus
  ``/`` and ``:``, which other tool ecosystems use as namespace separators (``github/repos.delete``,
  ``server:tool``);
- 1 to 200 characters: MCP suggests at most 128 for a tool's own name, and ``saga-mcp`` records an
  upstream tool as ``NAMESPACE.name``, so the namespace needs room on top.

A glob (a policy's ``tool`` or a pause's tool pattern) may also use fnmatch's ``*``, ``?`` and
``[...]`` classes (with ``!`` to negate one). The action record, the plan, the policy file (tool
globs, compensators, ``compensation_tool``), pauses and agent-named compensations all check here.
"""

from __future__ import annotations

import re

from ledger import errors

TOOL_NAME_MAX_LENGTH = 200
# JSON-Schema/pydantic patterns (documented in the OpenAPI document). ``\Z``-free on purpose:
# pydantic runs them on the Rust regex engine, where ``$`` is the end of the text; the Python
# checks below use ``fullmatch``, so a trailing newline cannot slip past either of them.
TOOL_NAME_PATTERN = rf"^[A-Za-z0-9_.:/-]{{1,{TOOL_NAME_MAX_LENGTH}}}$"
TOOL_GLOB_PATTERN = rf"^[A-Za-z0-9_.:/\-*?\[\]!]{{1,{TOOL_NAME_MAX_LENGTH}}}$"

_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:/-]+")
_TOOL_GLOB = re.compile(r"[A-Za-z0-9_.:/\-*?\[\]!]+")

TOOL_NAME_RULE = (
    f"1 to {TOOL_NAME_MAX_LENGTH} characters: ASCII letters, digits, and . _ - : / "
    "(no spaces or control characters)"
)
TOOL_GLOB_RULE = f"{TOOL_NAME_RULE}, plus * ? [ ] ! in a glob"


def is_tool_name(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= TOOL_NAME_MAX_LENGTH
        and _TOOL_NAME.fullmatch(value) is not None
    )


def is_tool_glob(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= TOOL_NAME_MAX_LENGTH
        and _TOOL_GLOB.fullmatch(value) is not None
    )


def tool_name_problem(value: object, *, glob: bool = False) -> str:
    """Why ``value`` is not a tool name (or glob), in words; "" when it is one."""
    if (is_tool_glob if glob else is_tool_name)(value):
        return ""
    rule = TOOL_GLOB_RULE if glob else TOOL_NAME_RULE
    return f"must be {rule}"


def check_tool_name(value: object, *, field: str = "tool", glob: bool = False) -> str:
    """``value`` when it is a tool name (or glob), else ``ValidationFailed`` (422
    ``invalid_request``) naming ``field``. The services call it, so a path that skipped the API's
    schema (the dashboard, a job, a test) is held to the same rule."""
    problem = tool_name_problem(value, glob=glob)
    if problem:
        raise errors.ValidationFailed(
            f"The {field} {problem}.",
            details={"errors": [{"field": field, "message": problem, "type": "tool_name"}]},
        )
    assert isinstance(value, str)
    return value


def is_glob(value: str) -> bool:
    """Whether a tool pattern is a glob (has a wildcard or a class), not an exact name."""
    return any(char in value for char in "*?[")


def glob_regex(pattern: str) -> str:
    """A tool glob (``check_tool_name(..., glob=True)`` passed it) as an anchored POSIX regular
    expression that matches what ``fnmatch.fnmatchcase`` matches, for a database to match with
    (PostgreSQL's ``~``). The glob's alphabet is small (``TOOL_GLOB_RULE``): every other character is
    a literal, escaped."""
    out = ["^"]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = pattern.find("]", i + 1 if pattern[i : i + 1] in ("!", "]") else i)
            if end == -1:
                out.append(r"\[")  # fnmatch reads an unclosed bracket as a literal
                continue
            body = pattern[i:end]
            i = end + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            escaped = "".join("\\" + c if c in r"\^[]" else c for c in body)
            out.append(f"[{'^' if negate else ''}{escaped}]")
        else:
            out.append("\\" + char if not char.isalnum() and char != "_" else char)
    out.append("$")
    return "".join(out)
