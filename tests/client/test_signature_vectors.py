"""One specification of the webhook signature (clients/spec/vectors/signatures.json), two
implementations: the server's (infra.signing, what the server distribution ships) and the Python
client's (saga_client.signing, what receivers use). Both must give every vector's answer, so the
server signs exactly what a client accepts without importing the client."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import saga_client.signing as client_signing

import infra.signing as server_signing

SPEC = json.loads(
    (Path(__file__).resolve().parents[2] / "clients" / "spec" / "vectors" / "signatures.json").read_text(
        "utf-8"
    )
)
IMPLEMENTATIONS = [pytest.param(server_signing, id="server"), pytest.param(client_signing, id="client")]


def _ids(vectors: list[dict]) -> list[str]:
    return [v.get("name") or v["context"] for v in vectors]


def test_the_spec_holds_passing_and_failing_cases():
    # A vector file that only ever agreed would prove nothing about refusals.
    outcomes = [v["valid"] for v in SPEC["verify"]]
    assert outcomes.count(True) >= 5 and outcomes.count(False) >= 15
    assert any(v["url"] for v in SPEC["verify"] if not v["valid"])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("vector", SPEC["signing"], ids=_ids(SPEC["signing"]))
def test_it_signs_as_specified(impl: ModuleType, vector: dict):
    body = vector["body"].encode()
    assert impl.compute_signature(vector["secret"], vector["timestamp"], body) == vector["expected_signature"]
    headers = impl.signed_headers(vector["secret"], body, timestamp=vector["timestamp"])
    assert headers == {
        "X-Saga-Timestamp": str(vector["timestamp"]),
        "X-Saga-Signature": vector["expected_signature"],
    }
    # What one implementation signs, the other verifies.
    other = client_signing if impl is server_signing else server_signing
    assert other.verify_signature(vector["secret"], headers, body, now=vector["timestamp"])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("vector", SPEC["derive_secret"], ids=_ids(SPEC["derive_secret"]))
def test_it_derives_secrets_as_specified(impl: ModuleType, vector: dict):
    assert impl.derive_secret(vector["master"], vector["context"]) == vector["expected"]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("vector", SPEC["verify"], ids=_ids(SPEC["verify"]))
def test_it_verifies_as_specified(impl: ModuleType, vector: dict):
    verdict = impl.verify_signature(
        vector["secret"],
        vector["headers"],
        vector["body"].encode(),
        vector["tolerance_s"],
        now=vector["now"],
        url=vector["url"],
    )
    assert verdict is vector["valid"]
