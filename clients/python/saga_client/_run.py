"""The flows of one run, shared by ``Run`` and ``AsyncRun``: its lifecycle (create or load,
complete, fail), its steps' state machine (record, wait for approval, start, call, record the
outcome) and its checkpoints. Like ``saga_client._core``, no I/O of its own: each flow yields the
effects the client performs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import httpx

from saga_client._before import take_after_image, take_image
from saga_client._core import DONE_STATES, Api, Flow, Invoke, Reply, rejection
from saga_client._failures import UnretriedFailures
from saga_client.errors import (
    ApprovalPending,
    BeforeImageFailed,
    Conflict,
    RunCancelled,
    SagaError,
    StepInDoubt,
)
from saga_client.images import images_equal
from saga_client.responses import ActionDict, CheckpointDict, PlanDict, RunDict, RunFailDict

log = logging.getLogger(__name__)

Target = tuple[str, str]
Compensation = tuple[str, Mapping[str, Any]]


class _PlanStepTool(TypedDict):
    tool: str


class PlanStep(_PlanStepTool, total=False):
    """One step of ``run.plan([...])``: what ``run.step`` takes to record it, without ``do``.
    ``before`` is the before snapshot, or a callable producing it (called when the plan is sent);
    ``start`` also starts it when it needs no approval."""

    target: Target
    args: Mapping[str, Any]
    compensate: Compensation
    intent: Mapping[str, Any]
    idempotency_key: str
    before: Any
    start: bool


PLAN_STEP_KEYS = frozenset(PlanStep.__annotations__) | {"tool"}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def jsonable(value: Any) -> Any:
    """What can be stored as a step's result: the value itself when it is JSON, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)[:10000]}
    return value


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, (TimeoutError, httpx.TimeoutException))


