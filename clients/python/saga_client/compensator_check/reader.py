"""The reader cases run against a webhook reader URL (a policy file's ``readers``: the read the
worker makes before an undo step, to check drift, and after it, to verify the undo).

A reader is POSTed ``{"tool", "args", "tenant", "run_id", "action_id"}``, signed as compensator
calls are, and answers ``{"state": …}``: the target's current state. The cases send the sample
read (``--request``: ``tool``, ``args`` and optionally ``path``, the policy's ``before.path``) with
the signature a case's ``send`` names (``valid``, ``none``, ``wrong``, ``stale``). With a state URL,
the ``state: matches`` case compares what the reader answers with what the state URL answers (a
signed GET, as the compensator cases read it) at ``path``.

Reads change nothing, but a reader that accepts a wrong signature hands the target's state to
anyone: those cases are required.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any

import httpx

from saga_client.compensator_check.cases import ERROR, FAIL, PASS, Case, Spec, status_matches
from saga_client.compensator_check.webhook import USER_AGENT, Result, Target, _short
from saga_client.signing import signed_headers as signed

_MISSING = object()


def _at(value: Any, path: str | None) -> Any:
    """The value at the dotted ``path`` (list items by index), ``_MISSING`` when there is none."""
    for segment in path.split(".") if path else []:
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return _MISSING
    return value


class _ReaderRun:
    def __init__(self, target: Target, spec: Spec, client: httpx.Client) -> None:
        self.target = target
        self.spec = spec
        self.client = client
        self.results: dict[str, Result] = {}
        self.state: Any = _MISSING  # what the valid read answered

    def _body(self) -> dict[str, Any]:
        sample = self.target.sample
        return {
            "tool": sample.get("tool", "saga.check_read"),
            "args": sample.get("args", {}),
            "tenant": sample.get("tenant", "saga-check"),
            "run_id": sample.get("run_id", "run_saga_check"),
            "action_id": sample.get("action_id", f"act_check-{uuid.uuid4().hex[:12]}"),
        }

    def _post(self, case: Case) -> httpx.Response:
        send = case.send
        body = b"{}" if send.get("body") == "empty" else json.dumps(self._body()).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        signature = send.get("signature", "valid")
        if signature == "valid":
            headers.update(signed(self.target.secret, body))
        elif signature == "wrong":
            headers.update(signed(secrets.token_hex(16), body))
        elif signature == "stale":
            stale = int(time.time()) - int(self.spec.protocol["stale_by_seconds"])
            headers.update(signed(self.target.secret, body, timestamp=stale))
        return self.client.post(self.target.url, content=body, headers=headers)

    def run(self, case: Case) -> Result:
        reachable = self.results.get("reader_reachable")
        if case.id != "reader_reachable" and reachable is not None and reachable.verdict != PASS:
            return Result(case, ERROR, "not run: the reader did not answer")
        if case.state == "matches":
            return self._matches(case)
        try:
            response = self._post(case)
        except httpx.TimeoutException:
            return Result(case, FAIL, f"no answer within the timeout ({self.target.timeout_s:g} s)")
        except httpx.HTTPError as exc:
            return Result(case, FAIL, f"no answer: {type(exc).__name__}: {exc}")
        status = response.status_code
        seconds = [response.elapsed.total_seconds()]
        if not status_matches(status, case.expect.get("pass", [])):
            wanted = " or ".join(str(token) for token in case.expect.get("pass", []))
            return Result(
                case, FAIL, f"answered {status}, expected {wanted}: {response.text.strip()[:160]}", status
            )
        if case.expect.get("state"):
            return self._state_of(case, response, seconds)
        return Result(case, PASS, "", status, seconds)

    def _state_of(self, case: Case, response: httpx.Response, seconds: list[float]) -> Result:
        """A valid read: a JSON object with ``state``, holding a value at ``path`` when given."""
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict) or "state" not in data:
            return Result(case, FAIL, 'the answer is not a JSON object {"state": …}', response.status_code)
        path = self.target.sample.get("path")
        value = _at(data["state"], path)
        if value is _MISSING or value is None:
            return Result(
                case, FAIL, f"the state has no value at {path}: {_short(data['state'])}", response.status_code
            )
        self.state = data["state"]
        return Result(case, PASS, f"state {_short(value)}", response.status_code, seconds)

    def _matches(self, case: Case) -> Result:
        if self.state is _MISSING:
            return Result(case, ERROR, "not run: no valid read to compare")
        assert self.target.state_url
        headers = {"User-Agent": USER_AGENT, **signed(self.target.secret, b"")}
        try:
            response = self.client.get(self.target.state_url, headers=headers)
            truth = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return Result(case, FAIL, f"the state URL gave no JSON: {type(exc).__name__}")
        path = self.target.sample.get("path")
        read, real = _at(self.state, path), _at(truth, path)
        if read != real:
            return Result(case, FAIL, f"the reader answered {_short(read)}, the state URL {_short(real)}")
        return Result(case, PASS, f"the same as the state URL: {_short(read)}", response.status_code)


def run_reader(target: Target, spec: Spec, *, harmless_only: bool = False) -> list[Result]:
    """Run the reader cases in the spec's order (harmless ones only, when asked; the state case
    only with a state URL) and return one result per case."""
    with httpx.Client(timeout=target.timeout_s, follow_redirects=False) as client:
        run = _ReaderRun(target, spec, client)
        for case in spec.reader:
            if harmless_only and not case.harmless:
                continue
            if case.state == "matches" and not target.state_url:
                continue
            run.results[case.id] = run.run(case)
        return list(run.results.values())
