"""Before- and after-images on the client side: the value an update replaced, read for the agent.

The same rules as the server's (API.md, "Before-images and verified undo"; the cases in
``clients/spec/vectors/before_images.json``, which this module passes), with no server code:

- a policy's ``before.args`` are templates of the call (``$args``, ``$args.<path>``,
  ``$target_id``, ``$target_type``; ``$$…`` is the literal ``$…``), filled by ``before_read_args``;
- a read's **result** is its structured content, or its single text block when that text is a
  JSON object (``read_result``); the same rule gives a ``$result`` template its value;
- the **image** is the value at the dotted ``path`` in the result (``image_at``; the whole result
  without a path); a missing or null value is no image;
- two images are **equal** as JSON values: member order ignored, numbers by value
  (``images_equal``).

The MCP gateway (``saga_client.mcp``) and the client's steps both read through this module.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "NoImage",
    "TemplateUnfillable",
    "before_read_args",
    "image_at",
    "images_equal",
    "read_result",
]

_TEMPLATE = re.compile(r"^\$(?:(?P<root>args)(?P<path>(?:\.[^.\s$]+)*)|(?P<target>target_id|target_type))$")


class NoImage(Exception):
    """A read gave no image: no result, a result that is not JSON, or nothing at ``path``."""


class TemplateUnfillable(Exception):
    """A ``before.args`` template the call does not fill; ``path`` is the template as written."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"{path}: {why}")


def read_result(*, structured: Any = None, texts: Sequence[str] = ()) -> Any:
    """A read tool's result as JSON: its structured content when it has one, else its single text
    block when that text is a JSON object. Raises ``NoImage`` otherwise (naming why)."""
    if structured is not None:
        return structured
    if len(texts) != 1:
        raise NoImage(
            "the read returned no structured content and "
            + ("no text" if not texts else f"{len(texts)} text blocks, not one JSON object")
        )
    value = json_object(texts[0])
    if value is None:
        try:
            parsed = json.loads(texts[0])
        except ValueError:
            raise NoImage("the read's text is not JSON (and it returned no structured content)") from None
        raise NoImage(f"the read's text is JSON but not an object ({type(parsed).__name__})")
    return value


def json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def image_at(result: Any, path: str | None) -> Any:
    """The image: the value at the dotted ``path`` in ``result`` (list items by index), or the
    whole result without a path. Raises ``NoImage`` naming the first segment that is missing."""
    value = result
    walked = ""
    for segment in path.split(".") if path else []:
        walked = f"{walked}.{segment}" if walked else segment
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise NoImage(f"the read's result has no '{walked}'")
    if value is None:
        raise NoImage(f"the read's result has null at '{path}'" if path else "the read returned null")
    return value


def before_read_args(
    before: Mapping[str, Any], *, args: Any, target_id: str = "", target_type: str = ""
) -> Any:
    """The read's args: ``before["args"]`` filled from the call. Raises ``TemplateUnfillable``
    naming the first template the call does not fill."""
    return _fill(before.get("args", {}), args=args, target_id=target_id, target_type=target_type)


def _fill(template: Any, *, args: Any, target_id: str, target_type: str) -> Any:
    if isinstance(template, dict):
        return {
            k: _fill(v, args=args, target_id=target_id, target_type=target_type) for k, v in template.items()
        }
    if isinstance(template, list):
        return [_fill(v, args=args, target_id=target_id, target_type=target_type) for v in template]
    if not isinstance(template, str) or not template.startswith("$"):
        return template
    if template.startswith("$$"):
        return template[1:]
    match = _TEMPLATE.match(template)
    if match is None:
        raise TemplateUnfillable(
            template, "not a template a read's args may use ($args.<path>, $target_id, $target_type)"
        )
    if match["target"]:
        known = target_id if match["target"] == "target_id" else target_type
        if not known:
            raise TemplateUnfillable(template, f"the call has no {match['target']}")
        return known
    return _lookup(template, args, match["path"])


def _lookup(template: str, args: Any, path: str) -> Any:
    value = args
    if value is None:
        raise TemplateUnfillable(template, "the call has no args")
    for segment in path.split(".")[1:]:
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise TemplateUnfillable(template, f"the call's args have no '{segment}' there")
    return value


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        number = float(value)
        return ("n", number) if not math.isnan(number) else ("nan", id(value))
    if isinstance(value, Mapping):
        return {"o": sorted((str(k), _canonical(v)) for k, v in value.items())}
    if isinstance(value, list | tuple):
        return ["a", *(_canonical(v) for v in value)]
    return ("?", repr(value))


def images_equal(left: Any, right: Any) -> bool:
    """Whether two images are the same JSON value (member order ignored, numbers by value)."""
    return bool(_canonical(left) == _canonical(right))
