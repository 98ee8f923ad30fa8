/**
 * A step's guarantees against the live server: a replayed started step never runs `do` again; an
 * approval wait resolves both ways and times out with the reason; an operator's cancel is a typed
 * `RunCancelled` and is not reported as a failure; `saga.tool` steps in its async context.
 */
import { afterEach, describe, expect, it, vi } from "vitest";

import { ApprovalPending, ApprovalRejected, ApprovalTimedOut, Conflict, NoActiveRun, RunCancelled, StepInDoubt, type Run } from "../src/index.js";
import { agentSaga, approver, noServer, operator, pendingApproval, unique, waitFor } from "./live.js";

afterEach(() => {
  vi.restoreAllMocks();
});

describe.skipIf(noServer)("a replayed step", () => {
  it("returns the recorded result without running do again, in this process and after a restart", async () => {
    const saga = agentSaga();
    let calls = 0;
    const create = {
      tool: "hr.create_user",
      target: ["user", "replay@company.com"] as const,
      args: { email: "replay@company.com" },
      do: async () => ({ user_id: ++calls }),
      compensate: ["hr.delete_user", { email: "replay@company.com" }] as const,
    };
    let runId = "";
    await saga.run({ agent: "onboarding", request: "Onboard twice" }, async (run) => {
      runId = run.id;
      expect(await run.step(create)).toEqual({ user_id: 1 });
      expect(await run.step(create)).toEqual({ user_id: 1 });
    });
    // Another process (a new client) attached to the same run replays it too.
    const restarted = agentSaga();
    const again = await restarted.attach(runId);
    expect(await again.step(create)).toEqual({ user_id: 1 });
    expect(calls).toBe(1);
  });

  it("never runs do for a step another call started and has not finished", async () => {
    const saga = agentSaga();
    let calls = 0;
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const step = {
      tool: "hr.create_user",
      target: ["user", "inflight@company.com"] as const,
      args: { email: "inflight@company.com" },
      compensate: ["hr.delete_user", { email: "inflight@company.com" }] as const,
      do: async () => {
        calls += 1;
        await released;
        return { user_id: 7 };
      },
    };
    await saga.run({ agent: "onboarding", request: "Two workers, one step" }, async (run) => {
      const first = run.step(step);
      await waitFor(async () => calls === 1, "the first call to start");
      // The same step again while the first runs: the server replays `running`, and do is not run.
      const other = await saga.attach(run.id);
      await expect(other.step(step)).rejects.toBeInstanceOf(StepInDoubt);
      release();
      expect(await first).toEqual({ user_id: 7 });
      // Once it succeeded, the same step replays its result.
      expect(await other.step(step)).toEqual({ user_id: 7 });
    });
    expect(calls).toBe(1);
  });
});

