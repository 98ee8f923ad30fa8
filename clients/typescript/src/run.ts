/**
 * One run and its steps' state machine — record (and start, in one call), wait for approval,
 * start, call, record the outcome — as the Python client's `saga_client._run` does it.
 */
import type { Api } from "./api.js";
import { BeforeImages, type PlannedRead } from "./before.js";
import {
  ApprovalPending,
  ApprovalRejected,
  ApprovalTimedOut,
  BeforeImageFailed,
  Conflict,
  RunCancelled,
  SagaError,
  StepInDoubt,
  rejectionFor,
} from "./errors.js";
import { UnretriedFailures } from "./failures.js";
import { sleep, type Reply } from "./http.js";
import { imagesEqual } from "./images.js";
import { canonical, stepKey } from "./keys.js";
import type { Action, Checkpoint, Command, Compensation, Plan, Run as RunData, RunFail, Target, Trail } from "./types.js";

/** Action states in which the call already ran to completion: a replayed step returns its result. */
export const DONE_STATES: ReadonlySet<string> = new Set(["succeeded", "compensating", "compensated", "compensation_failed"]);

/** What `do` receives beside the effective args. */
export interface StepContext {
  /** The action as recorded (its id, attempt, approval). */
  action: Action;
  /** Aborted when the run's signal aborts (the caller's, or an operator's cancel seen by a heartbeat). */
  signal: AbortSignal;
}

/**
 * What a step's args may be: any object type — an `interface`, a type alias, a `Record` — since the
 * API takes a JSON object. Primitives, `null`, arrays and functions are refused (arrays and
 * functions are objects to TypeScript, but have a `length`).
 */
export type StepArgs = object & { readonly length?: never };

export interface StepOptions<A extends StepArgs = Record<string, unknown>, R = unknown> {
  tool: string;
  /** Gets the effective args (an approver may have edited them) and the step's context. */
  do: (args: A, context: StepContext) => R | Promise<R>;
  target?: Target | null;
  args?: A;
  compensate?: Compensation | null;
  /**
   * A snapshot before the call, or a function producing one. Without it, a step whose policy has
   * `before` gets its before-image from the registered reader of the policy's read tool.
   */
  before?: unknown;
  /**
   * A snapshot after the call, or a function of `do`'s result producing one. Without it, a step
   * whose policy has `before` gets its after-image from the same read, once `do` succeeded.
   */
  after?: unknown;
  intent?: Record<string, unknown>;
  idempotencyKey?: string;
  approvalTimeoutS?: number;
  /** false: a step that needs approval throws `ApprovalPending` instead of waiting. */
  wait?: boolean;
  /** An adapter's framework context of the call, handed to readers as `context.host`. */
  host?: unknown;
}

export interface RecordOptions {
  tool: string;
  target?: Target | null;
  /** Any object (an `interface` too): the API takes a JSON object. */
  args?: object;
  compensate?: Compensation | null;
  intent?: Record<string, unknown>;
  idempotencyKey?: string;
  /** A snapshot before the call (or a function producing one) instead of the policy's read. */
  before?: unknown;
  /** An adapter's framework context of the call, handed to readers as `context.host`. */
  host?: unknown;
}

/** One step of `run.plan([...])`: what `record` takes, a before snapshot, and `start`. */
export interface PlanStepOptions extends RecordOptions {
  /** Also start it when it needs no approval. */
  start?: boolean;
}

export interface CheckpointOptions {
  state?: Record<string, unknown>;
  summary?: string;
  recoveryMode?: "resume_or_compensate" | "resume_only" | "compensate_only";
  recoveryInstructions?: string;
  completedActionIds?: string[];
  pendingActionIds?: string[];
  requiresUserApproval?: boolean;
  traceLinks?: unknown[];
}

function isTimeout(error: unknown): boolean {
  return error instanceof Error && error.name === "TimeoutError";
}

/** What can be stored as a step's result: the value when it is JSON, else its text. */
export function jsonable(value: unknown): unknown {
  if (value === undefined) return null;
  try {
    const text = JSON.stringify(value);
    return text === undefined ? null : (JSON.parse(text) as unknown);
  } catch {
    return { repr: String(value).slice(0, 10000) };
  }
}

