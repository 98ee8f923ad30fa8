"""What is wrong with a policy file, in words: ``PolicyFileError`` (every problem, one line
each, naming its entry and field) and the translation of pydantic's errors into those lines."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails


class PolicyFileError(Exception):
    """A policy file that cannot be loaded; ``problems`` lists every bad entry, one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        count = f"{len(problems)} error{'s' if len(problems) != 1 else ''}"
        super().__init__(f"{source}: {count}, nothing was changed:\n" + "\n".join(f"  {p}" for p in problems))


class Problems:
    """Problems found while reading a file outside pydantic (translating agentSafety, reading its
    top level), each naming its place."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


_FRIENDLY = {
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "list_type": "must be a list",
}


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind in _FRIENDLY:
        return _FRIENDLY[kind]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    ctx = error.get("ctx") or {}
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        symbol = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}[
            kind
        ]
        bound = next(iter(ctx.values()), "")
        return f"must be {symbol} {bound}"
    return str(error["msg"])


def entry_of(loc: tuple[Any, ...], data: Any, prefix: str) -> tuple[str, list[str]]:
    """Split a pydantic location into the entry it names and the field path within it."""
    if not loc:
        return prefix.rstrip(".") or "file", []
    head, rest = loc[0], list(loc[1:])
    if head == "policies" and rest and isinstance(rest[0], int):
        index = rest.pop(0)
        policies = data.get("policies") if isinstance(data, dict) else None
        tool = (
            policies[index].get("tool")
            if isinstance(policies, list) and index < len(policies) and isinstance(policies[index], dict)
            else None
        )
        if prefix:
            return f'{prefix}policies["{tool}"]', [str(p) for p in rest]
        label = f'policies[{index}] (tool "{tool}")' if isinstance(tool, str) else f"policies[{index}]"
        return label, [str(p) for p in rest]
    if head == "compensators" and rest:
        tool = rest.pop(0)
        # A bad dict key is reported as "[key]" by pydantic; the entry is the same either way.
        if rest and rest[0] == "[key]":
            rest = ["tool"]
        elif len(rest) >= 2 and rest[-1] == "[key]":
            # A bad key inside the entry (a header name in headers_env): the message names it.
            rest = rest[:-2]
        return f'{prefix}compensators["{tool}"]', [str(p) for p in rest]
    return f"{prefix}{head}", [str(p) for p in rest]


def validation_problems(exc: ValidationError, data: Any, prefix: str) -> list[str]:
    problems: list[str] = []
    for error in exc.errors():
        entry, fields = entry_of(tuple(error["loc"]), data, prefix)
        message = _message(error)
        # Model-level checks already name their field ("compensation: …") or speak of the entry.
        if error["type"] == "duplicate":
            problems.append(message)
            continue
        if error["type"] == "extra_forbidden" and fields:
            problems.append(f"{entry}: {'.'.join(fields)}: unknown key")
            continue
        problems.append(f"{entry}: {'.'.join(fields)}: {message}" if fields else f"{entry}: {message}")
    return problems
