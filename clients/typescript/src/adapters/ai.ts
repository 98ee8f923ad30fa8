/**
 * The Vercel AI SDK (`ai` 6) adapter: `sagaTool(name, tool, options)` wraps a `tool({...})` so each
 * execution is a step of the run active in the async context, and Saga's approval travels on the
 * SDK's own tool-approval flow. Only types are imported from `ai`: this module loads without it.
 *
 * 1. Before the SDK runs a call, the tool's `needsApproval` records it in Saga (not started) and
 *    answers true when Saga's policy gates it; the SDK then returns `tool-approval-request` parts
 *    instead of running it. A call Saga lets through without approval runs at once.
 * 2. `sagaApprovals(result.content, tools)` waits for Saga's approver and returns the tool message
 *    of `tool-approval-response`s to append before calling the model again: approved, or denied with
 *    the approver's reason (which the model reads).
 * 3. When the SDK then runs the call, the step asks Saga again: only a call Saga approved runs — once,
 *    with the approver's args if they edited them. A host that approves in the SDK alone gets a
 *    tool error and nothing runs.
 */
import type { Tool, ToolApprovalResponse, ToolExecutionOptions, ToolModelMessage } from "ai";

import { type ReadContext, registerToolReader } from "../before.js";
import { ApprovalPending, ApprovalRejected, ApprovalTimedOut, BeforeImageFailed, NoActiveRun, rejectionFor, rejectionWords } from "../errors.js";
import type { Run, StepArgs } from "../run.js";
import { currentRun } from "../saga.js";
import type { Action, Compensation, Target } from "../types.js";

type Args = Record<string, unknown>;

/** `target` and `compensate` are values or functions of the tool's input (`INPUT`, any object type). */
export interface SagaToolOptions<A extends StepArgs = Args> {
  target?: Target | ((args: A) => Target | null) | null;
  compensate?: Compensation | ((args: A) => Compensation | null) | null;
  intent?: Record<string, unknown>;
}

interface Registered {
  name: string;
  record(run: Run, args: StepArgs): Promise<Action>;
}

const registry = new WeakMap<object, Registered>();

function activeRun(name: string): Run {
  const run = currentRun();
  if (!run) throw new NoActiveRun(`${name} was called outside a run: call the model inside saga.run({...}, async (run) => ...).`);
  return run;
}

/** `tool` with each execution a step named `name` (`hr.create_user`) of the active run. */
export function sagaTool<INPUT extends StepArgs, OUTPUT>(
  name: string,
  tool: Tool<INPUT, OUTPUT>,
  options: SagaToolOptions<INPUT> = {},
): Tool<INPUT, OUTPUT> {
  const execute = tool.execute;
  if (!execute) throw new TypeError(`sagaTool(${name}): the tool has no execute function to record.`);
  // This tool serves as the reader of `name` when a policy's `before` names it (called directly,
  // not as a step): with the options of the call whose image it takes, under its own call id.
  registerToolReader(name, async (args, context) => execute(args as INPUT, readOptions(context)));
  const request = (args: INPUT, host?: unknown) => ({
    ...(host !== undefined ? { host } : {}),
    tool: name,
    args,
    target: (typeof options.target === "function" ? options.target(args) : options.target) ?? null,
    compensate: (typeof options.compensate === "function" ? options.compensate(args) : options.compensate) ?? null,
    ...(options.intent ? { intent: options.intent } : {}),
  });
  const record = (run: Run, args: StepArgs, host?: unknown): Promise<Action> => run.record(request(args as INPUT, host));
  const wrapped: Tool<INPUT, OUTPUT> = {
    ...tool,
    // Asked before the call and again when an approved call is about to run (the SDK denies an
    // approved call whose tool no longer needs approval): true whenever Saga gates this call.
    needsApproval: async (input: INPUT, approvalOptions?: unknown) => {
      let action: Action;
      try {
        action = await record(activeRun(name), input, approvalOptions);
      } catch (error) {
        // No before-image: the call is refused when it runs, with the reason for the model.
        if (error instanceof BeforeImageFailed) return false;
        throw error;
      }
      return action.requires_approval || action.status === "awaiting_approval" || action.status === "rejected";
    },
    execute: async (input: INPUT, executionOptions: ToolExecutionOptions) => {
      const run = activeRun(name);
      // The SDK hands a failed call to the model and carries on: the run's end rule decides.
      run.failUnretriedSteps = true;
      try {
        return await run.step<INPUT, OUTPUT>({
          ...request(input, executionOptions),
          wait: false,
          do: async (args) => (await execute(args, executionOptions)) as OUTPUT,
        });
      } catch (error) {
        // The SDK shows a tool's error to the model: say what Saga decided, in its words.
        if (error instanceof ApprovalPending || error instanceof ApprovalRejected || error instanceof BeforeImageFailed) {
          throw new Error(`Saga Admin: ${error.message}`, { cause: error });
        }
        throw error;
      }
    },
  } as Tool<INPUT, OUTPUT>;
  registry.set(wrapped, { name, record });
  return wrapped;
}

