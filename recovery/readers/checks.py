"""The worker's checks around an undo step whose action's policy has ``before`` and whose read
tool a reader serves (``recovery.readers.calls``):

- **drift** (before the compensator): the value read now must equal the after-image
  (``Action.after_snapshot``). Another value: the step is ``drifted``, reason ``state_drift``, and
  the compensator is not called (an operator's "retry anyway" skips this check). The before-image
  itself: an earlier attempt already restored it (its read-back failed, or its worker died after
  the call), so the step is done and verified without calling the compensator again.
- **verification** (after the compensator succeeded): the value read back must equal the
  before-image (``Action.before_snapshot``): the step is done with ``verified`` true; another value
  fails the step with code ``not_restored``. That failure is permanent, not retried by the
  engine: the compensator already said it succeeded, so the same call would most likely be
  acknowledged and not applied again, and a blind repeat could overwrite what now sits there. An
  operator's retry is safe: it runs the drift check first.
- a read that fails: transient (an outage) → retried like a compensator's 5xx, then failed;
  otherwise (a misconfigured reader, a result that is no JSON object) → failed at once.

Every attempt's ``checks`` are ``{"now", "read_back", "differences", "reads"}`` (recovery.models
UnwindStep.read_checks); the runner adds this attempt's reads to the step's earlier ones.
Without a reader (or without ``before``) the step is carried out as before, ``verified`` None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ledger.models import Compensator, StateReader
from ledger.policies.before_images import (
    before_read_args,
    differences_sentence,
    image_differences,
    images_equal,
)
from ledger.policies.compensation_args import TemplateUnfillable
from recovery import compensators
from recovery.compensators import CompensationRequest, Outcome
from recovery.readers.calls import Read, read_value, reader_label, reader_row

# Outcome.code of a step whose undo was acknowledged but whose value did not come back.
NOT_RESTORED = "not_restored"


def reader_for(request: CompensationRequest, *, tenant_id: int) -> StateReader | None:
    """The reader serving the step's action's ``before.tool`` (None without ``before`` or reader)."""
    before = request.before
    if not isinstance(before, dict) or not isinstance(before.get("tool"), str):
        return None
    return reader_row(tenant_id=tenant_id, tool=before["tool"])


def execute_checked(
    request: CompensationRequest,
    *,
    tenant_id: int,
    rows: dict[tuple[int, str], Compensator | None] | None = None,
) -> Outcome:
    """``compensators.execute`` with the reader's drift check before it and read-back after it,
    when the action has a reader; never raises for anything the reader's side can cause."""
    row = reader_for(request, tenant_id=tenant_id)
    if row is None:
        return compensators.execute(request, tenant_id=tenant_id, rows=rows)
    before = dict(request.before or {})
    checks: dict[str, Any] = {"now": None, "read_back": None, "differences": [], "reads": []}
    try:
        args = before_read_args(
            before, args=request.action_args, target_id=request.target_id, target_type=request.target_type
        )
    except TemplateUnfillable as exc:
        return _with(
            Outcome.failed(f"The read {row.tool} cannot be made for this action: {exc}"),
            checks,
            verified=None,
        )
    path = before.get("path")
    read = _Reading(row=row, request=request, args=args, path=path if isinstance(path, str) else None)
    drift_checked = not request.override_drift and request.after_snapshot is not None
    if drift_checked and (stop := _drift_check(read, checks)) is not None:
        return stop
    # The drift check passed (or the operator chose to retry anyway): the compensators' own
    # snapshot drift check would only repeat it.
    call = replace(request, override_drift=True) if drift_checked else request
    outcome = compensators.execute(call, tenant_id=tenant_id, rows=rows)
    if outcome.kind != compensators.DONE:
        return _with(outcome, checks, verified=None)
    return _verify(read, checks, outcome)


