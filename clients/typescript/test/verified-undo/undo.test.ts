/**
 * Verified undo of an update, end to end, with the policies, the CRM and the real worker that
 * `tests/client_ts/test_verified_undo.py` sets up first: the agent reads and updates a contact of
 * the CRM over its plain HTTP routes (`tests/support/mcp_crm.py`), the TypeScript client takes the
 * before- and after-image through the read, the run fails, an operator compensates, and the
 * worker undoes the update over the CRM's MCP tools — checking before (drift) and after
 * (read-back) through the MCP reader of `crm.get_contact`. Each flow runs through `run.step` with
 * `saga.reader(...)` and through the OpenAI Agents adapter (a scripted model) whose read tool is
 * the reader. Each flow prints `UNDO_CASE <flow> <via> <run id>` for the pytest side.
 */
import { readFileSync, renameSync, writeFileSync } from "node:fs";

import { Agent, Usage, run as runAgent, setTracingDisabled, tool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents";
import { afterEach, describe, expect, it } from "vitest";
import { z } from "zod";

import { sagaDecisions, sagaFunctionTool } from "../../src/adapters/openai-agents.js";
import { BeforeImageFailed, type Saga } from "../../src/index.js";
import { agentSaga, approver, noServer, operator, pendingApproval, unique, waitFor } from "../live.js";

setTracingDisabled(true);

const CRM_URL = process.env["CRM_URL"] ?? "";
const CRM_STATE = process.env["CRM_STATE"] ?? "";
const CRM_JOURNAL = process.env["CRM_JOURNAL"] ?? "";
const skip = noServer || !CRM_URL || !CRM_STATE;

// --- The CRM: its HTTP routes for the agent, its state file for the "hands" ----------------------

type Contact = { email: string; phone: string };
type State = { contacts: Record<string, Contact>; ignore_updates?: boolean };

const crm = {
  state(): State {
    return JSON.parse(readFileSync(CRM_STATE, "utf8")) as State;
  },
  /** Edit the state as a person in the CRM's own UI would (whole file, renamed into place). */
  write(state: State): void {
    writeFileSync(`${CRM_STATE}.tmp`, JSON.stringify(state));
    renameSync(`${CRM_STATE}.tmp`, CRM_STATE);
  },
  add(prefix: string): string {
    const id = unique(prefix);
    const state = crm.state();
    state.contacts[id] = { email: `${id}@old.example`, phone: "+1 555 0100" };
    crm.write(state);
    return id;
  },
  contact(id: string): Contact | undefined {
    return crm.state().contacts[id];
  },
  editByHand(id: string, fields: Partial<Contact>): void {
    const state = crm.state();
    state.contacts[id] = { ...state.contacts[id]!, ...fields };
    crm.write(state);
  },
  ignoreUpdates(on: boolean): void {
    crm.write({ ...crm.state(), ignore_updates: on });
  },
  /** The journal's calls of a tool for one contact: "http" (the agent's) or "mcp" (the worker's). */
  calls(tool: string, id: string): string[] {
    return readFileSync(CRM_JOURNAL, "utf8")
      .split("\n")
      .filter(Boolean)
      .map((line) => JSON.parse(line) as { tool: string; args: { id: string }; via?: string })
      .filter((entry) => entry.tool === tool && entry.args.id === id)
      .map((entry) => entry.via ?? "mcp");
  },
};

/** GET /contacts/{id}: the read, as the agent makes it; a contact the CRM does not have throws. */
async function getContact(id: string): Promise<{ contact: Contact }> {
  const response = await fetch(`${CRM_URL}/contacts/${encodeURIComponent(id)}`);
  if (!response.ok) throw new Error(`the CRM answered ${response.status}: ${await response.text()}`);
  return (await response.json()) as { contact: Contact };
}

/** PATCH /contacts/{id}: the update, as the agent makes it. */
async function patchContact(id: string, fields: Partial<Contact>): Promise<unknown> {
  const response = await fetch(`${CRM_URL}/contacts/${encodeURIComponent(id)}`, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(fields),
  });
  if (!response.ok) throw new Error(`the CRM answered ${response.status}: ${await response.text()}`);
  return response.json();
}

