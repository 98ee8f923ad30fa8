/**
 * The client: `new Saga({url, key})`, a run as a scope (`saga.run({...}, async (run) => …)`), the
 * tool wrapper, and one method per endpoint of the agent API.
 */
import { AsyncLocalStorage } from "node:async_hooks";

import { Api } from "./api.js";
import { BeforeImages, type Reader, registerToolReader } from "./before.js";
import { NoActiveRun } from "./errors.js";
import { Http, type Settings } from "./http.js";
import { PolicyCache } from "./policies.js";
import { Run, type StepArgs, type StepContext } from "./run.js";
import type { Action, ActionVerify, Checkpoint, Command, Compensation, Policies, Run as RunData, RunDetail, Target, Trail } from "./types.js";

export interface SagaOptions {
  /** The server's URL (`https://saga.example.com`, with or without `/api/v1`). */
  url: string;
  /** An agent key (`manage.py create_agent_key --tenant SLUG --name NAME`). */
  key: string;
  retries?: number;
  backoffS?: number;
  maxBackoffS?: number;
  timeoutS?: number;
  pollIntervalS?: number;
  maxPollIntervalS?: number;
  approvalTimeoutS?: number;
  /** Seconds between a run scope's background heartbeats (default 30; 0: none). */
  heartbeatIntervalS?: number;
  /** Another `fetch` (a proxy agent, a test server). */
  fetch?: typeof fetch;
  /**
   * Seconds the client uses its copy of the tenant's policies before it asks the server again
   * (default 5): it fetches them when a step first needs them (to know which steps' policies read
   * before-images) and then revalidates at most this often with `If-None-Match` (304: unchanged).
   */
  policyRefreshS?: number;
}

export interface RunOptions {
  agent: string;
  request: string;
  externalId?: string;
  userId?: string;
  goal?: string;
  traceUrl?: string;
  resumeUrl?: string;
  metadata?: Record<string, unknown>;
  /** Aborts the run's requests, waits and steps (`run.signal`); the scope then fails the run. */
  signal?: AbortSignal;
}

export interface ToolOptions<A> {
  target?: Target | ((args: A) => Target | null) | null;
  compensate?: Compensation | ((args: A) => Compensation | null) | null;
  intent?: Record<string, unknown>;
  approvalTimeoutS?: number;
}

/** A function each call of which is a step of the run active in its async context. */
export type SagaTool<A extends StepArgs, R> = ((args: A) => Promise<R>) & { readonly toolName: string };

// One store per process, not per copy of this module: the ESM build (`import`) and the CommonJS
// one (`require`) can both be loaded in one process (an app that requires the client, a library
// that imports it), and a tool of either must see a run scope of the other.
const ACTIVE_RUN = Symbol.for("@saga-admin/client.active-run");
const active = ((globalThis as { [ACTIVE_RUN]?: AsyncLocalStorage<Run> })[ACTIVE_RUN] ??= new AsyncLocalStorage<Run>());

/** The run of the innermost `saga.run(...)` scope this code runs in, if any. */
export function currentRun(): Run | undefined {
  return active.getStore();
}

export class Saga {
  readonly api: Api;
  /** The API root this client talks to. */
  readonly apiUrl: string;
  private readonly heartbeatIntervalS: number;
  /** The before- and after-images the client takes by policy, and the readers it calls for them. */
  readonly images: BeforeImages;

  constructor(options: SagaOptions) {
    const settings: Settings = {
      retries: options.retries ?? 4,
      backoffS: options.backoffS ?? 0.2,
      maxBackoffS: options.maxBackoffS ?? 5,
      timeoutS: options.timeoutS ?? 10,
      pollIntervalS: options.pollIntervalS ?? 2,
      maxPollIntervalS: options.maxPollIntervalS ?? 30,
      approvalTimeoutS: options.approvalTimeoutS ?? 3600,
    };
    const http = new Http(options.url, options.key, settings, options.fetch);
    this.api = new Api(http);
    this.apiUrl = http.root;
    this.heartbeatIntervalS = options.heartbeatIntervalS ?? 30;
    this.images = new BeforeImages(new PolicyCache(this.api, options.policyRefreshS ?? 5));
  }

