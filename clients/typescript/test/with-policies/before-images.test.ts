/**
 * Before- and after-images against the live server, with the policies
 * `tests/client_ts/test_before_images.py` loads first for the agent's tenant: `crm.update_contact`
 * reads its images with `crm.get_contact` (`{"id": "$args.id"}`, path `contact`), a `read_only`
 * tool. The agent's code only registers a reader (or has the read among its adapter tools); the
 * action the server keeps shows both images (GET /actions/{id}).
 */
import { Agent, Usage, run as runAgent, setTracingDisabled, tool, type Model, type ModelRequest, type ModelResponse } from "@openai/agents";
import { describe, expect, it } from "vitest";
import { z } from "zod";

import { sagaDecisions, sagaFunctionTool } from "../../src/adapters/openai-agents.js";
import { BeforeImageFailed, type Action } from "../../src/index.js";
import { agentSaga, noServer, unique } from "../live.js";

setTracingDisabled(true);

/** The CRM the agent updates: contacts by id. */
const contacts = new Map<string, { email: string; phone: string }>();

function newContact(): string {
  const id = unique("c");
  contacts.set(id, { email: `${id}@old.example`, phone: "+1 555 0100" });
  return id;
}

function getContact(args: Record<string, unknown>): { contact: { email: string; phone: string } | null } {
  const found = contacts.get(String(args["id"]));
  return { contact: found ? { ...found } : null };
}

const update = (id: string, email: string, ran: string[]) => ({
  tool: "crm.update_contact",
  args: { id, email },
  do: async (args: { id: string; email: string }) => {
    ran.push(args.email);
    contacts.get(args.id)!.email = args.email;
    return { updated: args.id };
  },
});

async function onlyAction(runId: string): Promise<Action> {
  const saga = agentSaga();
  const { actions } = await saga.getRun(runId);
  expect(actions.map((a) => [a.tool, a.status])).toEqual([["crm.update_contact", "succeeded"]]);
  // The action as GET /actions/{id} shows it.
  return saga.getAction(actions[0]!.id);
}

