/** One function per endpoint of the agent API, over `Http` (which holds the retries). */
import { NotFound } from "./errors.js";
import { Http, type Reply } from "./http.js";
import { ackKey, completeKey, failKey, startKey, succeedKey, type KeyedAction } from "./keys.js";
import type {
  Action,
  ActionPage,
  ActionVerify,
  Checkpoint,
  Command,
  Plan,
  Policies,
  Run,
  RunDetail,
  RunFail,
  RunPage,
  Trail,
} from "./types.js";

/** What the API keeps of a free-text error. */
const MAX_ERROR = 20000;
type Signal = AbortSignal | undefined;
type Body = Record<string, unknown>;

const randomKey = (prefix: string): string => `${prefix}-${crypto.randomUUID()}`;

export class Api {
  /** The tools the server said no policy names (`default_policy`), each said once. */
  readonly defaultedTools = new Set<string>();

  constructor(readonly http: Http) {}

  /** Say, once per tool for this client, a recorded action's `default_policy` warning: no policy
   * names the tool (a mistyped name, most often), so the default applied and the step may wait
   * for an approval nobody expected. */
  noteWarnings(actions: readonly Action[]): void {
    for (const action of actions) {
      for (const warning of action.warnings ?? []) {
        if (warning["code"] !== "default_policy" || this.defaultedTools.has(action.tool)) continue;
        this.defaultedTools.add(action.tool);
        console.warn(`saga: ${String(warning["message"] ?? `no policy names ${action.tool}`)}`);
      }
    }
  }

  createRun(fields: Body, idempotencyKey?: string, signal?: Signal): Promise<Run> {
    return this.http.call("POST", "/runs", { body: fields, idempotencyKey: idempotencyKey ?? randomKey("run"), signal });
  }
  getRun(runId: string, signal?: Signal): Promise<RunDetail> {
    return this.http.call("GET", `/runs/${runId}`, { signal });
  }
  runsPage(query: Record<string, string | number | undefined>, signal?: Signal): Promise<RunPage> {
    return this.http.call("GET", "/runs", { query, signal });
  }
  actionsPage(runId: string, query: Record<string, string | number | undefined>, signal?: Signal): Promise<ActionPage> {
    return this.http.call("GET", `/runs/${runId}/actions`, { query, signal });
  }
  async heartbeat(runId: string, note = "", signal?: Signal): Promise<Command[]> {
    // A heartbeat only says "alive" (and reads commands): repeating it is harmless.
    const data = await this.http.call<{ commands: Command[] }>("POST", `/runs/${runId}/heartbeat`, {
      body: { note },
      retrySafe: true,
      signal,
    });
    return data.commands;
  }
  /** `withdrawApprovals`: withdraw the approvals the run's steps still wait for (each is
   * rejected); without it such a run is refused (409 `pending_approvals`, naming them). */
  completeRun(runId: string, summary = "", signal?: Signal, withdrawApprovals = false): Promise<Run> {
    const body: Body = { summary };
    if (withdrawApprovals) body["withdraw_approvals"] = true;
    return this.http.call("POST", `/runs/${runId}/complete`, { body, idempotencyKey: completeKey(runId), signal });
  }
  failRun(
    runId: string,
    error: string,
    failedActionId: string | null,
    reason = "failed",
    signal?: Signal,
    withdrawApprovals = false,
  ): Promise<RunFail> {
    const body: Body = { error: error.slice(0, MAX_ERROR) || "failed", reason };
    if (failedActionId) body["failed_action_id"] = failedActionId;
    if (withdrawApprovals) body["withdraw_approvals"] = true;
    return this.http.call("POST", `/runs/${runId}/fail`, { body, idempotencyKey: randomKey(`fail-${runId}`), signal });
  }
  async commands(runId: string, signal?: Signal): Promise<Command[]> {
    return (await this.http.call<{ commands: Command[] }>("GET", `/runs/${runId}/commands`, { signal })).commands;
  }
  ackCommand(commandId: string, signal?: Signal): Promise<Command> {
    return this.http.call("POST", `/commands/${commandId}/ack`, { idempotencyKey: ackKey(commandId), signal });
  }
  trail(runId: string, signal?: Signal): Promise<Trail> {
    return this.http.call("GET", `/runs/${runId}/trail`, { signal });
  }
  policies(signal?: Signal): Promise<Policies> {
    return this.http.call("GET", "/policies", { signal });
  }
  /** The policies unless they are still those of `etag` (then 304, no data); the answer's ETag. */
  async policiesIfChanged(etag: string, signal?: Signal): Promise<{ status: number; data: Policies | null; etag: string }> {
    const reply = await this.http.request<Policies | null>("GET", "/policies", { signal, ...(etag ? { headers: { "If-None-Match": etag } } : {}) });
    return { status: reply.status, data: reply.status === 304 ? null : reply.data, etag: reply.headers?.get("ETag") ?? "" };
  }