/** The execution options a read is called with: the step's call's (when known), its own call id. */
function readOptions(context: ReadContext): ToolExecutionOptions {
  const host = (context.host ?? {}) as Partial<ToolExecutionOptions>;
  return {
    ...host,
    messages: host.messages ?? [],
    toolCallId: `${host.toolCallId ?? "saga"}:${context.phase}-image:${context.tool}`,
    abortSignal: context.signal,
  };
}

/** Wrap a whole tool set: `names` maps each key to its Saga tool name (default: the key). */
export function sagaTools<T extends Record<string, Tool<any, any>>>(tools: T, options: { names?: Partial<Record<keyof T, string>>; namespace?: string } = {}): T {
  const out: Record<string, Tool<any, any>> = {};
  for (const [key, tool] of Object.entries(tools)) {
    const name = options.names?.[key as keyof T] ?? (options.namespace ? `${options.namespace}.${key}` : key);
    out[key] = sagaTool(name, tool);
  }
  return out as T;
}

interface ApprovalRequestPart {
  type: string;
  approvalId?: string;
  toolCall?: { toolName: string; input: unknown };
}

/**
 * Saga's decisions as the SDK's approval responses, for the `tool-approval-request` parts of
 * `content` (a result's `content`) whose tool is a Saga tool of `tools`: waits (up to `timeoutS`)
 * for Saga's approver; `ApprovalTimedOut` when nobody decided. Undecided ones are left out with
 * `wait: false`. Append the message (`messages.push(...result.response.messages, message)`) and call
 * the model again.
 */
export async function sagaApprovals(
  content: readonly ApprovalRequestPart[],
  tools: Record<string, Tool<any, any>>,
  options: { wait?: boolean; timeoutS?: number } = {},
): Promise<ToolModelMessage> {
  const responses: ToolApprovalResponse[] = [];
  for (const part of content) {
    if (part.type !== "tool-approval-request" || !part.approvalId || !part.toolCall) continue;
    const tool = tools[part.toolCall.toolName];
    const registered = tool ? registry.get(tool) : undefined;
    if (!registered) continue; // another tool's approval: the host's to decide
    const run = activeRun(registered.name);
    let action = await registered.record(run, (part.toolCall.input ?? {}) as Args);
    if (action.status === "awaiting_approval") {
      if (options.wait === false) continue;
      try {
        action = await run.waitForApproval(action, options.timeoutS);
      } catch (error) {
        if (!(error instanceof ApprovalRejected)) throw error;
        responses.push({ type: "tool-approval-response", approvalId: part.approvalId, approved: false, reason: rejectionWords(registered.name, error) });
        continue;
      }
    } else if (action.status === "rejected") {
      responses.push({ type: "tool-approval-response", approvalId: part.approvalId, approved: false, reason: rejectionWords(registered.name, rejectionFor(action)) });
      continue;
    }
    responses.push({ type: "tool-approval-response", approvalId: part.approvalId, approved: true, reason: "Saga Admin: approved" });
  }
  return { role: "tool", content: responses };
}

export { ApprovalTimedOut };