describe.skipIf(noServer)("an approval wait", () => {
  const charge = (run: () => string, calls: unknown[]) => ({
    tool: "payments.charge",
    target: ["invoice", unique("NW")] as const,
    args: { amount: 300, currency: "EUR" },
    do: async (args: Record<string, unknown>) => {
      calls.push(args);
      return { charge_id: "ch_1" };
    },
    compensate: null,
    approvalTimeoutS: 120,
    runId: run,
  });

  it("proceeds once approved, with the approver's args", async () => {
    const saga = agentSaga();
    const calls: unknown[] = [];
    let runId = "";
    const approving = pendingApproval(saga, () => runId, "payments.charge").then((id) =>
      approver().request("POST", `/approvals/${id}/approve`, {
        body: { reason: "invoice checked", args: { amount: 250, currency: "EUR" } },
        idempotencyKey: unique("approve"),
      }),
    );
    const result = await saga.run({ agent: "onboarding", request: "Pay the invoice" }, async (run) => {
      runId = run.id;
      const { runId: _, ...step } = charge(() => run.id, calls);
      return run.step(step);
    });
    await approving;
    expect(result).toEqual({ charge_id: "ch_1" });
    expect(calls).toEqual([{ amount: 250, currency: "EUR" }]);
    expect((await saga.getRun(runId)).status).toBe("succeeded");
  });

  it("throws ApprovalRejected with the reason when rejected, and fails the run", async () => {
    const saga = agentSaga();
    const calls: unknown[] = [];
    let runId = "";
    const rejecting = pendingApproval(saga, () => runId, "payments.charge").then((id) =>
      approver().request("POST", `/approvals/${id}/reject`, { body: { reason: "duplicate invoice" }, idempotencyKey: unique("reject") }),
    );
    const outcome = saga.run({ agent: "onboarding", request: "Pay the invoice" }, async (run) => {
      runId = run.id;
      const { runId: _, ...step } = charge(() => run.id, calls);
      return run.step(step);
    });
    await expect(outcome).rejects.toSatisfy((e: unknown) => e instanceof ApprovalRejected && e.reason === "duplicate invoice");
    await rejecting;
    expect(calls).toEqual([]);
    expect((await saga.getRun(runId)).status).toBe("failed");
  });

  it("times out as ApprovalTimedOut with the reason, and the failed run withdraws the approval", async () => {
    const saga = agentSaga();
    let runId = "";
    const outcome = saga.run({ agent: "onboarding", request: "Pay the invoice" }, (run) => {
      runId = run.id;
      return run.step({ tool: "payments.charge", target: ["invoice", unique("NW")], args: { amount: 10 }, do: () => "never", approvalTimeoutS: 0.3 });
    });
    await expect(outcome).rejects.toSatisfy(
      (e: unknown) => e instanceof ApprovalTimedOut && e.code === "approval_timeout" && e.reason.startsWith("nobody decided"),
    );
    // Nobody is left to approve a step of a run that is over: the approval leaves the inbox.
    const detail = await saga.getRun(runId);
    expect(detail.status).toBe("failed");
    expect(detail.actions.map((a) => [a.tool, a.status])).toEqual([["payments.charge", "rejected"]]);
    expect(detail.actions[0]?.approval?.status).toBe("expired");
  });

  it("parks a run whose recorded step still waits for approval, and completes it only when told to withdraw", async () => {
    const saga = agentSaga();
    let runId = "";
    let actionId = "";
    await saga.run({ agent: "onboarding", request: "Pay later" }, async (run) => {
      runId = run.id;
      const recorded = await run.record({ tool: "payments.charge", target: ["invoice", unique("NW")], args: { amount: 10 } });
      expect(recorded.status).toBe("awaiting_approval");
      actionId = recorded.id;
    });
    expect((await saga.getRun(runId)).status).toBe("running");
    await expect(saga.completeRun(runId, "done")).rejects.toSatisfy(
      (e: unknown) => e instanceof Conflict && e.code === "pending_approvals" && e.message.includes(actionId),
    );
    expect((await saga.completeRun(runId, "done", { withdrawApprovals: true })).status).toBe("succeeded");
    expect((await saga.getAction(actionId)).status).toBe("rejected");
  });

  it("with wait: false, leaves the run running and raises ApprovalPending", async () => {
    const saga = agentSaga();
    let runId = "";
    const outcome = saga.run({ agent: "onboarding", request: "Pay later" }, async (run) => {
      runId = run.id;
      return run.step({ tool: "payments.charge", target: ["invoice", unique("NW")], args: { amount: 10 }, do: () => "never", wait: false });
    });
    await expect(outcome).rejects.toBeInstanceOf(ApprovalPending);
    expect((await saga.getRun(runId)).status).toBe("running");
  });
});

describe.skipIf(noServer)("a tool no policy names", () => {
  it("is said once per tool: the default policy applied (a mistyped name, most often)", async () => {
    const saga = agentSaga();
    const warned = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    for (const table of ["users", "orders"]) {
      await saga.run({ agent: "ops", request: `Clean up ${table}` }, async (run) => {
        const recorded = await run.record({ tool: "db.drop_table", args: { table } });
        expect(recorded.warnings.map((w) => w["code"])).toContain("default_policy");
        await run.complete("left for later", { withdrawApprovals: true });
      });
    }
    const said = warned.mock.calls.map((call) => String(call[0])).filter((line) => line.includes("db.drop_table"));
    expect(said).toEqual([
      "saga: No policy names db.drop_table; the default applied (risk high, approval manual). Check the tool's name, or add a policy for it.",
    ]);
  });
});

