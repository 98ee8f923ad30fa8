/**
 * The OpenAI Agents SDK for JS (`@openai/agents`) adapter: `sagaFunctionTool(tool, options)` wraps a
 * `tool({...})` so each call is a step of the run active in the async context, with Saga's approval
 * carried by the SDK's `needsApproval`/interruption flow. Only types are imported from the SDK: this
 * module loads without it.
 *
 * 1. Before the SDK runs a call, the tool's `needsApproval` records it in Saga (not started) and
 *    answers true unless Saga needs no approval for it or its approver already approved it; the run
 *    returns with `result.interruptions`.
 * 2. `sagaDecisions(result)` waits for Saga's approver and returns the run state with each
 *    interruption of a Saga tool decided as they decided: approved → `state.approve`; rejected →
 *    `state.reject` with the approver's reason as the message the model reads. Resume with
 *    `run(agent, state)`.
 * 3. When the SDK then runs the call, the step asks Saga again: only a call Saga approved runs — once,
 *    with the approver's args if they edited them. A host that approves in the SDK alone gets a tool
 *    error ("Saga Admin: … is waiting for approval") and nothing runs.
 *
 * Arguments the model sent that are not a JSON object are a tool error the model reads (nothing is
 * recorded or run), never an exception. An interruption is matched to the Saga tool among the tools
 * of the agent that made the call, so two agents may each have a Saga tool of one SDK name; two in
 * one agent are refused, since the SDK cannot tell their calls apart.
 */
import type { FunctionTool, RunContext, RunState, RunToolApprovalItem } from "@openai/agents";

import { registerToolReader } from "../before.js";
import { ApprovalPending, ApprovalRejected, BeforeImageFailed, NoActiveRun, SagaError, rejectionFor, rejectionWords } from "../errors.js";
import type { Run } from "../run.js";
import { currentRun } from "../saga.js";
import type { Action, Compensation, Target } from "../types.js";

type Args = Record<string, unknown>;

export interface SagaFunctionToolOptions {
  /** The Saga tool name (default: the SDK tool's name). */
  name?: string;
  target?: Target | ((args: Args) => Target | null) | null;
  compensate?: Compensation | ((args: Args) => Compensation | null) | null;
  intent?: Record<string, unknown>;
  /**
   * What the model reads when the call failed, for a tool built with `errorFunction: null` (its
   * error then reaches Saga, which records the step failed): without it that error goes up to the
   * SDK. A tool built with the SDK's default error function needs none (see `sdkFailure`).
   */
  errorFunction?: (context: RunContext<any>, error: unknown) => string | Promise<string>;
}

/**
 * The SDK's default error function answers a failed call with this text (documented: "Always
 * returns `An error occurred while running the tool. Please try again. Error: <error details>`")
 * instead of throwing, so the call's failure would reach Saga as its result. Seen here, it is the
 * failure it is: the step is recorded failed and the model reads the same text.
 */
const SDK_FAILURE = "An error occurred while running the tool. Please try again. Error: ";

class SdkToolFailure extends Error {
  constructor(readonly output: string) {
    super(output.slice(SDK_FAILURE.length) || output);
    this.name = "ToolFailed";
  }
}

function sdkFailure(output: unknown): SdkToolFailure | undefined {
  return typeof output === "string" && output.startsWith(SDK_FAILURE) ? new SdkToolFailure(output) : undefined;
}

interface Registered {
  name: string;
  record(run: Run, args: Args): Promise<Action>;
}

// How to ask Saga about a call of this tool, on the wrapped tool itself (an own enumerable symbol
// property, so the SDK's copies of the tool keep it). `sagaDecisions` finds it among the tools of
// the agent that made the call: two agents may each have their own tool of one SDK name.
const SAGA_TOOL = Symbol.for("saga-admin.openai-agents.tool");

type Carrier = { name?: unknown; [SAGA_TOOL]?: Registered };

function activeRun(name: string): Run {
  const run = currentRun();
  if (!run) throw new NoActiveRun(`${name} was called outside a run: run the agent inside saga.run({...}, async (run) => ...).`);
  return run;
}

/** The call's arguments as the model sent them (a JSON object), or undefined when they are not. */
function parsed(input: unknown): Args | undefined {
  let value: unknown = input ?? {};
  if (typeof input === "string") {
    try {
      value = input ? JSON.parse(input) : {};
    } catch {
      return undefined;
    }
  }
  return typeof value === "object" && value !== null && !Array.isArray(value) ? (value as Args) : undefined;
}

/** What the model reads when its arguments are not a JSON object: nothing was recorded or run. */
function invalidArguments(name: string): string {
  return `Saga Admin: the arguments of ${name} are not a JSON object; nothing was recorded or run. Call it again with valid JSON arguments.`;
}

