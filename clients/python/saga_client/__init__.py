"""The Python client for Saga Admin's agent API (httpx only; importing it never imports Django).

    from saga_client import Saga
    saga = Saga("https://saga.example.com", "sk_…")

    @saga.tool("hr.create_user", target=lambda email: ("user", email),
               compensate=lambda email: ("hr.delete_user", {"email": email}))
    def create_user(email: str, name: str) -> dict: ...

    with saga.run(agent="onboarding", request="Onboard Ashu Kumar"):
        create_user("ashu@company.com", "Ashu Kumar")

``AsyncSaga`` is the same client for asyncio. Receivers of Saga Admin's webhooks (compensators,
``resume_url``) check requests with ``verify_signature``.
"""

from __future__ import annotations

from saga_client._run import PlanStep
from saga_client._tracing import trace_context
from saga_client.aio import AsyncRun, AsyncSaga, current_async_run
from saga_client.client import Run, Saga, current_run
from saga_client.errors import (
    ApprovalDeadlinePassed,
    ApprovalPending,
    ApprovalRejected,
    ApprovalTimedOut,
    ApprovalTimeout,
    AuthenticationFailed,
    BeforeImageFailed,
    Conflict,
    InvalidRequest,
    NoActiveRun,
    NotFound,
    Paused,
    PolicyDenied,
    RateLimited,
    RunArchived,
    RunCancelled,
    SagaAPIError,
    SagaAuthError,
    SagaError,
    SagaUnavailable,
    ServerError,
    StepInDoubt,
)
from saga_client.signing import compute_signature, signed_headers, verify_signature

# The names this client had before it grew an async twin; kept so existing code keeps working.
SagaClient = Saga
RunContext = Run

__all__ = [
    "ApprovalPending",
    "ApprovalDeadlinePassed",
    "ApprovalRejected",
    "ApprovalTimedOut",
    "ApprovalTimeout",
    "AsyncRun",
    "AsyncSaga",
    "AuthenticationFailed",
    "BeforeImageFailed",
    "Conflict",
    "InvalidRequest",
    "NoActiveRun",
    "NotFound",
    "Paused",
    "PlanStep",
    "RunArchived",
    "RunCancelled",
    "PolicyDenied",
    "RateLimited",
    "Run",
    "RunContext",
    "Saga",
    "SagaAPIError",
    "SagaAuthError",
    "SagaClient",
    "SagaError",
    "SagaUnavailable",
    "ServerError",
    "StepInDoubt",
    "trace_context",
    "compute_signature",
    "current_async_run",
    "current_run",
    "signed_headers",
    "verify_signature",
]
