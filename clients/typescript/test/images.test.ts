/**
 * Before- and after-images without a server: the shared vectors (`clients/spec/vectors/before_images.json`,
 * which the server and the Python client pass too), the server's policy precedence, the policy
 * copy kept current with `If-None-Match`, and a step's images taken through a scripted API.
 */
import { readFileSync } from "node:fs";
import { describe, expect, it, vi } from "vitest";

import { sagaTool } from "../src/adapters/ai.js";
import { BeforeImageFailed, Saga, type ReadContext, fillBeforeArgs, imageAt, imagesEqual, policyFor, readResult, type ToolPolicy } from "../src/index.js";

const vectors = JSON.parse(readFileSync(new URL("../../spec/vectors/before_images.json", import.meta.url), "utf8"));

describe("the before-image vectors", () => {
  it.each(vectors.fill as any[])("fills before.args: $name", (v) => {
    const fill = () => fillBeforeArgs(v.template, { args: v.args, targetId: v.target_id, targetType: v.target_type });
    if ("error" in v) expect(fill).toThrow(v.error);
    else expect(fill()).toEqual(v.expected);
  });
  it.each(vectors.result as any[])("reads a result: $name", (v) => {
    const read = () => readResult(v.structured, v.texts);
    if ("error" in v) expect(read).toThrow(v.error);
    else expect(read()).toEqual(v.expected);
  });
  it.each(vectors.image as any[])("takes the image: $name", (v) => {
    const image = () => imageAt(v.result, v.path);
    if ("error" in v) expect(image).toThrow(v.error);
    else expect(image()).toEqual(v.expected);
  });
  it.each(vectors.equal as any[])("compares images: $name", (v) => {
    expect(imagesEqual(v.left, v.right)).toBe(v.equal);
    expect(imagesEqual(v.right, v.left)).toBe(v.equal);
  });
});

const policy = (tool: string, scope: "tenant" | "global" = "global", before: unknown = null): ToolPolicy =>
  ({ tool, scope, before, risk: "low", approval: "auto", action_class: "internal_update", compensation: "none", compensation_tool: "", approval_timeout: "", on_timeout: "reject", source: "" }) as ToolPolicy;

describe("which policy governs a tool (the server's precedence)", () => {
  const policies = [policy("crm.*"), policy("crm.update_*"), policy("crm.update_contact"), policy("crm.update_contact", "tenant"), policy("*"), policy("hr.[!x]et_?ser")];
  it.each([
    ["crm.update_contact", "crm.update_contact", "tenant"],
    ["crm.update_phone", "crm.update_*", "global"],
    ["crm.delete_x", "crm.*", "global"],
    ["billing.charge", "*", "global"],
    ["hr.get_user", "hr.[!x]et_?ser", "global"],
    ["hr.xet_user", "*", "global"],
  ])("%s is governed by %s (%s)", (tool, pattern, scope) => {
    const found = policyFor(policies, tool);
    expect([found?.tool, found?.scope]).toEqual([pattern, scope]);
  });
  it("an exact name beats a tenant's glob; a tenant's glob beats any global one; then the longer literal part", () => {
    expect(policyFor([policy("crm.get_*", "tenant"), policy("crm.get_contact")], "crm.get_contact")?.scope).toBe("global");
    expect(policyFor([policy("crm.get_*"), policy("crm.*", "tenant")], "crm.get_contact")?.tool).toBe("crm.*");
    expect(policyFor([policy("crm.*", "tenant"), policy("crm.ge?_*", "tenant")], "crm.get_contact")?.tool).toBe("crm.ge?_*");
    expect(policyFor([policy("crm.*")], "hr.create_user")).toBeUndefined();
    expect(policyFor([policy("a.b")], "aXb")).toBeUndefined(); // a dot is a dot
  });
});

const BEFORE = { tool: "crm.get_contact", args: { id: "$args.id" }, path: "contact" };