  /**
   * Register `fn` as the reader of the read tool `tool` (`crm.get_contact`): a step whose policy has
   * `before` naming it gets its before-image from `fn(filledArgs, context)` before it is recorded,
   * and its after-image from it once `do` succeeded (API.md, "Before-images and verified undo").
   * `fn` returns the read's result: a JSON value, an MCP tool result or a JSON object's text. A
   * `saga.tool` (or an adapter's tool) of that name serves without this; `reader` wins over them.
   * Returns this client.
   */
  reader(tool: string, fn: Reader): this {
    if (typeof tool !== "string" || !tool) throw new TypeError("saga.reader(tool, fn): tool must be the read tool's name.");
    if (typeof fn !== "function") throw new TypeError(`saga.reader(${tool}, fn): fn must be a function.`);
    this.images.readers.set(tool, fn);
    return this;
  }

  // High level --------------------------------------------------------------------------------

  /**
   * Without `body`: create the run and return it. With `body`: a scope — the run is created, `body`
   * runs with it (heartbeats in the background), a clean return completes it and a throw fails it
   * (into the recovery queue, naming the failing step) and rethrows. A run whose step waits for
   * approval (`ApprovalPending`) is left running; one an operator cancelled (`RunCancelled`) is
   * left as it is.
   */
  run(options: RunOptions): Promise<Run>;
  run<T>(options: RunOptions, body: (run: Run) => Promise<T> | T): Promise<T>;
  async run<T>(options: RunOptions, body?: (run: Run) => Promise<T> | T): Promise<Run | T> {
    const fields: Record<string, unknown> = { agent: options.agent, request: options.request };
    const names: Record<string, keyof RunOptions> = {
      external_id: "externalId",
      user_id: "userId",
      goal: "goal",
      trace_url: "traceUrl",
      resume_url: "resumeUrl",
      metadata: "metadata",
    };
    for (const [field, option] of Object.entries(names)) if (options[option] !== undefined) fields[field] = options[option];
    const run = new Run(this.api, fields, "", options.signal, this.images);
    if (!body) return run.open();
    return this.scope(run, body);
  }

  /**
   * Continue an existing run (after a resume command, or once an approval is decided): steps
   * already done replay their recorded results instead of running again.
   */
  attach(runId: string, options?: { signal?: AbortSignal }): Promise<Run>;
  attach<T>(runId: string, body: (run: Run) => Promise<T> | T, options?: { signal?: AbortSignal }): Promise<T>;
  async attach<T>(
    runId: string,
    bodyOrOptions?: ((run: Run) => Promise<T> | T) | { signal?: AbortSignal },
    options?: { signal?: AbortSignal },
  ): Promise<Run | T> {
    const body = typeof bodyOrOptions === "function" ? bodyOrOptions : undefined;
    const signal = (typeof bodyOrOptions === "object" ? bodyOrOptions : options)?.signal;
    const run = new Run(this.api, {}, runId, signal, this.images);
    if (!body) return run.open();
    return this.scope(run, body);
  }

  private async scope<T>(run: Run, body: (run: Run) => Promise<T> | T): Promise<T> {
    await run.open();
    const stopHeartbeats = this.heartbeats(run);
    let value: T;
    try {
      value = await active.run(run, () => body(run));
    } catch (error) {
      stopHeartbeats();
      await run.exit(error, true);
      throw error;
    }
    stopHeartbeats();
    await run.exit(undefined, false);
    return value;
  }

  /** Heartbeats every `heartbeatIntervalS` while the scope runs; a `cancel` command aborts `run.signal`. */
  private heartbeats(run: Run): () => void {
    if (this.heartbeatIntervalS <= 0) return () => undefined;
    let stopped = false;
    const beat = async (): Promise<void> => {
      try {
        await run.heartbeat();
      } catch {
        // A missed heartbeat is retried at the next tick; the step's own requests report errors.
      }
      if (!stopped) timer = setTimeout(() => void beat(), this.heartbeatIntervalS * 1000).unref();
    };
    let timer = setTimeout(() => void beat(), this.heartbeatIntervalS * 1000).unref();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }

