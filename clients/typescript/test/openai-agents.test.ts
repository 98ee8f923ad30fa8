/**
 * The OpenAI Agents SDK adapter's edges: arguments the model sent that are not a JSON object come
 * back to the model as a tool error (nothing recorded, nothing run), never as a thrown exception;
 * and two agents' Saga tools of one SDK name are each asked about as themselves. The first part
 * needs no server; the SDK runs against the live one.
 */
import { Agent, RunContext, Usage, run as runAgent, setTracingDisabled, tool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents";
import { beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";

import { sagaDecisions, sagaFunctionTool } from "../src/adapters/openai-agents.js";
import { agentSaga, approver, noServer, unique, waitFor } from "./live.js";

setTracingDisabled(true);

/** What the wrapped tools' `execute` ran, in this test. */
const ran: string[] = [];
beforeEach(() => {
  ran.length = 0;
});

function chargeTool(sagaName: string, sdkName = "charge") {
  return sagaFunctionTool(
    tool({
      name: sdkName,
      description: "Charge a customer",
      parameters: z.object({ customer: z.string(), amount: z.number() }),
      execute: async ({ customer, amount }) => {
        ran.push(`${sagaName} ${customer} ${amount}`);
        return `charged ${customer}`;
      },
    }),
    { name: sagaName, target: (args) => ["customer", String(args["customer"])] },
  );
}

const MALFORMED = ["{not json", "[1, 2]", "42", "null", '"a string"'];

describe("arguments that are not a JSON object", () => {
  it.each(MALFORMED)("are a tool error the model reads, outside a run too: %s", async (input) => {
    const charge = chargeTool("payments.charge");
    const context = new RunContext({});
    await expect(charge.needsApproval(context, input as never, "call-1")).resolves.toBe(false);
    const answer = await charge.invoke(context, input);
    expect(answer).toBe(
      "Saga Admin: the arguments of payments.charge are not a JSON object; nothing was recorded or run. Call it again with valid JSON arguments.",
    );
    expect(ran).toEqual([]);
  });
});

/** Calls `charge` once with these raw arguments, then says what came back. */
class OneCallModel implements Model {
  constructor(private readonly args: string) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const items = typeof request.input === "string" ? [] : request.input;
    const result = items.findLast((item) => item.type === "function_call_result");
    if (result && result.type === "function_call_result") {
      const output = result.output;
      const text = typeof output === "string" ? output : "text" in output ? String(output.text) : JSON.stringify(output);
      return { usage: new Usage(), output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: `Done: ${text}` }] }] };
    }
    return { usage: new Usage(), output: [{ type: "function_call", callId: "call-1", name: "charge", status: "completed", arguments: this.args }] };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

async function approveCharge(customer: string): Promise<void> {
  const inbox = approver();
  const id = await waitFor(async () => {
    const page = await inbox.request<{ items: Array<{ id: string; tool: string; args: Record<string, unknown> }> }>("GET", "/approvals", {
      query: { status: "pending", limit: 100 },
    });
    return page.items.find((a) => a.tool === "payments.charge" && a.args["customer"] === customer)?.id;
  }, `the approval of ${customer}'s charge`);
  await inbox.request("POST", `/approvals/${id}/approve`, { body: { reason: "due" }, idempotencyKey: unique("approve") });
}

describe.skipIf(noServer)("the adapter in the SDK's run loop", () => {
  it("answers a call with malformed arguments with a tool error, records nothing and runs nothing", async () => {
    const saga = agentSaga();
    const agent = new Agent({ name: "billing", instructions: "Charge.", model: new OneCallModel("{not json"), tools: [chargeTool("payments.charge")] });
    const outcome = await saga.run({ agent: "billing", request: "malformed" }, async (run) => {
      let result = await runAgent(agent, "Charge someone");
      while (result.interruptions.length > 0) result = await runAgent(agent, await sagaDecisions(result, { timeoutS: 30 }));
      return { runId: run.id, output: String(result.finalOutput ?? "") };
    });
    expect(outcome.output.startsWith("Done: ")).toBe(true);
    expect((await saga.getRun(outcome.runId)).actions).toEqual([]);
    expect(ran).toEqual([]);
  });

  it("asks Saga about each agent's own tool when two agents' tools share an SDK name", async () => {
    const saga = agentSaga();
    const customer = unique("oa-twin");
    const billing = new Agent({
      name: "billing",
      instructions: "Charge.",
      model: new OneCallModel(JSON.stringify({ customer, amount: 30 })),
      tools: [chargeTool("payments.charge")],
    });
    // Another agent's tool, wrapped later under the same SDK name: it must not stand in for billing's.
    const other = new Agent({ name: "notes", instructions: "Note.", tools: [chargeTool("ledger.note")] });
    expect(other.tools.length).toBe(1);
    const approved = approveCharge(customer);
    const outcome = await saga.run({ agent: "billing", request: "twin names" }, async (run) => {
      let result = await runAgent(billing, "Charge the customer");
      while (result.interruptions.length > 0) result = await runAgent(billing, await sagaDecisions(result, { timeoutS: 60 }));
      return { runId: run.id, output: String(result.finalOutput ?? "") };
    });
    await approved;
    expect(outcome.output).toBe(`Done: charged ${customer}`);
    expect(ran).toEqual([`payments.charge ${customer} 30`]);
    const actions = (await saga.getRun(outcome.runId)).actions.map((a) => [a.tool, a.status]);
    expect(actions).toEqual([["payments.charge", "succeeded"]]);
  });

  it("refuses to guess between two Saga tools of one SDK name in one agent", async () => {
    const saga = agentSaga();
    const customer = unique("oa-dup");
    const agent = new Agent({
      name: "billing",
      instructions: "Charge.",
      model: new OneCallModel(JSON.stringify({ customer, amount: 5 })),
      tools: [chargeTool("payments.charge"), chargeTool("payments.charge_again")],
    });
    await expect(
      saga.run({ agent: "billing", request: "duplicate names" }, async () => {
        const result = await runAgent(agent, "Charge the customer");
        return sagaDecisions(result, { wait: false });
      }),
    ).rejects.toThrow(/has 2 Saga tools named charge \(payments\.charge, payments\.charge_again\)/);
    expect(ran).toEqual([]);
  });
});
