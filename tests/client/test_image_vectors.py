"""The Python client's before- and after-image rules (``saga_client.images``) pass every case of
the shared vectors file, as the server does (tests/ledger/test_before_images.py): the gateway, the
client and the worker read and compare images the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from saga_client.images import (
    NoImage,
    TemplateUnfillable,
    before_read_args,
    image_at,
    images_equal,
    read_result,
)

from tests.support.processes import ROOT

VECTORS = json.loads((ROOT / "clients" / "spec" / "vectors" / "before_images.json").read_text())


def _named(kind: str) -> Any:
    return pytest.mark.parametrize("case", VECTORS[kind], ids=[case["name"] for case in VECTORS[kind]])


def test_every_kind_of_vector_has_cases():
    assert all(len(VECTORS[kind]) >= 3 for kind in ("fill", "result", "image", "equal"))


@_named("fill")
def test_fill(case):
    call = lambda: before_read_args(  # noqa: E731
        {"args": case["template"]},
        args=case["args"],
        target_id=case["target_id"],
        target_type=case["target_type"],
    )
    if "error" in case:
        with pytest.raises(TemplateUnfillable, match=case["error"].replace("$", r"\$")):
            call()
    else:
        assert call() == case["expected"]


@_named("result")
def test_result(case):
    if "error" in case:
        with pytest.raises(NoImage, match=case["error"]):
            read_result(structured=case["structured"], texts=case["texts"])
    else:
        assert read_result(structured=case["structured"], texts=case["texts"]) == case["expected"]


@_named("image")
def test_image(case):
    if "error" in case:
        with pytest.raises(NoImage, match=case["error"]):
            image_at(case["result"], case["path"])
    else:
        assert image_at(case["result"], case["path"]) == case["expected"]


@_named("equal")
def test_equal(case):
    assert images_equal(case["left"], case["right"]) is case["equal"]
    assert images_equal(case["right"], case["left"]) is case["equal"]
