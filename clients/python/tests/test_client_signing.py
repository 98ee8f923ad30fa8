"""verify_signature, as a webhook receiver calls it."""

from __future__ import annotations

import json
import time

import pytest

from saga_client import verify_signature
from saga_client.signing import signed_headers

BODY = json.dumps({"step_id": "stp_1"}).encode()


def test_signatures_verify_for_receivers():
    headers = signed_headers("s3cret", BODY)
    assert verify_signature("s3cret", headers, BODY)
    assert not verify_signature("s3cret", headers, BODY + b" ")
    assert not verify_signature("other", headers, BODY)


def test_header_names_are_matched_whatever_their_case():
    headers = {k.lower(): v for k, v in signed_headers("s3cret", BODY).items()}
    assert verify_signature("s3cret", headers, BODY)
    assert verify_signature("s3cret", {k.upper(): v for k, v in headers.items()}, BODY)


@pytest.mark.parametrize("age_s, ok", [(-299, True), (299, True), (301, False), (-301, False)])
def test_the_timestamp_must_be_within_the_tolerance_either_way(age_s, ok):
    now = time.time()
    headers = signed_headers("s3cret", BODY, timestamp=int(now - age_s))
    assert verify_signature("s3cret", headers, BODY, 300, now=now) is ok
    assert verify_signature("s3cret", headers, BODY, tolerance_s=1000, now=now)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Saga-Timestamp": "12a", "X-Saga-Signature": "sha256=00"},
        {"X-Saga-Timestamp": "١٢٣", "X-Saga-Signature": "sha256=00"},  # digits, but not ASCII ones
        {"X-Saga-Timestamp": str(int(time.time())), "X-Saga-Signature": "sha256=é"},
        {"X-Saga-Timestamp": str(int(time.time()))},
    ],
)
def test_malformed_headers_are_refused_not_raised(headers):
    assert verify_signature("s3cret", headers, BODY) is False


def test_a_text_body_is_taken_as_utf8():
    text = '{"name": "Zoë"}'
    assert verify_signature("s3cret", signed_headers("s3cret", text.encode()), text)


RESUME_URL = "https://agent.example/saga/commands?tenant=acme"


def _command(url: object) -> bytes:
    return json.dumps({"command_id": "cmd_1", "kind": "cancel", "run_id": "run_1", "url": url}).encode()


@pytest.mark.parametrize(
    "named, ok",
    [
        (RESUME_URL, True),
        ("HTTPS://Agent.Example:443/saga/commands?tenant=acme", True),  # the same request
        ("https://agent.example/saga/commands?tenant=acme#frag", True),  # fragments are not sent
        ("https://agent.example/saga/commands?tenant=globex", False),
        ("https://agent.example/saga/other?tenant=acme", False),
        ("https://other.example/saga/commands?tenant=acme", False),
        ("http://agent.example/saga/commands?tenant=acme", False),
        ("https://agent.example:8443/saga/commands?tenant=acme", False),
        ("", False),
        (None, False),
        (["https://agent.example/saga/commands?tenant=acme"], False),
    ],
)
def test_a_command_verifies_only_at_the_destination_its_signed_body_names(named, ok):
    body = _command(named)
    headers = signed_headers("s3cret", body)
    assert verify_signature("s3cret", headers, body, url=RESUME_URL) is ok
    assert verify_signature("s3cret", headers, body)  # no destination given: the signature alone


@pytest.mark.parametrize(
    "body", [b"not json", b"[1, 2]", b'"https://agent.example/"', json.dumps({}).encode()]
)
def test_a_body_that_names_no_destination_is_refused_when_one_is_expected(body):
    assert verify_signature("s3cret", signed_headers("s3cret", body), body, url=RESUME_URL) is False


def test_the_destination_does_not_rescue_a_bad_signature():
    body = _command(RESUME_URL)
    assert not verify_signature("other", signed_headers("s3cret", body), body, url=RESUME_URL)
    assert not verify_signature("s3cret", signed_headers("s3cret", body), body, url="not a url")