  async recordAction(runId: string, tool: string, idempotencyKey: string, fields: Body, signal?: Signal): Promise<Reply<Action>> {
    const reply = await this.http.request<Action>("POST", `/runs/${runId}/actions`, {
      body: { tool, idempotency_key: idempotencyKey, ...fields },
      signal,
    });
    this.noteWarnings([reply.data]);
    return reply;
  }
  /** Several actions in one request, all or nothing; safe to send again (a plan whose keys were all recorded is a replay). */
  async recordPlan(runId: string, actions: Body[], signal?: Signal): Promise<Reply<Plan>> {
    const reply = await this.http.request<Plan>("POST", `/runs/${runId}/plan`, { body: { actions }, retrySafe: true, signal });
    this.noteWarnings(reply.data.actions);
    return reply;
  }
  getAction(actionId: string, signal?: Signal): Promise<Action> {
    return this.http.call("GET", `/actions/${actionId}`, { signal });
  }
  /** Start an action; one key per attempt, shared by every caller of the same action. */
  start(action: KeyedAction & { id: string }, signal?: Signal): Promise<Reply<Action>> {
    return this.http.request("POST", `/actions/${action.id}/start`, { idempotencyKey: startKey(action), signal });
  }
  succeedAction(action: KeyedAction & { id: string }, result: unknown, afterSnapshot: unknown, signal?: Signal): Promise<Action> {
    return this.http.call("POST", `/actions/${action.id}/succeed`, {
      body: { result: result ?? null, after_snapshot: afterSnapshot ?? null },
      idempotencyKey: succeedKey(action),
      signal,
    });
  }
  failAction(
    action: KeyedAction & { id: string },
    fields: { error: string; retryable?: boolean; layer?: string; outcomeUnknown?: boolean },
    signal?: Signal,
  ): Promise<Action> {
    return this.http.call("POST", `/actions/${action.id}/fail`, {
      body: {
        error: fields.error.slice(0, MAX_ERROR) || "failed",
        retryable: fields.retryable ?? false,
        layer: fields.layer ?? "tool",
        outcome_unknown: fields.outcomeUnknown ?? false,
      },
      idempotencyKey: failKey(action),
      signal,
    });
  }
  verifyAction(actionId: string, body: { ok: boolean; expected?: unknown; actual?: unknown; reason?: string }, signal?: Signal): Promise<ActionVerify> {
    return this.http.call("POST", `/actions/${actionId}/verify`, {
      body: { ok: body.ok, expected: body.expected ?? null, actual: body.actual ?? null, reason: body.reason ?? "" },
      idempotencyKey: randomKey("verify"),
      signal,
    });
  }
  reconcileAction(
    actionId: string,
    body: { happened: boolean; reason: string; result?: unknown; afterSnapshot?: unknown },
    signal?: Signal,
  ): Promise<Action> {
    return this.http.call("POST", `/actions/${actionId}/reconcile`, {
      body: { happened: body.happened, reason: body.reason, result: body.result ?? null, after_snapshot: body.afterSnapshot ?? null },
      idempotencyKey: randomKey("reconcile"),
      signal,
    });
  }
  writeCheckpoint(runId: string, fields: Body, idempotencyKey?: string, signal?: Signal): Promise<Checkpoint> {
    return this.http.call("POST", `/runs/${runId}/checkpoints`, {
      body: fields,
      idempotencyKey: idempotencyKey ?? randomKey("checkpoint"),
      signal,
    });
  }
  async latestCheckpoint(runId: string, signal?: Signal): Promise<Checkpoint | null> {
    try {
      return await this.http.call<Checkpoint>("GET", `/runs/${runId}/checkpoints/latest`, { signal });
    } catch (error) {
      if (error instanceof NotFound) return null;
      throw error;
    }
  }
}
