"""Before- and after-images: the value an update replaced, read for the agent.

A policy's ``before`` names a read (``{"tool", "args", "path"}``, API.md "Before-images and
verified undo"). Whoever carries the call out — the MCP gateway, a client, the worker's drift and
read-back checks — reads the same way, by the rules kept here, so the three never disagree:

- a read's **result** is its structured content, or its single text block when that text is a
  JSON object (``read_result``); the same rule gives a ``$result`` template its value;
- the **image** is the value at ``path`` in the result (``image_at``; the whole result without a
  path); a missing or null value is no image;
- two images are **equal** as JSON values: object member order ignored, numbers by value
  (``images_equal``); ``image_differences`` says where two differ, for the operator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.policies.compensation_args import compensation_args_fill


class NoImage(Exception):
    """A read gave no image: no result, a result that is not JSON, or nothing at ``path``."""


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
    try:
        value = json.loads(texts[0])
    except ValueError:
        raise NoImage("the read's text is not JSON (and it returned no structured content)") from None
    if not isinstance(value, dict):
        raise NoImage(f"the read's text is JSON but not an object ({type(value).__name__})")
    return value


def image_at(result: Any, path: str | None) -> Any:
    """The image: the value at the dotted ``path`` in ``result`` (list items by index), or the
    whole result without a path. Raises ``NoImage`` naming the first segment that is missing."""
    value = result
    walked = ""
    for segment in (path or "").split(".") if path else []:
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
    """The read's args: ``before.args`` filled from the call (``$args.<path>``, ``$target_*``).
    Raises ``ledger.policies.compensation_args.TemplateUnfillable``."""
    return compensation_args_fill(
        before.get("args", {}), args=args, target_id=target_id, target_type=target_type
    )


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        # Numbers by value: 1 == 1.0; NaN equals nothing, not even itself, as in JSON Schema.
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


def image_differences(expected: Any, actual: Any, *, limit: int = 20) -> list[dict[str, Any]]:
    """Where ``actual`` differs from ``expected``: ``[{"path", "expected", "actual"}]`` (a missing
    member shows as absent), at most ``limit`` entries, shallowest first."""
    found: list[dict[str, Any]] = []

    def walk(left: Any, right: Any, where: str) -> None:
        if len(found) >= limit or images_equal(left, right):
            return
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            for key in sorted(set(left) | set(right), key=str):
                here = f"{where}.{key}" if where else str(key)
                if key not in right:
                    found.append({"path": here, "expected": left[key], "actual": None, "absent": "actual"})
                elif key not in left:
                    found.append({"path": here, "expected": None, "actual": right[key], "absent": "expected"})
                else:
                    walk(left[key], right[key], here)
            return
        found.append({"path": where or "(the whole value)", "expected": left, "actual": right})

    walk(expected, actual, "")
    return found[:limit]


def differences_sentence(differences: list[dict[str, Any]], *, limit: int = 3) -> str:
    """``differences`` in words for a queue item: "email is 'x@y' where 'a@b' was expected"."""
    parts = []
    for diff in differences[:limit]:
        if diff.get("absent") == "actual":
            parts.append(f"{diff['path']} is gone")
        elif diff.get("absent") == "expected":
            parts.append(f"{diff['path']} appeared ({_short(diff['actual'])})")
        else:
            parts.append(f"{diff['path']} is {_short(diff['actual'])}, not {_short(diff['expected'])}")
    more = len(differences) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "…"
