"""The client's image rules (``saga_client.images``) pass every vector of
``clients/spec/vectors/before_images.json``, as the server (tests/ledger/test_before_images.py) and
the TypeScript client do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from saga_client.images import ImageError, fill_args, image_at, images_equal, read_result

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "spec" / "vectors" / "before_images.json").read_text("utf-8")
)


def _ids(cases: list[dict]) -> list[str]:
    return [case["name"] for case in cases]


@pytest.mark.parametrize("case", VECTORS["fill"], ids=_ids(VECTORS["fill"]))
def test_the_client_fills_before_args_as_the_vectors_say(case):
    def fill():
        return fill_args(
            case["template"], args=case["args"], target_id=case["target_id"], target_type=case["target_type"]
        )

    if "error" in case:
        with pytest.raises(ImageError, match=case["error"].replace("$", r"\$")):
            fill()
    else:
        assert fill() == case["expected"]


@pytest.mark.parametrize("case", VECTORS["result"], ids=_ids(VECTORS["result"]))
def test_the_client_reads_results_as_the_vectors_say(case):
    if "error" in case:
        with pytest.raises(ImageError, match=case["error"]):
            read_result(structured=case["structured"], texts=case["texts"])
    else:
        assert read_result(structured=case["structured"], texts=case["texts"]) == case["expected"]


@pytest.mark.parametrize("case", VECTORS["image"], ids=_ids(VECTORS["image"]))
def test_the_client_takes_images_as_the_vectors_say(case):
    if "error" in case:
        with pytest.raises(ImageError, match=case["error"]):
            image_at(case["result"], case["path"])
    else:
        assert image_at(case["result"], case["path"]) == case["expected"]


@pytest.mark.parametrize("case", VECTORS["equal"], ids=_ids(VECTORS["equal"]))
def test_the_client_compares_images_as_the_vectors_say(case):
    assert images_equal(case["left"], case["right"]) is case["equal"]
    assert images_equal(case["right"], case["left"]) is case["equal"]


def test_a_template_of_a_root_not_known_before_the_call_is_refused():
    with pytest.raises(ImageError, match=r"\$result.id: cannot be filled before the call"):
        fill_args({"id": "$result.id"}, args={})