/** A scripted API: the policies (with an ETag), and actions recorded, started and succeeded. */
function scripted(policies: ToolPolicy[]) {
  const calls: Array<{ method: string; path: string; body: any; headers: Record<string, string> }> = [];
  const answer = async (url: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const path = new URL(String(url)).pathname.replace("/api/v1", "");
    const headers = (init?.headers ?? {}) as Record<string, string>;
    const body = init?.body ? JSON.parse(String(init.body)) : null;
    calls.push({ method: init?.method ?? "GET", path, body, headers });
    const json = (data: unknown, extra: Record<string, string> = {}) => new Response(JSON.stringify(data), { status: 200, headers: { "Content-Type": "application/json", ...extra } });
    if (path === "/policies") {
      if (headers["If-None-Match"] === '"p-1"') return new Response(null, { status: 304, headers: { ETag: '"p-1"' } });
      return json({ policies, default_policy: {}, unwind: {}, auto_compensate: {}, source: "t" }, { ETag: '"p-1"' });
    }
    if (path === "/runs") return json({ id: "run_1", status: "running" });
    const action = { id: "act_1", run_id: "run_1", tool: body?.tool ?? "crm.update_contact", status: "running", attempt: 1, idempotency_key: "k", args: body?.args ?? { id: 7 }, result: null };
    if (path === "/runs/run_1/actions") return json(action);
    if (path === "/runs/run_1/plan") return json({ actions: body.actions.map((a: any) => ({ ...action, ...a, status: "planned" })), warnings: [] });
    if (path.endsWith("/succeed")) return json({ ...action, status: "succeeded", result: body.result });
    if (path === "/runs/run_1/complete" || path === "/runs/run_1/fail") return json({ id: "run_1", status: "succeeded" });
    return json({});
  };
  return { calls, fetch: answer as typeof fetch };
}

const update = (done: unknown[]) => ({ tool: "crm.update_contact", args: { id: 7, email: "new@x" }, do: async (args: object) => { done.push(args); return { ok: true }; } });