@dataclass(frozen=True)
class _Reading:
    """One step's read: the reader, the step, the read's args and the image's path."""

    row: StateReader
    request: CompensationRequest
    args: Any
    path: str | None

    def __call__(self, phase: str, checks: dict[str, Any]) -> Read:
        read = read_value(self.row, request=self.request, args=self.args, path=self.path, phase=phase)
        checks["reads"].append(read.entry)
        return read


def _drift_check(read_now: _Reading, checks: dict[str, Any]) -> Outcome | None:
    """Before the undo: None when the value is still the after-image (go on), else the outcome."""
    request = read_now.request
    read = read_now("drift", checks)
    if not read.ok:
        return _read_failed(read, checks, when="before the undo (the drift check); the undo was not run")
    now = None if read.absent else read.value
    checks["now"] = now
    if images_equal(now, request.after_snapshot):
        return None
    if request.before_snapshot is not None and images_equal(now, request.before_snapshot):
        # An earlier attempt put it back (its read-back failed, or its worker died after the
        # call): nothing is left to undo, and calling the compensator again would change nothing.
        checks["read_back"] = now
        return _with(Outcome.done(), checks, verified=True)
    checks["differences"] = image_differences(request.after_snapshot, now)
    what = _what_differs(checks["differences"], read, read_now.path)
    return _with(
        Outcome.drifted(
            f"{_subject(read_now)} changed since the agent: {what}; the undo was not run so as not to overwrite it."
        ),
        checks,
        verified=None,
    )


def _verify(read_back_now: _Reading, checks: dict[str, Any], outcome: Outcome) -> Outcome:
    """After the compensator said done: the value read back must be the before-image."""
    request = read_back_now.request
    read = read_back_now("verify", checks)
    if not read.ok:
        return _read_failed(read, checks, when="after the undo, which the compensator reported done")
    read_back = None if read.absent else read.value
    checks["read_back"] = read_back
    if request.before_snapshot is None:
        # Nothing to compare with: the undo is done, but unproven.
        return _with(outcome, checks, verified=None)
    if images_equal(read_back, request.before_snapshot):
        return _with(outcome, checks, verified=True)
    checks["differences"] = image_differences(request.before_snapshot, read_back)
    what = _what_differs(checks["differences"], read, read_back_now.path)
    return _with(
        Outcome.failed(
            f"{_subject(read_back_now)} did not come back after the undo: {what}. The compensator reported "
            "success, but the value read back is not the one the agent replaced.",
            status_code=outcome.status_code,
            code=NOT_RESTORED,
        ),
        checks,
        verified=False,
    )


def _read_failed(read: Read, checks: dict[str, Any], *, when: str) -> Outcome:
    text = f"Reading the value {when}: {read.error}"
    outcome = Outcome.retry(text) if read.transient else Outcome.failed(text)
    return _with(outcome, checks, verified=None)


def _with(outcome: Outcome, checks: dict[str, Any], *, verified: bool | None) -> Outcome:
    return replace(outcome, checks=checks, verified=verified)


def _subject(read: _Reading) -> str:
    """What changed, for the sentence: the action's target, else (a call recorded with none, as
    saga-mcp and the adapters record them) what the read reads: ``the contact read by
    crm.get_contact {"id": "c-9"}``."""
    request = read.request
    if request.target_type or request.target_id:
        return f"{request.target_type or 'target'} {request.target_id}".strip()
    name = read.path.rsplit(".", 1)[-1] if read.path else "value"
    shown = json.dumps(read.args, default=str, ensure_ascii=False)
    return f"the {name} read by {read.row.tool} {shown[:200]}"


def _what_differs(differences: list[dict[str, Any]], read: Read, path: Any) -> str:
    """The differences in words, the whole value named by the path it was read at."""
    if read.absent:
        return f"it has no value at {path} any more" if path else "it has no value any more"
    name = str(path).rsplit(".", 1)[-1] if path else "the value"
    worded = [
        {**diff, "path": name} if diff.get("path") == "(the whole value)" else diff for diff in differences
    ]
    return differences_sentence(worded) or "it differs"


__all__ = ["NOT_RESTORED", "execute_checked", "reader_for", "reader_label"]
