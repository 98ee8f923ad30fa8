/**
 * What the client throws on purpose. Every class carries `code`: the API's stable machine code for
 * an error the server answered, or the client's own for what it found out itself (`unavailable`,
 * `approval_timeout`, `step_in_doubt`, …). The class an API error gets is decided by the rules of
 * `clients/spec/errors.json` (generated into `generated/codes.ts`), the same rules the Python
 * client follows.
 */
import { CLASS_RULES, type ClassRule, DEFAULT_CLASS, REJECTION_DEFAULT, REJECTION_RULES } from "./generated/codes.js";
import type { Action } from "./types.js";

export type Details = Record<string, unknown>;

/** The base class of everything this client throws on purpose. */
export class SagaError extends Error {
  readonly code: string;
  constructor(message: string, code = "saga_error", options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/**
 * The client was constructed with a setting it cannot work with — no server URL (an unset
 * `SAGA_URL`, say), one that is not an http(s) URL, no key. Thrown by `new Saga(...)` itself,
 * naming the option, so a deployment's missing variable fails at start-up rather than at its first
 * step (as an unreachable server, after the retries).
 */
export class SagaConfigError extends SagaError {
  /** The option at fault (`url`, `key`). */
  readonly option: string;
  constructor(option: string, message: string) {
    super(message, "invalid_config");
    this.option = option;
  }
}

/** The server could not be reached after the client's own retries (`cause`: the fetch error). */
export class SagaUnavailable extends SagaError {
  readonly attempts: number;
  constructor(message: string, attempts: number, options?: { cause?: unknown }) {
    super(message, "unavailable", options);
    this.attempts = attempts;
  }
}

/** The API answered with an error: `status`, the stable `code`, `details`, `requestId`. */
export class SagaAPIError extends SagaError {
  readonly status: number;
  readonly details: Details;
  readonly requestId: string;
  constructor(status: number, code: string, message: string, details: Details = {}, requestId = "") {
    super(message, code);
    this.status = status;
    this.details = details;
    this.requestId = requestId;
  }
  override toString(): string {
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

/** 401/403: the key is missing, wrong, revoked, or lacks a scope. */
export class SagaAuthError extends SagaAPIError {}
/** 404 (including another tenant's object, or another agent's run). */
export class NotFound extends SagaAPIError {}
/**
 * 410 `archived`: retention moved the run to its archive and removed it from Saga Admin, so it
 * takes no more reads or writes there. A kind of `NotFound`; `archive` is the URL of the run's
 * manifest, `archivedAt` when (ISO 8601). Only a key that could have read the run is told: any
 * other gets `NotFound`.
 */
export class RunArchived extends NotFound {
  get archive(): string {
    return String(this.details["archive"] ?? "");
  }
  get archivedAt(): string {
    return String(this.details["archived_at"] ?? "");
  }
}
/** 409: a state change the state machine refused, a gated action, a closed run, … */
export class Conflict extends SagaAPIError {}
/**
 * 409 with `details.current == "cancelled"`: an operator cancelled the run, which refuses every
 * further write (`code` stays the API's). A run scope that ends with it does not try to fail the
 * run: it is finished already.
 */
export class RunCancelled extends Conflict {
  get runId(): string {
    return String(this.details["run_id"] ?? this.details["subject"] ?? "");
  }
}
/** 409 `paused`: an operator paused this agent or tool (`details` names the pause). */
export class Paused extends Conflict {}
/** 403 `policy_denied`: a policy rule or limit refuses this call. */
export class PolicyDenied extends SagaAPIError {}
/** 400/413/415/422: fix the request; retrying it unchanged will not help. */
export class InvalidRequest extends SagaAPIError {}
/** 429 after the client's own retries. */
export class RateLimited extends SagaAPIError {}
/** 5xx after the client's own retries. */
export class ServerError extends SagaAPIError {}

/**
 * A gated step was recorded and waits for a person (`step({..., wait: false})`). Nothing ran. Run
 * the same step again (same tool, target and args: the same key) once it is decided.
 */
export class ApprovalPending extends SagaError {
  readonly action: Action;
  readonly actionId: string;
  readonly runId: string;
  readonly tool: string;
  readonly args: unknown;
  readonly idempotencyKey: string;
  readonly approvalId: string;
  constructor(action: Action) {
    const approvalId = action.approval?.id ?? "";
    super(
      `Action ${action.id} (${action.tool}) is waiting for approval${approvalId ? " " + approvalId : ""}; ` +
        "run the same step again once it is decided.",
      "approval_pending",
    );
    this.action = action;
    this.actionId = action.id;
    this.runId = action.run_id;
    this.tool = action.tool;
    this.args = action.args;
    this.idempotencyKey = action.idempotency_key;
    this.approvalId = approvalId;
  }
}

/** A person rejected the step (or its approval expired). Nothing ran. */
export class ApprovalRejected extends SagaError {
  readonly actionId: string;
  readonly reason: string;
  readonly action: Action | undefined;
  constructor(actionId: string, reason = "", action?: Action) {
    super(`Action ${actionId} was rejected${reason ? ": " + reason : ""}.`, "approval_rejected");
    this.actionId = actionId;
    this.reason = reason;
    this.action = action;
  }
}

/**
 * Nobody decided before the approval deadline of the step's policy (its `approval_timeout`,
 * escalated first if its policy says so), so Saga Admin rejected it: the action is `rejected` and
 * its approval `expired` with reason `timed_out`. Nothing ran. A kind of `ApprovalRejected`.
 */
export class ApprovalDeadlinePassed extends ApprovalRejected {
  /** When the deadline passed (ISO 8601, "" when unknown). */
  readonly deadline: string;
  /** To whom it was escalated first ("" when it was not). */
  readonly escalatedTo: string;
  constructor(actionId: string, reason = "", action?: Action) {
    super(actionId, reason, action);
    const approval = (action?.approval ?? {}) as { expires_at?: string; escalate_to?: string | null; escalated_at?: string | null };
    this.deadline = approval.expires_at ?? "";
    this.escalatedTo = approval.escalated_at ? approval.escalate_to ?? "" : "";
    Object.defineProperty(this, "code", { value: "approval_deadline_passed" });
    const escalated = this.escalatedTo ? ` (escalated to ${this.escalatedTo} first)` : "";
    this.message = `Action ${actionId} was rejected: nobody decided before its approval deadline${this.deadline ? ` (${this.deadline})` : ""}${escalated}; reason ${reason || "timed_out"}.`;
  }
}

const REJECTIONS: Record<string, new (actionId: string, reason: string, action?: Action) => ApprovalRejected> = {
  ApprovalRejected,
  ApprovalDeadlinePassed,
};

/**
 * What a rejected action throws: the class of the spec's first rejection rule whose reason is the
 * action's approval's (`clients/spec/errors.json`, "rejections"), else `ApprovalRejected`.
 */
export function rejectionFor(action: Action): ApprovalRejected {
  const approvalReason = action.approval?.reason ?? "";
  const rule = REJECTION_RULES.find((r) => r.reason === approvalReason);
  const Rejected = REJECTIONS[rule?.className ?? REJECTION_DEFAULT.className] ?? ApprovalRejected;
  return new Rejected(action.id, approvalReason || action.error || "", action);
}

/** A rejection as a framework's adapter tells its model: who refused, and why. */
export function rejectionWords(tool: string, rejected: ApprovalRejected): string {
  if (rejected instanceof ApprovalDeadlinePassed) {
    return `Saga Admin: nobody approved ${tool} before its approval deadline, so it was rejected (reason ${rejected.reason || "timed_out"}); it did not run.`;
  }
  return `Saga Admin: an approver rejected ${tool}${rejected.reason ? ": " + rejected.reason : ""}`;
}

/** Nobody decided within the approval deadline; the action stays `awaiting_approval`. */
export class ApprovalTimedOut extends SagaError {
  readonly actionId: string;
  readonly waitedS: number;
  readonly reason: string;
  constructor(actionId: string, waitedS: number) {
    const reason = `nobody decided within ${Math.round(waitedS)}s`;
    super(`Action ${actionId} was still awaiting approval after ${Math.round(waitedS)}s (${reason}).`, "approval_timeout");
    this.actionId = actionId;
    this.waitedS = waitedS;
    this.reason = reason;
  }
}
/** The Python client's name for it. */
export { ApprovalTimedOut as ApprovalTimeout };

/**
 * An earlier attempt of the step started and never reported an outcome, or another call of the
 * same step started it and is still running: running it here could do it twice.
 */
export class StepInDoubt extends SagaError {
  readonly action: Action;
  constructor(action: Action) {
    super(
      action.status === "running"
        ? `Action ${action.id} (${action.tool}) is running, started by another call of the same step; ` +
            "it was not run again here. Read its outcome once that call reports it, or reconcile it if that call is lost."
        : `Action ${action.id} (${action.tool}) is ${action.status} from an earlier attempt; ` +
            "reconcile it (POST /actions/{id}/reconcile) before running it again.",
      "step_in_doubt",
    );
    this.action = action;
  }
}

/**
 * A step whose policy has `before` was refused before anything was recorded or called: its
 * before-image could not be taken (no reader registered for the read, a read that threw, or a
 * result with no value at the policy's path). `readTool` names the read and `reason` says why;
 * `do` was not called (no update without its before-image). Also thrown for a step recorded
 * earlier (it waited for approval, or was recorded ahead) whose read, made again just before it
 * starts, no longer gives the before-image recorded with it (`reason`: "changed while the step
 * waited for approval"): the action is left approved and not started, as `saga-mcp` leaves it.
 */
export class BeforeImageFailed extends SagaError {
  /** The step's tool. */
  readonly tool: string;
  /** The read (the policy's `before.tool`). */
  readonly readTool: string;
  readonly reason: string;
  constructor(tool: string, readTool: string, reason: string, options?: { cause?: unknown; message?: string }) {
    super(
      options?.message ??
        `${tool} was not called: its policy takes a before-image through ${readTool}, and that read failed (${reason}). No update without its before-image.`,
      "before_image_failed",
      options?.cause !== undefined ? { cause: options.cause } : undefined,
    );
    this.tool = tool;
    this.readTool = readTool;
    this.reason = reason;
  }
}

/** A `saga.tool` function was called outside `saga.run(...)`. */
export class NoActiveRun extends SagaError {
  constructor(message: string) {
    super(message, "no_active_run");
  }
}

type APIErrorClass = new (status: number, code: string, message: string, details?: Details, requestId?: string) => SagaAPIError;

const CLASSES: Record<string, APIErrorClass> = {
  RunCancelled,
  Paused,
  PolicyDenied,
  SagaAuthError,
  RunArchived,
  NotFound,
  Conflict,
  RateLimited,
  ServerError,
  InvalidRequest,
};

/**
 * Every class the spec's rules name, from `classes`; throws naming the first that is missing. Run
 * when this module loads: a class misspelt in `clients/spec/errors.json` fails every import of the
 * client at once, rather than turning its answers into the default class unnoticed.
 */
export function checkClassRules(
  rules: readonly ClassRule[],
  defaultClass: string,
  classes: Record<string, APIErrorClass>,
): void {
  for (const name of [...rules.map((rule) => rule.className), defaultClass]) {
    if (!Object.hasOwn(classes, name)) {
      throw new Error(
        `clients/spec/errors.json names the error class ${JSON.stringify(name)}, which the TypeScript client does not have ` +
          `(it has ${Object.keys(classes).join(", ")}).`,
      );
    }
  }
}

checkClassRules(CLASS_RULES, DEFAULT_CLASS, CLASSES);

/** The first of the spec's rules that matches the answer. */
export function classFor(status: number, code: string, details: Details): APIErrorClass {
  for (const rule of CLASS_RULES) {
    if (rule.code !== undefined && code !== rule.code) continue;
    if (rule.status !== undefined && !rule.status.includes(status)) continue;
    if (rule.minStatus !== undefined && status < rule.minStatus) continue;
    if (rule.current !== undefined && details["current"] !== rule.current) continue;
    return CLASSES[rule.className]!; // checked when the module loaded
  }
  return CLASSES[DEFAULT_CLASS]!;
}

/**
 * The typed error for an error answer: the API's `{"error": {code, message, details}}`, or (from a
 * proxy in front, say) `http_error` with the start of the body.
 */
export function errorFromAnswer(status: number, reason: string, body: string, requestId = ""): SagaAPIError {
  let code = "http_error";
  let message = body.slice(0, 500) || reason;
  let details: Details = {};
  try {
    const parsed: unknown = JSON.parse(body);
    const error = (parsed as { error?: unknown } | null)?.error as
      | { code?: unknown; message?: unknown; details?: unknown }
      | undefined;
    if (error && typeof error === "object" && "code" in error && "message" in error) {
      code = String(error.code);
      message = String(error.message);
      const raw = error.details ?? {};
      details = typeof raw === "object" && raw !== null && !Array.isArray(raw) ? (raw as Details) : { details: raw };
    }
  } catch {
    // not JSON: the status and the start of the body
  }
  const cls = classFor(status, code, details);
  return new cls(status, code, message, details, requestId);
}

/** Whether an error means an operator cancelled the run. */
export function isCancelled(error: unknown): error is RunCancelled {
  return error instanceof RunCancelled;
}
