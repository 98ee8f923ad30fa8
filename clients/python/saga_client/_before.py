"""Before- and after-images taken by the client (API.md, "Before-images and verified undo").

A tenant's policy may name a read in ``before`` (``{"tool", "args", "path"}``). For a step of such
a tool, the client calls the **reader** registered for that read with the filled args, takes the
value at ``path`` of its result (``saga_client.images``) and sends it as the action's
``before_snapshot`` with the record; after the call succeeds it reads again and sends the
after-image as ``after_snapshot`` with the success. A step given ``before=`` (``after=``) sends
that instead. No reader, a read that raises or a result without a value at ``path`` refuses the
step (``BeforeImageFailed``) before anything is recorded: ``do`` is never called.

Where readers come from, first found wins:

1. ``saga.reader("crm.get_contact")(fn)``: registered on that client explicitly;
2. a function the process wrapped as a tool of that name: ``@saga.tool("crm.get_contact")`` (of
   any client), ``saga_function_tool`` (OpenAI Agents) or ``saga_tool``/``saga_tools``
   (LangGraph); the reader calls the wrapped function itself, so the read is not a step.

A reader is called with the filled args as keyword arguments (a LangGraph tool: as its input).
What it returns is its result: a mapping (or other JSON value) is structured content, a string is
one text block (a JSON object in text counts, as from an MCP server).

Which steps take images: the tenant's policies as the client keeps them (``saga_client._policies``).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from saga_client._core import Api, Flow, Invoke
from saga_client.errors import BeforeImageFailed
from saga_client.images import ImageError, fill_args, image_at, read_result

log = logging.getLogger(__name__)

Reader = Callable[..., Any]
Target = tuple[str, str]

# Readers from the tools this process wrapped (``@saga.tool``, the adapters), by tool name: the
# most recently wrapped function of a name.
tool_readers: dict[str, Reader] = {}


def register_tool_reader(name: str, reader: Reader) -> None:
    tool_readers[name] = reader


def reader_result(value: Any) -> Any:
    """A reader's return value as a read's result (``images.read_result``)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return read_result(texts=[value])
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model
        value = dump(mode="json")
    if value is None:
        return read_result()
    return read_result(structured=json.loads(json.dumps(value, default=str)))


def take_image(
    api: Api,
    before: Mapping[str, Any],
    *,
    tool: str,
    args: Any,
    target: Target | None,
) -> Flow[Any]:
    """The image ``before`` names, read now through the registered reader; ``BeforeImageFailed``
    (naming the read and why) when there is none."""
    read_tool = str(before.get("tool", ""))
    reader = api.readers.get(read_tool) or tool_readers.get(read_tool)
    if reader is None:
        raise BeforeImageFailed(
            tool,
            read_tool,
            f"no reader is registered for {read_tool}: register one with saga.reader({read_tool!r}) "
            f"or wrap the read as a tool of that name, or give the step before=",
        )
    try:
        read_args = fill_args(
            before.get("args") or {},
            args=args,
            target_id=str(target[1]) if target else "",
            target_type=str(target[0]) if target else "",
        )
    except ImageError as exc:
        raise BeforeImageFailed(tool, read_tool, f"its args cannot be filled: {exc}") from None
    call = (
        functools.partial(reader, **read_args)
        if isinstance(read_args, dict)
        else functools.partial(reader, read_args)
    )
    try:
        value = yield Invoke(call)
    except Exception as exc:
        raise BeforeImageFailed(tool, read_tool, f"{type(exc).__name__}: {exc}") from exc
    try:
        return image_at(reader_result(value), before.get("path"))
    except ImageError as exc:
        raise BeforeImageFailed(tool, read_tool, str(exc)) from None


def take_after_image(
    api: Api, before: Mapping[str, Any], *, tool: str, args: Any, target: Target | None
) -> Flow[Any]:
    """The after-image, or None (logged) when the read fails: the call happened, and it is
    recorded a success either way."""
    try:
        return (yield from take_image(api, before, tool=tool, args=args, target=target))
    except BeforeImageFailed as exc:
        log.warning("saga: no after-image for %s: %s", tool, exc.reason)
        return None