def accepts_argument(func: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume they take the args
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


@dataclass(frozen=True)
class _AfterRead:
    """A step's after-image, to be read through its policy's ``before`` once the call succeeded."""

    reads: Mapping[str, Any]
    target: Target | None


@dataclass(frozen=True)
class _ReadAgain:
    """A step's before-image, taken through its policy's ``before``: read again before the step
    starts when it was not started as it was recorded (it waited for approval, or was recorded
    ahead)."""

    reads: Mapping[str, Any]
    target: Target | None


class RunCore:
    """A run's state and the flows of its lifecycle and steps, shared by ``Run`` and ``AsyncRun``."""

    def __init__(
        self, api: Api, *, agent: str, request: str, fields: Mapping[str, Any], run_id: str = ""
    ) -> None:
        self._api = api
        self._create = {"agent": agent, "request": request, **fields}
        self.id = run_id
        self.run: RunDict = cast(RunDict, {})  # empty until the run is opened
        self.actions: list[ActionDict] = []
        # Steps that raised ApprovalPending and have not been decided since (action id → action).
        self.pending_approvals: dict[str, dict[str, Any]] = {}
        self._finished = False
        self._failed_action_id: str | None = None
        # What the run's failure report calls it: a timed-out step must be reconciled first.
        self._failure_reason = "failed"
        # The steps whose call failed and that were not retried successfully since, and whether
        # they fail the run at a clean exit. The adapters set it: their frameworks hand a tool's
        # exception to the model and carry on, so the block ends cleanly after a failed step.
        self.unretried = UnretriedFailures()
        self.fail_unretried_steps = False
        # The before-images sent with the actions recorded ahead (``record``, ``plan``), by key:
        # the step that runs such an action later is that action, its image taken already.
        self._recorded_images: dict[str, Any] = {}

    # Lifecycle --------------------------------------------------------------------------------

    def _open(self) -> Flow[RunDict]:
        if self.id:
            if not self.run:
                self.run = yield from self._api.get_run(self.id)
        else:
            self.run = yield from self._api.create_run(**self._create)
            self.id = self.run["id"]
        return self.run

    def _exit(self, exc: BaseException | None) -> Flow[None]:
        if self._finished:
            return
        if isinstance(exc, ApprovalPending) or (exc is None and self.pending_approvals):
            # Parked, not finished: a step waits for a person. The run stays running; the agent
            # (or an adapter) carries on later with ``attach(run_id)``.
            log.info(
                "saga: run %s left running, waiting for approval of %s", self.id, list(self.pending_approvals)
            )
            return
        if isinstance(exc, RunCancelled):
            # An operator cancelled the run: it is finished, and failing it could only be refused.
            self._finished = True
            log.info("saga: run %s was cancelled by an operator", self.id)
            return
        if exc is None and self.fail_unretried_steps and self.unretried:
            yield from self._fail_unretried()
            return
        if exc is None:
            try:
                yield from self._complete()
            except Conflict as refused:
                if refused.code != "pending_approvals":
                    raise
                # A step recorded (or planned) but not taken still waits for a person: parked, as
                # above; the server named the steps, and ``complete(withdraw_approvals=True)``
                # (or ``fail``) ends the run without them.
                log.info("saga: run %s left running: %s", self.id, refused)
            return
        try:
            # The block raised: the steps still waiting for approval will not be taken (a wait for
            # approval that timed out raised here too), so their approvals are withdrawn with the
            # failure rather than left in an approver's inbox for a run that is over.
            yield from self._fail(
                f"{type(exc).__name__}: {exc}",
                failed_action_id=self._failed_action_id,
                reason=self._failure_reason,
                withdraw_approvals=True,
            )
        except RunCancelled:
            # Cancelled while the block was failing: nothing to report, nothing gone wrong here.
            log.info("saga: run %s was cancelled by an operator", self.id)
        except SagaError:
            # The original exception matters more than a failed report; the heartbeat sweeper
            # will still find a silent run.
            log.exception("saga: could not report the failure of run %s", self.id)

    def _fail_unretried(self) -> Flow[None]:
        """A clean exit after a failed step that was not retried successfully: the run fails, as
        ``saga-mcp`` fails such a session (``saga_client._failures``)."""
        verdict = self.unretried.verdict("The run ended")
        assert verdict is not None
        report, action_id = verdict
        log.warning("saga: run %s failed: %s", self.id, report)
        try:
            yield from self._fail(report, failed_action_id=action_id, withdraw_approvals=True)
        except RunCancelled:
            log.info("saga: run %s was cancelled by an operator", self.id)

    def _complete(self, summary: str = "", *, withdraw_approvals: bool = False) -> Flow[RunDict]:
        self.run = yield from self._api.complete_run(self.id, summary, withdraw_approvals=withdraw_approvals)
        self._finished = True
        return self.run

    def _fail(
        self,
        error: str,
        *,
        failed_action_id: str | None = None,
        reason: str = "failed",
        withdraw_approvals: bool = False,
    ) -> Flow[RunFailDict]:
        self._finished = True
        failed = yield from self._api.fail_run(
            self.id,
            error,
            failed_action_id=failed_action_id,
            reason=reason,
            withdraw_approvals=withdraw_approvals,
        )
        self.run = failed
        return failed

    # Steps ----------------------------------------------------------------------------------

    def step_key(self, tool: str, target: Target | None, args: Any) -> str:
        """Deterministic: the same call in the same run always gets the same key, so a retried
        step (in this process or after a restart) replays instead of acting twice."""
        digest = hashlib.sha256(canonical([self.id, tool, list(target) if target else None, args]).encode())
        return f"{self.id}:{digest.hexdigest()[:40]}"

    def _action_request(
        self,
        tool: str,
        target: Target | None,
        args: dict[str, Any],
        compensate: Compensation | None,
        intent: Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> tuple[str, dict[str, Any]]:
        """The idempotency key and body that record a step: one place, so that a step recorded
        ahead (``record``) and the same step run later are one action."""
        key = idempotency_key or self.step_key(tool, target, args)
        body: dict[str, Any] = {"args": args}
        if target is not None:
            body["target_type"], body["target_id"] = str(target[0]), str(target[1])
        if compensate is not None:
            body["compensation"] = {"tool": compensate[0], "args": dict(compensate[1])}
        if intent is not None:
            body["intent"] = dict(intent)
        return key, body

    def _record(
        self,
        tool: str,
        *,
        target: Target | None,
        args: Mapping[str, Any] | None,
        compensate: Compensation | None,
        intent: Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> Flow[ActionDict]:
        if not self.id:
            raise SagaError(
                "The run is not open yet: use it as a context manager (or open it) first.",
                code="run_not_open",
            )
        key, body = self._action_request(tool, target, dict(args or {}), compensate, intent, idempotency_key)
        reads = yield from self._api.policy_cache.before_of(self._api, tool)
        if reads is not None:
            body["before_snapshot"] = yield from take_image(
                self._api, reads, tool=tool, args=body["args"], target=target
            )
        reply = yield from self._api.record_action(self.id, tool=tool, idempotency_key=key, **body)
        if reads is not None:
            self._recorded_images[key] = body["before_snapshot"]
        action: ActionDict = reply.data
        return action

    def _plan(self, steps: Sequence[Mapping[str, Any]]) -> Flow[PlanDict]:
        if not self.id:
            raise SagaError(
                "The run is not open yet: use it as a context manager (or open it) first.",
                code="run_not_open",
            )
        actions: list[dict[str, Any]] = []
        imaged: dict[str, Any] = {}
        for index, step in enumerate(steps):
            unknown = sorted(set(step) - PLAN_STEP_KEYS)
            if unknown or "tool" not in step:
                raise TypeError(
                    f"run.plan: step {index} "
                    + (f"has unknown keys {unknown}" if unknown else "has no 'tool'")
                    + f" (a step takes {sorted(PLAN_STEP_KEYS)})"
                )
            tool = step["tool"]
            key, body = self._action_request(
                tool,
                step.get("target"),
                dict(step.get("args") or {}),
                step.get("compensate"),
                step.get("intent"),
                step.get("idempotency_key"),
            )
            before = step.get("before")
            snapshot = (yield Invoke(before)) if callable(before) else before
            if before is None:
                reads = yield from self._api.policy_cache.before_of(self._api, tool)
                if reads is not None:
                    snapshot = yield from take_image(
                        self._api, reads, tool=tool, args=body["args"], target=step.get("target")
                    )
                    imaged[key] = snapshot
            if snapshot is not None:
                body["before_snapshot"] = snapshot
            if step.get("start"):
                body["start"] = True
            actions.append({"tool": tool, "idempotency_key": key, **body})
        reply = yield from self._api.record_plan(self.id, actions)
        self._recorded_images.update(imaged)
        plan: PlanDict = reply.data
        return plan

    def _step(
        self,
        tool: str,
        *,
        do: Callable[..., Any],
        target: Target | None,
        args: Mapping[str, Any] | None,
        compensate: Compensation | None,
        before: Any,
        after: Any,
        intent: Mapping[str, Any] | None,
        idempotency_key: str | None,
        approval_timeout_s: float | None,
        wait: bool,
    ) -> Flow[Any]:
        if not self.id:
            raise SagaError(
                "The run is not open yet: use it as a context manager (or open it) first.",
                code="run_not_open",
            )
        call_args = dict(args or {})
        key, body = self._action_request(tool, target, call_args, compensate, intent, idempotency_key)
        body["start"] = True
        snapshot, after, reread = yield from self._images(tool, key, call_args, target, before, after)
        if snapshot is not None:
            body["before_snapshot"] = snapshot

        reply = yield from self._api.record_action(self.id, tool=tool, idempotency_key=key, **body)
        action: ActionDict = reply.data
        if action["status"] in DONE_STATES:
            self._settled(action)
            self.unretried.succeeded(tool, call_args)
            return action["result"]
        # Started by this very call (``start: true``) only when the answer is not a replay. A
        # replayed ``running`` may be another caller's start (another process running the same
        # step, or our own first send whose answer was lost — the server cannot tell which):
        # running ``do`` on it could make one recorded call two real ones.
        started_here = reply.started_here
        try:
            value = yield from self._execute(
                action,
                started_here=started_here,
                do=do,
                call_args=call_args,
                after=after,
                reread=_ReadAgain(reread, target) if reread is not None else None,
                approval_timeout_s=approval_timeout_s,
                wait=wait,
            )
        except ApprovalPending as pending:
            self.pending_approvals[pending.action_id] = pending.action
            raise
        except BaseException:
            # Whatever stopped this step (rejection, approval timeout, the tool itself), the
            # run's failure report names it.
            self.pending_approvals.pop(action["id"], None)
            self._failed_action_id = action["id"]
            raise
        # An earlier failed step that was retried successfully is no longer the run's culprit.
        self._failed_action_id = None
        self._failure_reason = "failed"
        self.unretried.succeeded(tool, call_args)
        return value

    def _images(
        self, tool: str, key: str, call_args: dict[str, Any], target: Target | None, before: Any, after: Any
    ) -> Flow[tuple[Any, Any, Mapping[str, Any] | None]]:
        """A step's before-image, what takes its after-image, and the policy's read when the
        before-image is that read's (made again before an approved step starts): the images it
        was given, else its policy's read (``saga_client._before``) — the image sent with the
        action when it was recorded ahead, or one read now (refused: ``BeforeImageFailed``)."""
        reads = None
        if before is None or after is None:
            reads = yield from self._api.policy_cache.before_of(self._api, tool)
        if before is not None or reads is None:
            snapshot = (yield Invoke(before)) if callable(before) else before
            if after is None and reads is not None:
                after = _AfterRead(reads, target)
            return snapshot, after, None
        if key in self._recorded_images:
            snapshot = self._recorded_images[key]  # recorded ahead with it: no second read
        else:
            try:
                snapshot = yield from take_image(self._api, reads, tool=tool, args=call_args, target=target)
            except BeforeImageFailed as refused:
                # Refused before it was recorded: a failed call all the same, for the run's end rule.
                self.unretried.failed(tool, call_args, "", str(refused))
                raise
        if after is None:
            after = _AfterRead(reads, target)
        return snapshot, after, reads

    def _execute(
        self,
        action: ActionDict,
        *,
        started_here: bool,
        do: Callable[..., Any],
        call_args: dict[str, Any],
        after: Any,
        reread: _ReadAgain | None,
        approval_timeout_s: float | None,
        wait: bool,
    ) -> Flow[Any]:
        if not started_here:
            action = yield from self._decided(action, approval_timeout_s=approval_timeout_s, wait=wait)

        effective_args = action["args"]
        takes_args = accepts_argument(do)
        if not takes_args and effective_args != call_args:
            raise SagaError(
                f"The approver edited the args of {action['tool']}; `do` must accept them as a parameter.",
                code="args_edited",
            )
        if not started_here:
            if reread is not None and action["status"] in ("planned", "approved"):
                yield from self._image_still_holds(action, reread, call_args)
            started = yield from self._start(action, approval_timeout_s=approval_timeout_s, wait=wait)
            action = started.data
            if not started.started_here:
                # Another call of this step started it first: its outcome is that call's to
                # report. A finished one is replayed; one still running is in doubt here.
                if action["status"] in DONE_STATES:
                    self._settled(action)
                    return action["result"]
                raise StepInDoubt(action)
        self.pending_approvals.pop(action["id"], None)
        value = yield from self._call(action, do, (effective_args,) if takes_args else (), call_args)
        if isinstance(after, _AfterRead):
            after_snapshot = yield from take_after_image(
                self._api, after.reads, tool=action["tool"], args=effective_args, target=after.target
            )
            yield from self._succeeded(action, value, after_snapshot)
            return value
        try:
            after_snapshot = (yield Invoke(after, (value,))) if callable(after) else after
        except Exception:
            # The call happened: record it (without a snapshot) before the error goes up.
            yield from self._succeeded(action, value, None)
            raise
        yield from self._succeeded(action, value, after_snapshot)
        return value

    def _image_still_holds(
        self, action: ActionDict, reread: _ReadAgain, call_args: dict[str, Any]
    ) -> Flow[None]:
        """Before a step that was not started as it was recorded is started (it waited for approval,
        or was recorded ahead by ``record``/``plan`` or an adapter): its before-image was read then,
        and may be stale now. The read
        is made again with the approved args; no image, or another value than the recorded one,
        refuses the step (``BeforeImageFailed``) before its approval is spent by the start: its
        undo would restore the wrong value. The action stays as it is (approved, or planned), as
        ``saga-mcp`` leaves it."""
        tool, read_tool = action["tool"], str(reread.reads.get("tool", ""))
        try:
            now = yield from take_image(
                self._api, reread.reads, tool=tool, args=action["args"], target=reread.target
            )
        except BeforeImageFailed as failed:
            refused = BeforeImageFailed(
                tool,
                read_tool,
                failed.reason,
                action_id=action["id"],
                message=f"{tool} was not started: the read {read_tool} made again before it gave no image "
                f"({failed.reason}). The action is left as it was (its approval, if it had one, still "
                "stands in Saga Admin); take the step again once the read works.",
            )
        else:
            if "before_snapshot" not in action or images_equal(now, action["before_snapshot"]):
                return
            why = (
                "the value changed while the step waited for approval"
                if action["status"] == "approved"
                else "the value changed since the step was recorded"
            )
            refused = BeforeImageFailed(
                tool,
                read_tool,
                why,
                action_id=action["id"],
                message=f"{tool} was not started: the value it changes (read by {read_tool}) is no longer "
                f"the one recorded with it ({why}), so its undo would restore the wrong value. The action "
                "is left as it was (its approval, if it had one, still stands in Saga Admin); to change "
                "the value as it is now, take the step again with a new idempotency_key.",
            )
        log.warning("saga: %s", refused)
        self.unretried.failed(tool, call_args, action["id"], str(refused))
        raise refused

    def _decided(
        self, action: ActionDict, *, approval_timeout_s: float | None, wait: bool
    ) -> Flow[ActionDict]:
        """A step this call did not start: the action once a person approved it, or why it cannot
        run here (in doubt, rejected, or pending with ``wait=False``)."""
        if action["status"] in ("running", "unknown"):
            raise StepInDoubt(action)
        if action["status"] == "rejected":
            raise rejection(action)
        if action["status"] == "awaiting_approval":
            if not wait:
                raise ApprovalPending(action)
            action = yield from self._api.wait_for_approval(action, timeout_s=approval_timeout_s)
        return action

    def _call(
        self, action: ActionDict, do: Callable[..., Any], args: tuple[Any, ...], call_args: dict[str, Any]
    ) -> Flow[Any]:
        """Call ``do``; when it raises, record the action failed (its outcome unknown after a
        timeout) and re-raise the same exception."""
        try:
            value = yield Invoke(do, args)
        except BaseException as exc:
            self.unretried.failed(
                action["tool"], call_args, action["id"], f"{action['tool']}: {type(exc).__name__}: {exc}"
            )
            unknown = is_timeout(exc)
            if unknown:
                self._failure_reason = "outcome_unknown"
            try:
                yield from self._api.fail_action(
                    action,
                    error=f"{type(exc).__name__}: {exc}",
                    retryable=bool(getattr(exc, "retryable", unknown)),
                    layer="tool",
                    outcome_unknown=unknown,
                )
            except SagaError:
                # The tool's own exception is what the caller must see; the run's failure report
                # still names this action.
                log.exception("saga: could not record the failure of %s", action["id"])
            raise
        return value

    def _succeeded(self, action: Mapping[str, Any], value: Any, after_snapshot: Any) -> Flow[None]:
        done = yield from self._api.succeed_action(
            action, result=jsonable(value), after_snapshot=after_snapshot
        )
        self._settled(done)

    def _start(self, action: ActionDict, *, approval_timeout_s: float | None, wait: bool) -> Flow[Reply]:
        try:
            return (yield from self._api.start(action))
        except Conflict as exc:
            if exc.code == "approval_rejected":
                raise rejection((yield from self._api.get_action(action["id"]))) from None
            if exc.code != "approval_pending":
                raise
            # Recorded before its approval was opened (a race with a policy change): wait, retry once.
            current = yield from self._api.get_action(action["id"])
            if not wait:
                raise ApprovalPending(current) from None
            approved = yield from self._api.wait_for_approval(current, timeout_s=approval_timeout_s)
            return (yield from self._api.start(approved))

    def _settled(self, action: ActionDict) -> None:
        self.pending_approvals.pop(action["id"], None)
        self.actions = [a for a in self.actions if a["id"] != action["id"]] + [action]

    # Checkpoints ----------------------------------------------------------------------------

    def _checkpoint(
        self,
        name: str,
        *,
        state: Mapping[str, Any] | None,
        summary: str,
        recovery_mode: str,
        recovery_instructions: str,
        completed_action_ids: list[str] | None,
        pending_action_ids: list[str] | None,
        requires_user_approval: bool,
        trace_links: list[Any] | None,
    ) -> Flow[CheckpointDict]:
        return self._api.write_checkpoint(
            self.id,
            name=name,
            state=dict(state or {}),
            summary=summary,
            recovery_mode=recovery_mode,
            recovery_instructions=recovery_instructions,
            completed_action_ids=completed_action_ids
            if completed_action_ids is not None
            else [a["id"] for a in self.actions if a["status"] == "succeeded"],
            pending_action_ids=pending_action_ids or [],
            requires_user_approval=requires_user_approval,
            trace_links=trace_links or [],
        )