describe.skipIf(noServer)("an operator's cancel", () => {
  it("surfaces as RunCancelled, and the client does not try to fail the cancelled run", async () => {
    const saga = agentSaga({ heartbeatIntervalS: 0 });
    const errors = vi.spyOn(console, "error");
    let runId = "";
    const outcome = saga.run({ agent: "onboarding", request: "Onboard Ashu" }, async (run) => {
      runId = run.id;
      await run.step({ tool: "hr.create_user", target: ["user", "c@company.com"], args: { email: "c@company.com" }, do: () => ({ ok: true }), compensate: ["hr.delete_user", { email: "c@company.com" }] });
      await operator().request("POST", `/runs/${run.id}/cancel`, { body: { reason: "the user withdrew" }, idempotencyKey: unique("cancel") });
      await run.step({ tool: "email.send_welcome", target: ["user", "c@company.com"], args: { to: "c@company.com" }, do: () => "never" });
    });
    await expect(outcome).rejects.toSatisfy((e: unknown) => e instanceof RunCancelled && e.code === "run_not_accepting_actions" && e.runId === runId);
    expect(errors).not.toHaveBeenCalled();
    expect((await saga.getRun(runId)).status).toBe("cancelled");
  });

  it("seen by a background heartbeat, aborts the running step's signal", async () => {
    const saga = agentSaga({ heartbeatIntervalS: 0.1 });
    const errors = vi.spyOn(console, "error");
    let runId = "";
    const outcome = saga.run({ agent: "onboarding", request: "A long step" }, async (run: Run) => {
      runId = run.id;
      return run.step({
        tool: "hr.create_user",
        target: ["user", "long@company.com"],
        args: { email: "long@company.com" },
        compensate: ["hr.delete_user", { email: "long@company.com" }],
        do: async (_args, { signal }) => {
          await operator().request("POST", `/runs/${run.id}/cancel`, { body: { reason: "stop" }, idempotencyKey: unique("cancel") });
          // A step that honours its signal stops when the heartbeat brings the cancel command (which
          // may have come while the cancel request was still answering: then it is aborted already).
          await new Promise((_resolve, reject) => {
            if (signal.aborted) return reject(signal.reason);
            signal.addEventListener("abort", () => reject(signal.reason), { once: true });
          });
        },
      });
    });
    await expect(outcome).rejects.toBeInstanceOf(RunCancelled);
    expect(errors).not.toHaveBeenCalled();
    expect((await saga.getRun(runId)).status).toBe("cancelled");
  });
});

describe.skipIf(noServer)("saga.tool", () => {
  it("makes each call a step of the run in its async context, and refuses outside one", async () => {
    const saga = agentSaga();
    const createUser = saga.tool(
      "hr.create_user",
      async ({ email, name }: { email: string; name: string }) => ({ created: `${name} <${email}>` }),
      { target: ({ email }) => ["user", email], compensate: ({ email }) => ["hr.delete_user", { email }] },
    );
    await expect(createUser({ email: "t@company.com", name: "T" })).rejects.toBeInstanceOf(NoActiveRun);
    let runId = "";
    await saga.run({ agent: "onboarding", request: "Onboard T" }, async (run) => {
      runId = run.id;
      // Calls in concurrent tasks see the same run.
      await Promise.all([createUser({ email: "t@company.com", name: "T" }), createUser({ email: "u@company.com", name: "U" })]);
    });
    const detail = await saga.getRun(runId);
    expect(detail.actions.map((a) => [a.tool, a.target_id, a.compensation?.tool, a.status]).sort()).toEqual([
      ["hr.create_user", "t@company.com", "hr.delete_user", "succeeded"],
      ["hr.create_user", "u@company.com", "hr.delete_user", "succeeded"],
    ]);
  });
});

describe.skipIf(noServer)("an AbortSignal", () => {
  it("ends an approval wait and fails the run", async () => {
    const saga = agentSaga();
    const controller = new AbortController();
    let runId = "";
    const outcome = saga.run({ agent: "onboarding", request: "Pay, then give up", signal: controller.signal }, async (run) => {
      runId = run.id;
      return run.step({ tool: "payments.charge", target: ["invoice", unique("NW")], args: { amount: 10 }, do: () => "never" });
    });
    await pendingApproval(saga, () => runId, "payments.charge");
    controller.abort(new Error("the user closed the tab"));
    await expect(outcome).rejects.toThrow("the user closed the tab");
    expect((await saga.getRun(runId)).status).toBe("failed");
  });
});
