"""The Python client for Saga Admin's agent API (httpx only; importing it never imports Django).

    from saga_client import Saga
    saga = Saga("https://saga.example.com", "sk_…")
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        run.step("hr.create_user", target=("user", email), args={...}, do=create_user,
                 compensate=("hr.delete_user", {"email": email}))

Receivers of Saga Admin's webhooks (compensators, resume_url) check requests with
``verify_signature``.
"""

from __future__ import annotations

from saga_client.client import (
    ApprovalRejected,
    ApprovalTimeout,
    AuthenticationFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    RateLimited,
    RunContext,
    Saga,
    SagaAPIError,
    SagaClient,
    SagaError,
    ServerError,
    StepInDoubt,
)
from saga_client.signing import compute_signature, signed_headers, verify_signature

__all__ = [
    "ApprovalRejected",
    "ApprovalTimeout",
    "AuthenticationFailed",
    "Conflict",
    "InvalidRequest",
    "NotFound",
    "RateLimited",
    "RunContext",
    "Saga",
    "SagaAPIError",
    "SagaClient",
    "SagaError",
    "ServerError",
    "StepInDoubt",
    "compute_signature",
    "signed_headers",
    "verify_signature",
]