/** The SDK's `FunctionTool`, each call a step of the active run, its approval Saga's. */
export function sagaFunctionTool<C, P extends FunctionTool<C, any, any>>(tool: P, options: SagaFunctionToolOptions = {}): P {
  const name = options.name ?? tool.name;
  // This tool serves as the reader of `name` when a policy's `before` names it (called directly,
  // not as a step), in the run context of the call whose image it takes. A failure its error
  // function answered is a failed read.
  registerToolReader(name, async (args, context) => {
    const host = context.host as { context?: RunContext<C> } | undefined;
    const output: unknown = await tool.invoke(host?.context ?? (undefined as unknown as RunContext<C>), JSON.stringify(args));
    const failed = sdkFailure(output);
    if (failed) throw failed;
    return output;
  });
  const request = (args: Args, host?: unknown) => ({
    ...(host !== undefined ? { host } : {}),
    tool: name,
    args,
    target: (typeof options.target === "function" ? options.target(args) : options.target) ?? null,
    compensate: (typeof options.compensate === "function" ? options.compensate(args) : options.compensate) ?? null,
    ...(options.intent ? { intent: options.intent } : {}),
  });
  const record = (run: Run, args: Args, host?: unknown): Promise<Action> => run.record(request(args, host));
  const registered: Registered = { name, record };
  const wrapped = {
    ...tool,
    [SAGA_TOOL]: registered,
    needsApproval: async (context: RunContext, input: unknown) => {
      const args = parsed(input);
      // Arguments that do not parse need no approval: the call itself only tells the model so.
      if (args === undefined) return false;
      let action: Action;
      try {
        action = await record(activeRun(name), args, { context });
      } catch (error) {
        // No before-image: the call is refused when it runs, with the reason for the model.
        if (error instanceof BeforeImageFailed) return false;
        throw error;
      }
      return action.status === "awaiting_approval" || action.status === "rejected";
    },
    invoke: async (context: RunContext<C>, input: string, details?: Parameters<P["invoke"]>[2]) => {
      const args = parsed(input);
      if (args === undefined) return invalidArguments(name);
      const run = activeRun(name);
      // The SDK hands a failed call to the model and carries on: the run's end rule decides.
      run.failUnretriedSteps = true;
      try {
        return await run.step({
          ...request(args, { context }),
          wait: false,
          do: async (args) => {
            const output = await tool.invoke(context, JSON.stringify(args), details);
            const failed = sdkFailure(output);
            if (failed) throw failed;
            return output;
          },
        });
      } catch (error) {
        // Saga's approval errors are the model's to read; a failure the SDK's error function
        // answered is answered the same; every other error is the SDK's to handle, unless this
        // tool says what the model reads instead.
        if (error instanceof ApprovalPending || error instanceof ApprovalRejected || error instanceof BeforeImageFailed) {
          return `Saga Admin: ${error.message}`;
        }
        if (error instanceof SdkToolFailure) return error.output;
        if (options.errorFunction && !(error instanceof SagaError)) return options.errorFunction(context, error);
        throw error;
      }
    },
  } as P;
  return wrapped;
}

/** The Saga side of the tool an interruption is for, among its agent's tools (undefined: not a Saga tool). */
function registeredFor(item: RunToolApprovalItem): Registered | undefined {
  const tools = ((item.agent as { tools?: unknown[] } | undefined)?.tools ?? []) as Carrier[];
  const found = tools.filter((t) => t?.[SAGA_TOOL] !== undefined && t.name === item.name);
  if (found.length > 1) {
    const names = found.map((t) => t[SAGA_TOOL]!.name).join(", ");
    throw new Error(
      `Agent ${item.agent.name} has ${found.length} Saga tools named ${String(item.name)} (${names}): the SDK cannot tell their calls apart; give each its own name.`,
    );
  }
  return found[0]?.[SAGA_TOOL];
}

interface Interrupted<C> {
  readonly interruptions: RunToolApprovalItem[];
  readonly state: RunState<C, any>;
}

/**
 * The run state with each interruption of a Saga tool decided as Saga's approver decided (waiting
 * up to `timeoutS` for them; `ApprovalTimedOut` when nobody did; with `wait: false` an undecided
 * call stays interrupted). Interruptions of other tools are left to the host.
 */
export async function sagaDecisions<C>(result: Interrupted<C>, options: { wait?: boolean; timeoutS?: number } = {}): Promise<RunState<C, any>> {
  for (const item of result.interruptions) {
    const registered = registeredFor(item);
    if (!registered) continue;
    const raw = item.rawItem as { arguments?: string };
    const args = parsed(raw.arguments ?? "{}");
    if (args === undefined) {
      // The SDK asks for approval of a call whose arguments it could not parse: nothing to decide.
      result.state.reject(item, { message: invalidArguments(registered.name) });
      continue;
    }
    const run = activeRun(registered.name);
    let action = await registered.record(run, args);
    try {
      if (action.status === "awaiting_approval") {
        if (options.wait === false) continue;
        action = await run.waitForApproval(action, options.timeoutS);
      }
      if (action.status === "rejected") throw rejectionFor(action);
      result.state.approve(item);
    } catch (error) {
      if (!(error instanceof ApprovalRejected)) throw error;
      result.state.reject(item, { message: rejectionWords(registered.name, error) });
    }
  }
  return result.state;
}
