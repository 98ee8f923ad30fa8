"""Before- and after-images, by the rules the server keeps (API.md, "Before-images and verified
undo"; the vectors in ``clients/spec/vectors/before_images.json``).

A policy's ``before`` names a read (``{"tool", "args", "path"}``). Whoever takes the images for a
call — this client's steps, the ``saga-mcp`` gateway — reads the same way, by the rules kept here,
so that the client, the gateway and the server never disagree:

- ``fill_args``: the read's args, ``before.args`` filled from the call (``$args``,
  ``$args.<path>``, ``$target_id``, ``$target_type``; ``$$…`` is the literal ``$…``);
- ``read_result``: a read's **result** is its structured content, or its single text block when
  that text is a JSON object;
- ``image_at``: the **image** is the value at the dotted ``path`` in the result (list items by
  index; the whole result without a path); a missing or null value is no image;
- ``images_equal``: two images are equal as JSON values (object member order ignored, numbers by
  value, a boolean is not a number).

Every refusal raises ``ImageError`` saying why.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ImageError", "fill_args", "image_at", "images_equal", "read_result"]

_TEMPLATE = re.compile(r"^\$(?:(?P<root>args)(?P<path>(?:\.[^.\s$]+)*)|(?P<target>target_id|target_type))$")


class ImageError(Exception):
    """No image: a read's args that cannot be filled, a result that is not JSON, or nothing (or
    null) at the path."""


def fill_args(template: Any, *, args: Any, target_id: str = "", target_type: str = "") -> Any:
    """A ``before`` read's args: ``template`` filled from the call. Raises ``ImageError`` naming
    the first template the call cannot fill."""
    if isinstance(template, Mapping):
        return {
            key: fill_args(value, args=args, target_id=target_id, target_type=target_type)
            for key, value in template.items()
        }
    if isinstance(template, list | tuple):
        return [
            fill_args(value, args=args, target_id=target_id, target_type=target_type) for value in template
        ]
    if not isinstance(template, str) or not template.startswith("$"):
        return template
    if template.startswith("$$"):
        return template[1:]
    return _fill_one(template, args=args, target_id=target_id, target_type=target_type)


def _fill_one(template: str, *, args: Any, target_id: str, target_type: str) -> Any:
    match = _TEMPLATE.match(template)
    if match is None:
        raise ImageError(
            f"{template}: cannot be filled before the call (use $args.<path>, $target_id or $target_type)"
        )
    if match["target"]:
        value = target_id if match["target"] == "target_id" else target_type
        if not value:
            raise ImageError(f"{template}: the call has no {match['target']}")
        return value
    value = args
    if value is None:
        raise ImageError(f"{template}: the call has no args")
    for segment in match["path"].split(".")[1:]:
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise ImageError(f"{template}: the call's args have no '{segment}' there")
    return value


def read_result(*, structured: Any = None, texts: Sequence[str] = ()) -> Any:
    """A read's result as JSON: its structured content when it has one, else its single text block
    when that text is a JSON object. Raises ``ImageError`` otherwise (naming why)."""
    if structured is not None:
        return structured
    if isinstance(texts, str):
        texts = (texts,)
    if len(texts) != 1:
        raise ImageError(
            "the read returned no structured content and "
            + ("no text" if not texts else f"{len(texts)} text blocks, not one JSON object")
        )
    try:
        value = json.loads(texts[0])
    except ValueError:
        raise ImageError("the read's text is not JSON (and it returned no structured content)") from None
    if not isinstance(value, dict):
        raise ImageError(f"the read's text is JSON but not an object ({type(value).__name__})")
    return value


def image_at(result: Any, path: str | None) -> Any:
    """The image: the value at the dotted ``path`` in ``result`` (list items by index), or the
    whole result without a path. Raises ``ImageError`` naming the first segment that is missing,
    or saying the value is null."""
    value = result
    walked = ""
    for segment in path.split(".") if path else []:
        walked = f"{walked}.{segment}" if walked else segment
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise ImageError(f"the read's result has no '{walked}'")
    if value is None:
        raise ImageError(f"the read's result has null at '{path}'" if path else "the read returned null")
    return value


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        number = float(value)  # numbers by value: 1 == 1.0; NaN equals nothing
        return ("n", number) if not math.isnan(number) else ("nan", id(value))
    if isinstance(value, Mapping):
        return {"o": sorted((str(k), _canonical(v)) for k, v in value.items())}
    if isinstance(value, list | tuple):
        return ["a", *(_canonical(v) for v in value)]
    return ("?", repr(value))


def images_equal(a: Any, b: Any) -> bool:
    """Whether two images are the same JSON value (member order ignored, numbers by value)."""
    return bool(_canonical(a) == _canonical(b))
