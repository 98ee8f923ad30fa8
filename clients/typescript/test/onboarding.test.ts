/**
 * The onboarding saga against the live server: three steps, the third failing. The run lands in
 * the recovery queue naming the failing step; an operator's compensation is carried out by the
 * workers, newest first (the harness checks the webhooks' order: the license before the user).
 */
import { describe, expect, it } from "vitest";

import type { Run } from "../src/index.js";
import { agentSaga, noServer, operator, unique, waitFor } from "./live.js";

const EMAIL = "ashu@company.com";

class MailDown extends Error {
  override name = "MailDown";
}

async function onboard(saga = agentSaga(), failMail = true): Promise<{ run: Run | undefined; calls: string[] }> {
  const calls: string[] = [];
  let opened: Run | undefined;
  await saga
    .run({ agent: "onboarding", request: "Onboard Ashu Kumar", externalId: unique("HR") }, async (run) => {
      opened = run;
      await run.step({
        tool: "hr.create_user",
        target: ["user", EMAIL],
        args: { email: EMAIL, name: "Ashu Kumar" },
        do: async (args) => {
          calls.push(`create_user:${String(args["email"])}`);
          return { user_id: 17 };
        },
        compensate: ["hr.delete_user", { email: EMAIL }],
        after: (result: { user_id: number }) => ({ user_id: result.user_id, active: true }),
      });
      await run.step({
        tool: "workspace.provision_license",
        target: ["user", EMAIL],
        args: { email: EMAIL, sku: "business-standard" },
        do: async () => {
          calls.push("provision_license");
          return { license: "lic-business-standard" };
        },
        compensate: ["workspace.cancel_license", { email: EMAIL }],
      });
      await run.checkpoint("accounts-ready", { state: { email: EMAIL }, summary: "Ashu has an account and a license." });
      await run.step({
        tool: "email.send_welcome",
        target: ["user", EMAIL],
        args: { to: EMAIL, template: "welcome" },
        do: async () => {
          calls.push("send_welcome");
          if (failMail) throw new MailDown("SMTP 451: try again later");
          return { message_id: "m-1" };
        },
      });
    })
    .catch((error: unknown) => {
      if (!(error instanceof MailDown)) throw error;
      calls.push("rethrown");
    });
  return { run: opened, calls };
}

describe.skipIf(noServer)("the onboarding saga", () => {
  it("completes with every step recorded and its compensation registered", async () => {
    const saga = agentSaga();
    const { run, calls } = await onboard(saga, false);
    expect(calls).toEqual([`create_user:${EMAIL}`, "provision_license", "send_welcome"]);
    const detail = await saga.getRun(run!.id);
    expect(detail.status).toBe("succeeded");
    expect(detail.actions.map((a) => [a.tool, a.status, a.compensation?.tool ?? null])).toEqual([
      ["hr.create_user", "succeeded", "hr.delete_user"],
      ["workspace.provision_license", "succeeded", "workspace.cancel_license"],
      ["email.send_welcome", "succeeded", null],
    ]);
    expect(detail.latest_checkpoint?.name).toBe("accounts-ready");
  });

  it("fails at step three into the recovery queue and is compensated newest first by the workers", async () => {
    const saga = agentSaga();
    const { run, calls } = await onboard(saga, true);
    // The tool's own error went up unchanged, after the run was failed.
    expect(calls).toEqual([`create_user:${EMAIL}`, "provision_license", "send_welcome", "rethrown"]);
    const failed = await saga.getRun(run!.id);
    expect(failed.status).toBe("failed");
    const mail = failed.actions.find((a) => a.tool === "email.send_welcome")!;
    expect(failed.failed_action_id).toBe(mail.id);
    expect(mail.status).toBe("failed");
    expect(mail.error).toContain("MailDown: SMTP 451");
    const item = failed.recovery_item as { id: string } | null;
    expect(item?.id).toMatch(/^rec_/);

    // An operator decides to undo it; the workers call the compensators.
    const ops = operator();
    const unwind = await ops.request<{ id: string }>("POST", `/recovery/${item!.id}/compensate`, {
      body: { reason: "the new hire withdrew" },
      idempotencyKey: unique("compensate"),
    });
    type Unwind = { status: string; steps: Array<{ status: string; tool: string; error?: string }> };
    let last: Unwind | undefined;
    const finished = await waitFor(async () => {
      last = await ops.request<Unwind>("GET", `/unwinds/${unwind.id}`);
      return ["completed", "failed", "cancelled", "paused"].includes(last.status) ? last : undefined;
    }, "the unwind to finish", 150).catch((error: Error) => {
      throw new Error(`${error.message}; the unwind as last seen: ${JSON.stringify(last)}`);
    });
    expect(finished.status, JSON.stringify(finished)).toBe("completed");
    const done = await saga.getRun(run!.id);
    expect(done.status).toBe("compensated");
    expect(Object.fromEntries(done.actions.map((a) => [a.tool, a.status]))).toEqual({
      "hr.create_user": "compensated",
      "workspace.provision_license": "compensated",
      "email.send_welcome": "failed",
    });
    console.log(`ONBOARDING_COMPENSATED ${run!.id}`);
  }, 240_000);
});