describe("a step whose policy reads its images", () => {
  it("sends the reader's before-image with the record and its after-image with the success", async () => {
    const api = scripted([policy("crm.update_*", "global", BEFORE), policy("crm.get_contact")]);
    const contact = { email: "old@x" };
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0 });
    const reads: unknown[] = [];
    saga.reader("crm.get_contact", async (args, context) => {
      reads.push([args, context.phase, context.step]);
      return { contact: { ...contact } };
    });
    const done: unknown[] = [];
    await saga.run({ agent: "a", request: "r" }, async (run) => {
      await run.step({ ...update(done), do: async () => { contact.email = "new@x"; done.push(1); return { ok: true }; } });
    });
    expect(reads).toEqual([[{ id: 7 }, "before", "crm.update_contact"], [{ id: 7 }, "after", "crm.update_contact"]]);
    const record = api.calls.find((c) => c.path === "/runs/run_1/actions")!;
    expect(record.body.before_snapshot).toEqual({ email: "old@x" });
    expect(api.calls.find((c) => c.path.endsWith("/succeed"))!.body.after_snapshot).toEqual({ email: "new@x" });
    expect(done).toEqual([1]);
  });

  it("refuses the step when the reader fails or gives no image: nothing recorded, do not called", async () => {
    const api = scripted([policy("crm.update_contact", "tenant", BEFORE)]);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0 });
    const run = await saga.run({ agent: "a", request: "r" });
    const done: unknown[] = [];
    // No reader at all.
    await expect(run.step(update(done))).rejects.toThrow(/no reader is registered for crm\.get_contact/);
    saga.reader("crm.get_contact", async () => {
      throw new Error("CRM is down");
    });
    const failed = await run.step(update(done)).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(BeforeImageFailed);
    expect(failed).toMatchObject({ code: "before_image_failed", readTool: "crm.get_contact", tool: "crm.update_contact" });
    expect((failed as Error).message).toBe(
      "crm.update_contact was not called: its policy takes a before-image through crm.get_contact, and that read failed (Error: CRM is down). No update without its before-image.",
    );
    saga.reader("crm.get_contact", async () => ({ content: [{ type: "text", text: '{"contact": null}' }] }));
    await expect(run.step(update(done))).rejects.toThrow(/that read failed \(the read's result has null at 'contact'\)/);
    expect(done).toEqual([]);
    expect(api.calls.filter((c) => c.path === "/runs/run_1/actions")).toEqual([]);
  });

  it("takes an explicit before (value or function) instead of the read, and an explicit after", async () => {
    const api = scripted([policy("crm.update_contact", "global", BEFORE)]);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0 });
    const reader = vi.fn(async (_args: Record<string, unknown>, _context: ReadContext) => ({ contact: { email: "read@x" } }));
    saga.reader("crm.get_contact", reader);
    const run = await saga.run({ agent: "a", request: "r" });
    await run.step({ ...update([]), before: () => ({ email: "given@x" }), after: { email: "given-after@x" } });
    expect(reader).not.toHaveBeenCalled();
    expect(api.calls.find((c) => c.path === "/runs/run_1/actions")!.body.before_snapshot).toEqual({ email: "given@x" });
    expect(api.calls.find((c) => c.path.endsWith("/succeed"))!.body.after_snapshot).toEqual({ email: "given-after@x" });
    // An explicit before alone: the after-image is still read.
    await run.step({ ...update([]), before: { email: "given@x" } });
    expect(reader).toHaveBeenCalledTimes(1);
    expect(reader.mock.calls[0]![1]).toMatchObject({ phase: "after" });
  });

  it("serves a saga.tool of the read's name as its reader, without recording the read", async () => {
    const api = scripted([policy("crm.update_contact", "global", BEFORE)]);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0 });
    saga.tool("crm.get_contact", async (args: { id: number }) => JSON.stringify({ contact: { id: args.id, email: "a@b" } }));
    const updateContact = saga.tool("crm.update_contact", async (_args: { id: number; email: string }) => ({ ok: true }));
    await saga.run({ agent: "a", request: "r" }, async () => updateContact({ id: 7, email: "new@x" }));
    const recorded = api.calls.filter((c) => c.path === "/runs/run_1/actions");
    expect(recorded.map((c) => [c.body.tool, c.body.before_snapshot])).toEqual([["crm.update_contact", { id: 7, email: "a@b" }]]);
  });

  it("keeps the policies and revalidates them with If-None-Match at most every policyRefreshS", async () => {
    const api = scripted([policy("crm.update_contact")]);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0, policyRefreshS: 3600 });
    const run = await saga.run({ agent: "a", request: "r" });
    await run.step(update([]));
    await run.step(update([]));
    expect(api.calls.filter((c) => c.path === "/policies")).toHaveLength(1);
    saga.images.policies.invalidate();
    await run.step(update([]));
    const asked = api.calls.filter((c) => c.path === "/policies");
    expect(asked.map((c) => c.headers["If-None-Match"])).toEqual([undefined, '"p-1"']);
    // A step given both snapshots needs no policy.
    saga.images.policies.invalidate();
    await run.step({ ...update([]), before: { a: 1 }, after: { a: 2 } });
    expect(api.calls.filter((c) => c.path === "/policies")).toHaveLength(2);
  });
});