afterEach(() => {
  if (!skip) crm.ignoreUpdates(false);
});

// --- The two agents -----------------------------------------------------------------------------

const WRONG = "the agent updated the wrong contact";

/** The agent on the client: a reader for the read, one step for the update, then it fails. */
async function clientAgent(id: string, email: string): Promise<{ runId: string; error: unknown }> {
  const saga = agentSaga();
  saga.reader("crm.get_contact", async (args) => getContact(String(args["id"])));
  let runId = "";
  const error = await saga
    .run({ agent: "crm-ts", request: `Fix the e-mail of ${id}` }, async (run) => {
      runId = run.id;
      await run.step({
        tool: "crm.update_contact",
        target: ["contact", id],
        args: { id, email },
        do: async (args: { id: string; email: string }) => patchContact(args.id, { email: args.email }),
      });
      throw new Error(WRONG);
    })
    .catch((caught: unknown) => caught);
  return { runId, error };
}

/** Calls `update_contact` once with these arguments, then says what came back. */
class UpdateOnceModel implements Model {
  constructor(private readonly args: Record<string, unknown>) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const items = typeof request.input === "string" ? [] : request.input;
    const result = items.findLast((item) => item.type === "function_call_result");
    if (result && result.type === "function_call_result") {
      const output = result.output;
      const text = typeof output === "string" ? output : "text" in output ? String(output.text) : JSON.stringify(output);
      return { usage: new Usage(), output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: `Done: ${text}` }] }] };
    }
    const call = { type: "function_call" as const, callId: "call-1", name: "update_contact", status: "completed" as const, arguments: JSON.stringify(this.args) };
    return { usage: new Usage(), output: [call] };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

/** The agent on the OpenAI Agents SDK: its own two tools wrapped for Saga, nothing about images. */
function crmTools() {
  return [
    sagaFunctionTool(
      tool({ name: "get_contact", description: "Read a contact", parameters: z.object({ id: z.string() }), execute: async ({ id }) => getContact(id) }),
      { name: "crm.get_contact" },
    ),
    sagaFunctionTool(
      tool({
        name: "update_contact",
        description: "Change a contact's e-mail",
        parameters: z.object({ id: z.string(), email: z.string() }),
        execute: async ({ id, email }) => JSON.stringify(await patchContact(id, { email })),
      }),
      { name: "crm.update_contact", target: (args) => ["contact", String(args["id"])] },
    ),
  ];
}

async function adapterAgent(id: string, email: string, failAfter = true): Promise<{ runId: string; output: string; error: unknown }> {
  const agent = new Agent({ name: "crm", instructions: "Fix contacts.", model: new UpdateOnceModel({ id, email }), tools: crmTools() });
  const saga = agentSaga();
  let runId = "";
  let output = "";
  const error = await saga
    .run({ agent: "crm-ts-agents", request: `Fix the e-mail of ${id}` }, async (run) => {
      runId = run.id;
      let result = await runAgent(agent, "Change the e-mail");
      while (result.interruptions.length > 0) result = await runAgent(agent, await sagaDecisions(result, { timeoutS: 30 }));
      output = String(result.finalOutput ?? "");
      if (failAfter) throw new Error(WRONG);
    })
    .catch((caught: unknown) => caught);
  return { runId, output, error };
}

type Via = "client" | "adapter";
const VIAS: Via[] = ["client", "adapter"];