describe.skipIf(noServer)("a step whose policy reads its before-image", () => {
  it("is recorded with the reader's before-image and succeeds with its after-image", async () => {
    const saga = agentSaga();
    const reads: string[] = [];
    saga.reader("crm.get_contact", async (args, context) => {
      reads.push(`${context.phase} ${String(args["id"])}`);
      // As an MCP server answers: JSON in one text block.
      return { content: [{ type: "text", text: JSON.stringify(getContact(args)) }] };
    });
    const id = newContact();
    const ran: string[] = [];
    const runId = await saga.run({ agent: "crm", request: "Fix a contact's e-mail" }, async (run) => {
      expect(await run.step(update(id, "new@example.com", ran))).toEqual({ updated: id });
      return run.id;
    });
    expect(ran).toEqual(["new@example.com"]);
    expect(reads).toEqual([`before ${id}`, `after ${id}`]);
    const action = await onlyAction(runId);
    expect(action.before_snapshot).toEqual({ email: `${id}@old.example`, phone: "+1 555 0100" });
    expect(action.after_snapshot).toEqual({ email: "new@example.com", phone: "+1 555 0100" });
    expect((action.policy as { before?: unknown }).before).toEqual({ tool: "crm.get_contact", args: { id: "$args.id" }, path: "contact" });
  });

  it("is refused when the read fails or finds nothing: do is not called and nothing is recorded", async () => {
    const saga = agentSaga();
    const ran: string[] = [];
    let runId = "";
    saga.reader("crm.get_contact", async () => {
      throw new Error("the CRM answered 503");
    });
    const failed = await saga
      .run({ agent: "crm", request: "Fix a contact while the CRM is down" }, async (run) => {
        runId = run.id;
        await run.step(update(newContact(), "x@example.com", ran));
      })
      .catch((error: unknown) => error);
    expect(failed).toBeInstanceOf(BeforeImageFailed);
    expect((failed as BeforeImageFailed).message).toBe(
      "crm.update_contact was not called: its policy takes a before-image through crm.get_contact, and that read failed (Error: the CRM answered 503). No update without its before-image.",
    );
    // A contact the read does not find (null at `contact`) is no image either.
    saga.reader("crm.get_contact", async (args) => getContact(args));
    const missing = await saga
      .run({ agent: "crm", request: "Fix a contact that is not there" }, async (run) => run.step(update("nobody", "x@example.com", ran)))
      .catch((error: unknown) => error);
    expect((missing as Error).message).toMatch(/through crm\.get_contact, and that read failed \(the read's result has null at 'contact'\)/);
    expect(ran).toEqual([]);
    const run = await saga.getRun(runId);
    expect(run.actions).toEqual([]);
    expect(run.status).toBe("failed"); // the scope threw: the run failed, naming the refusal
  });

  it("takes the step's own before (a value or a function) over the read, and still reads the after-image", async () => {
    const saga = agentSaga();
    const reads: string[] = [];
    saga.reader("crm.get_contact", async (args, context) => {
      reads.push(context.phase);
      return getContact(args);
    });
    const id = newContact();
    const runId = await saga.run({ agent: "crm", request: "Fix a contact, knowing its old e-mail" }, async (run) => {
      await run.step({ ...update(id, "mine@example.com", []), before: async () => ({ email: "as-the-agent-knew-it@example.com" }) });
      return run.id;
    });
    expect(reads).toEqual(["after"]);
    const action = await onlyAction(runId);
    expect(action.before_snapshot).toEqual({ email: "as-the-agent-knew-it@example.com" });
    expect(action.after_snapshot).toEqual({ email: "mine@example.com", phone: "+1 555 0100" });
  });
});

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

describe.skipIf(noServer)("the OpenAI Agents SDK adapter", () => {
  it("records the images through the agent's own read tool, with no change to the agent", async () => {
    // The agent as it is written: its tools wrapped for Saga, nothing about images.
    const ran: string[] = [];
    const tools = [
      sagaFunctionTool(
        tool({ name: "get_contact", description: "Read a contact", parameters: z.object({ id: z.string() }), execute: async (args) => getContact(args) }),
        { name: "crm.get_contact" },
      ),
      sagaFunctionTool(
        tool({
          name: "update_contact",
          description: "Change a contact's e-mail",
          parameters: z.object({ id: z.string(), email: z.string() }),
          execute: async ({ id, email }) => {
            ran.push(email);
            contacts.get(id)!.email = email;
            return `updated ${id}`;
          },
        }),
        { name: "crm.update_contact" },
      ),
    ];
    const id = newContact();
    const agent = new Agent({ name: "crm", instructions: "Fix contacts.", model: new UpdateOnceModel({ id, email: "agent@example.com" }), tools });
    const saga = agentSaga();
    const outcome = await saga.run({ agent: "crm", request: "Fix a contact's e-mail" }, async (run) => {
      let result = await runAgent(agent, "Change the e-mail");
      while (result.interruptions.length > 0) result = await runAgent(agent, await sagaDecisions(result, { timeoutS: 30 }));
      return { runId: run.id, output: String(result.finalOutput ?? "") };
    });
    expect(outcome.output).toBe(`Done: updated ${id}`);
    expect(ran).toEqual(["agent@example.com"]);
    const action = await onlyAction(outcome.runId);
    expect(action.before_snapshot).toEqual({ email: `${id}@old.example`, phone: "+1 555 0100" });
    expect(action.after_snapshot).toEqual({ email: "agent@example.com", phone: "+1 555 0100" });

    // A read that finds nothing: the model reads why, the update never runs, the run fails.
    const refused = new Agent({ name: "crm", instructions: "Fix contacts.", model: new UpdateOnceModel({ id: "nobody", email: "x@example.com" }), tools });
    const second = await saga.run({ agent: "crm", request: "Fix a contact that is not there" }, async (run) => {
      const result = await runAgent(refused, "Change the e-mail");
      return { runId: run.id, output: String(result.finalOutput ?? "") };
    });
    expect(second.output).toMatch(/^Done: Saga Admin: crm\.update_contact was not called: its policy takes a before-image through crm\.get_contact, and that read failed \(the read's result has null at 'contact'\)/);
    expect(ran).toEqual(["agent@example.com"]);
    const run = await saga.getRun(second.runId);
    expect([run.status, run.actions]).toEqual(["failed", []]);
  });
});
