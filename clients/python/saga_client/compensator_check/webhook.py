"""The webhook cases run against a compensator URL.

Every case sends one request (the latency case, many) that differs from a valid call the way its
``send`` says: the signature (``valid``, ``none``, ``wrong`` — another secret —, ``stale`` — a
correct signature over a timestamp outside the window), the body (``valid``, ``malformed`` — signed
bytes that are not JSON —, ``drifted`` — an ``after_snapshot`` whose every value differs from the
sample's —, ``extra_fields``) and the ``Idempotency-Key`` (``fresh``, or ``remembered``: the one of
the valid call, so a replay is what the worker's retry would send: same key, same fields, the next
``attempt``). With a state URL, a case marked ``state: unchanged`` reads the target's state before
and after (a signed GET) and fails if it moved.

These are real calls: point the kit at a staging compensator and a staging target.
"""

from __future__ import annotations

import json
import math
import secrets
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from saga_client.compensator_check.cases import ERROR, FAIL, NOT_SUPPORTED, PASS, Case, Spec, status_matches
from saga_client.signing import signed_headers

USER_AGENT = "saga-compensator-check/1"


@dataclass
class Target:
    """What the kit calls, and the sample step it sends."""

    url: str
    secret: str
    # The step's fields for a valid call (tool, args, target_type, target_id, before_snapshot,
    # after_snapshot); the ids the kit fills in.
    sample: dict[str, Any]
    state_url: str | None = None
    timeout_s: float = 10.0
    calls: int = 20


@dataclass
class Result:
    case: Case
    verdict: str
    detail: str = ""
    status: int | None = None
    seconds: list[float] = field(default_factory=list)

    @property
    def blocking(self) -> bool:
        """A required case that did not pass: the command exits non-zero."""
        return self.case.required and self.verdict in (FAIL, ERROR)


def _drifted(value: Any) -> Any:
    """The same shape with every leaf changed: what a person's edit since the action looks like."""
    if isinstance(value, dict):
        return (
            {key: _drifted(item) for key, item in value.items()}
            if value
            else {"saga_check_drift": uuid.uuid4().hex}
        )
    if isinstance(value, list):
        return [_drifted(item) for item in value] or ["saga-check-drift"]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1000003
    if isinstance(value, str):
        return f"{value}-drifted-{uuid.uuid4().hex[:6]}"
    return {"saga_check_drift": uuid.uuid4().hex}


