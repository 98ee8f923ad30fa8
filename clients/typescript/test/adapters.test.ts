/**
 * The two adapters' examples against the live server, with scripted models (no network): a gated
 * call goes through the framework's own approval flow and runs once Saga's approver approved it, or
 * never when they rejected it (the model reads the reason); a host cannot approve by itself.
 */
import { describe, expect, it } from "vitest";

import { chargeWithTheAiSdk, charged as aiCharged } from "../examples/ai-sdk.js";
import { chargeWithOpenAIAgents, charged as agentsCharged } from "../examples/openai-agents.js";
import { agentSaga, approver, noServer, unique, waitFor } from "./live.js";

/** Saga's approver, from their inbox: decides the pending charge of this customer once it appears. */
async function decide(customer: string, verdict: "approve" | "reject", reason: string): Promise<void> {
  const inbox = approver();
  const id = await waitFor(async () => {
    const page = await inbox.request<{ items: Array<{ id: string; tool: string; args: Record<string, unknown> }> }>("GET", "/approvals", {
      query: { status: "pending", limit: 100 },
    });
    return page.items.find((a) => a.tool === "payments.charge" && a.args["customer"] === customer)?.id;
  }, `the approval of ${customer}'s charge`);
  await inbox.request("POST", `/approvals/${id}/${verdict}`, { body: { reason }, idempotencyKey: unique(verdict) });
}

describe.skipIf(noServer)("the Vercel AI SDK adapter", () => {
  it("runs a call Saga approved, once, through the SDK's tool-approval flow", async () => {
    const saga = agentSaga();
    const customer = unique("ai-ok");
    const decided = decide(customer, "approve", "first month is due");
    const outcome = await chargeWithTheAiSdk(saga, { customer, amount: 120 });
    await decided;
    expect(outcome.approvalRequests).toBe(1);
    expect(outcome.text).toMatch(/^Charged: \{"charge_id":"ch_\d+"\}$/);
    expect(aiCharged.filter((c) => c.customer === customer)).toEqual([{ customer, amount: 120 }]);
    const run = await saga.getRun(outcome.runId);
    expect(run.status).toBe("succeeded");
    expect(run.actions.map((a) => [a.tool, a.status, a.target_id])).toEqual([["payments.charge", "succeeded", customer]]);
  });

  it("denies a call Saga's approver rejected, with their reason for the model", async () => {
    const saga = agentSaga();
    const customer = unique("ai-no");
    const decided = decide(customer, "reject", "the card is blocked");
    const outcome = await chargeWithTheAiSdk(saga, { customer, amount: 90 });
    await decided;
    expect(outcome.text).toBe("Not charged: Saga Admin: an approver rejected payments.charge: the card is blocked");
    expect(aiCharged.filter((c) => c.customer === customer)).toEqual([]);
  });
});

describe.skipIf(noServer)("the OpenAI Agents SDK adapter", () => {
  it("runs a call Saga approved, once, after the SDK's interruption", async () => {
    const saga = agentSaga();
    const customer = unique("oa-ok");
    const decided = decide(customer, "approve", "first month is due");
    const outcome = await chargeWithOpenAIAgents(saga, { customer, amount: 120 });
    await decided;
    expect(outcome.interruptions).toBe(1);
    expect(outcome.output).toMatch(/^Done: charge ch_\d+$/);
    expect(agentsCharged.filter((c) => c.customer === customer)).toEqual([{ customer, amount: 120 }]);
    const run = await saga.getRun(outcome.runId);
    expect(run.status).toBe("succeeded");
    expect(run.actions.map((a) => [a.tool, a.status])).toEqual([["payments.charge", "succeeded"]]);
  });

  it("rejects a call Saga's approver rejected, with their reason for the model", async () => {
    const saga = agentSaga();
    const customer = unique("oa-no");
    const decided = decide(customer, "reject", "the card is blocked");
    const outcome = await chargeWithOpenAIAgents(saga, { customer, amount: 90 });
    await decided;
    expect(outcome.output).toBe("Done: Saga Admin: an approver rejected payments.charge: the card is blocked");
    expect(agentsCharged.filter((c) => c.customer === customer)).toEqual([]);
  });
});