describe("images through the AI SDK adapter and plans", () => {
  it("reads the before-image once when the SDK asks needsApproval, and the after-image after execute", async () => {
    const api = scripted([policy("crm.update_contact", "global", BEFORE)]);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0 });
    const contact = { email: "old@x" };
    const seen: string[] = [];
    // The agent's two tools, as the SDK's `tool({...})` makes them: nothing about images.
    sagaTool("crm.get_contact", {
      inputSchema: {} as never,
      execute: async (input: { id: number }, options: { toolCallId: string }) => {
        seen.push(options.toolCallId);
        return { contact: { id: input.id, ...contact } };
      },
    } as never);
    const update = sagaTool("crm.update_contact", {
      inputSchema: {} as never,
      execute: async (input: { id: number; email: string }) => {
        contact.email = input.email;
        return { ok: true };
      },
    } as never) as unknown as {
      needsApproval: (input: object, options: object) => Promise<boolean>;
      execute: (input: object, options: object) => Promise<unknown>;
    };
    await saga.run({ agent: "a", request: "r" }, async () => {
      const call = { toolCallId: "call-1", messages: [] };
      expect(await update.needsApproval({ id: 7, email: "new@x" }, call)).toBe(false);
      expect(await update.execute({ id: 7, email: "new@x" }, call)).toEqual({ ok: true });
    });
    expect(seen).toEqual(["call-1:before-image:crm.get_contact", "call-1:after-image:crm.get_contact"]);
    const records = api.calls.filter((c) => c.path === "/runs/run_1/actions");
    expect(records.map((c) => c.body.before_snapshot)).toEqual([
      { id: 7, email: "old@x" },
      undefined, // the step's record is a replay of the one needsApproval made: not read again
    ]);
    expect(api.calls.find((c) => c.path.endsWith("/succeed"))!.body.after_snapshot).toEqual({ id: 7, email: "new@x" });
  });

  it("sends a planned step's before-image with the plan", async () => {
    const api = scripted([policy("crm.update_contact", "global", BEFORE)]);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0 });
    saga.reader("crm.get_contact", async () => '{"contact": {"email": "old@x"}}');
    const run = await saga.run({ agent: "a", request: "r" });
    await run.plan([{ tool: "crm.update_contact", args: { id: 7, email: "new@x" } }, { tool: "crm.update_contact", args: { id: 8 }, before: { given: true } }]);
    const planned = api.calls.find((c) => c.path === "/runs/run_1/plan")!.body.actions;
    expect(planned.map((a: any) => a.before_snapshot)).toEqual([{ email: "old@x" }, { given: true }]);
  });
});

/** A scripted API whose update waits for approval: recorded `awaiting_approval` with the before-image it was sent, approved when polled, started on request. */
function approving(policies: ToolPolicy[], approvedArgs?: Record<string, unknown>) {
  const calls: Array<{ method: string; path: string; body: any }> = [];
  let recorded: any = null;
  const answer = async (url: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const path = new URL(String(url)).pathname.replace("/api/v1", "");
    const body = init?.body ? JSON.parse(String(init.body)) : null;
    calls.push({ method: init?.method ?? "GET", path, body });
    const json = (data: unknown) => new Response(JSON.stringify(data), { status: 200, headers: { "Content-Type": "application/json" } });
    if (path === "/policies") return json({ policies, default_policy: {}, unwind: {}, auto_compensate: {}, source: "t" });
    if (path === "/runs") return json({ id: "run_1", status: "running" });
    if (path === "/runs/run_1/actions") {
      recorded = { id: "act_1", run_id: "run_1", tool: body.tool, status: "awaiting_approval", attempt: 1, idempotency_key: body.idempotency_key ?? "k", args: body.args, before_snapshot: body.before_snapshot, result: null, approval: { id: "apr_1", status: "pending" } };
      return new Response(JSON.stringify(recorded), { status: 201, headers: { "Content-Type": "application/json" } });
    }
    if (path === "/actions/act_1" && (init?.method ?? "GET") === "GET") return json({ ...recorded, ...(approvedArgs ? { args: approvedArgs } : {}), status: "approved", approval: { id: "apr_1", status: "approved" } });
    if (path === "/actions/act_1/start") return json({ ...recorded, status: "running" });
    if (path === "/actions/act_1/succeed") return json({ ...recorded, status: "succeeded", result: body.result });
    if (path === "/runs/run_1/complete" || path === "/runs/run_1/fail") return json({ id: "run_1", status: "failed" });
    return json({});
  };
  return { calls, fetch: answer as typeof fetch };
}