class _Run:
    def __init__(self, target: Target, spec: Spec, client: httpx.Client) -> None:
        self.target = target
        self.spec = spec
        self.client = client
        self.remembered: tuple[str, dict[str, Any]] | None = None
        self.results: dict[str, Result] = {}
        # The cases whose request the compensator carried out (2xx), as a later 409 explains.
        self.carried_out: list[str] = []

    # --- requests -----------------------------------------------------------------------------

    def _fields(self, key: str) -> dict[str, Any]:
        sample = self.target.sample
        step = f"check-{key[-12:]}"
        return {
            "step_id": sample.get("step_id", step),
            "action_id": sample.get("action_id", f"act_{step}"),
            "run_id": sample.get("run_id", "run_saga_check"),
            "tenant": sample.get("tenant", "saga-check"),
            "tool": sample.get("tool", "saga.check"),
            "args": sample.get("args", {}),
            "target_type": sample.get("target_type", ""),
            "target_id": sample.get("target_id", ""),
            "before_snapshot": sample.get("before_snapshot"),
            "after_snapshot": sample.get("after_snapshot"),
            "attempt": 1,
        }

    def _request(self, case: Case) -> tuple[str, bytes, dict[str, str]]:
        send = case.send
        if send.get("key") == "remembered" and self.remembered is not None:
            key, fields = self.remembered
            fields = {**fields, "attempt": int(fields["attempt"]) + 1}
            self.remembered = (key, fields)
        else:
            key = f"saga-check-{uuid.uuid4().hex}"
            fields = self._fields(key)
        body_kind = send.get("body", "valid")
        if body_kind == "drifted":
            fields = {**fields, "after_snapshot": _drifted(fields.get("after_snapshot"))}
        elif body_kind == "extra_fields":
            fields = {**fields, "saga_check_future_field": {"nested": [1, "two", None]}, "x_saga_check": True}
        if send.get("remember_key"):
            self.remembered = (key, fields)
        if body_kind == "malformed":
            body = b'{"step_id": "check-'
        elif body_kind == "empty":
            body = b"{}"
        else:
            body = json.dumps(fields).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": key, "User-Agent": USER_AGENT}
        signature = send.get("signature", "valid")
        if signature == "valid":
            headers.update(signed_headers(self.target.secret, body))
        elif signature == "wrong":
            headers.update(signed_headers(secrets.token_hex(16), body))
        elif signature == "stale":
            stale = int(time.time()) - int(self.spec.protocol["stale_by_seconds"])
            headers.update(signed_headers(self.target.secret, body, timestamp=stale))
        return key, body, headers

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, float, str]:
        started = time.perf_counter()
        response = self.client.post(self.target.url, content=body, headers=headers)
        return response.status_code, time.perf_counter() - started, response.text[:300]

    def state(self) -> Any:
        """The target's state from the state URL (a signed GET), or None without one."""
        if not self.target.state_url:
            return None
        headers = {"User-Agent": USER_AGENT, **signed_headers(self.target.secret, b"")}
        response = self.client.get(self.target.state_url, headers=headers)
        try:
            return {"status": response.status_code, "body": response.json()}
        except ValueError:
            return {"status": response.status_code, "body": response.text}

    # --- cases --------------------------------------------------------------------------------

    def run(self, case: Case) -> Result:
        if case.tls:
            return self._tls(case)
        if (
            case.id != "reachable"
            and "reachable" in self.results
            and self.results["reachable"].verdict != PASS
        ):
            return Result(case, ERROR, "not run: the compensator did not answer")
        before = self.state() if case.state == "unchanged" else None
        if case.latency:
            result = self._latency(case)
        else:
            key, body, headers = self._request(case)
            try:
                status, seconds, text = self._post(body, headers)
            except httpx.TimeoutException:
                return Result(case, FAIL, self._timed_out(case, key), seconds=[self.target.timeout_s])
            except httpx.HTTPError as exc:
                return Result(case, FAIL, f"no answer: {type(exc).__name__}: {exc}")
            result = self._judge(case, status, text)
            result.seconds = [seconds]
            if 200 <= status < 300:
                self.carried_out.append(case.id)
        if case.state == "unchanged" and self.target.state_url and result.verdict == PASS:
            after = self.state()
            if after != before:
                return Result(
                    case,
                    FAIL,
                    f"the target's state changed: {_short(before)} -> {_short(after)}",
                    result.status,
                )
        return result

    def _timed_out(self, case: Case, key: str) -> str:
        """What a call slower than the timeout means: the worker retries it with the same key (and
        the next attempt), so the kit does too, once, and says what the retry got."""
        said = f"no answer within the timeout ({self.target.timeout_s:g} s)"
        if case.send.get("signature") != "valid" or case.send.get("body") in ("malformed", "empty"):
            return said
        if self.remembered is not None and self.remembered[0] == key:
            _, body, headers = self._request(
                Case(
                    case.id,
                    case.title,
                    case.required,
                    case.harmless,
                    {**case.send, "key": "remembered", "remember_key": False},
                )
            )
        else:
            return said
        try:
            status, _, _ = self._post(body, headers)
        except httpx.TimeoutException:
            return f"{said}; retried with the same key: no answer either"
        except httpx.HTTPError as exc:
            return f"{said}; retried with the same key: {type(exc).__name__}"
        return f"{said}; retried with the same key: answered {status}"

    def _judge(self, case: Case, status: int, text: str) -> Result:
        expect = case.expect
        if status_matches(status, expect.get("pass", [])):
            return Result(case, PASS, "", status)
        after = expect.get("pass_after")
        if after:
            earlier = self.results.get(after["case"])
            if earlier and earlier.verdict == after["verdict"] and status_matches(status, after["status"]):
                return Result(
                    case,
                    PASS,
                    f"already done by the {after['case']} call (the compensator ignores drift)",
                    status,
                )
        if status_matches(status, expect.get("not_supported", [])):
            return Result(case, NOT_SUPPORTED, f"answered {status}: the call was carried out", status)
        wanted = " or ".join(str(token) for token in expect.get("pass", []))
        if status == 409 and self.carried_out:
            done_by = ", ".join(self.carried_out)
            return Result(
                case, FAIL, f"answered 409 (already done): carried out earlier by the {done_by} call", status
            )
        return Result(case, FAIL, f"answered {status}, expected {wanted}: {text.strip()[:160]}", status)

    def _tls(self, case: Case) -> Result:
        if not self.target.url.lower().startswith("https://"):
            return Result(
                case, FAIL, "served over plain HTTP: the signed bodies and their args travel in clear"
            )
        try:
            response = self.client.post(self.target.url, content=b"{}", headers={"User-Agent": USER_AGENT})
        except httpx.ConnectError as exc:
            if isinstance(exc.__cause__, ssl.SSLError) or "CERTIFICATE" in str(exc).upper():
                return Result(case, FAIL, f"the certificate does not verify: {exc}")
            return Result(case, FAIL, f"no answer: {exc}")
        except httpx.HTTPError as exc:
            return Result(case, FAIL, f"no answer: {type(exc).__name__}: {exc}")
        return Result(case, PASS, "", response.status_code)

    def _latency(self, case: Case) -> Result:
        """``calls`` replays of the valid call; a call slower than the timeout is retried with the
        same key, as the worker retries it, and the retry's answer reported."""
        if self.remembered is None:
            return Result(case, ERROR, "not run: no valid call to replay")
        # The valid call did the work; the replays show the answer to a retry. Both count.
        valid = self.results.get("valid_call_succeeds")
        seconds: list[float] = list(valid.seconds) if valid else []
        statuses: list[int] = []
        slow: list[str] = []
        for _ in range(max(1, self.target.calls)):
            _, body, headers = self._request(case)
            try:
                status, took, text = self._post(body, headers)
            except httpx.TimeoutException:
                seconds.append(self.target.timeout_s)
                try:
                    _, retry_body, retry_headers = self._request(case)
                    retried, _, _ = self._post(retry_body, retry_headers)
                    slow.append(f"retried with the same key: {retried}")
                except httpx.HTTPError as exc:
                    slow.append(f"retried with the same key: {type(exc).__name__}")
                continue
            except httpx.HTTPError as exc:
                return Result(case, FAIL, f"no answer: {type(exc).__name__}: {exc}")
            seconds.append(took)
            statuses.append(status)
            if not status_matches(status, case.expect["pass"]):
                return Result(
                    case, FAIL, f"a replay answered {status}: {text.strip()[:160]}", status, seconds
                )
        p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
        summary = (
            f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms over {len(seconds)} calls (the valid call and "
            f"its replays); step timeout {self.target.timeout_s:g} s"
        )
        if slow:
            return Result(
                case,
                FAIL,
                f"{len(slow)} call(s) slower than the step timeout ({slow[0]}); {summary}",
                statuses[-1] if statuses else None,
                seconds,
            )
        if p99 >= self.target.timeout_s:
            return Result(case, FAIL, f"too slow: {summary}", statuses[-1], seconds)
        return Result(case, PASS, summary, statuses[-1], seconds)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (no interpolation: with 20 calls, p99 is the slowest)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def run_webhook(
    target: Target, spec: Spec, *, harmless_only: bool = False, verify_tls: bool = True
) -> list[Result]:
    """Run the webhook cases in the spec's order (harmless ones only, when asked) and return one
    result per case."""
    with httpx.Client(timeout=target.timeout_s, verify=verify_tls, follow_redirects=False) as client:
        run = _Run(target, spec, client)
        for case in spec.webhook:
            if harmless_only and not case.harmless:
                continue
            run.results[case.id] = run.run(case)
        return list(run.results.values())
