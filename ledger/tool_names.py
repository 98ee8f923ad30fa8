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

import fnmatch
import re
import string

from infra import errors

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


def glob_problem(pattern: str) -> str:
    """Why a tool glob's ``[...]`` classes are no good, in words; "" when they are. fnmatch reads
    a bracket it cannot close, and a ``]`` without one, as literals no tool name has, and drops a
    range that runs backwards; a class left with no tool-name character matches nothing. Each of
    those is a typo, and one once reached PostgreSQL as an invalid regular expression (``[z-a]``,
    ``[!]``: a 500), so each is refused, the same way on every path that takes a glob."""
    for kind, text in _glob_tokens(pattern):
        if kind == "unclosed":
            return f"has a [ with no ] to close it: {pattern!r}"
        if kind == "literal" and text == "]":
            return f"has a ] with no [ before it: {pattern!r}"
        if kind == "class":
            body = text[1:] if text.startswith("!") else text
            for start, end in re.findall(r"(.)-(.)", body):
                if start > end:
                    return f"has the range {start}-{end}, which runs backwards: {pattern!r}"
            if not _class_chars(text):
                return f"has the class [{text}], which matches no character a tool name may have"
    return ""


def tool_name_problem(value: object, *, glob: bool = False) -> str:
    """Why ``value`` is not a tool name (or glob), in words; "" when it is one."""
    if (is_tool_glob if glob else is_tool_name)(value):
        assert isinstance(value, str)
        return glob_problem(value) if glob else ""
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


# Every character a tool name may have (``_TOOL_NAME``): what a glob's class can match.
_ALPHABET = string.ascii_letters + string.digits + "_.:/-"


def _glob_tokens(pattern: str) -> list[tuple[str, str]]:
    """A glob as fnmatch reads it: ``("*", "*")``, ``("?", "?")``, ``("class", body)`` (``!``
    first when negated), ``("unclosed", "[")`` for a ``[`` fnmatch takes literally, and
    ``("literal", char)``. As ``fnmatch.translate``: a ``]`` right after ``[`` or ``[!`` is
    part of the class."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char in "*?":
            tokens.append((char, char))
        elif char == "[":
            j = i + 1 if pattern[i : i + 1] == "!" else i
            j = j + 1 if pattern[j : j + 1] == "]" else j
            end = pattern.find("]", j)
            if end == -1:
                tokens.append(("unclosed", "["))
            else:
                tokens.append(("class", pattern[i:end]))
                i = end + 1
        else:
            tokens.append(("literal", char))
    return tokens


def _class_chars(body: str) -> str:
    """The tool-name characters the class ``[body]`` matches, by fnmatch's own reading of it."""
    matcher = re.compile(fnmatch.translate(f"[{body}]"))
    return "".join(char for char in _ALPHABET if matcher.fullmatch(char))


def _escaped(char: str) -> str:
    # Letters and digits as they are: in PostgreSQL's regular expressions a backslash before one
    # is a class (\d, \w) or an escape (\n), not the character; before anything else it is that
    # character, inside a bracket expression too.
    return char if char.isalnum() or char == "_" else "\\" + char


def glob_regex(pattern: str) -> str:
    """A tool glob (``check_tool_name(..., glob=True)`` passed it) as an anchored POSIX regular
    expression that matches what ``fnmatch.fnmatchcase`` matches, for a database to match with
    (PostgreSQL's ``~``). Each class becomes the explicit list of tool-name characters fnmatch's
    class matches (tool names have no others), each escaped but letters and digits, so no range or
    bracket-expression syntax of the glob's reaches the database's regular-expression parser:
    whatever the glob, the expression is valid."""
    out = ["^"]
    for kind, text in _glob_tokens(pattern):
        if kind == "*":
            out.append(".*")
        elif kind == "?":
            out.append(".")
        elif kind == "class":
            chars = "".join(_escaped(c) for c in _class_chars(text))
            # No character: what matches nothing (glob_problem refuses such a class before here).
            out.append(f"[{chars}]" if chars else "(?!.).")
        elif kind == "unclosed":
            out.append(r"\[")  # fnmatch reads it as a literal
        else:
            out.append(_escaped(text))
    out.append("$")
    return "".join(out)
