"""The compensation args templates of a policy.

A policy that names its compensating tool may say how that tool's args are built from the forward
action: a string value "$args.<path>", "$result.<path>", "$before.<path>", "$after.<path>",
"$target_id" or "$target_type" (or "$args"/"$result"/"$before"/"$after": the whole value) is
replaced by that value of the action (``$before``/``$after``: its before- and after-image, the
policy's ``before`` read, ``ledger.policies.before_images``); "$$…" is the literal
string "$…"; every other value is kept as it is; dicts and lists are filled recursively. The
loader checks them (``compensation_args_problems``); the record and the planner fill them
(``compensation_args_fill``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TEMPLATE_ROOTS = ("args", "result", "before", "after", "target_id", "target_type")
_TEMPLATE = re.compile(
    r"^\$(?:(?P<root>args|result|before|after)(?P<path>(?:\.[^.\s$]+)*)|(?P<target>target_id|target_type))$"
)
# What the args of a policy's ``before`` read may use: the call's args and target, known before
# the call is made.
_BEFORE_ARGS_ROOTS = ("args",)


class TemplateUnfillable(Exception):
    """A template path the forward action does not have; ``path`` is the template as written."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"{path}: {why}")


def _template_walk(template: Any, where: str) -> list[tuple[str, str]]:
    """(where, string) of every template-like string (one starting with a single "$")."""
    if isinstance(template, str):
        return [(where, template)] if template.startswith("$") and not template.startswith("$$") else []
    if isinstance(template, dict):
        return [found for key, value in template.items() for found in _template_walk(value, f"{where}.{key}")]
    if isinstance(template, list):
        return [
            found
            for index, value in enumerate(template)
            for found in _template_walk(value, f"{where}[{index}]")
        ]
    return []


def compensation_args_problems(template: Any, *, where: str = "compensation_args") -> list[str]:
    """Every malformed template string in ``template``, each naming its key: what the policy loader
    reports, so a typo is a load error instead of a compensation that fails months later."""
    return [
        f"{path}: '{value}' is not a template; use $args.<path>, $result.<path>, $before.<path>, "
        "$after.<path>, $target_id or $target_type (write $$ for a literal $)"
        for path, value in _template_walk(template, where)
        if not _TEMPLATE.match(value)
    ]


def before_args_problems(template: Any, *, where: str = "before.args") -> list[str]:
    """Every template in a ``before`` read's args that cannot be filled before the call: only
    ``$args.<path>``, ``$target_id`` and ``$target_type`` are known then."""
    problems = []
    for path, value in _template_walk(template, where):
        match = _TEMPLATE.match(value)
        if match is None or (match["root"] and match["root"] not in _BEFORE_ARGS_ROOTS):
            problems.append(
                f"{path}: '{value}' cannot be filled before the call; use $args.<path>, $target_id or "
                "$target_type (write $$ for a literal $)"
            )
    return problems


def template_roots(template: Any) -> set[str]:
    """The roots (``args``, ``result``, ``before``, ``after``, ``target_id``, ``target_type``) the
    templates in ``template`` use."""
    roots = set()
    for _path, value in _template_walk(template, "t"):
        match = _TEMPLATE.match(value)
        if match is not None:
            roots.add(match["root"] or match["target"])
    return roots


def template_uses(template: Any, *, where: str = "compensation_args") -> list[tuple[str, str, str]]:
    """(key, root, path) of every well-formed template in ``template``: ``("compensation_args.price",
    "result", "item.price")`` for ``{"price": "$result.item.price"}`` (path "" for a whole root or a
    target); what the load-time warnings compare with what the tool returned."""
    uses = []
    for key, value in _template_walk(template, where):
        match = _TEMPLATE.match(value)
        if match is not None:
            uses.append((key, match["root"] or match["target"], (match["path"] or "").lstrip(".")))
    return uses


_NOT_YET = object()


def _lookup(root: str, value: Any, path: str) -> Any:
    written = f"${root}{path}"
    if value is None:
        raise TemplateUnfillable(written, f"the forward action has no {root}")
    for segment in path.split(".")[1:]:
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise TemplateUnfillable(written, f"the forward action's {root} has no '{segment}' there")
    return value


def compensation_args_fill(
    template: Any,
    *,
    args: Any,
    target_id: str,
    target_type: str,
    result: Any = _NOT_YET,
    before: Any = _NOT_YET,
    after: Any = _NOT_YET,
) -> Any:
    """The compensating tool's args: ``template`` filled from the forward action (its args as they
    are now, i.e. the approved ones when an approver edited them, its result, and its before- and
    after-image). Raises ``TemplateUnfillable`` naming the first path the action does not have.
    Without ``result`` / ``before`` / ``after`` (the action has not succeeded yet), those templates
    are left as they are."""
    known = {
        "args": args,
        "result": result,
        "before": before,
        "after": after,
        "target_id": target_id,
        "target_type": target_type,
    }
    return _fill(template, known)


def _fill(template: Any, known: dict[str, Any]) -> Any:
    if isinstance(template, dict):
        return {key: _fill(value, known) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, known) for value in template]
    if not isinstance(template, str) or not template.startswith("$"):
        return template
    if template.startswith("$$"):
        return template[1:]
    match = _TEMPLATE.match(template)
    if match is None:
        # The loader refuses these; a row written another way (the admin, a shell) fails visibly.
        raise TemplateUnfillable(
            template,
            "not a template ($args.<path>, $result.<path>, $before.<path>, $after.<path>, $target_id, "
            "$target_type)",
        )
    if match["target"]:
        if not known[match["target"]]:
            raise TemplateUnfillable(template, f"the forward action has no {match['target']}")
        return known[match["target"]]
    root = match["root"]
    value = known[root]
    if value is _NOT_YET:
        return template
    if value is None and root in ("before", "after"):
        raise TemplateUnfillable(template, f"the forward action has no {root}-image")
    return _lookup(root, value, match["path"])