  /**
   * Make each call of `fn` a step of the run active in the caller's async context (the innermost
   * `saga.run(...)` scope), with its one argument object as the step's `args`. `target` and
   * `compensate` may be functions of those args. Called outside a run it throws `NoActiveRun`.
   * The argument may be of any object type, an `interface` too (not an array or a primitive).
   */
  tool<A extends StepArgs, R>(
    name: string,
    fn: (args: A, context: StepContext) => R | Promise<R>,
    options: ToolOptions<A> = {},
  ): SagaTool<A, R> {
    const wrapped = async (args: A): Promise<R> => {
      const run = active.getStore();
      if (!run) {
        throw new NoActiveRun(
          `${name} was called outside a run: a saga.tool function records each call as a step of the run ` +
            "active in its async context; call it inside `saga.run({...}, async (run) => ...)`.",
        );
      }
      const target = typeof options.target === "function" ? options.target(args) : options.target;
      const compensate = typeof options.compensate === "function" ? options.compensate(args) : options.compensate;
      return run.step<A, R>({
        tool: name,
        args,
        target: target ?? null,
        compensate: compensate ?? null,
        do: (effective, context) => fn(effective, context),
        ...(options.intent ? { intent: options.intent } : {}),
        ...(options.approvalTimeoutS !== undefined ? { approvalTimeoutS: options.approvalTimeoutS } : {}),
      });
    };
    // The same function serves as the reader of `name` when a policy's `before` names it: called
    // directly, not as a step (a read is not recorded).
    registerToolReader(name, (args, context) =>
      fn(args as A, {
        signal: context.signal,
        get action(): never {
          throw new TypeError(`${name} was called as the ${context.phase}-image read of ${context.step}: a read has no action.`);
        },
      }),
    );
    return Object.assign(wrapped, { toolName: name });
  }

  // One method per endpoint --------------------------------------------------------------------

  /** Any endpoint: the decoded JSON, or a typed `SagaError` (retries as everywhere). */
  request<T = unknown>(
    method: string,
    path: string,
    options: { body?: unknown; query?: Record<string, string | number | undefined>; idempotencyKey?: string; signal?: AbortSignal } = {},
  ): Promise<T> {
    return this.api.http.call<T>(method, path, options);
  }

  createRun(fields: { agent: string; request: string } & Record<string, unknown>, idempotencyKey?: string): Promise<RunData> {
    return this.api.createRun(fields, idempotencyKey);
  }
  getRun(runId: string): Promise<RunDetail> {
    return this.api.getRun(runId);
  }
  /** Every action of the run, oldest first, following the cursor. */
  async *listActions(runId: string, pageSize = 500): AsyncGenerator<Action> {
    let cursor: string | undefined;
    do {
      const page = await this.api.actionsPage(runId, { limit: pageSize, cursor });
      yield* page.items;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }
  /** Every run matching the filters, newest first. */
  async *listRuns(filters: { status?: string; agent?: string; external_id?: string } = {}): AsyncGenerator<RunData> {
    let cursor: string | undefined;
    do {
      const page = await this.api.runsPage({ ...filters, cursor });
      yield* page.items;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }
  heartbeat(runId: string, note = ""): Promise<Command[]> {
    return this.api.heartbeat(runId, note);
  }
  /** `withdrawApprovals`: withdraw the approvals the run's steps still wait for (each is rejected);
   * without it such a run is refused (`Conflict`, code `pending_approvals`, naming them). */
  completeRun(runId: string, summary = "", options: { withdrawApprovals?: boolean } = {}): Promise<RunData> {
    return this.api.completeRun(runId, summary, undefined, options.withdrawApprovals ?? false);
  }
  failRun(
    runId: string,
    error: string,
    options: { failedActionId?: string; reason?: string; withdrawApprovals?: boolean } = {},
  ): Promise<RunData> {
    return this.api.failRun(
      runId,
      error,
      options.failedActionId ?? null,
      options.reason ?? "failed",
      undefined,
      options.withdrawApprovals ?? false,
    );
  }
  commands(runId: string): Promise<Command[]> {
    return this.api.commands(runId);
  }
  ackCommand(commandId: string): Promise<Command> {
    return this.api.ackCommand(commandId);
  }
  trail(runId: string): Promise<Trail> {
    return this.api.trail(runId);
  }
  policies(): Promise<Policies> {
    return this.api.policies();
  }
  getAction(actionId: string): Promise<Action> {
    return this.api.getAction(actionId);
  }
  verifyAction(actionId: string, body: { ok: boolean; expected?: unknown; actual?: unknown; reason?: string }): Promise<ActionVerify> {
    return this.api.verifyAction(actionId, body);
  }
  reconcileAction(actionId: string, body: { happened: boolean; reason: string; result?: unknown; afterSnapshot?: unknown }): Promise<Action> {
    return this.api.reconcileAction(actionId, body);
  }
  latestCheckpoint(runId: string): Promise<Checkpoint | null> {
    return this.api.latestCheckpoint(runId);
  }
}