/** The rejection a rejected action throws (`ApprovalDeadlinePassed` for a timed-out one). */
export function rejection(action: Action): ApprovalRejected {
  return rejectionFor(action);
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

export class Run {
  /** The run's id (empty until it is opened). */
  id: string;
  /** The run as the server last answered. */
  data: RunData | undefined;
  /** This run's steps as they settled, in order. */
  actions: Action[] = [];
  /** Steps that threw `ApprovalPending` and are not decided since (action id → action). */
  readonly pendingApprovals = new Map<string, Action>();
  /** Aborted when the caller's signal aborts or an operator cancels the run. */
  readonly signal: AbortSignal;
  /** The steps whose call failed and that were not retried successfully (same tool and args) since. */
  readonly unretried = new UnretriedFailures();
  /**
   * Whether those fail the run at a clean end (`exit`), as `saga-mcp` fails such a session. The
   * adapters set it: their frameworks hand a tool's error to the model and carry on, so the scope
   * ends cleanly after a failed step. Code that catches a step's error itself has decided about it.
   */
  failUnretriedSteps = false;

  private readonly controller = new AbortController();
  /** Idempotency keys this run recorded with a before-image taken by policy: not read again. */
  private readonly imaged = new Set<string>();
  /** Idempotency keys this run recorded with a before snapshot the agent gave: not read again. */
  private readonly givenBefore = new Set<string>();
  private finished = false;
  private failedActionId: string | null = null;
  private failureReason = "failed";

  constructor(
    private readonly api: Api,
    private readonly create: Record<string, unknown>,
    runId = "",
    signal?: AbortSignal,
    /** Takes the images of steps whose policy has `before` (none: the agent supplies them). */
    private readonly images?: BeforeImages,
  ) {
    this.id = runId;
    this.signal = signal ? AbortSignal.any([signal, this.controller.signal]) : this.controller.signal;
  }

  // Lifecycle ---------------------------------------------------------------------------------

  /** Create the run (or load an attached one). */
  async open(): Promise<this> {
    if (this.id) {
      this.data ??= await this.api.getRun(this.id, this.signal);
    } else {
      this.data = await this.api.createRun(this.create, undefined, this.signal);
      this.id = this.data.id;
    }
    return this;
  }

  /**
   * The end of a run scope: complete it on a clean end, leave it running while a step waits for
   * approval, leave it alone when an operator cancelled it, fail it otherwise (into the recovery
   * queue, naming the failing step). The caller's error goes on up unchanged.
   */
  async exit(error: unknown, hadError: boolean): Promise<void> {
    if (this.finished) return;
    if (error instanceof ApprovalPending || (!hadError && this.pendingApprovals.size > 0)) return;
    if (hadError && (error instanceof RunCancelled || this.cancelledBy(error))) {
      this.finished = true;
      return;
    }
    if (!hadError && this.failUnretriedSteps) {
      const verdict = this.unretried.verdict("The run ended");
      if (verdict) {
        console.warn(`saga: run ${this.id} failed: ${verdict.report}`);
        try {
          await this.fail(verdict.report, { failedActionId: verdict.actionId, withdrawApprovals: true });
        } catch (refused) {
          if (!(refused instanceof RunCancelled)) throw refused;
        }
        return;
      }
    }
    if (!hadError) {
      try {
        await this.complete();
      } catch (refused) {
        // A step recorded (or planned) but not taken still waits for a person: parked, as above;
        // `complete(summary, { withdrawApprovals: true })` (or `fail`) ends the run without it.
        if (!(refused instanceof Conflict && refused.code === "pending_approvals")) throw refused;
      }
      return;
    }
    try {
      // The scope threw: the steps still waiting for approval will not be taken (a wait that timed
      // out threw here too), so their approvals are withdrawn with the failure, not left in an
      // approver's inbox for a run that is over.
      await this.fail(describe(error), {
        failedActionId: this.failedActionId,
        reason: this.failureReason,
        withdrawApprovals: true,
      });
    } catch (reportError) {
      if (reportError instanceof RunCancelled) return; // cancelled meanwhile: nothing to report
      // The original error matters more than a failed report; the sweeper still finds a silent run.
      console.error(`saga: could not report the failure of run ${this.id}:`, reportError);
    }
  }

  private cancelledBy(error: unknown): boolean {
    return this.controller.signal.aborted && this.controller.signal.reason === error;
  }

  /** Complete the run. A run with a step still waiting for approval is refused (`Conflict`, code
   * `pending_approvals`) unless `withdrawApprovals`: then those approvals are withdrawn and the
   * steps rejected. (A scope's clean end leaves such a run running instead, parked for it.) */
  async complete(summary = "", options: { withdrawApprovals?: boolean } = {}): Promise<RunData> {
    this.data = await this.api.completeRun(this.id, summary, undefined, options.withdrawApprovals ?? false);
    this.finished = true;
    return this.data;
  }

  /** Fail the run (into the recovery queue). `withdrawApprovals`: as `complete`; a scope that
   * throws always withdraws them. */
  async fail(
    error: string,
    options: { failedActionId?: string | null; reason?: string; withdrawApprovals?: boolean } = {},
  ): Promise<RunFail> {
    this.finished = true;
    const failed = await this.api.failRun(
      this.id,
      error,
      options.failedActionId ?? null,
      options.reason ?? "failed",
      undefined,
      options.withdrawApprovals ?? false,
    );
    this.data = failed;
    return failed;
  }

  /** An operator's cancel, seen by a heartbeat: abort the run's signal with `RunCancelled`. */
  cancelled(command: Command): void {
    if (this.controller.signal.aborted) return;
    this.controller.abort(
      new RunCancelled(409, "run_cancelled", `Run ${this.id} was cancelled by an operator.`, {
        run_id: this.id,
        current: "cancelled",
        command_id: command.id,
      }),
    );
  }

  // Steps -------------------------------------------------------------------------------------

  /** Deterministic: the same call in the same run always gets the same key. */
  stepKey(tool: string, target: Target | null | undefined, args: unknown): string {
    return stepKey(this.id, tool, target, args);
  }

  private actionRequest(options: RecordOptions): [string, Record<string, unknown>] {
    const args = options.args ?? {};
    const key = options.idempotencyKey ?? this.stepKey(options.tool, options.target, args);
    const body: Record<string, unknown> = { args };
    if (options.target) {
      body["target_type"] = String(options.target[0]);
      body["target_id"] = String(options.target[1]);
    }
    if (options.compensate) body["compensation"] = { tool: options.compensate[0], args: { ...options.compensate[1] } };
    if (options.intent) body["intent"] = { ...options.intent };
    return [key, body];
  }

  private requireOpen(): void {
    if (!this.id) throw new SagaError("The run is not open yet: run it in saga.run(...) (or open it) first.", "run_not_open");
  }

  /**
   * Record a step without starting it (the key and body `step` would send), e.g. so it is approved
   * before it runs; the action as it is now. `step` with the same tool, target and args runs it later.
   */
  async record(options: RecordOptions): Promise<Action> {
    this.requireOpen();
    const [key, body] = this.actionRequest(options);
    await this.beforeImage(key, body, options);
    return (await this.api.recordAction(this.id, options.tool, key, body, this.signal)).data;
  }

  /**
   * Put the step's before snapshot in the record's body: the one it was given (a value, or a
   * function called now), else the before-image its policy's read gives (once per step and
   * process; a failed read refuses the step: `BeforeImageFailed`, nothing recorded). The
   * planned read, for the after-image.
   */
  private async beforeImage(
    key: string,
    body: Record<string, unknown>,
    options: { tool: string; args?: object; target?: Target | null; before?: unknown; after?: unknown; host?: unknown },
  ): Promise<PlannedRead | undefined> {
    if (options.before !== undefined) {
      const snapshot = typeof options.before === "function" ? await (options.before as () => unknown)() : options.before;
      if (snapshot !== undefined && snapshot !== null) body["before_snapshot"] = snapshot;
      this.givenBefore.add(key);
      if (options.after !== undefined || !this.images) return undefined;
      try {
        return await this.images.planned(options.tool, options.args ?? {}, options.target, this.signal);
      } catch (error) {
        if (error instanceof BeforeImageFailed) return undefined; // the given snapshot stands
        throw error;
      }
    }
    if (!this.images || (this.imaged.has(key) && options.after !== undefined)) return undefined;
    const read = await this.images.planned(options.tool, options.args ?? {}, options.target, this.signal);
    if (!read || this.imaged.has(key)) return read;
    try {
      body["before_snapshot"] = await this.images.take(read, "before", this.signal, options.host);
    } catch (error) {
      if (error instanceof BeforeImageFailed) {
        // Nothing was recorded or run; the run's end rule still counts the call as failed.
        this.unretried.failedCall(options.tool, options.args ?? {}, "", error.message);
      }
      throw error;
    }
    this.imaged.add(key);
    return read;
  }

  /**
   * Record the steps the agent means to take in one request before any runs, all or nothing: a
   * pause, a denying rule or limit or a refused compensation of any step throws its error (with the
   * step's `details.plan_index`) and records none. Each step gets the key `step` would give it, so
   * `step` with the same tool, target and args later runs the planned action (once approved). Every
   * approval the plan needs is requested at once. Returns the recorded actions in order and the
   * plan's `warnings` (`pivot_order`: an irreversible step before one that can be undone, naming
   * both). Sent again, the same plan comes back as its actions are now.
   */
  async plan(steps: readonly PlanStepOptions[]): Promise<Plan> {
    this.requireOpen();
    const actions: Record<string, unknown>[] = [];
    for (const step of steps) {
      const [key, body] = this.actionRequest(step);
      // Without a given snapshot, the policy's read takes the before-image (when the plan is sent).
      await this.beforeImage(key, body, { ...step, after: null });
      if (step.start) body["start"] = true;
      actions.push({ tool: step.tool, idempotency_key: key, ...body });
    }
    return (await this.api.recordPlan(this.id, actions, this.signal)).data;
  }

  /**
   * Record the action (and start it when it needs no approval, in the same call), wait for
   * approval when policy demands it, call `do` and record the outcome. Returns what `do` returned —
   * or, when this step already succeeded earlier, its recorded result (`do` is not called again).
   * `do` runs only when this very call moved the action to `running`: a step another call started
   * throws `StepInDoubt` while that call runs. `do` throwing records the action failed (unknown
   * after a timeout) and rethrows the same error.
   */
  async step<A extends StepArgs, R>(options: StepOptions<A, R>): Promise<R> {
    this.requireOpen();
    const callArgs = (options.args ?? {}) as A;
    const [key, body] = this.actionRequest({ ...options, args: callArgs as Record<string, unknown> });
    body["start"] = true;
    const read = await this.beforeImage(key, body, { ...options, args: callArgs });

    const reply = await this.api.recordAction(this.id, options.tool, key, body, this.signal);
    const action = reply.data;
    if (DONE_STATES.has(action.status)) {
      this.settled(action);
      this.unretried.succeededCall(options.tool, callArgs);
      return action.result as R;
    }
    // Started by this very call only when the answer is not a replay: a replayed `running` may be
    // another caller's start, and running `do` on it could make one recorded call two real ones.
    const startedHere = startedByThisRequest(reply);
    let value: R;
    try {
      value = await this.execute(action, startedHere, options, callArgs, read);
    } catch (error) {
      if (error instanceof ApprovalPending) {
        this.pendingApprovals.set(error.actionId, error.action);
      } else {
        this.pendingApprovals.delete(action.id);
        this.failedActionId = action.id;
      }
      throw error;
    }
    // An earlier failed step retried successfully is no longer the run's culprit.
    this.failedActionId = null;
    this.failureReason = "failed";
    this.unretried.succeededCall(options.tool, callArgs);
    return value;
  }

  private async execute<A extends StepArgs, R>(
    recorded: Action,
    startedHere: boolean,
    options: StepOptions<A, R>,
    callArgs: A,
    recordRead: PlannedRead | undefined,
  ): Promise<R> {
    const wait = options.wait ?? true;
    let read = recordRead;
    let action = recorded;
    if (!startedHere) action = await this.decided(action, options.approvalTimeoutS, wait);
    const effective = action.args as A;
    if (options.do.length === 0 && canonical(effective) !== canonical(callArgs)) {
      throw new SagaError(`The approver edited the args of ${action.tool}; \`do\` must take them as its first parameter.`, "args_edited");
    }
    if (!startedHere) {
      // Its before-image was read when it was recorded; read it again before starting it.
      if (read && options.before === undefined && !this.givenBefore.has(action.idempotency_key)) {
        read = await this.stillBefore(action, options, read);
      }
      const started = await this.startAction(action, options.approvalTimeoutS, wait);
      action = started.data;
      if (!startedByThisRequest(started)) {
        // Another call of this step started it first: its outcome is that call's to report.
        if (DONE_STATES.has(action.status)) {
          this.settled(action);
          return action.result as R;
        }
        throw new StepInDoubt(action);
      }
    }
    this.pendingApprovals.delete(action.id);
    const value = await this.call(action, options, effective, callArgs);
    let afterSnapshot: unknown = options.after;
    if (options.after === undefined && read && this.images) {
      // The policy's read again: the after-image. The call happened, so a failed read is said,
      // not thrown: the success is recorded without it (the undo then has no drift check).
      try {
        afterSnapshot = await this.images.take(read, "after", this.signal, options.host);
      } catch (error) {
        if (!(error instanceof BeforeImageFailed)) throw error;
        console.warn(`saga: ${action.tool} (${action.id}) succeeded, but its after-image was not taken: ${error.reason}.`);
        afterSnapshot = null;
      }
    }
    if (typeof options.after === "function") {
      try {
        afterSnapshot = await (options.after as (result: R) => unknown)(value);
      } catch (error) {
        // The call happened: record it (without a snapshot) before the error goes up.
        await this.succeeded(action, value, null);
        throw error;
      }
    }
    await this.succeeded(action, value, afterSnapshot);
    return value;
  }

  /**
   * Before a step recorded earlier is started (it waited for approval, or was recorded ahead):
   * its policy's read made again with the args as approved. A value someone changed while the
   * step waited would make its undo restore the wrong value, so a read that fails or gives another
   * value than the recorded before-image refuses the step (`BeforeImageFailed`, `do` not called)
   * and leaves the action approved and not started, as `saga-mcp` does. The read, for the after-image.
   */
  private async stillBefore(action: Action, options: { tool: string; target?: Target | null; host?: unknown }, read: PlannedRead): Promise<PlannedRead> {
    const recorded = action.before_snapshot;
    if (!this.images || recorded === undefined || recorded === null) return read;
    const args = (action.args ?? {}) as Record<string, unknown>;
    let now: unknown;
    try {
      read = (await this.images.planned(options.tool, args, options.target, this.signal)) ?? read;
      now = await this.images.take(read, "before", this.signal, options.host);
    } catch (error) {
      if (error instanceof BeforeImageFailed) this.unretried.failedCall(options.tool, args, "", error.message);
      throw error;
    }
    if (imagesEqual(now, recorded)) return read;
    const differences = JSON.stringify(now).slice(0, 300);
    const refused = new BeforeImageFailed(options.tool, read.before.tool, "changed while the step waited for approval", {
      message:
        `${options.tool} was not called: the value it changes (read through ${read.before.tool}) changed while the step waited for approval ` +
        `(recorded ${JSON.stringify(recorded).slice(0, 300)}, now ${differences}), so its undo would restore the wrong value. ` +
        `The action ${action.id} is left approved and not started.`,
    });
    this.unretried.failedCall(options.tool, args, "", refused.message);
    throw refused;
  }

  /** A step this call did not start: the action once approved, or why it cannot run here. */
  private async decided(action: Action, timeoutS: number | undefined, wait: boolean): Promise<Action> {
    if (action.status === "running" || action.status === "unknown") throw new StepInDoubt(action);
    if (action.status === "rejected") throw rejection(action);
    if (action.status === "awaiting_approval") {
      if (!wait) throw new ApprovalPending(action);
      return this.waitForApproval(action, timeoutS);
    }
    return action;
  }

  /**
   * Poll the action (backing off from `pollIntervalS` to `maxPollIntervalS`) until a person
   * decided: the action once approved; `ApprovalRejected` (rejected or expired) or
   * `ApprovalTimedOut` after the deadline. The run's signal ends the wait.
   */
  async waitForApproval(action: Action, timeoutS?: number): Promise<Action> {
    const settings = this.api.http.settings;
    const timeout = timeoutS ?? settings.approvalTimeoutS;
    const started = performance.now();
    let interval = settings.pollIntervalS;
    let current = action;
    while (current.status === "awaiting_approval") {
      const waited = (performance.now() - started) / 1000;
      if (waited >= timeout) throw new ApprovalTimedOut(current.id, waited);
      await sleep(Math.max(Math.min(interval, timeout - waited), 0), this.signal);
      interval = Math.min(interval * 1.5, Math.max(settings.maxPollIntervalS, settings.pollIntervalS));
      current = await this.api.getAction(current.id, this.signal);
    }
    if (current.status === "rejected") throw rejection(current);
    return current;
  }

  private async startAction(action: Action, timeoutS: number | undefined, wait: boolean): Promise<Reply<Action>> {
    try {
      return await this.api.start(action, this.signal);
    } catch (error) {
      if (!(error instanceof Conflict)) throw error;
      if (error.code === "approval_rejected") throw rejection(await this.api.getAction(action.id, this.signal));
      if (error.code !== "approval_pending") throw error;
      // Recorded before its approval was opened (a race with a policy change): wait, retry once.
      const current = await this.api.getAction(action.id, this.signal);
      if (!wait) throw new ApprovalPending(current);
      return this.api.start(await this.waitForApproval(current, timeoutS), this.signal);
    }
  }

  /** Call `do`; when it throws, record the action failed and rethrow the same error. */
  private async call<A extends StepArgs, R>(action: Action, options: StepOptions<A, R>, args: A, callArgs: A): Promise<R> {
    try {
      return await options.do(args, { action, signal: this.signal });
    } catch (error) {
      // Cancelled by an operator: the server already settled the action (unknown); nothing to report.
      if (error instanceof RunCancelled) throw error;
      this.unretried.failedCall(options.tool, callArgs, action.id, `${options.tool}: ${describe(error)}`);
      const unknown = isTimeout(error);
      if (unknown) this.failureReason = "outcome_unknown";
      try {
        const retryable = (error as { retryable?: unknown } | null)?.retryable;
        await this.api.failAction(action, {
          error: describe(error),
          retryable: typeof retryable === "boolean" ? retryable : unknown,
          layer: "tool",
          outcomeUnknown: unknown,
        });
      } catch (reportError) {
        if (!(reportError instanceof SagaError)) throw reportError;
        // The tool's own error is what the caller must see; the run's failure report names this action.
        if (!(reportError instanceof RunCancelled)) console.error(`saga: could not record the failure of ${action.id}:`, reportError);
      }
      throw error;
    }
  }

  private async succeeded(action: Action, value: unknown, afterSnapshot: unknown): Promise<void> {
    const done = await this.api.succeedAction(action, jsonable(value), afterSnapshot);
    this.settled(done);
  }

  private settled(action: Action): void {
    this.pendingApprovals.delete(action.id);
    this.actions = [...this.actions.filter((a) => a.id !== action.id), action];
  }

  // Checkpoints, heartbeats, commands ---------------------------------------------------------

  /** Write a safe pause point. By default the completed actions are this run's steps so far. */
  checkpoint(name: string, options: CheckpointOptions = {}): Promise<Checkpoint> {
    this.requireOpen();
    return this.api.writeCheckpoint(
      this.id,
      {
        name,
        state: options.state ?? {},
        summary: options.summary ?? "",
        recovery_mode: options.recoveryMode ?? "resume_or_compensate",
        recovery_instructions: options.recoveryInstructions ?? "",
        completed_action_ids: options.completedActionIds ?? this.actions.filter((a) => a.status === "succeeded").map((a) => a.id),
        pending_action_ids: options.pendingActionIds ?? [],
        requires_user_approval: options.requiresUserApproval ?? false,
        trace_links: options.traceLinks ?? [],
      },
      undefined,
      this.signal,
    );
  }

  /** Tell Saga Admin the agent is alive; the pending `resume`/`cancel` commands. */
  async heartbeat(note = ""): Promise<Command[]> {
    const commands = await this.api.heartbeat(this.id, note);
    for (const command of commands) if (command.kind === "cancel") this.cancelled(command);
    return commands;
  }

  commands(): Promise<Command[]> {
    return this.api.commands(this.id);
  }

  ack(commandId: string): Promise<Command> {
    return this.api.ackCommand(commandId);
  }

  trail(): Promise<Trail> {
    return this.api.trail(this.id);
  }
}

function startedByThisRequest(reply: Reply<Action>): boolean {
  return !reply.replayed && reply.data?.status === "running";
}
