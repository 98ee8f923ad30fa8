/**
 * The adapters end a run as `saga-mcp` ends a session: a step that failed and was not retried
 * successfully with the same arguments fails the run (into the recovery queue), though the framework
 * handed the error to the model and the run's scope ended cleanly. The real Vercel AI SDK and OpenAI
 * Agents SDK with scripted models, against the live server.
 */
import { Agent, Usage, run as runAgent, setTracingDisabled, tool as agentsTool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents";
import { generateText, stepCountIs, tool, type LanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { describe, expect, it } from "vitest";
import { z } from "zod";

import { sagaTool } from "../src/adapters/ai.js";
import { sagaFunctionTool } from "../src/adapters/openai-agents.js";
import { agentSaga, noServer, unique } from "./live.js";

setTracingDisabled(true);

type User = { email: string; name: string };

/** The HR directory the agent writes to: down for the first `outages` calls. */
class Directory {
  readonly created: string[] = [];
  constructor(private outages: number) {}

  createUser({ email }: User): { user_id: number } {
    if (this.outages > 0) {
      this.outages -= 1;
      throw new Error("the HR directory is down");
    }
    this.created.push(email);
    return { user_id: this.created.length };
  }
}

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** An AI SDK model that asks for `calls` one at a time, then says "done". */
function aiModel(calls: User[]): LanguageModel {
  let asked = 0;
  return new MockLanguageModelV3({
    doGenerate: async () => {
      const call = calls[asked];
      asked += 1;
      if (!call) return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      return {
        content: [{ type: "tool-call", toolCallId: `call-${asked}`, toolName: "create_user", input: JSON.stringify(call) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage,
        warnings: [],
      };
    },
  });
}

async function withTheAiSdk(directory: Directory, calls: User[]): Promise<{ runId: string; errors: number }> {
  const tools = {
    create_user: sagaTool(
      "hr.create_user",
      tool({
        description: "Create the HR user",
        inputSchema: z.object({ email: z.string(), name: z.string() }),
        execute: async (user: User) => directory.createUser(user),
      }),
    ),
  };
  return agentSaga().run({ agent: "onboarding", request: "Onboard" }, async (run) => {
    // The SDK turns the tool's error into a `tool-error` part for the model and carries on.
    const result = await generateText({ model: aiModel(calls), tools, prompt: "Onboard them", stopWhen: stepCountIs(calls.length + 1) });
    expect(result.text).toBe("done");
    const errors = result.steps.flatMap((step) => step.content).filter((part) => part.type === "tool-error").length;
    return { runId: run.id, errors };
  });
}

/** An OpenAI Agents model that asks for `calls` one at a time, then says "done". */
class ScriptedCalls implements Model {
  private asked = 0;
  /** The outputs of the calls, as the model read them. */
  readonly seen: string[] = [];
  constructor(private readonly calls: User[]) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const items = typeof request.input === "string" ? [] : request.input;
    const result = items.findLast((item) => item.type === "function_call_result");
    if (result && result.type === "function_call_result") {
      const output = result.output;
      this.seen.push(typeof output === "string" ? output : "text" in output ? String(output.text) : JSON.stringify(output));
    }
    const call = this.calls[this.asked];
    this.asked += 1;
    if (!call) return { usage: new Usage(), output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "done" }] }] };
    return { usage: new Usage(), output: [{ type: "function_call", callId: `call-${this.asked}`, name: "create_user", status: "completed", arguments: JSON.stringify(call) }] };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

async function withOpenAIAgents(
  directory: Directory,
  calls: User[],
  errors: { inner?: null; outer?: (context: unknown, error: unknown) => string } = {},
): Promise<{ runId: string; output: unknown; seen: string[] }> {
  const model = new ScriptedCalls(calls);
  const createUser = sagaFunctionTool(
    agentsTool({
      name: "create_user",
      description: "Create the HR user",
      parameters: z.object({ email: z.string(), name: z.string() }),
      execute: async (user: User) => directory.createUser(user),
      ...("inner" in errors ? { errorFunction: errors.inner } : {}),
    }),
    { name: "hr.create_user", ...(errors.outer ? { errorFunction: errors.outer } : {}) },
  );
  const agent = new Agent({ name: "hr", instructions: "Onboard people.", model, tools: [createUser] });
  return agentSaga().run({ agent: "onboarding", request: "Onboard" }, async (run) => {
    // The SDK hands the tool's error to the model as the call's output and carries on.
    const result = await runAgent(agent, "Onboard them");
    return { runId: run.id, output: result.finalOutput, seen: model.seen };
  });
}

async function expectFailedIntoTheQueue(runId: string, email: string): Promise<void> {
  const run = await agentSaga().getRun(runId);
  expect(run.status).toBe("failed");
  expect(run.error).toMatch(/not retried successfully with the same arguments; the last: hr\.create_user: .*the HR directory is down/);
  const failed = run.actions.find((a) => a.id === run.failed_action_id);
  expect([failed?.status, (failed?.args as Record<string, unknown> | undefined)?.["email"]]).toEqual(["failed", email]);
}

describe.skipIf(noServer)("a failed step and the run's end, with the Vercel AI SDK", () => {
  it("fails the run when the model moved past the failed step", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("ai-fail")}@company.com`, name: "Ashu" };
    const { runId, errors } = await withTheAiSdk(directory, [ashu]);
    expect(errors).toBe(1);
    expect(directory.created).toEqual([]);
    await expectFailedIntoTheQueue(runId, ashu.email);
  });

  it("completes the run when the same call was retried successfully", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("ai-retry")}@company.com`, name: "Ashu" };
    const { runId } = await withTheAiSdk(directory, [ashu, ashu]);
    expect(directory.created).toEqual([ashu.email]);
    expect((await agentSaga().getRun(runId)).status).toBe("succeeded");
  });

  it("fails the run when only a call with other arguments succeeded", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("ai-a")}@company.com`, name: "Ashu" };
    const zoe = { email: `${unique("ai-z")}@company.com`, name: "Zoe" };
    const { runId } = await withTheAiSdk(directory, [ashu, zoe]);
    expect(directory.created).toEqual([zoe.email]);
    await expectFailedIntoTheQueue(runId, ashu.email);
  });
});

describe.skipIf(noServer)("a failed step and the run's end, with the OpenAI Agents SDK", () => {
  it("fails the run when the model moved past the failed step", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("oa-fail")}@company.com`, name: "Ashu" };
    const { runId, output } = await withOpenAIAgents(directory, [ashu]);
    expect(output).toBe("done");
    expect(directory.created).toEqual([]);
    await expectFailedIntoTheQueue(runId, ashu.email);
  });

  it("records the failure the SDK's error function answered, and the model reads the SDK's words", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("oa-words")}@company.com`, name: "Ashu" };
    const { runId, seen } = await withOpenAIAgents(directory, [ashu]);
    expect(seen).toEqual(["An error occurred while running the tool. Please try again. Error: Error: the HR directory is down"]);
    await expectFailedIntoTheQueue(runId, ashu.email);
  });

  it("answers the model with the adapter's errorFunction for a tool built with errorFunction: null", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("oa-own")}@company.com`, name: "Ashu" };
    const outer = (_context: unknown, error: unknown) => `HR says: ${(error as Error).message}`;
    const { runId, seen } = await withOpenAIAgents(directory, [ashu], { inner: null, outer });
    expect(seen).toEqual(["HR says: the HR directory is down"]);
    await expectFailedIntoTheQueue(runId, ashu.email);
  });

  it("completes the run when the same call was retried successfully", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("oa-retry")}@company.com`, name: "Ashu" };
    const { runId } = await withOpenAIAgents(directory, [ashu, ashu]);
    expect(directory.created).toEqual([ashu.email]);
    expect((await agentSaga().getRun(runId)).status).toBe("succeeded");
  });
});

describe.skipIf(noServer)("a plain run", () => {
  it("still completes when its own code caught a failed step", async () => {
    const directory = new Directory(1);
    const ashu = { email: `${unique("plain")}@company.com`, name: "Ashu" };
    const runId = await agentSaga().run({ agent: "onboarding", request: "Onboard" }, async (run) => {
      await expect(run.step({ tool: "hr.create_user", args: ashu, do: () => directory.createUser(ashu) })).rejects.toThrow("down");
      return run.id;
    });
    expect((await agentSaga().getRun(runId)).status).toBe("succeeded");
  });
});