describe("a step that waited for approval reads its before-image again before it starts", () => {
  const setUp = (approvedArgs?: Record<string, unknown>) => {
    const api = approving([policy("crm.update_contact", "tenant", BEFORE), policy("crm.get_contact")], approvedArgs);
    const saga = new Saga({ url: "http://saga.invalid", key: "sk", fetch: api.fetch, heartbeatIntervalS: 0, pollIntervalS: 0.001, maxPollIntervalS: 0.001 });
    const contact = { email: "old@x" };
    const reads: string[] = [];
    return { api, saga, contact, reads };
  };
  const started = (api: ReturnType<typeof approving>) => api.calls.filter((c) => c.path.startsWith("/actions/act_1/")).map((c) => c.path);

  it("starts it when the value is still the recorded one", async () => {
    const { api, saga, contact, reads } = setUp();
    saga.reader("crm.get_contact", async (_args, context) => {
      reads.push(`${context.phase} ${contact.email}`);
      return { contact: { ...contact } };
    });
    const done: unknown[] = [];
    await saga.run({ agent: "a", request: "r" }, async (run) => {
      await run.step({ tool: "crm.update_contact", args: { id: 7, email: "new@x" }, do: async (args: { id: number; email: string }) => { done.push(args); contact.email = args.email; return { ok: true }; } });
    });
    expect(reads).toEqual(["before old@x", "before old@x", "after new@x"]);
    expect(done).toEqual([{ id: 7, email: "new@x" }]);
    expect(started(api)).toEqual(["/actions/act_1/start", "/actions/act_1/succeed"]);
  });

  it("refuses it when the value changed while it waited: do not called, the action left approved and not started", async () => {
    const { api, saga, contact, reads } = setUp();
    saga.reader("crm.get_contact", async (_args, context) => {
      reads.push(`${context.phase} ${contact.email}`);
      const seen = { contact: { ...contact } };
      contact.email = "edited-by-hand@x"; // someone changes it during the approval wait
      return seen;
    });
    const done: unknown[] = [];
    let runId = "";
    const refused = await saga
      .run({ agent: "a", request: "r" }, async (run) => {
        runId = run.id;
        await run.step({ tool: "crm.update_contact", args: { id: 7, email: "new@x" }, do: async (args: object) => { done.push(args); return { ok: true }; } });
      })
      .catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(BeforeImageFailed);
    expect(refused).toMatchObject({ code: "before_image_failed", tool: "crm.update_contact", readTool: "crm.get_contact", reason: "changed while the step waited for approval" });
    expect((refused as Error).message).toBe(
      'crm.update_contact was not called: the value it changes (read through crm.get_contact) changed while the step waited for approval (recorded {"email":"old@x"}, now {"email":"edited-by-hand@x"}), so its undo would restore the wrong value. The action act_1 is left approved and not started.',
    );
    expect(reads).toEqual(["before old@x", "before edited-by-hand@x"]);
    expect(done).toEqual([]);
    // Neither started nor reported failed: its approval is unspent; the scope's failure fails the run.
    expect(started(api)).toEqual([]);
    expect(runId).toBe("run_1");
    expect(api.calls.filter((c) => c.path === "/runs/run_1/fail").map((c) => c.body.error)).toEqual([`BeforeImageFailed: ${(refused as Error).message}`]);
  });

  it("refuses it when the read fails now, and reads with the args as the approver edited them", async () => {
    const { api, saga, reads } = setUp({ id: 8, email: "new@x" }); // the approver chose contact 8
    let calls = 0;
    saga.reader("crm.get_contact", async (args, context) => {
      reads.push(`${context.phase} ${String(args["id"])}`);
      calls += 1;
      if (calls > 1) throw new Error("the CRM answered 503");
      return { contact: { email: "old@x" } };
    });
    const done: unknown[] = [];
    const run = await saga.run({ agent: "a", request: "r" });
    const refused = await run.step({ tool: "crm.update_contact", args: { id: 7, email: "new@x" }, do: async (args: object) => { done.push(args); return {}; } }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(BeforeImageFailed);
    expect((refused as Error).message).toMatch(/that read failed \(Error: the CRM answered 503\)/);
    expect(done).toEqual([]);
    expect(started(api)).toEqual([]);
    expect(reads).toEqual(["before 7", "before 8"]);
  });

  it("does not read again for a step given its own before", async () => {
    const { api, saga, reads } = setUp();
    saga.reader("crm.get_contact", async (_args, context) => {
      reads.push(context.phase);
      return { contact: { email: "changes@x" } };
    });
    await saga.run({ agent: "a", request: "r" }, async (run) => {
      await run.step({ tool: "crm.update_contact", args: { id: 7, email: "new@x" }, before: { email: "as-known@x" }, do: async () => ({ ok: true }) });
    });
    expect(reads).toEqual(["after"]);
    expect(started(api)).toEqual(["/actions/act_1/start", "/actions/act_1/succeed"]);
  });
});