/** The agent's update of a new contact, its images recorded, and its run failed into the queue. */
async function failedUpdate(via: Via, id: string, email: string): Promise<string> {
  const { runId, error } = via === "client" ? await clientAgent(id, email) : await adapterAgent(id, email);
  expect((error as Error).message).toBe(WRONG);
  expect(crm.contact(id)?.email).toBe(email);
  const saga = agentSaga();
  const run = await saga.getRun(runId);
  expect(run.status).toBe("failed");
  const [action] = run.actions;
  expect(run.actions.map((a) => [a.tool, a.status])).toEqual([["crm.update_contact", "succeeded"]]);
  const shown = await saga.getAction(action!.id);
  expect(shown.before_snapshot).toEqual({ email: `${id}@old.example`, phone: "+1 555 0100" });
  expect(shown.after_snapshot).toEqual({ email, phone: "+1 555 0100" });
  return runId;
}

// --- The operator's undo, carried out by the worker ----------------------------------------------

type Step = { status: string; verified: boolean | null; error: string; read_checks: Record<string, any> | null };
type Unwind = { id: string; status: string; steps: Step[] };

async function compensate(ops: Saga, runId: string): Promise<Unwind> {
  const item = (await ops.getRun(runId)).recovery_item as { id: string } | null;
  expect(item?.id).toMatch(/^rec_/);
  const started = await ops.request<{ id: string }>("POST", `/recovery/${item!.id}/compensate`, {
    body: { reason: "undo the wrong update" },
    idempotencyKey: unique("compensate"),
  });
  let last: Unwind | undefined;
  return waitFor(async () => {
    last = await ops.request<Unwind>("GET", `/unwinds/${started.id}`);
    return ["completed", "failed", "cancelled"].includes(last.status) ? last : undefined;
  }, "the worker to finish the unwind", 120).catch((error: Error) => {
    throw new Error(`${error.message}; the unwind as last seen: ${JSON.stringify(last)}`);
  });
}

async function recoveryReason(ops: Saga, runId: string): Promise<{ reason: string; error: string }> {
  const items = await ops.request<{ items: Array<{ reason: string; error: string }> }>("GET", "/recovery", { query: { run: runId, status: "all" } });
  expect(items.items).toHaveLength(1);
  return items.items[0]!;
}

describe.skipIf(skip)("an update's undo, checked by the worker", () => {
  it.each(VIAS)("is exact and verified (%s)", async (via) => {
    const id = crm.add(`exact-${via}`);
    const runId = await failedUpdate(via, id, "ana@wrong.example");
    const ops = operator();

    const unwind = await compensate(ops, runId);

    expect(unwind.status, JSON.stringify(unwind)).toBe("completed");
    const [step] = unwind.steps;
    expect([step!.status, step!.verified]).toEqual(["done", true]);
    expect(step!.read_checks!["now"]).toEqual({ email: "ana@wrong.example", phone: "+1 555 0100" });
    expect(step!.read_checks!["read_back"]).toEqual({ email: `${id}@old.example`, phone: "+1 555 0100" });
    expect(crm.contact(id)).toEqual({ email: `${id}@old.example`, phone: "+1 555 0100" });
    expect(crm.calls("update_contact", id)).toEqual(["http", "mcp"]); // the agent's, then the worker's one undo
    const run = await ops.getRun(runId);
    expect(run.status).toBe("compensated");
    const trail = await ops.trail(runId);
    expect(trail.restored.map((r: any) => r.verified)).toEqual([true]);
    console.log(`UNDO_CASE exact ${via} ${runId}`);
  });

  it.each(VIAS)("is refused as drift after a hand edit, which it keeps (%s)", async (via) => {
    const id = crm.add(`drift-${via}`);
    const runId = await failedUpdate(via, id, "ana@wrong.example");
    crm.editByHand(id, { email: "ana@fixed-by-hand.example" });
    const ops = operator();

    const unwind = await compensate(ops, runId);

    expect(unwind.status).toBe("failed");
    const [step] = unwind.steps;
    expect([step!.status, step!.verified]).toEqual(["drifted", null]);
    expect(step!.read_checks!["differences"]).toEqual([{ path: "email", expected: "ana@wrong.example", actual: "ana@fixed-by-hand.example" }]);
    // Not clobbered: the hand edit stands and the compensator was never called.
    expect(crm.contact(id)?.email).toBe("ana@fixed-by-hand.example");
    expect(crm.calls("update_contact", id)).toEqual(["http"]);
    expect((await ops.getRun(runId)).status).not.toBe("compensated");
    const item = await recoveryReason(ops, runId);
    expect(item.reason).toBe("state_drift");
    expect(item.error).toContain(`contact ${id} changed since the agent: email is "ana@fixed-by-hand.example", not "ana@wrong.example"`);
    console.log(`UNDO_CASE drift ${via} ${runId}`);
  });

  it.each(VIAS)("is not_restored when the CRM acknowledges the undo but does not apply it (%s)", async (via) => {
    const id = crm.add(`ignored-${via}`);
    const runId = await failedUpdate(via, id, "ana@wrong.example");
    crm.ignoreUpdates(true);
    const ops = operator();

    const unwind = await compensate(ops, runId);

    expect(unwind.status).toBe("failed");
    const [step] = unwind.steps;
    expect([step!.status, step!.verified]).toEqual(["failed", false]);
    expect(step!.read_checks!["differences"]).toEqual([{ path: "email", expected: `${id}@old.example`, actual: "ana@wrong.example" }]);
    expect(crm.contact(id)?.email).toBe("ana@wrong.example");
    expect(crm.calls("update_contact", id)).toEqual(["http", "mcp"]); // one undo call, not retried
    expect((await ops.getRun(runId)).status).not.toBe("compensated");
    expect((await ops.trail(runId)).restored).toEqual([]);
    const item = await recoveryReason(ops, runId);
    expect(item.reason).toBe("not_restored");
    expect(item.error).toContain(`contact ${id} did not come back after the undo: email is "ana@wrong.example", not "${id}@old.example"`);
    console.log(`UNDO_CASE not_restored ${via} ${runId}`);
  });

  it("is never needed when the before-read fails: the update is refused and not sent (client)", async () => {
    const id = unique("nobody"); // the CRM has no such contact: GET answers 404, the reader throws
    const { runId, error } = await clientAgent(id, "x@example.com");
    expect(error).toBeInstanceOf(BeforeImageFailed);
    expect((error as Error).message).toMatch(/^crm\.update_contact was not called: its policy takes a before-image through crm\.get_contact, and that read failed \(Error: the CRM answered 404/);
    expect(crm.calls("get_contact", id)).toEqual(["http"]);
    expect(crm.calls("update_contact", id)).toEqual([]);
    const run = await agentSaga().getRun(runId);
    expect([run.status, run.actions]).toEqual(["failed", []]);
    console.log(`UNDO_CASE refused client ${runId}`);
  });

  it("is never needed when the before-read fails: the update is refused and not sent (adapter)", async () => {
    const id = unique("nobody");
    const { runId, output, error } = await adapterAgent(id, "x@example.com", false);
    expect(error).toBeUndefined();
    // The model read why; the run's end rule failed the run for the refused call.
    expect(output).toMatch(/^Done: Saga Admin: crm\.update_contact was not called: its policy takes a before-image through crm\.get_contact, and that read failed/);
    expect(output).toContain("404");
    // Read when the SDK asks needsApproval and again when it makes the call: each refused.
    const reads = crm.calls("get_contact", id);
    expect(reads.length).toBeGreaterThan(0);
    expect(new Set(reads)).toEqual(new Set(["http"]));
    expect(crm.calls("update_contact", id)).toEqual([]);
    const run = await agentSaga().getRun(runId);
    expect([run.status, run.actions]).toEqual(["failed", []]);
    console.log(`UNDO_CASE refused adapter ${runId}`);
  });
});

describe.skipIf(skip)("a step that waited for approval", () => {
  it("is refused when the value changed meanwhile: read again before it starts, the PATCH never sent", async () => {
    const id = crm.add("approved");
    const saga = agentSaga();
    saga.reader("crm.get_contact", async (args) => getContact(String(args["id"])));
    let runId = "";
    // Someone edits the contact by hand while the step waits; then the approver approves.
    const approving = pendingApproval(saga, () => runId, "crm.set_contact_email").then((approvalId) => {
      crm.editByHand(id, { email: "ana@edited-meanwhile.example" });
      return approver().request("POST", `/approvals/${approvalId}/approve`, { body: { reason: "looks right" }, idempotencyKey: unique("approve") });
    });
    const error = await saga
      .run({ agent: "crm-ts", request: `Fix the e-mail of ${id}` }, async (run) => {
        runId = run.id;
        await run.step({
          tool: "crm.set_contact_email",
          args: { id, email: "ana@new.example" },
          approvalTimeoutS: 60,
          do: async (args: { id: string; email: string }) => patchContact(args.id, { email: args.email }),
        });
      })
      .catch((caught: unknown) => caught);
    await approving;
    expect(error).toBeInstanceOf(BeforeImageFailed);
    expect((error as BeforeImageFailed).reason).toBe("changed while the step waited for approval");
    expect(crm.calls("update_contact", id)).toEqual([]);
    expect(crm.contact(id)?.email).toBe("ana@edited-meanwhile.example");
    const run = await saga.getRun(runId);
    expect(run.status).toBe("failed");
    expect(run.actions.map((a) => [a.tool, a.status])).toEqual([["crm.set_contact_email", "approved"]]);
    console.log(`UNDO_CASE approval_changed client ${runId}`);
  });

  it("is refused the same way through the OpenAI Agents adapter: the model reads why", async () => {
    const id = crm.add("approved-agents");
    const update = tool({
      name: "update_contact",
      description: "Change a contact's e-mail",
      parameters: z.object({ id: z.string(), email: z.string() }),
      execute: async ({ id, email }) => JSON.stringify(await patchContact(id, { email })),
    });
    const tools = [crmTools()[0]!, sagaFunctionTool(update, { name: "crm.set_contact_email", target: (args) => ["contact", String(args["id"])] })];
    const agent = new Agent({ name: "crm", instructions: "Fix contacts.", model: new UpdateOnceModel({ id, email: "ana@new.example" }), tools });
    const saga = agentSaga();
    let runId = "";
    const approving = pendingApproval(saga, () => runId, "crm.set_contact_email").then((approvalId) => {
      crm.editByHand(id, { email: "ana@edited-meanwhile.example" });
      return approver().request("POST", `/approvals/${approvalId}/approve`, { body: { reason: "looks right" }, idempotencyKey: unique("approve") });
    });
    const output = await saga.run({ agent: "crm-ts-agents", request: `Fix the e-mail of ${id}` }, async (run) => {
      runId = run.id;
      let result = await runAgent(agent, "Change the e-mail");
      while (result.interruptions.length > 0) result = await runAgent(agent, await sagaDecisions(result, { timeoutS: 60 }));
      return String(result.finalOutput ?? "");
    });
    await approving;
    expect(output).toMatch(/^Done: Saga Admin: crm\.set_contact_email was not called: the value it changes \(read through crm\.get_contact\) changed while the step waited for approval/);
    expect(crm.calls("update_contact", id)).toEqual([]);
    expect(crm.contact(id)?.email).toBe("ana@edited-meanwhile.example");
    const run = await saga.getRun(runId);
    expect(run.status).toBe("failed"); // the refused call fails the run at its end, as saga-mcp does
    expect(run.actions.map((a) => [a.tool, a.status])).toEqual([["crm.set_contact_email", "approved"]]);
    console.log(`UNDO_CASE approval_changed adapter ${runId}`);
  });
});
